"""The ``Verifiers`` environment type: episodes of an environment written for PrimeIntellect's ``verifiers`` library,
run unchanged by the library's own rollout loop against the endpoint, recorded token by token.

Neighbours: ``endpoint`` serves the model calls and records them; ``runner`` is the library-side process
(the environments' own interpreter, ``.venv-envs``: verifiers 0.4 needs openai < 3, our stack pins openai 3).
This module opens one endpoint episode per rollout, starts the runner with the jobs, waits (bounded), and pairs
each episode's recording with the reward the library computed.

    run_group ─ open_episode × n ─▶ runner process (verifiers Env → its interception server → our endpoint)
              ◀─ JSON line per job: reward, rewards, ok, error ─┘      close_episode × n ─▶ Recording × n

Invariants: each rollout is bounded (``rollout_timeout``: the runner cancels it past that, ``env_timeout`` for that
episode alone); the runner's wall time is bounded (``timeout``; it is killed past it and every episode of the group
fails with ``env_timeout``); its output is bounded (``MAX_OUTPUT``); a runner that exits non-zero or prints garbage
fails the group's episodes with ``env_error``/``env_garbage``, never the job. :meth:`VerifiersEnvironment.check`
loads the environment once at the generator's start: a missing interpreter, a module the interpreter cannot import
or arguments its config refuses fail the role at start (``EnvironmentUnavailable``, naming the field or setting).
The runner starts through ``isolation`` (a minimal environment, its own session, Landlock where the kernel has it):
the environment's code sees none of the pod's secrets, only the endpoint's derived key.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import selectors
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from kubeforge.runtime import isolation
from kubeforge.runtime.agents import endpoint

RUNNER = pathlib.Path(__file__).with_name("runner.py")
ENV_PYTHON = "KUBEFORGE_ENVS_PYTHON"       # the environments' interpreter (default: .venv-envs/bin/python)
MAX_OUTPUT = 1 << 20
API_KEY_VAR = "KUBEFORGE_ENDPOINT_KEY"
ENV_PATH = "KUBEFORGE_ENVS_PATH"           # folders the environment's module is imported from (default: the cwd)
CHECK_TIMEOUT = 300.0                      # the start-up check: the library's import on loaded CPUs


class EnvironmentUnavailable(RuntimeError):
    """The environment cannot run here (start-up check): the message names the field or setting to fix."""


def default_python(root: pathlib.Path | None = None) -> pathlib.Path:
    explicit = os.environ.get(ENV_PYTHON)
    if explicit:
        return pathlib.Path(explicit)
    return (root or pathlib.Path.cwd()) / ".venv-envs" / "bin" / "python"


def default_paths() -> tuple[str, ...]:
    """Where the environment's module is looked for: ``KUBEFORGE_ENVS_PATH`` (folders, ``os.pathsep``-separated,
    relative ones against the cwd), else the cwd."""
    raw = os.environ.get(ENV_PATH)
    parts = [p for p in raw.split(os.pathsep) if p] if raw else ["."]
    return tuple(str(pathlib.Path(p).resolve()) for p in parts)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outcome:
    """One rollout: what the library said (reward, named rewards, ok, error) and what the endpoint recorded."""

    task: int
    reward: float | None
    rewards: dict[str, float]
    ok: bool
    error: str | None
    finish_reason: str                       # "stop", or env_error / env_timeout / env_garbage
    tool_calls: int = 0                      # tool messages in the library's traces
    recording: endpoint.record.Recording


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifiersEnvironment:
    environment: str                          # spec.environment.verifiers.environment: the taskset's module
    python: pathlib.Path                      # the environments' interpreter
    paths: tuple[str, ...] = ()               # extra import paths for the environment's module
    timeout: float = 300.0                    # the runner process, whole
    rollout_timeout: float | None = None      # one rollout (None: only the process bound)
    args: dict[str, Any] = dataclasses.field(default_factory=dict)   # spec.environment.verifiers.args

    def run_group(self, ep: endpoint.server.Endpoint, tasks: Sequence[int]) -> list[Outcome]:
        episodes = [ep.open_episode() for _ in tasks]
        jobs = [{"base_url": ep.base_url(e), "task": int(t)} for e, t in zip(episodes, tasks)]
        spec = {"environment": self.environment, "model": ep.config.model, "jobs": jobs, "api_key_var": API_KEY_VAR,
                "args": self.args, "rollout_timeout": self.rollout_timeout}
        lines, failure = self._run(spec, key=ep.config.key, timeout=self.timeout)
        recordings = [ep.close_episode(e) for e in episodes]
        return [_outcome(int(t), lines.get(i), failure, rec) for i, (t, rec) in enumerate(zip(tasks, recordings))]

    def check(self, *, timeout: float = CHECK_TIMEOUT) -> int:
        """Load the environment once in its interpreter (no rollout): the number of its tasks, or
        :class:`EnvironmentUnavailable` naming what to fix."""
        if not self.python.exists():
            raise EnvironmentUnavailable(
                f"spec.environment.type: Verifiers needs the environments' interpreter with the verifiers library: "
                f"{self.python} does not exist (make venv-envs, or set {ENV_PYTHON})")
        spec = {"check": True, "environment": self.environment, "args": self.args}
        try:
            proc = isolation.run([str(self.python), str(RUNNER)], input=json.dumps(spec), timeout=timeout,
                                 settings=_settings(self.paths, None))
        except subprocess.TimeoutExpired:
            raise EnvironmentUnavailable(f"spec.environment.verifiers.environment: loading {self.environment!r} "
                                         f"took over {timeout:g} s") from None
        if proc.returncode != 0:
            tail = proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
            raise EnvironmentUnavailable(
                f"spec.environment.verifiers: {self.environment!r} with args {self.args} does not load in "
                f"{self.python} (module path {os.pathsep.join(self.paths)}; set {ENV_PATH} to the folder holding "
                f"it): {tail[0][:500]}")
        return int(json.loads(proc.stdout.strip().splitlines()[-1]).get("tasks", 0))

    def _run(self, spec: dict[str, Any], *, key: bytes | None,
             timeout: float) -> tuple[dict[int, dict[str, Any]], str]:
        """The runner's result lines by job index, and the group's failure reason ("" if none)."""
        try:
            proc = isolation.run([str(self.python), str(RUNNER)], input=json.dumps(spec), timeout=timeout,
                                 settings=_settings(self.paths, key))
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


def _settings(paths: Sequence[str], key: bytes | None) -> dict[str, str]:
    """The runner's environment beyond ``isolation.ALLOWED``: its import path and the endpoint's key (derived from
    the job key: it opens the endpoint, nothing else); never the pod's own variables."""
    return {"PYTHONPATH": os.pathsep.join(paths), API_KEY_VAR: endpoint.server.api_key(key) if key is not None else "local"}


def _outcome(task: int, line: dict[str, Any] | None, failure: str,
             recording: endpoint.record.Recording) -> Outcome:
    if line is None:
        return Outcome(task=task, reward=None, rewards={}, ok=False, error=failure or "no result",
                       finish_reason=failure or "env_garbage", recording=recording)
    reward = line.get("reward")
    ok = bool(line.get("ok")) and isinstance(reward, (int, float))
    failed = "env_timeout" if line.get("timed_out") else "env_error"
    calls = line.get("tool_calls")
    return Outcome(task=task, reward=float(reward) if isinstance(reward, (int, float)) else None,
                   rewards={str(k): float(v) for k, v in dict(line.get("rewards") or {}).items()}, ok=ok,
                   error=line.get("error"), finish_reason="stop" if ok else failed, recording=recording,
                   tool_calls=calls if isinstance(calls, int) and calls >= 0 else 0)


class RunnerProcess:
    """One long-lived runner (``runner.py --serve``) for many groups: the library is imported and the
    environment loaded once, not per batch (both take seconds). Same ``run_group`` and outcomes as
    :meth:`VerifiersEnvironment.run_group`; the same bounds: a batch's answer is awaited ``environment.timeout``
    seconds at most (its start included when the process is fresh) and ``MAX_OUTPUT`` bytes; past either, or on
    an exit or a line that is not JSON, the process is killed, the group's episodes fail, and the next group starts a
    fresh one. The runner's stderr is this process's (the role's log)."""

    def __init__(self, environment: VerifiersEnvironment) -> None:
        self.environment = environment
        self._proc: subprocess.Popen[bytes] | None = None
        self._child: isolation.Confined | None = None
        self.starts = 0

    def run_group(self, ep: endpoint.server.Endpoint, tasks: Sequence[int]) -> list[Outcome]:
        env = self.environment
        episodes = [ep.open_episode() for _ in tasks]
        jobs = [{"base_url": ep.base_url(e), "task": int(t)} for e, t in zip(episodes, tasks)]
        spec = {"environment": env.environment, "model": ep.config.model, "jobs": jobs, "api_key_var": API_KEY_VAR,
                "args": env.args, "rollout_timeout": env.rollout_timeout}
        try:
            lines, failure = self._ask(spec, key=ep.config.key, n=len(jobs))
        finally:
            recordings = [ep.close_episode(e) for e in episodes]
        return [_outcome(int(t), lines.get(i), failure, rec) for i, (t, rec) in enumerate(zip(tasks, recordings))]

    def _ask(self, spec: dict[str, Any], *, key: bytes | None, n: int) -> tuple[dict[int, dict[str, Any]], str]:
        if self._proc is None or self._proc.poll() is not None:
            try:
                self._start(key)
            except OSError as exc:
                print(f"verifiers runner did not start: {exc}", file=sys.stderr)
                return {}, "env_error"
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(spec).encode() + b"\n")
            proc.stdin.flush()
        except OSError:
            self.close()
            return {}, "env_error"
        lines, failure = _read_answer(proc, n=n, timeout=self.environment.timeout)
        if failure:
            if failure == "env_error" and proc.poll() is not None:
                print(f"verifiers runner exited {proc.returncode}", file=sys.stderr)
            self.close()
        return lines, failure

    def _start(self, key: bytes | None) -> None:
        self._child = isolation.Confined([str(self.environment.python), str(RUNNER), "--serve"],
                                         settings=_settings(self.environment.paths, key), bounds=isolation.Bounds(),
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._proc = self._child.proc
        self.starts += 1

    def close(self) -> None:
        proc, self._proc = self._proc, None
        child, self._child = self._child, None
        if proc is None or child is None:
            return
        child.kill()            # its whole process group (the library's own children too), and its private home
        for f in (proc.stdin, proc.stdout):
            if f is not None:
                f.close()


def _read_answer(proc: subprocess.Popen[bytes], *, n: int, timeout: float) -> tuple[dict[int, dict[str, Any]], str]:
    """Read result lines up to ``{"end": true}`` within ``timeout`` seconds and ``MAX_OUTPUT`` bytes."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    buf = b""
    total = 0
    lines: dict[int, dict[str, Any]] = {}
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            while b"\n" in buf:
                raw, buf = buf.split(b"\n", 1)
                try:
                    obj = json.loads(raw)
                except ValueError:
                    return {}, "env_garbage"
                if not isinstance(obj, dict):
                    return {}, "env_garbage"
                if obj.get("end") is True:
                    return (lines, "") if len(lines) == n else ({}, "env_garbage")
                lines[len(lines)] = obj
            left = deadline - time.monotonic()
            if left <= 0:
                return {}, "env_timeout"
            if not sel.select(timeout=left):
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                return {}, "env_error"            # the runner exited mid-answer
            buf += chunk
            total += len(chunk)
            if total > MAX_OUTPUT:
                return {}, "env_garbage"
