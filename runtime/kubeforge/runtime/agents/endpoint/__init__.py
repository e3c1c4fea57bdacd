"""The OpenAI-compatible endpoint in front of a generator's engine (docs/agents-endpoint.md): ``server`` (HTTP,
episodes, authentication, refusals, counters), ``request`` (a ``/v1/chat/completions`` body, validated), ``chat``
(messages to prompt ids without re-tokenisation drift), ``record`` (an episode's branches of calls), ``stream`` (a
call as server-sent events while it is sampled), ``sampler`` (the ``Sampler`` interface; ``VllmSampler``). Callers
write ``endpoint.server.Endpoint``, ``endpoint.chat.ChatTemplate``; the modules import each other, never this face."""
from kubeforge.runtime.agents.endpoint import chat, record, request, sampler, server, stream

__all__ = ["chat", "record", "request", "sampler", "server", "stream"]
