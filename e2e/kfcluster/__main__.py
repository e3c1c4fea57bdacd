"""Command line for Make: ``python -m kfcluster up|down|add-nodes|status|rss``.

``up`` prints progress on stderr and ``export KUBECONFIG=<path>`` as the last line of stdout.
Configuration comes from the ``KF_*`` environment variables (docs/test-cluster.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from kfcluster import config as cfg
from kfcluster import lifecycle


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kfcluster")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("up", help="start the cluster (idempotent)")
    sub.add_parser("down", help="stop the cluster, leave nothing behind")
    sub.add_parser("status", help="print cluster.json")
    sub.add_parser("rss", help="print RSS (KiB) of the cluster processes as JSON")
    add = sub.add_parser("add-nodes", help="add simulated GPU nodes")
    add.add_argument("--count", type=int, default=1)
    add.add_argument("--gpus", type=int, default=8)
    add.add_argument("--prefix", default="kwok-extra")
    add.add_argument("--start", type=int, default=0)
    add.add_argument("--zones", default="zone-a,zone-b")
    args = p.parse_args(argv)
    try:
        config = cfg.from_env()
        if args.cmd == "up":
            cluster = lifecycle.up(lifecycle.with_real_node_settings(config))
            print(f"export KUBECONFIG={cluster.kubeconfig}")
        elif args.cmd == "down":
            lifecycle.down(config=config)
        elif args.cmd == "status":
            print(json.dumps(json.loads(open(f"{config.workdir}/cluster.json").read()), indent=2))
        elif args.cmd == "rss":
            print(json.dumps(lifecycle.cluster_rss_kib(lifecycle.Cluster.load(config.workdir)), indent=2))
        elif args.cmd == "add-nodes":
            pool = cfg.NodePool(count=args.count, gpus=args.gpus, prefix=args.prefix, start=args.start,
                                zones=tuple(z for z in args.zones.split(",") if z))
            lifecycle.add_nodes(lifecycle.Cluster.load(config.workdir), [pool])
    except (ValueError, FileNotFoundError, RuntimeError, TimeoutError, subprocess.CalledProcessError) as exc:
        print(f"kfcluster {args.cmd}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
