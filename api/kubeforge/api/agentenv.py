"""The env contract of an agent pod's process (``spec.agent``): a small sibling of ``roleenv`` for a process that is
not a role. It gets the generators' addresses and the agent key, never the job key (docs/agents.md, "Agents in
their own pods").

```
 operator (render/agent.py) ──┐                       ┌──▶ runtime (agents/pods/start.py): AgentEnv
                              ├─▶ render() ─▶ env ─▶ read()
 launcher (launcher/main.py) ─┘                        one message per problem, named by variable
```

Invariant: ``read(render(...))`` (strings only) gives back what was rendered (tests/api/test_agentenv.py).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from kubeforge.api import contract, roleenv

AGENT_KEY_BYTES = 32


@dataclasses.dataclass(frozen=True, kw_only=True)
class AgentEnv:
    index: int
    config_path: str
    job_name: str | None
    port_base: int
    bind_host: str
    generators: tuple[roleenv.Peer, ...]
    agent_key: bytes


def render(*, index: int | roleenv.FieldRef, config_path: str, job_name: str, generators: Sequence[roleenv.Peer],
           port_base: int, bind_host: str, agent_key: bytes | roleenv.SecretRef,
           namespace: str | roleenv.FieldRef | None = None,
           pod_name: str | roleenv.FieldRef | None = None) -> dict[str, roleenv.Value]:
    """The agent process's variables, in a fixed order; unset optional ones left out."""
    env: dict[str, roleenv.Value | None] = {
        **roleenv.identity(role=contract.AGENT, index=index, config_path=config_path, job_name=job_name,
                           namespace=namespace, pod_name=pod_name, port_base=port_base, bind_host=bind_host),
        contract.env_replicas("generator"): str(len(generators)),
        contract.env_peers("generator"): ",".join(p.render() for p in generators),
        contract.ENV_AGENT_KEY: agent_key.hex() if isinstance(agent_key, bytes) else agent_key,
    }
    return {k: v for k, v in env.items() if v is not None and v != ""}


def read(env: Mapping[str, str]) -> tuple[AgentEnv, list[str]]:
    """The agent process's contract parsed as far as it goes, and one message per problem (none: valid)."""
    problems: list[str] = []
    if env.get(contract.ENV_ROLE) != contract.AGENT:
        problems.append(f"{contract.ENV_ROLE}: Unsupported value: {env.get(contract.ENV_ROLE)!r}: want "
                        f"{contract.AGENT!r}")
    index = _int(env, contract.ENV_INDEX, problems, default=0)
    port_base = _int(env, contract.ENV_PORT_BASE, problems, default=contract.DEFAULT_PORT_BASE)
    key = contract.env_peers("generator")
    generators = roleenv.parse_peers(env.get(key, ""), key=key, problems=problems)
    if not generators and not any(p.startswith(key) for p in problems):
        problems.append(f"{key}: Required value")
    path = env.get(contract.ENV_CONFIG, "")
    if not path:
        problems.append(f"{contract.ENV_CONFIG}: Required value")
    agent_key = roleenv.secret_key(env, contract.ENV_AGENT_KEY, problems)
    return AgentEnv(index=index, config_path=path, job_name=env.get(contract.ENV_JOB_NAME) or None,
                    port_base=port_base, bind_host=env.get(contract.ENV_BIND_HOST) or "0.0.0.0",
                    generators=generators, agent_key=agent_key), problems


def _int(env: Mapping[str, str], key: str, problems: list[str], *, default: int) -> int:
    raw = env.get(key) or ""
    if not raw:
        return default
    if not raw.isdigit():
        problems.append(f"{key}: Invalid value: {raw!r}: must be a non-negative integer")
        return default
    return int(raw)
