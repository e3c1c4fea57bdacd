"""learner/malloc.py: with the fixed mmap threshold, tensors freed in the middle of a glibc heap leave the RSS;
without it (glibc's dynamic threshold, raised by one freed 20 MB block) they stay resident."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = """
import sys, torch
from kubeforge.runtime.learner import malloc
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
on = malloc.return_freed_memory() if sys.argv[1] == "1" else False
big = torch.ones(20 << 20, dtype=torch.uint8)
del big                                             # glibc's dynamic threshold is now 20 MB
keep = [torch.ones(5 << 18, dtype=torch.float32) for _ in range(60)]     # 60 x 5 MB, interleaved
before = rss()
keep = keep[1::2]                                   # free every other one: 150 MB, none at the heap's top
print(on, before - rss())
"""


def _freed_mb(setting: bool) -> tuple[bool, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", SCRIPT, "1" if setting else "0"], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()
    return out[0] == "True", float(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_tensors_leave_the_rss_with_the_fixed_threshold_and_stay_without() -> None:
    on, freed = _freed_mb(True)
    if not on:
        pytest.skip("not glibc")
    assert freed >= 120                               # of 150 MB freed
    off, kept = _freed_mb(False)
    assert not off and kept < 30                      # glibc's default keeps them


def test_an_explicit_environment_setting_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubeforge.runtime.learner import malloc
    monkeypatch.setattr(malloc, "_done", [])
    monkeypatch.setenv(malloc.ENV, "1048576")
    assert malloc.return_freed_memory() is False
    assert malloc.return_freed_memory() is False      # decided once per process
