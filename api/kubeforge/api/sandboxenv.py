"""The env contract of a sandbox pod's process (``spec.sandbox``; docs/sandboxes.md), and of its clients.

A sandbox process is not a role: it reads no manifest (its pod mounts nothing of the job), so its settings travel
as variables, and it holds the sandbox key, never the job key. Its clients (the verifier role's CodeExecution and
environment workers) get the pods' addresses and the same key (:func:`client_env`).

```
 operator (render/sandbox.py, render/env.py) ──┐                        ┌──▶ runtime (sandboxes/start.py): SandboxEnv
                                               ├─▶ render() ─▶ env ─▶ read()
 launcher (launcher/main.py) ──────────────────┘                        └──▶ runtime (sandboxes/client.py): from_env
```

Invariant: ``read(render(...))`` (strings only) gives back what was rendered (tests/api/test_sandboxenv.py).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from kubeforge.api import contract, roleenv

KEY_BYTES = 32
ENV_SLOTS = "KUBEFORGE_SANDBOX_SLOTS"
ENV_MAX_RUN = "KUBEFORGE_SANDBOX_MAX_RUN_SECONDS"
ENV_IDLE = "KUBEFORGE_SANDBOX_IDLE_SECONDS"


@dataclasses.dataclass(frozen=True, kw_only=True)
class SandboxEnv:
    index: int
    job_name: str | None
    port_base: int
    bind_host: str
    key: bytes
    slots: int
    max_run_seconds: float
    idle_seconds: float


def render(*, index: int | roleenv.FieldRef, job_name: str | None, port_base: int, bind_host: str,
           key: bytes | roleenv.SecretRef, slots: int, max_run_seconds: float,
           idle_seconds: float) -> dict[str, roleenv.Value]:
    """The sandbox process's variables, in a fixed order."""
    env: dict[str, roleenv.Value | None] = {
        contract.ENV_ROLE: contract.SANDBOX,
        contract.ENV_INDEX: index if isinstance(index, roleenv.FieldRef) else str(index),
        contract.ENV_JOB_NAME: job_name,
        contract.ENV_PORT_BASE: str(port_base),
        contract.ENV_BIND_HOST: bind_host,
        contract.ENV_SANDBOX_KEY: key.hex() if isinstance(key, bytes) else key,
        ENV_SLOTS: str(slots),
        ENV_MAX_RUN: f"{max_run_seconds:g}",
        ENV_IDLE: f"{idle_seconds:g}",
    }
    return {k: v for k, v in env.items() if v is not None and v != ""}


def client_env(*, sandboxes: Sequence[roleenv.Peer],
               key: bytes | roleenv.SecretRef) -> dict[str, roleenv.Value]:
    """What a client of the pool (a verifier) is given: the sandbox pods' addresses and the key."""
    return {contract.ENV_SANDBOXES: ",".join(p.render() for p in sandboxes),
            contract.ENV_SANDBOX_KEY: key.hex() if isinstance(key, bytes) else key}


def read(env: Mapping[str, str]) -> tuple[SandboxEnv, list[str]]:
    """The sandbox process's contract parsed as far as it goes, and one message per problem (none: valid)."""
    problems: list[str] = []
    if env.get(contract.ENV_ROLE) != contract.SANDBOX:
        problems.append(f"{contract.ENV_ROLE}: Unsupported value: {env.get(contract.ENV_ROLE)!r}: want "
                        f"{contract.SANDBOX!r}")
    index = int(_number(env, contract.ENV_INDEX, problems, default=0, zero=True))
    port_base = int(_number(env, contract.ENV_PORT_BASE, problems, default=contract.DEFAULT_PORT_BASE))
    slots = int(_number(env, ENV_SLOTS, problems, default=8))
    max_run = _number(env, ENV_MAX_RUN, problems, default=30.0, real=True)
    idle = _number(env, ENV_IDLE, problems, default=60.0, real=True)
    key = roleenv.secret_key(env, contract.ENV_SANDBOX_KEY, problems)
    return SandboxEnv(index=index, job_name=env.get(contract.ENV_JOB_NAME) or None, port_base=port_base,
                      bind_host=env.get(contract.ENV_BIND_HOST) or "0.0.0.0", key=key, slots=slots,
                      max_run_seconds=max_run, idle_seconds=idle), problems


def read_client(env: Mapping[str, str]) -> tuple[tuple[roleenv.Peer, ...], bytes] | None:
    """The pool a client may claim from (addresses, key), or None when the job has none (``spec.sandbox`` unset).
    Raises ``ValueError`` naming the variable when it is set but malformed."""
    raw = env.get(contract.ENV_SANDBOXES, "")
    if not raw:
        return None
    problems: list[str] = []
    peers = roleenv.parse_peers(raw, key=contract.ENV_SANDBOXES, problems=problems)
    key = roleenv.secret_key(env, contract.ENV_SANDBOX_KEY, problems)
    if problems:
        raise ValueError("; ".join(problems))
    return peers, key


def _number(env: Mapping[str, str], key: str, problems: list[str], *, default: float,
            real: bool = False, zero: bool = False) -> float:
    raw = env.get(key) or ""
    if not raw:
        return default
    try:
        value = float(raw) if real else int(raw)
    except ValueError:
        problems.append(f"{key}: Invalid value: {raw!r}: must be {'a number' if real else 'an integer'}")
        return default
    if value < 0 or (value == 0 and not zero):
        problems.append(f"{key}: Invalid value: {raw!r}: must be {'at least 0' if zero else 'positive'}")
        return default
    return value
