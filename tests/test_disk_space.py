"""`make test`'s free-disk check (e2e/host/diskspace.py): a short filesystem fails at once and says which and how
much; a filesystem shared by several folders is counted once; folders a fresh machine lacks are checked at their
parent. (A stop's CI run on a full disk: 65 failures and 60 errors, each naming something else.)"""

from __future__ import annotations

import importlib.util
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
_SPEC = importlib.util.spec_from_file_location("diskspace", ROOT / "e2e" / "host" / "diskspace.py")
assert _SPEC and _SPEC.loader
diskspace = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(diskspace)


def test_a_folder_not_made_yet_is_checked_at_its_parent(tmp_path: pathlib.Path) -> None:
    assert diskspace.existing(tmp_path / "no" / "such" / "cache") == tmp_path


def test_enough_free_passes_and_a_short_filesystem_is_named_once(tmp_path: pathlib.Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    assert diskspace.shortfalls(paths=[tmp_path], need_bytes=free // 2) == []
    lines = diskspace.shortfalls(paths=[tmp_path, tmp_path / "a", tmp_path / "b" / "c"], need_bytes=free * 4)
    assert len(lines) == 1 and str(tmp_path) in lines[0] and "GiB free" in lines[0]


@pytest.mark.parametrize("need, rc", [("0", 0), ("1e9", 1)])
def test_the_command_exits_by_the_bound(tmp_path: pathlib.Path, need: str, rc: int) -> None:
    run = subprocess.run([sys.executable, str(ROOT / "e2e" / "host" / "diskspace.py"), "--need-gib", need,
                          str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == rc, run.stderr
    assert ("not enough free disk" in run.stderr) == bool(rc)


def test_make_test_checks_the_disk_first() -> None:
    makefile = (ROOT / "Makefile").read_text()
    test_rule = next(line for line in makefile.splitlines() if line.startswith("test:"))
    assert test_rule.split(":", 1)[1].split()[0] == "disk-space"
