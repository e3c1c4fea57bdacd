"""Probe: what moving environment steps into the verifiers' servers costs per turn, on loopback.

Steps ``--episodes`` GuessNumber episodes (the tiny multi-turn example's environment) ``--rounds`` times through
``workers.SubprocessHost`` (the pool beside the caller: the baseline, what a generator ran before) and through
``remote_host.RemoteHost`` to an ``env_server.EnvServer`` over the same kind of pool, on a thread of this process
(CURVE over loopback TCP, as between pods). Prints the median and p90 seconds of one batched step call each way, and
their ratio, as JSON on the last line. Nothing is asserted.

    python bench/probes/env_remote_roundtrip.py [--episodes 256] [--rounds 30] [--workers 2]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time

from kubeforge.api import rljob
from kubeforge.runtime import rpc, transport, types
from kubeforge.runtime.agents.hosts import env_server, host, remote_host, workers


def timed_steps(h: host.EnvironmentHost, *, episodes: int, rounds: int) -> list[float]:
    out = []
    for r in range(rounds):
        ids = range(r * episodes, (r + 1) * episodes)
        h.reset([(i, types.Prompt(index=i, text="guess", answer="2")) for i in ids])
        t0 = time.perf_counter()
        replies = h.step([(i, "1") for i in ids])
        out.append(time.perf_counter() - t0)
        assert not any(x.failure for x in replies), replies[0]
        h.close(list(ids))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--episodes", type=int, default=256)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args()
    spec = rljob.EnvironmentSpec.model_validate({"type": "GuessNumber", "guessNumber": {"maxValue": 2},
                                                 "maxTurns": 2})
    local = workers.SubprocessHost(spec, workers=a.workers)
    try:
        timed_steps(local, episodes=a.episodes, rounds=2)                 # warm: the workers' imports
        base = timed_steps(local, episodes=a.episodes, rounds=a.rounds)
    finally:
        local.shutdown()
    keys = transport.CurveKeys.from_job_key(os.urandom(32))
    pool = workers.SubprocessHost(spec, workers=a.workers)
    server = env_server.EnvServer(rpc.bind("tcp://127.0.0.1:*", auth=keys), pool)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    bounds = host.Bounds(timeout_s=spec.turn_timeout_seconds, max_observation_bytes=spec.max_observation_bytes)
    remote = remote_host.RemoteHost(rpc.connect([server.address], auth=keys), bounds=bounds)
    try:
        timed_steps(remote, episodes=a.episodes, rounds=2)
        far = timed_steps(remote, episodes=a.episodes, rounds=a.rounds)
    finally:
        remote.shutdown()
        server.close()
        thread.join(timeout=60)

    def q(xs: list[float], f: float) -> float:
        return sorted(xs)[min(len(xs) - 1, int(f * len(xs)))]

    fig = {"episodes": a.episodes, "rounds": a.rounds, "workers": a.workers,
           "subprocess_step_s_p50": round(statistics.median(base), 5), "subprocess_step_s_p90": round(q(base, 0.9), 5),
           "remote_step_s_p50": round(statistics.median(far), 5), "remote_step_s_p90": round(q(far, 0.9), 5),
           "remote_over_subprocess_p50": round(statistics.median(far) / statistics.median(base), 3)}
    print(json.dumps(fig))


if __name__ == "__main__":
    main()
