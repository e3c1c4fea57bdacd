"""The user's agent as pods of its own (``spec.agent``; docs/agents.md, "Agents in their own pods").

An agent program (any framework: it talks to an OpenAI-compatible base URL) runs once per episode in the agent
pods; its model calls reach the generators' endpoint through the job's Service with that episode's credentials.
Pod settings are a role's (image, env, resources, placement), so the agent pods render like the other roles.

Neighbours: ``environment`` (``type: Agent`` needs this section, and this section needs it), ``spec`` composes it,
``validate_environment`` holds the rules across sections.
"""
from __future__ import annotations

from pydantic import Field

from kubeforge.api.rljob.roles import PodSettings


class AgentSpec(PodSettings):
    """The agent pods: ``replicas`` pods, each running up to ``concurrency`` episodes at once, one process of
    ``program`` per episode. The image defaults to the runtime image; an image of your own must carry the
    ``kubeforge`` command (the pod's process claims episodes and starts ``program``)."""

    program: list[str] = Field(
        min_length=1, max_length=64, description="The agent's command line, run once per episode: it gets the "
        "episode's prompt on stdin and OPENAI_BASE_URL, OPENAI_API_KEY (the episode's own credential) and "
        "OPENAI_DEFAULT_MODEL in its environment, so an unchanged openai client or agent framework calls the "
        "policy. Its exit ends the episode (0: done; otherwise the episode fails as env_error).")
    concurrency: int = Field(4, ge=1, le=256, description="Episodes one agent pod runs at once.")
