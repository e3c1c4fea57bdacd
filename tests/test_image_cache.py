"""The image cache keeps the most recently used archives of each image (images/lib/prune.sh, called by
images/build.sh each time it hands an archive out): every source change made a new ~1.1 GB runtime archive and
nothing removed the old ones (8.2 GB after one day of work)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import time

import pytest

PRUNE = pathlib.Path(__file__).resolve().parents[1] / "images" / "lib" / "prune.sh"


def prune(directory: pathlib.Path, name: str, keep: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", f'set -euo pipefail; source "{PRUNE}"; kf_prune_archives "$@"', "prune",
                           str(directory), name, keep], capture_output=True, text=True, timeout=30)


def archive(directory: pathlib.Path, name: str, age_s: int) -> pathlib.Path:
    path = directory / name
    path.write_bytes(b"x")
    t = time.time() - 10_000 - age_s
    os.utime(path, (t, t))
    return path


def test_keeps_the_newest_archives_of_one_name_and_nothing_else_is_touched(tmp_path: pathlib.Path) -> None:
    runtime = [archive(tmp_path, f"runtime-{i:016x}.tar", age_s=100 * i) for i in range(5)]   # 0 is the newest
    others = [archive(tmp_path, "operator-00000000000000aa.tar", age_s=1000),
              archive(tmp_path, "runtime-gpu-00000000000000bb.tar", age_s=1000),    # another image's name
              archive(tmp_path, "runtime-00000000000000cc.tar.new", age_s=1000),    # a build in progress
              archive(tmp_path, "runtime-latest.tar", age_s=1000)]                   # not a cache entry
    r = prune(tmp_path, "runtime", "3")
    assert r.returncode == 0, r.stderr
    assert [p.exists() for p in runtime] == [True, True, True, False, False]
    assert all(p.exists() for p in others)


def test_a_reused_archive_counts_as_recent(tmp_path: pathlib.Path) -> None:
    old = archive(tmp_path, "operator-00000000000000a1.tar", age_s=900)
    newer = [archive(tmp_path, f"operator-00000000000000b{i}.tar", age_s=100 * i) for i in range(1, 3)]
    os.utime(old)                    # what build.sh's `touch` does when it hands the archive out again
    assert prune(tmp_path, "operator", "2").returncode == 0
    assert old.exists() and newer[0].exists() and not newer[1].exists()


@pytest.mark.parametrize("keep", ["0", "-1", "two", ""])
def test_refuses_a_keep_below_one(tmp_path: pathlib.Path, keep: str) -> None:
    kept = archive(tmp_path, "operator-00000000000000a1.tar", age_s=0)
    r = prune(tmp_path, "operator", keep)
    assert r.returncode == 2 and "KEEP must be >= 1" in r.stderr
    assert kept.exists()


def test_build_sh_prunes_every_archive_it_hands_out() -> None:
    text = (PRUNE.parent.parent / "build.sh").read_text()
    assert 'source "$here/lib/prune.sh"' in text
    assert text.count('handed_out "$name" "$out"') == 2 and text.count('handed_out rootfs "$out"') == 1


def test_the_wheels_hash_is_the_same_from_any_checkout(tmp_path: pathlib.Path) -> None:
    """The runtime's cache key covers the wheels dir beside the checkout (``../shared/wheels``), outside the repo
    root whose prefix kf_hash strips: hashed by absolute path, every clone in another folder missed the cache and
    rebuilt the 1.1 GB runtime image (two fresh clones, two rebuilds in one session). build.sh hashes it by
    relative names now."""
    lib = PRUNE.parent / "buildah.sh"
    homes = []
    for where in ("a", "b"):
        wheels = tmp_path / where / "shared" / "wheels"
        wheels.mkdir(parents=True)
        (wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"wheel bytes")
        homes.append(wheels)

    def kf_hash(wheels: pathlib.Path, how: str) -> str:
        script = f'KF_REPO_ROOT={tmp_path / "repo"}; source "{lib}"; {how}'
        r = subprocess.run(["bash", "-c", script, "h", str(wheels)], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    relative = [kf_hash(w, 'cd "$1" && kf_hash .') for w in homes]
    absolute = [kf_hash(w, 'kf_hash "$1"') for w in homes]
    assert relative[0] == relative[1] and absolute[0] != absolute[1]
    (homes[1] / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"other bytes")
    assert kf_hash(homes[1], 'cd "$1" && kf_hash .') != relative[0]      # content still counts
    build = (PRUNE.parent.parent / "build.sh").read_text()
    assert 'wheel_hash="$(cd "$WHEELS" && kf_hash .)"' in build
