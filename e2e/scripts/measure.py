"""Measure the test cluster: cold build seconds per component (from the build log the build script
keeps), warm `make cluster-up` / `make cluster-down` seconds, RSS of the cluster processes, cache sizes.
Prints one JSON object last. Usage: python3 e2e/scripts/measure.py   (uses KF_CLUSTER_NAME, default kf-measure)
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

from kfcluster import binaries, lifecycle  # noqa: E402
from kfcluster import config as cfg  # noqa: E402


def du_mib(path: str) -> float | None:
    if not os.path.exists(path):
        return None
    out = subprocess.run(["du", "-sk", path], capture_output=True, text=True, check=False).stdout.split()
    return round(int(out[0]) / 1024, 1) if out else None


def go_env(key: str) -> str:
    try:
        return subprocess.run(["go", "env", key], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def main() -> int:
    env = {**os.environ, "KF_CLUSTER_NAME": os.environ.get("KF_CLUSTER_NAME", "kf-measure")}
    config = cfg.from_env(env)
    builds: dict[str, int] = {}
    log = binaries.cache_dir() / "build-times.log"
    if log.is_file():
        for line in log.read_text().splitlines():
            name, _, seconds = line.split()
            builds[name] = int(seconds)  # last build of each component wins
    t0 = time.monotonic()
    subprocess.run(["make", "-s", "-C", str(ROOT), "cluster-up"], env=env, check=True, capture_output=True)
    up_s = round(time.monotonic() - t0, 1)
    rss = lifecycle.cluster_rss_kib(lifecycle.Cluster.load(config.workdir))
    t0 = time.monotonic()
    subprocess.run(["make", "-s", "-C", str(ROOT), "cluster-down"], env=env, check=True, capture_output=True)
    down_s = round(time.monotonic() - t0, 1)
    result = {
        "cold_build_seconds": builds,
        "warm_cluster_up_seconds": up_s,
        "cluster_down_seconds": down_s,
        "rss_mib": {k: round(v / 1024, 1) for k, v in rss.items()},
        "disk_mib": {
            "bin": du_mib(str(binaries.bin_dir())),
            "go_mod_cache": du_mib(go_env("GOMODCACHE")),
            "go_build_cache": du_mib(go_env("GOCACHE")),
        },
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
