"""A trainer pod with several ranks (one per GPU): the pod's process starts them and stands for them.

Role: ``role.run`` calls :func:`supervise` instead of the trainer loop when ``RoleConfig.supervises``
(``spec.roles.trainer`` has more than one rank per pod and this process is not a rank yet). It starts the pod's N
ranks as child processes of the same command (``kubeforge role trainer``) with ``KUBEFORGE_LOCAL_RANK`` = 0..N-1
added to the same env; ``config.from_env`` turns that into the global rank ``pod*N + l`` and the port block
``base + l*PORTS_PER_PROCESS`` (rank 0 of the pod serves the pod's metrics and probes on the pod's own ports).
With CUDA, local rank ``l`` uses ``cuda:l`` (``trainer.start``).

Invariants:
- The pod lives and dies with its ranks: the first rank to exit non-zero makes the supervisor stop the others
  (SIGTERM, then SIGKILL after ``grace_s``) and exit with that rank's status, so the failure policy sees the
  rank's exit code; all ranks exiting 0 exit 0. SIGTERM/SIGINT to the supervisor are passed to every rank.
- No wait is unbounded: after a stop request, ranks get ``grace_s`` before SIGKILL.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from kubeforge.api import contract


def rank_env(environ: Mapping[str, str], local_rank: int) -> dict[str, str]:
    """The env of local rank ``local_rank``: the pod's env plus ``KUBEFORGE_LOCAL_RANK``."""
    return {**environ, contract.ENV_LOCAL_RANK: str(local_rank)}


def supervise(*, ranks: int, environ: Mapping[str, str], name: str, grace_s: float = 30.0,
              argv: Sequence[str] | None = None, poll_s: float = 0.2) -> int:
    """Run ``ranks`` local ranks of this trainer pod to completion; the pod's exit status (see module doc)."""
    cmd = list(argv) if argv is not None else [sys.executable, "-m", "kubeforge.cli", "role", "trainer"]
    procs = [subprocess.Popen(cmd, env=rank_env(environ, r)) for r in range(ranks)]
    print(f"{name}: pod supervisor pid {os.getpid()}: ranks {[p.pid for p in procs]}", flush=True)
    stopping: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        stopping.append(signum)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        failed: int | None = None
        stop_at: float | None = None
        while None in [p.poll() for p in procs]:      # a list: poll every rank (any() would stop at the first)
            bad = next((p.returncode for p in procs if p.returncode not in (None, 0)), None)
            if bad is not None and failed is None:
                failed = bad
                print(f"{name}: a rank exited with {bad}: stopping the others", flush=True)
                for p in procs:
                    if p.poll() is None:
                        p.terminate()
            if (failed is not None or stopping) and stop_at is None:
                stop_at = time.monotonic() + grace_s
            if stop_at is not None and time.monotonic() > stop_at:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            time.sleep(poll_s)
        codes = [p.returncode for p in procs]
        if failed is None:
            failed = next((c for c in codes if c != 0), None)
        status = 0 if failed is None else (128 - failed if failed < 0 else failed)
        print(f"{name}: ranks exited {codes}: pod exits {status}", flush=True)
        return status
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
