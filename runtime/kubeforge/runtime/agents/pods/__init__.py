"""Agents in their own pods (``spec.agent``, ``environment.type: Agent``; docs/agents.md): the generator side that
hands episodes out (``dispatch``) and turns their recordings into groups (``sampler``), and the agent pod's
process that claims them and runs the user's program once per episode (``worker``, ``start``)."""
from kubeforge.runtime.agents.pods import dispatch

__all__ = ["dispatch"]
