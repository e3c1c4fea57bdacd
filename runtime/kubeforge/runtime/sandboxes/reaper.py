"""What a sandbox pod leaves behind: nothing. The processes of ended runs are killed, escaped ones included.

A run is a session of its own (``verifiers.sandbox``); its time-out kills that session. Left over can be: a
background process of a run that exited normally (same session), or one that left its session (``setsid`` after a
double fork). The first is killed by its session's process group when its run ends; for the second, a dedicated
sandbox process (``kubeforge role sandbox``: every child of it is a run's) is the **child subreaper** of its
descendants, so an orphan is re-parented to it, not to PID 1, and :meth:`Reaper.sweep` kills every child whose
session is no live run's (repeating until none is left: killing a stray re-parents its own children to us).

```
 run starts ─ guard held ─ Popen ─ started(pid) ─ guard released      (a sweep never sees a run half-registered)
 run ends   ─ ended(pid): killpg(pid) ─ sweep()                         (dedicated: every non-live child killed)
```

Only ``dedicated`` sweeps other children: a server inside a test process must not kill the test's own children.
Linux only (``/proc``, ``prctl``).
"""
from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import signal
import threading
import time

PR_SET_CHILD_SUBREAPER = 36
SWEEP_ROUNDS = 20


class Reaper:
    def __init__(self, *, dedicated: bool) -> None:
        self.dedicated = dedicated
        self.guard = threading.Lock()        # held while a run's process starts and while sweeping
        # session ids (the runs' pids) of runs in flight, counted: a pid reused by a new run before the old run's
        # end is handled must not lose the new run its protection (nor have its group killed)
        self._live: collections.Counter[int] = collections.Counter()
        self.killed = 0                      # strays killed by sweeps, since the start
        if dedicated:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    def started(self, pid: int) -> None:
        """Called with ``guard`` held (``Sandbox.run``'s ``on_start``)."""
        self._live[pid] += 1

    def ended(self, pid: int | None) -> None:
        """A run's call returned: its session's group is killed, then (dedicated) every stray."""
        with self.guard:
            if pid is not None:
                self._live[pid] -= 1
                if self._live[pid] <= 0:
                    del self._live[pid]
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pid, signal.SIGKILL)
        self.sweep()

    def sweep(self) -> int:
        """Kill (and reap) every child of this process that belongs to no live run; how many. No-op unless
        ``dedicated``."""
        if not self.dedicated:
            return 0
        total = 0
        with self.guard:
            for _ in range(SWEEP_ROUNDS):
                strays = [(pid, state) for pid, sid, state in _children() if sid not in self._live]
                if not strays:
                    break
                for pid, state in strays:
                    if state != "Z":
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.kill(pid, signal.SIGKILL)
                        total += 1
                    _reap(pid)
        self.killed += total
        return total


def _children() -> list[tuple[int, int, str]]:
    """(pid, session id, state) of this process's children, from ``/proc/<pid>/stat``."""
    me, out = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()    # the name may hold spaces and parentheses
        if len(fields) > 3 and int(fields[1]) == me:
            out.append((int(name), int(fields[3]), fields[0]))
    return out


def _reap(pid: int) -> None:
    """Collect a killed child's exit, briefly (a SIGKILLed process exits within milliseconds)."""
    deadline = time.monotonic() + 1.0
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done or time.monotonic() > deadline:
            return
        time.sleep(0.005)
