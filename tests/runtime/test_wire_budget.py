"""Decoding memory is bounded by the frame: hostile msgpack payloads are priced from their headers and refused
before msgpack builds their objects (``runtime/kubeforge/runtime/wire/budget.py``).

The memory test runs each 64 MiB hostile frame in a fresh interpreter and measures the peak RSS growth while
``wire.decode`` runs (the frame is built in place first, so building it adds nothing to the peak that follows)."""
from __future__ import annotations

import json
import pathlib
import struct
import subprocess
import sys

import msgpack
import pytest

from kubeforge.runtime import types, wire
from kubeforge.runtime.wire import budget as wire_budget

_PROBE = r"""
import json, resource, struct, sys, time
from kubeforge.runtime import wire
N, case = int(sys.argv[1]), sys.argv[2]
head = wire.HEADER.pack(wire.MAGIC, wire.SCHEMA_VERSION, int(wire.Kind.WORK if case not in ("floats", "lying-array")
                                                             else wire.Kind.SCORED))
unit = {"empty-maps": b"\x80", "nested-arrays": b"\x91", "tiny-strings": b"\xa2ab", "floats": b"\xcb" + b"\x3f" * 8,
        "uint16s": b"\xcd\x01\x00", "empty-arrays": b"\x90", "lying-array": b""}[case]
if case == "lying-array":   # a SCORED group whose header claims 64 completions of 2^20 tokens; it carries zeros
    frame = bytearray(N)
    struct.pack_into("<4sHBB4Q8I", frame, 0, wire.MAGIC, wire.SCHEMA_VERSION, int(wire.Kind.SCORED), 0, 0, 0, 0, 0,
                     64, 0, 64 << 20, 0, 1, 0, 0, 0)
else:
    prefix = b"" if case == "nested-arrays" else b"\x81\xa7prompts\xdd"
    count = (N - len(head) - len(prefix) - 4) // len(unit)
    frame = bytearray(len(head) + len(prefix) + (0 if case == "nested-arrays" else 4) + count * len(unit))
    frame[:len(head)] = head
    pos = len(head) + len(prefix)
    frame[len(head):pos] = prefix
    if case != "nested-arrays":
        frame[pos:pos + 4] = struct.pack(">I", count); pos += 4
    step = len(unit) * 65536
    chunk = unit * 65536
    for off in range(pos, len(frame), step):
        frame[off:off + step] = chunk[:len(frame) - off]
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
t = time.perf_counter()
try:
    wire.decode(frame); outcome = "accepted"
except wire.WireError as e:
    outcome = str(e)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
print(json.dumps({"frame": len(frame), "growth": peak, "seconds": time.perf_counter() - t, "outcome": outcome}))
"""

HOSTILE = ("empty-maps", "empty-arrays", "nested-arrays", "tiny-strings", "floats", "uint16s", "lying-array")


@pytest.mark.slow
@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_64_mib_frame_peaks_below_4x_its_size(case: str) -> None:
    run = subprocess.run([sys.executable, "-c", _PROBE, str(wire.MAX_FRAME_BYTES), case], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    print(case, got)
    assert got["outcome"].startswith("malformed:"), got
    assert got["growth"] < 4 * got["frame"], got
    if case == "lying-array":   # refused by the length check before anything is made
        assert "its header says" in got["outcome"] and got["growth"] < 0.1 * got["frame"], got


def _frame(kind: wire.Kind, body: bytes) -> bytes:
    return wire.HEADER.pack(wire.MAGIC, wire.SCHEMA_VERSION, int(kind)) + body


@pytest.mark.parametrize("body,why", [
    (b"\xdd" + struct.pack(">I", 1 << 20) + b"\x80" * (1 << 20), "would allocate"),
    (b"\x91" * (1 << 19), "nesting deeper"),
    (b"\xdd" + struct.pack(">I", 1 << 30) + b"\x00" * (1 << 19), "container of"),
    (b"\xc0" + b"\x00" * (1 << 19), "trailing"),
    (b"\xdd" + struct.pack(">I", 2) + b"\xd4\x01\x00" + b"\xa0" * (1 << 19), "ext or reserved"),
])
def test_hostile_payloads_are_refused_by_the_budget(body: bytes, why: str) -> None:
    with pytest.raises(wire.WireError, match=why) as info:
        wire.decode(_frame(wire.Kind.WORK, body))
    assert info.value.reason == wire.REASON_MALFORMED


def test_the_estimate_covers_what_msgpack_allocates() -> None:
    """The walk's price is an upper bound of the real allocation (tracemalloc) for typical payloads."""
    import tracemalloc

    payloads = [
        {"prompts": [{"index": i, "text": f"{i}+{i}=", "answer": str(2 * i)} for i in range(20000)]},
        {"xs": [float(i) for i in range(50000)], "ys": [{} for _ in range(20000)], "zs": [[] for _ in range(20000)]},
    ]
    for doc in payloads:
        raw = msgpack.packb(doc)
        estimate = wire_budget.check(raw, ratio=1000, slack=0)
        tracemalloc.start()
        obj = msgpack.unpackb(raw)
        used, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        del obj
        assert estimate >= 0.8 * used, (estimate, used)


def test_legitimate_large_frames_still_decode() -> None:
    comp = types.Completion(token_ids=list(range(200_000)), logprobs=[-0.5] * 200_000, text="x" * 100_000,
                            finish_reason="length")
    g = types.RolloutGroup(prompt=types.Prompt(index=0, text="p", answer="a"), prompt_token_ids=[1, 2],
                           completions=[comp] * 8, policy_version=0, rewards=[1.0] * 8,
                           scores={f"v{i}": [0.5] * 8 for i in range(64)})
    frame = wire.encode(wire.Scored(group=g))
    assert len(frame) > wire_budget.WALK_ABOVE
    assert wire.decode(frame) == wire.Scored(group=g)
    work = wire.Work(step=1, policy_version=0, prompts=tuple(types.Prompt(index=i, text="12+34=", answer="46")
                                                             for i in range(wire.MAX_PROMPTS)))
    assert wire.decode(wire.encode(work)) == work


def test_a_valid_60_mib_rollout_decodes_to_about_its_size() -> None:
    """Token ids and logprobs stay packed: decoding a maximal valid ROLLOUT (5 completions of 2^20 tokens, ~60 MiB)
    allocates about the frame's size (the payload's bytes, once), not one Python object per token (6.8x before the
    arrays were packed). The measurement is bench/bench_transport.py's own (tracemalloc peak around decode)."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
    import bench_transport

    got = bench_transport.decode_memory()
    assert got["frame_bytes"] > 60 << 20
    assert got["peak_over_frame"] < 1.25, got
