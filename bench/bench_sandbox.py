"""Claim latency of the sandbox pool (``spec.sandbox``; docs/sandboxes.md) at N concurrent episodes.

Each of ``--concurrent`` threads is one episode at a time: claim a lease (timed), run one small program against
two tests (timed), release (timed); ``--episodes`` each. The pool is ``--pods`` sandbox processes started here
(``kubeforge role sandbox``, what a sandbox pod runs, on loopback, with enough slots for every episode at once),
or pods already running (``--urls`` and ``--key-hex``).

Baseline, same run, same program: the local sandbox (``verifiers.sandbox.Sandbox.run`` in this process: what an
episode pays without a pool), run ``--concurrent`` at once as well; the ratio says what a claim adds next to one
sandboxed run. JSON on the last line of stdout.

    python bench/bench_sandbox.py --concurrent 100
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any

from kubeforge.api import contract, sandboxenv
from kubeforge.runtime.launcher import ports
from kubeforge.runtime.sandboxes import client
from kubeforge.runtime.verifiers import sandbox

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402

PROGRAM = "def f(x):\n    return 2 * x\n"
TESTS = ["assert f(2) == 4", "assert f(3) == 6"]


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))] if s else float("nan")


def start_pool(pods: int, slots: int, key: bytes) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    procs, urls = [], []
    for i, base in enumerate(ports.allocate(pods, blocks=1)):
        env = {k: v for k, v in os.environ.items() if not k.startswith(contract.ENV_PREFIX)}
        env.update({k: str(v) for k, v in sandboxenv.render(
            index=i, job_name="bench", port_base=base, bind_host="127.0.0.1", key=key, slots=slots,
            max_run_seconds=30.0, idle_seconds=120.0).items()})
        procs.append(subprocess.Popen([sys.executable, "-m", "kubeforge.cli", "role", "sandbox"], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        urls.append(f"http://127.0.0.1:{base + contract.PORT_SANDBOX}")
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{base}/readyz", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or procs[-1].poll() is not None:
                raise SystemExit(f"sandbox process {i} did not become ready")
            time.sleep(0.2)
    return procs, urls


def episodes(pool: client.Pool, *, concurrent: int, per_thread: int) -> dict[str, Any]:
    claims: list[float] = []
    runs: list[float] = []
    releases: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(concurrent)
    limits = sandbox.Limits(timeout_s=10.0)

    def one() -> None:
        start.wait()
        for _ in range(per_thread):
            t0 = time.perf_counter()
            try:
                lease = pool.claim(seconds=120.0)
            except client.Unavailable as exc:
                with lock:
                    failures.append(str(exc))
                continue
            t1 = time.perf_counter()
            r = lease.run(PROGRAM, TESTS, limits)
            t2 = time.perf_counter()
            lease.release()
            t3 = time.perf_counter()
            with lock:
                claims.append(t1 - t0)
                runs.append(t2 - t1)
                releases.append(t3 - t2)
                if r.status != "ok" or r.passed != 2:
                    failures.append(f"{r.status}: {r.error}")

    t = time.perf_counter()
    with cf.ThreadPoolExecutor(max_workers=concurrent) as ex:
        for f in [ex.submit(one) for _ in range(concurrent)]:
            f.result()
    wall = time.perf_counter() - t
    return {"claims": claims, "runs": runs, "releases": releases, "failures": failures, "wall_s": wall}


def local_runs(*, concurrent: int, per_thread: int) -> list[float]:
    box = sandbox.Sandbox(sandbox.Limits(timeout_s=10.0), concurrent=concurrent)
    times: list[float] = []
    lock = threading.Lock()

    def one() -> None:
        for _ in range(per_thread):
            t0 = time.perf_counter()
            box.run(PROGRAM, TESTS)
            with lock:
                times.append(time.perf_counter() - t0)

    with cf.ThreadPoolExecutor(max_workers=concurrent) as ex:
        for f in [ex.submit(one) for _ in range(concurrent)]:
            f.result()
    return times


def ms(x: float) -> float:
    return round(1000 * x, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrent", type=int, default=100, help="episodes at once (threads)")
    ap.add_argument("--episodes", type=int, default=3, help="episodes per thread")
    ap.add_argument("--pods", type=int, default=4, help="sandbox processes to start (ignored with --urls)")
    ap.add_argument("--urls", nargs="*", default=None, help="running sandbox pods: http://host:port each")
    ap.add_argument("--key-hex", default=None, help="their sandbox key (with --urls)")
    args = ap.parse_args()
    load_before = common.load_average()
    procs: list[subprocess.Popen[bytes]] = []
    if args.urls:
        urls, key = list(args.urls), bytes.fromhex(args.key_hex or "")
        target = "running pods (--urls)"
    else:
        key = secrets.token_bytes(32)
        slots = math.ceil(args.concurrent / args.pods)
        procs, urls = start_pool(args.pods, slots, key)
        target = f"{args.pods} local sandbox processes (kubeforge role sandbox), {slots} slots each, loopback"
    try:
        pool = client.Pool(urls, key=key)
        got = episodes(pool, concurrent=args.concurrent, per_thread=args.episodes)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    local = local_runs(concurrent=args.concurrent, per_thread=1)
    claims = got["claims"]
    out = {
        "bench": "sandbox", "against": target, "concurrent": args.concurrent, "episodes": len(claims),
        "failures": len(got["failures"]), "first_failure": (got["failures"] or [None])[0],
        "claim_p50_ms": ms(pct(claims, 0.5)), "claim_p99_ms": ms(pct(claims, 0.99)),
        "claim_max_ms": ms(max(claims, default=float("nan"))),
        "run_p50_ms": ms(pct(got["runs"], 0.5)), "run_p99_ms": ms(pct(got["runs"], 0.99)),
        "release_p50_ms": ms(pct(got["releases"], 0.5)), "release_p99_ms": ms(pct(got["releases"], 0.99)),
        "episodes_per_s": round(len(claims) / got["wall_s"], 2),
        "baseline_local_run_p50_ms": ms(pct(local, 0.5)), "baseline_local_run_p99_ms": ms(pct(local, 0.99)),
        "claim_p50_over_local_run_p50": round(pct(claims, 0.5) / pct(local, 0.5), 4),
        "load_average_before": load_before, "load_average_after": common.load_average(),
        "machine": common.machine(),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
