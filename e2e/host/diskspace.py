"""Free disk before `make test`: fail at once, naming the folder and the figure, instead of an hour later.

Role: the first prerequisite of `make test` (Makefile `disk-space`). The suites write the cluster binaries and image
archives under ``~/.cache/kubeforge``, venvs beside the checkout, and clusters, run folders and compile caches under
the temporary folder; on a full disk they fail in ways that name other causes (a stop's CI run: 65 failures, 60
errors, from tqdm's and marshal's "No space left on device" deep inside unrelated tests).

Invariants: host Python only (stdlib; runs before any venv exists); the check reads the free space of each folder's
filesystem once (paths that do not exist yet are checked at their nearest existing parent), and a filesystem shared
by several folders is reported once.

Usage: ``python3 e2e/host/diskspace.py --need-gib N PATH [PATH ...]``; exit 0 when every filesystem has N GiB free,
1 with one line per short filesystem otherwise.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys

GIB = 1 << 30


def existing(path: pathlib.Path) -> pathlib.Path:
    """The path itself or its nearest existing parent (a cache folder a fresh machine has not made yet)."""
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def shortfalls(*, paths: list[pathlib.Path], need_bytes: int) -> list[str]:
    """One line per filesystem among ``paths`` with less than ``need_bytes`` free (each filesystem once)."""
    seen: set[int] = set()
    lines = []
    for path in paths:
        here = existing(path)
        device = os.stat(here).st_dev
        if device in seen:
            continue
        seen.add(device)
        free = shutil.disk_usage(here).free
        if free < need_bytes:
            lines.append(f"{path}: {free / GIB:.1f} GiB free on its filesystem, make test needs "
                         f"{need_bytes / GIB:.0f} GiB (set MIN_FREE_GIB to change the bound)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--need-gib", type=float, required=True)
    parser.add_argument("paths", nargs="+", type=pathlib.Path)
    args = parser.parse_args(argv)
    lines = shortfalls(paths=args.paths, need_bytes=int(args.need_gib * GIB))
    for line in lines:
        print(f"[disk] not enough free disk: {line}", file=sys.stderr)
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
