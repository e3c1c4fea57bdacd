"""The sender's streaming path: metadata first, then tensors produced (gathered) one bucket at a time."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import _trainer_util as util
from kubeforge.runtime import weightsync
from kubeforge.runtime.learner import sharding, step


class LoggedStream:
    """A lazy stream that logs when each tensor is produced."""

    def __init__(self, tensors: list[tuple[str, torch.Tensor]], log: list[str]) -> None:
        self.tensors, self.log = tensors, log
        self.meta = [sharding.Entry(name=n, shape=tuple(t.shape), dtype=t.dtype) for n, t in tensors]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for n, t in self.tensors:
            self.log.append(f"make {n}")
            yield n, t


def _receive(port: int, got: list[dict[str, torch.Tensor]], errors: list[BaseException]) -> threading.Thread:
    def run() -> None:
        try:
            r = weightsync.WeightReceiver(host="127.0.0.1", port=port, world_size=2, rank=1, timeout=20)
            box: dict[str, torch.Tensor] = {}

            def load(it: Iterator[tuple[str, torch.Tensor]]) -> None:
                for n, t in it:
                    box[n] = t.clone()
            try:
                r.receive(load)
            finally:
                r.close()
            got.append(box)
        except BaseException as e:  # surfaced by the test
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _sender(port: int, log: list[str], bucket_mb: float) -> weightsync.WeightSender:
    sender = weightsync.WeightSender(host="127.0.0.1", port=port, world_size=2, timeout=20, bucket_mb=bucket_mb)
    sender.connect()
    group = sender.group
    assert group is not None
    plain = group.broadcast

    def logged(t: torch.Tensor) -> None:
        log.append(f"send {t.numel()}")
        plain(t)
    group.broadcast = logged  # type: ignore[method-assign]
    return sender


def test_a_stream_is_produced_bucket_by_bucket() -> None:
    g = torch.Generator().manual_seed(0)
    tensors = [(f"t{i}", torch.randn(100, 100, generator=g)) for i in range(6)]     # 40 KB each
    port, log, got, errors = util.free_port(), [], [], []
    thread = _receive(port, got, errors)
    sender = _sender(port, log, bucket_mb=0.08)                                       # 2 tensors per bucket
    stats = sender.send(LoggedStream(tensors, log), version=3)
    thread.join(timeout=30)
    sender.close()
    assert not errors and stats.buckets == 3 and stats.tensors == 6
    assert all(torch.equal(got[0][n], t) for n, t in tensors)
    sends = [e for e in log if e.startswith("send")]
    assert len(sends) == 2 + 3                      # header, metadata, three buckets
    body = log[log.index(sends[1]) + 1:]            # after the metadata went out, production interleaves
    assert body == ["make t0", "make t1", sends[2], "make t2", "make t3", sends[3], "make t4", "make t5", sends[4]]


def test_a_stream_that_contradicts_its_metadata_is_refused() -> None:
    bad = LoggedStream([("a", torch.zeros(3))], [])
    bad.meta = [sharding.Entry(name="a", shape=(4,), dtype=torch.float32)]
    port, got, errors = util.free_port(), [], []
    thread = _receive(port, got, errors)
    sender = _sender(port, [], bucket_mb=1)
    with pytest.raises(weightsync.WeightSyncError, match="metadata said"):
        sender.send(bad, version=1)
    sender.close()
    thread.join(timeout=30)


def test_trainer_stream_sends_hf_names_in_the_compute_dtype(tmp_path: Path) -> None:
    tiny = util.build_tiny(tmp_path / "m")
    t = step.Trainer(model_path=tiny, algorithm=util.algorithm(), dtype="bfloat16")
    port, log, got, errors = util.free_port(), [], [], []
    thread = _receive(port, got, errors)
    sender = _sender(port, log, bucket_mb=0.05)
    stats = sender.send(t.named_tensors(), version=1)
    thread.join(timeout=30)
    sender.close()
    assert not errors
    want = {n: p.detach().to(torch.bfloat16) for n, p in t.model.named_parameters()}
    assert got[0].keys() == want.keys() and "lm_head.weight" not in want          # tied head sent once
    assert all(torch.equal(got[0][n], w) for n, w in want.items())
    assert stats.bytes == sum(w.numel() * 2 for w in want.values())


def _receiver_thread(port: int, syncs: int, got: list[dict[str, torch.Tensor]], errors: list[BaseException],
                     allocations: list[int]) -> threading.Thread:
    def run() -> None:
        try:
            r = weightsync.WeightReceiver(host="127.0.0.1", port=port, world_size=2, rank=1, timeout=20)
            try:
                for _ in range(syncs):
                    box: dict[str, torch.Tensor] = {}

                    def load(it: Iterator[tuple[str, torch.Tensor]]) -> None:
                        for n, t in it:
                            box[n] = t.clone()
                    r.receive(load)
                    got.append(box)
                    allocations.append(r.buffers.allocations)
            finally:
                r.close()
        except BaseException as e:  # surfaced by the test
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_overlapped_syncs_snapshot_at_start_reuse_buffers_and_arrive_in_order() -> None:
    """``start`` returns once the tensors are packed: changing them afterwards (the next training step) does not
    change what is broadcast; syncs arrive in version order; both ends allocate their buffers once per layout."""
    g = torch.Generator().manual_seed(0)
    params = [(f"p{i}", torch.randn(64, 64, generator=g)) for i in range(5)]
    extra = ("q", torch.randn(10, generator=g))
    port, got, errors, allocations = util.free_port(), [], [], []
    thread = _receiver_thread(port, 4, got, errors, allocations)
    sender = weightsync.WeightSender(host="127.0.0.1", port=port, world_size=2, timeout=20, bucket_mb=0.04)
    sent: list[dict[str, torch.Tensor]] = []
    stats = []
    for v in (1, 2, 3):
        sent.append({n: t.clone() for n, t in params})
        flight = sender.start(params, version=v)
        for _, t in params:          # the next step changes the weights while the broadcast may still run
            t.add_(1.0)
        stats.append(flight.result(timeout=30))
    layouts_before = sender.buffers.allocations
    sent.append({n: t.clone() for n, t in params + [extra]})
    stats.append(sender.start(params + [extra], version=4).result(timeout=30))   # another layout
    thread.join(timeout=30)
    sender.close()
    assert not errors, errors
    assert [s.version for s in stats] == [1, 2, 3, 4] and all(s.buckets >= 3 for s in stats)
    for want, have in zip(sent, got):
        assert want.keys() == have.keys() and all(torch.equal(want[n], have[n]) for n in want)
    assert layouts_before == 1 and sender.buffers.allocations == 2
    assert allocations == [1, 1, 1, 2]


def test_a_failed_background_broadcast_raises_on_result() -> None:
    def boom() -> weightsync.SyncStats:
        raise RuntimeError("peer gone")

    with pytest.raises(weightsync.WeightSyncError, match="v7 failed: peer gone"):
        weightsync.InFlight(boom, version=7).result(timeout=10)
    ok = weightsync.SyncStats(version=8, bytes=1, seconds=0.1, tensors=1, buckets=1)
    assert weightsync.InFlight(lambda: ok, version=8).result(timeout=10) is ok
