"""Run `make cluster-up && make cluster-down` N times (default 5) and check that nothing is left behind.

After every `cluster-down`: no live process names the cluster's work dir, and none of the ports recorded
in its cluster.json (etcd, etcd peer, apiserver, controller-manager, scheduler, kwok) is listening. Also
reports, informatively, listening ports that appeared on the machine during the run (other programs on a
shared machine may open ports too, so that set is not asserted). Prints one JSON summary line last and
exits 1 on any leak.

Usage: python3 e2e/scripts/check_cycles.py [N]     (uses KF_CLUSTER_NAME, default kf-cycle)
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "e2e"))

from kfcluster import config as cfg  # noqa: E402
from kfcluster import procs  # noqa: E402


def main() -> int:
    cycles = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    env = {**os.environ, "KF_CLUSTER_NAME": os.environ.get("KF_CLUSTER_NAME", "kf-cycle")}
    config = cfg.from_env(env)
    before = procs.listening_ports()
    leaks: list[str] = []
    up_times: list[float] = []
    for i in range(cycles):
        t0 = time.monotonic()
        out = subprocess.run(["make", "-s", "-C", str(ROOT), "cluster-up"], env=env, capture_output=True,
                             text=True, check=False)
        up_times.append(round(time.monotonic() - t0, 1))
        last = out.stdout.strip().splitlines()[-1:] or [""]
        if out.returncode != 0 or not last[0].startswith("export KUBECONFIG="):
            print(out.stderr[-3000:], file=sys.stderr)
            leaks.append(f"cycle {i}: cluster-up failed (rc {out.returncode}, last line {last[0]!r})")
            break
        ports = set(json.loads(pathlib.Path(config.workdir, "cluster.json").read_text())["ports"].values())
        subprocess.run(["make", "-s", "-C", str(ROOT), "cluster-down"], env=env, check=True,
                       capture_output=True)
        left = procs.processes_mentioning(config.workdir)
        still = ports & procs.listening_ports()
        if left:
            leaks.append(f"cycle {i}: processes left: {left}")
        if still:
            leaks.append(f"cycle {i}: ports still listening: {sorted(still)}")
        if os.path.exists(config.workdir):
            leaks.append(f"cycle {i}: work dir {config.workdir} still exists")
        print(f"cycle {i}: up {up_times[-1]}s, down clean={not (left or still)}", file=sys.stderr)
    new_ports = sorted(procs.listening_ports() - before)
    print(json.dumps({"cycles": cycles, "up_seconds": up_times, "leaks": leaks,
                      "new_listening_ports_on_machine": new_ports}))
    return 1 if leaks else 0


if __name__ == "__main__":
    sys.exit(main())
