"""The ``Verifiers`` environment type: episodes of an environment written for PrimeIntellect's ``verifiers`` library,
run unchanged by the library's own rollout loop against the endpoint, recorded token by token.

Neighbours: ``endpoint`` serves the model calls and records them; ``verifiers_runner`` is the library-side process
(the environments' own interpreter, ``.venv-envs``: verifiers 0.4 needs openai < 3, our stack pins openai 3).
This module opens one endpoint episode per rollout, starts the runner with the jobs, waits (bounded), and pairs
each episode's recording with the reward the library computed.

    run_group ─ open_episode × n ─▶ runner process (verifiers Env → its interception server → our endpoint)
              ◀─ JSON line per job: reward, rewards, ok, error ─┘      close_episode × n ─▶ Recording × n

Invariants: the runner's wall time is bounded (``timeout``; it is killed past it and every episode of the group
fails with ``env_timeout``); its output is bounded (``MAX_OUTPUT``); a runner that exits non-zero or prints garbage
fails the group's episodes with ``env_error``/``env_garbage``, never the job.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from kubeforge.runtime.agents import endpoint, endpoint_record

RUNNER = pathlib.Path(__file__).with_name("verifiers_runner.py")
ENV_PYTHON = "KUBEFORGE_ENVS_PYTHON"       # the environments' interpreter (default: .venv-envs/bin/python)
MAX_OUTPUT = 1 << 20
API_KEY_VAR = "KUBEFORGE_ENDPOINT_KEY"


def default_python(root: pathlib.Path | None = None) -> pathlib.Path:
    explicit = os.environ.get(ENV_PYTHON)
    if explicit:
        return pathlib.Path(explicit)
    return (root or pathlib.Path.cwd()) / ".venv-envs" / "bin" / "python"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outcome:
    """One rollout: what the library said (reward, named rewards, ok, error) and what the endpoint recorded."""

    task: int
    reward: float | None
    rewards: dict[str, float]
    ok: bool
    error: str | None
    finish_reason: str                       # "stop", or env_error / env_timeout / env_garbage
    recording: endpoint_record.Recording


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifiersEnvironment:
    environment: str                          # spec.environment.verifiers.environment: the taskset's module
    python: pathlib.Path                      # the environments' interpreter
    paths: tuple[str, ...] = ()               # extra import paths for the environment's module
    timeout: float = 300.0
    args: dict[str, Any] = dataclasses.field(default_factory=dict)   # spec.environment.verifiers.args

    def run_group(self, ep: endpoint.Endpoint, tasks: Sequence[int]) -> list[Outcome]:
        episodes = [ep.open_episode() for _ in tasks]
        jobs = [{"base_url": ep.base_url(e), "task": int(t)} for e, t in zip(episodes, tasks)]
        spec = {"environment": self.environment, "model": ep.config.model, "jobs": jobs, "api_key_var": API_KEY_VAR,
                "args": self.args}
        lines, failure = self._run(spec, key=ep.config.key)
        recordings = [ep.close_episode(e) for e in episodes]
        return [_outcome(int(t), lines.get(i), failure, rec) for i, (t, rec) in enumerate(zip(tasks, recordings))]

    def _run(self, spec: dict[str, Any], *, key: bytes | None) -> tuple[dict[int, dict[str, Any]], str]:
        """The runner's result lines by job index, and the group's failure reason ("" if none)."""
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(self.paths), PYTHONNOUSERSITE="1",
                   **{API_KEY_VAR: endpoint.api_key(key) if key is not None else "local"})
        try:
            proc = subprocess.run([str(self.python), str(RUNNER)], input=json.dumps(spec), capture_output=True,
                                  text=True, timeout=self.timeout, env=env, check=False)
        except subprocess.TimeoutExpired:
            return {}, "env_timeout"
        except OSError as exc:           # no such interpreter (make venv-envs), not executable, ...
            print(f"verifiers runner did not start: {exc}", file=sys.stderr)
            return {}, "env_error"
        if proc.returncode != 0:
            print(f"verifiers runner exited {proc.returncode}: {proc.stderr[-2000:]}", file=sys.stderr)
            return {}, "env_error"
        if len(proc.stdout) > MAX_OUTPUT:
            return {}, "env_garbage"
        lines: dict[int, dict[str, Any]] = {}
        try:
            for i, line in enumerate(proc.stdout.splitlines()):
                obj = json.loads(line)
                if not isinstance(obj, dict):
                    return {}, "env_garbage"
                lines[i] = obj
        except ValueError:
            return {}, "env_garbage"
        return lines, ""


def _outcome(task: int, line: dict[str, Any] | None, failure: str,
             recording: endpoint_record.Recording) -> Outcome:
    if line is None:
        return Outcome(task=task, reward=None, rewards={}, ok=False, error=failure or "no result",
                       finish_reason=failure or "env_garbage", recording=recording)
    reward = line.get("reward")
    ok = bool(line.get("ok")) and isinstance(reward, (int, float))
    return Outcome(task=task, reward=float(reward) if isinstance(reward, (int, float)) else None,
                   rewards={str(k): float(v) for k, v in dict(line.get("rewards") or {}).items()}, ok=ok,
                   error=line.get("error"), finish_reason="stop" if ok else "env_error", recording=recording)
