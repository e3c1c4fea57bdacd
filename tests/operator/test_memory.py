"""The operator's allocator settings (``memory``): two malloc arenas however many threads run, unless the
environment chose; kopf's idle per-object workers let go of their last body quickly."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import kopf

from kubeforge.operator import handlers

PROBE = textwrap.dedent("""
    import sys, threading
    from kubeforge.operator import memory
    print(memory.limit_arenas())
    held = threading.Barrier(16)
    def work():
        blocks = [bytearray(200) for _ in range(20000)]   # small allocations: served from the thread's arena
        held.wait(timeout=30)      # all 16 alive at once: an exited thread's arena would be reused by the next one
        del blocks
    threads = [threading.Thread(target=work) for _ in range(16)]
    for t in threads: t.start()
    for t in threads: t.join()
    prev, heaps = None, 0
    for line in open("/proc/self/maps"):                 # a non-main arena is a 64 MiB mapping (part rw, part ---)
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if prev is not None and prev[1] == lo and hi - prev[0] == 64 << 20:
            heaps += 1
        prev = (lo, hi)
    print(heaps)
    print(memory.trim() in (True, False))
""")


def run_probe(env: dict[str, str]) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**base, **env}, capture_output=True, text=True,
                         timeout=60, check=True)
    return out.stdout.split()


def test_sixteen_threads_share_at_most_one_arena_beside_the_main_one() -> None:
    limited = run_probe({})
    assert limited[0] == "True" and int(limited[1]) <= 1 and limited[2] == "True"
    chosen = run_probe({"MALLOC_ARENA_MAX": "8"})        # the user's explicit choice is left alone
    assert chosen[0] == "False" and int(chosen[1]) > 1


def test_kopf_lets_an_idle_object_worker_go_within_a_second() -> None:
    settings = kopf.OperatorSettings()
    handlers.configure(settings)
    assert settings.queueing.idle_timeout == handlers.IDLE_WORKER_S <= 1.0
