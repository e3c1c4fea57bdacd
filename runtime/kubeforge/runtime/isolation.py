"""Starting a process that runs environment or tool code: it sees no secret of the pod (docs/security.md).

Neighbours: ``agents.hosts.workers`` (environment workers) and ``agents.primeintellect.adapter`` (the Verifiers
runner) start their children with ``start``; ``confine`` is the program the child runs first (Landlock, rlimits,
then ``exec``). The code sandbox (``verifiers.sandbox``) keeps its own, stricter launcher and shares ``confine``'s
Landlock code.

```
 start(argv, settings) ─ env: ALLOWED names of ours + settings, HOME=TMPDIR=a private temp folder (nothing else)
   └─ Popen python -I -S confine.py CONFIG argv ... own session (process group), no fds but stdio
        confine: RLIMIT_AS / NOFILE / CORE=0 (CPU when asked) → Landlock: no reads beneath the hidden folders
                 (the service-account token; KUBEFORGE_HIDE_PATHS adds more) nor of other processes' /proc
        └─ execv argv (the worker / runner)
```

What holds where is probed once per process (``status``) and said once in the log; without Landlock (an old kernel,
or it is left out of the LSM list) the child still gets the minimal environment, its session and rlimits, and this
process makes itself non-dumpable so its own ``/proc/<pid>/environ`` is closed to same-uid children -- but the
token file and PID 1's environment stay readable, and ``status().full`` is False (never claimed).

Invariants: the environment is an allow-list (``ALLOWED``), never the parent's environment minus a list; the
caller's ``settings`` are the only other names, and must not be a secret of the job (an endpoint's derived key
is fine: it opens that endpoint only).
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import IO, Any

from kubeforge.runtime import confine

ALLOWED = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
HIDDEN = ("/var/run/secrets", "/run/secrets")     # the service-account token (and any other mounted Secret there)
HIDE_ENV = "KUBEFORGE_HIDE_PATHS"                 # more folders to hide, os.pathsep-separated
PR_SET_DUMPABLE = 4
NOFILE = 4096


@dataclasses.dataclass(frozen=True, kw_only=True)
class Bounds:
    memory_mib: int = 0      # RLIMIT_AS (0: none)
    cpu_s: int = 0           # RLIMIT_CPU, the child's whole life (0: none; a long-lived worker is bounded per call)
    nofile: int = NOFILE


@dataclasses.dataclass(frozen=True)
class Status:
    landlock_abi: int
    full: bool
    detail: str


@functools.lru_cache(maxsize=1)
def status() -> Status:
    """What isolation holds in this process's children, probed once and said once on stderr."""
    abi = confine.abi()
    if abi > 0:
        st = Status(abi, True, f"full (Landlock ABI {abi}: the hidden folders and other processes' /proc unreadable"
                               f"{', signals scoped' if abi >= 6 else ''}; minimal environment; own session; rlimits)")
    else:
        _not_dumpable()
        st = Status(0, False, "PARTIAL: no Landlock in this kernel: minimal environment, own session, rlimits and "
                              "this process non-dumpable; the service-account token and PID 1's environment stay "
                              "readable to environment code")
    print(f"environment isolation: {st.detail}", file=sys.stderr, flush=True)
    return st


def _not_dumpable() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def hidden() -> list[str]:
    extra = [p for p in os.environ.get(HIDE_ENV, "").split(os.pathsep) if p]
    return [*HIDDEN, *extra]


def environment(settings: Mapping[str, str], *, home: str) -> dict[str, str]:
    """The child's whole environment: ``ALLOWED`` names this process has, ``HOME``/``TMPDIR``, ``settings``."""
    env = {k: os.environ[k] for k in ALLOWED if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(HOME=home, TMPDIR=home, PYTHONNOUSERSITE="1")
    env.update(settings)
    return env


class Confined:
    """A started child: ``proc`` (its pid leads its own process group), its private home removed by ``kill``."""

    def __init__(self, argv: Sequence[str], *, settings: Mapping[str, str], bounds: Bounds,
                 stdin: int | IO[Any] | None = None, stdout: int | IO[Any] | None = None,
                 stderr: int | IO[Any] | None = None) -> None:
        st = status()
        self.home = tempfile.mkdtemp(prefix="kf-env-home-")
        cfg = {"memory_mib": bounds.memory_mib, "cpu_s": bounds.cpu_s, "nofile": bounds.nofile,
               "landlock": st.landlock_abi > 0, "hide": hidden()}
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", confine.__file__, json.dumps(cfg), *argv], stdin=stdin, stdout=stdout,
                stderr=stderr, env=environment(settings, home=self.home), start_new_session=True)
        except BaseException:
            shutil.rmtree(self.home, ignore_errors=True)
            raise

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        shutil.rmtree(self.home, ignore_errors=True)


def run(argv: Sequence[str], *, settings: Mapping[str, str], input: str, timeout: float,
        bounds: Bounds = Bounds()) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, input=..., capture_output=True, text=True, timeout=...)`` in a ``Confined`` child;
    past ``timeout`` its whole process group is killed and ``subprocess.TimeoutExpired`` raised."""
    child = Confined(argv, settings=settings, bounds=bounds, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE)
    try:
        out, err = child.proc.communicate(input.encode(), timeout=timeout)
    finally:
        child.kill()
    return subprocess.CompletedProcess(list(argv), child.proc.returncode, out.decode("utf-8", "replace"),
                                       err.decode("utf-8", "replace"))
