"""Running untrusted Python (a completion's code and its tests) in a sandboxed subprocess.

Neighbours: ``code.CodeExecution`` calls ``Sandbox.run`` once per completion; ``_sandbox_child`` is the program
that confines itself and runs the code inside.

```
 Sandbox.run ─mkdtemp (private dir, owned by nobody when root)─▶ solution.py, tests.json
   └─ Popen [unshare --net --pid --ipc --uts --fork --kill-child (--user --map-root-user when not root)]
            python -I -S _sandbox_child.py CONFIG      own session; result on a pipe fd; env minimal
        child: setuid nobody (root) → rlimits CPU/AS/NPROC/FSIZE/NOFILE/CORE → Landlock → run
   wait(timeout + STARTUP_S) ─overrun─▶ SIGKILL the session (the pid namespace dies with its init)
   read the result (non-blocking, bounded) → rmtree the dir
```

Mechanisms are probed once per process (``mechanisms()``): ``namespaces`` (``unshare`` works here), ``landlock``
(ABI >= 1; >= 4 also denies TCP), ``drop-user`` (started as root), and ``rlimits`` always. Without namespaces a
completion still cannot write outside its dir or connect by TCP when Landlock is there; with neither, only rlimits,
the session kill and the minimal environment remain (logged once at start-up).

Invariants: nothing the code does can crash or stop the caller: every failure is a ``Result`` with ``passed == 0``
(``status`` says timeout / crashed / ok); a run never takes longer than ``timeout_s + STARTUP_S`` plus the kill.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from kubeforge.runtime import confine, isolation

CHILD = pathlib.Path(__file__).with_name("_sandbox_child.py")
NOBODY = 65534
STARTUP_S = 1.0          # interpreter start-up allowed on top of the completion's own time limit
RESULT_MAX_BYTES = 65536
ENV_PYTHON = "KUBEFORGE_SANDBOX_PYTHON"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Limits:
    timeout_s: float = 5.0
    memory_mib: int = 256
    max_processes: int = 8
    max_file_mib: int = 16


@dataclasses.dataclass(frozen=True, kw_only=True)
class Result:
    passed: int
    total: int
    status: str              # ok | timeout | crashed
    error: str | None
    seconds: float


def _unshare_prefix() -> list[str]:
    exe = shutil.which("unshare")
    if exe is None:
        return []
    prefix = [exe, "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child"]
    if os.geteuid() != 0:
        prefix[1:1] = ["--user", "--map-root-user"]
    try:
        ok = subprocess.run([*prefix, "true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return prefix if ok else []


def _world_readable(path: str) -> bool:
    """Every directory down to ``path`` can be traversed (and ``path`` read) by any user."""
    p = pathlib.Path(os.path.realpath(path))
    try:
        if not p.stat().st_mode & 0o004:
            return False
        return all(q.stat().st_mode & 0o001 for q in p.parents)
    except OSError:
        return False


def _interpreter(drop: bool) -> str:
    """The Python that runs the sandboxed code: ours, unless the unprivileged user cannot read its standard
    library (e.g. an interpreter under /root), then the system's; ``KUBEFORGE_SANDBOX_PYTHON`` overrides."""
    override = os.environ.get(ENV_PYTHON)
    if override:
        return override
    if not drop or (_world_readable(sys.executable) and _world_readable(os.path.dirname(os.__file__))):
        return sys.executable
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(cand) and _world_readable(cand):
            return cand
    return sys.executable


@functools.lru_cache(maxsize=1)
def probe() -> tuple[list[str], int, bool, str]:
    """(unshare prefix or [], Landlock ABI or 0, drop to nobody, interpreter) for this process, probed once."""
    drop = os.geteuid() == 0
    return _unshare_prefix(), confine.abi(), drop, _interpreter(drop)


def mechanisms() -> list[str]:
    prefix, abi, drop, _ = probe()
    out = ["rlimits", "session-kill"]
    if prefix:
        out.append("namespaces(net,pid,ipc,uts" + (",user" if "--user" in prefix else "") + ")")
    if abi:
        out.append(f"landlock(abi {abi}{', tcp' if abi >= 4 else ''})")
    if drop:
        out.append("drop-user(nobody)")
    return out


class Sandbox:
    def __init__(self, limits: Limits, *, root: str | None = None, concurrent: int = 1) -> None:
        self.limits = limits
        self.root = root
        self.concurrent = max(1, concurrent)   # runs at once: they share the unprivileged user's process count

    def run(self, source: str, tests: list[str], *, guard: contextlib.AbstractContextManager[object] | None = None,
            on_start: Callable[[int], None] | None = None) -> Result:
        """Run ``source`` against ``tests`` in a fresh confined process. ``guard`` is held while the process is
        started and ``on_start`` told its pid (its session's id): a sandbox pod's sweep (``sandboxes.server``) must
        not take a run that is starting for a stray."""
        prefix, abi, drop, python = probe()
        lim = self.limits
        started = time.monotonic()
        d = tempfile.mkdtemp(prefix="kf-sandbox-", dir=self.root)
        r, w = os.pipe()
        try:
            for name, text in (("solution.py", source), ("tests.json", json.dumps(tests))):
                pathlib.Path(d, name).write_text(text, encoding="utf-8")
            if drop:
                for p in (d, os.path.join(d, "solution.py"), os.path.join(d, "tests.json")):
                    os.chown(p, NOBODY, NOBODY)
            cfg = {"dir": d, "drop_user": drop, "cpu_s": int(math.ceil(lim.timeout_s)) + 1,
                   "memory_mib": lim.memory_mib, "nproc": self._nproc(drop), "file_mib": lim.max_file_mib,
                   "landlock": abi > 0, "result_fd": w, "confine": confine.__file__, "hide": isolation.hidden()}
            env = {"PATH": "/usr/bin:/bin", "HOME": d, "TMPDIR": d, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
            with guard or contextlib.nullcontext():
                proc = subprocess.Popen([*prefix, python, "-I", "-S", str(CHILD), json.dumps(cfg)],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, pass_fds=(w,), start_new_session=True, cwd=d,
                                        env=env)
                if on_start is not None:
                    on_start(proc.pid)
            os.close(w)
            w = -1
            status = "ok"
            try:
                proc.wait(timeout=lim.timeout_s + STARTUP_S)
            except subprocess.TimeoutExpired:
                status = "timeout"
                _kill(proc)
            raw = _read_available(r)
        finally:
            if w >= 0:
                os.close(w)
            os.close(r)
            shutil.rmtree(d, ignore_errors=True)
        seconds = time.monotonic() - started
        try:
            rep = json.loads(raw.decode("utf-8", "replace").splitlines()[0])
            passed, total, error = int(rep["passed"]), int(rep["total"]), rep.get("error")
        except (ValueError, KeyError, IndexError, TypeError):
            return Result(passed=0, total=len(tests), status=status if status != "ok" else "crashed",
                          error=f"no result (exit {proc.returncode})", seconds=seconds)
        if status == "timeout":
            passed = 0
        return Result(passed=passed, total=total, status=status, error=error, seconds=seconds)

    def _nproc(self, drop: bool) -> int:
        """RLIMIT_NPROC counts every process of the (real) user: nobody's when dropped, else ours plus the limit."""
        if drop:
            return self.limits.max_processes * self.concurrent + 1
        mine = 0
        for p in pathlib.Path("/proc").iterdir():
            try:
                if p.name.isdigit() and p.stat().st_uid == os.getuid():
                    mine += 1
            except OSError:
                continue
        return mine + self.limits.max_processes * self.concurrent + 1


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _read_available(fd: int) -> bytes:
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    size = 0
    while size < RESULT_MAX_BYTES:
        try:
            b = os.read(fd, 4096)
        except BlockingIOError:
            break
        if not b:
            break
        chunks.append(b)
        size += len(b)
    return b"".join(chunks)
