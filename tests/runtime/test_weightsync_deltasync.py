"""Delta syncs end to end over a real gloo group: after every sync of real AdamW steps, every receiver's tensors hash
equal to the trainer's (both receive paths: ``receive`` and the prefetch's ``take``/``load_staged``); a receiver that
missed a version, and a group re-formed with a new member, get the full copy; a delta never costs more than the full
copy."""
from __future__ import annotations

import contextlib
import hashlib
import queue
import socket
import threading
from collections.abc import Callable, Iterator

from pathlib import Path

import pytest
import torch

import _trainer_util as util
from kubeforge.runtime import weightsync
from kubeforge.runtime.learner import step

Hashes = dict[str, str]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


class Peer:
    """A receiver in its own thread, driven by commands: ``sync`` receives one sync and reports the hash of every
    tensor it was handed (``prefetch``: through the background receive, as a generator does)."""

    def __init__(self, *, port: int, world: int, rank: int, prefetch: bool, epoch: int = 0) -> None:
        self.commands: queue.Queue[Callable[[weightsync.WeightReceiver], object] | None] = queue.Queue()
        self.results: queue.Queue[object] = queue.Queue()
        self.prefetch = prefetch
        self.thread = threading.Thread(target=self._run, args=(port, world, rank, epoch), daemon=True)
        self.thread.start()

    def _run(self, port: int, world: int, rank: int, epoch: int) -> None:
        try:
            r = weightsync.WeightReceiver(host="127.0.0.1", port=port, world_size=world, rank=rank, timeout=30,
                                          join_timeout=60, epoch=epoch)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            self.results.put(e)
            return
        if self.prefetch:
            r.prefetch()
        while (command := self.commands.get()) is not None:
            try:
                self.results.put(command(r))
            except BaseException as e:  # noqa: BLE001 - reported to the test
                self.results.put(e)
        r.close()

    def sync(self) -> None:
        def run(r: weightsync.WeightReceiver) -> tuple[weightsync.SyncStats, Hashes]:
            box: Hashes = {}

            def load(it: Iterator[tuple[str, torch.Tensor]]) -> None:
                box.update((n, digest(t)) for n, t in it)
            if not self.prefetch:
                return r.receive(load), box
            stats = r.load_staged(r.take(timeout=60), load)
            r.prefetch()
            return stats, box
        self.commands.put(run)

    def do(self, command: Callable[[weightsync.WeightReceiver], object]) -> None:
        self.commands.put(command)

    def result(self) -> object:
        got = self.results.get(timeout=90)
        if isinstance(got, BaseException):
            raise got
        return got

    def synced(self) -> tuple[weightsync.SyncStats, Hashes]:
        """What the last ``sync`` reported: its stats and the hash of every tensor it was handed."""
        got = self.result()
        assert isinstance(got, tuple) and isinstance(got[0], weightsync.SyncStats) and isinstance(got[1], dict)
        return got[0], got[1]

    def close(self) -> None:
        self.commands.put(None)
        self.thread.join(timeout=30)


class Trainer:
    """Float32 masters under AdamW; what it sends is each parameter in the wire dtype, plus a buffer that flips
    between +0.0 / -0.0 and between two NaN payloads (equal as floats, different in their bits)."""

    def __init__(self, dtype: torch.dtype, *, lr: float) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Embedding(256, 48), torch.nn.Linear(48, 192), torch.nn.GELU(),
                                         torch.nn.Linear(192, 48), torch.nn.LayerNorm(48), torch.nn.Linear(48, 256))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.dtype, self.steps = dtype, 0
        self.special = torch.tensor([0.0, float("nan"), 1.0, -0.0] * 8, dtype=torch.float32)

    def step(self) -> None:
        x = torch.randint(0, 256, (16, 8))
        loss = torch.nn.functional.cross_entropy(self.model(x).reshape(-1, 256), x.roll(1, dims=1).reshape(-1))
        self.opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        self.opt.step()
        self.steps += 1
        bits = self.special.view(torch.int32)
        bits[0::4] ^= torch.iinfo(torch.int32).min           # +0.0 <-> -0.0
        bits[1::4] ^= 1                                      # another NaN payload
        bits[2] += 1                                         # one ulp

    def tensors(self) -> list[tuple[str, torch.Tensor]]:
        named = [(n, p.detach().to(self.dtype)) for n, p in self.model.named_parameters()]
        return named + [("special", self.special.to(self.dtype))]


def push(sender: weightsync.WeightSender, peers: list[Peer], trainer: Trainer) -> weightsync.SyncStats:
    """One overlapped sync, as the trainer's push runs it; every peer's hashes equal the trainer's."""
    for p in peers:
        p.sync()
    want = {n: digest(t) for n, t in trainer.tensors()}
    stats = sender.start(trainer.tensors(), version=trainer.steps).result(timeout=90)
    for p in peers:
        got_stats, got = p.synced()
        assert got == want, f"version {trainer.steps}: {sorted(n for n in want if got.get(n) != want[n])} differ"
        assert got_stats.delta == stats.delta and got_stats.version == trainer.steps
    assert stats.bytes < stats.full_bytes if stats.delta else stats.bytes == stats.full_bytes
    return stats


@contextlib.contextmanager
def group(*prefetch: bool, delta: bool = True) -> Iterator[tuple[weightsync.WeightSender, list[Peer], int]]:
    """A sender and one receiver per entry of ``prefetch`` (True: through the background receive); all closed after
    (with any peer the test appends)."""
    port, world = free_port(), 1 + len(prefetch)
    peers = [Peer(port=port, world=world, rank=r + 1, prefetch=p) for r, p in enumerate(prefetch)]
    sender = weightsync.WeightSender(host="127.0.0.1", port=port, world_size=world, timeout=30, join_timeout=60,
                                     bucket_mb=0.02, delta=delta)
    try:
        yield sender, peers, port
    finally:
        for p in peers:
            p.close()
        sender.close()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_sync_of_real_adam_steps_is_bit_equal_and_a_delta_when_smaller(dtype: torch.dtype) -> None:
    trainer = Trainer(dtype, lr=1e-5)
    with group(False, True) as (sender, peers, _):
        stats = [push(sender, peers, trainer)]
        for _ in range(5):
            trainer.step()
            stats.append(push(sender, peers, trainer))
    assert not stats[0].delta and stats[0].changed is None             # no base yet: full
    later = stats[1:]
    assert all(s.changed is not None and 0 < s.changed <= 1 for s in later)
    if dtype is torch.bfloat16:    # an update far below a bf16 step mostly rounds to the same bits
        assert all(s.delta and s.changed is not None and s.changed < 0.5 for s in later), [s.as_dict() for s in later]
        assert all(s.buckets >= 1 for s in later)


def test_a_sync_where_every_element_changed_goes_out_full() -> None:
    trainer = Trainer(torch.float32, lr=1e-3)
    with group(True) as (sender, peers, _):
        push(sender, peers, trainer)
        with torch.no_grad():
            for p in trainer.model.parameters():
                p.add_(1.0)
            trainer.special.neg_()                # the sign bit of every element, NaNs too
        trainer.steps += 1
        everything = push(sender, peers, trainer)
        trainer.step()
        after = push(sender, peers, trainer)      # bit-equal again whatever it sends
    assert not everything.delta and everything.changed is not None and everything.changed > 0.99
    assert everything.bytes == everything.full_bytes
    assert after.version == 2


def test_a_receiver_that_missed_a_version_gets_the_full_copy_with_everyone() -> None:
    """One receiver's buffers no longer hold the sender's last version (as a generator that missed it): it votes
    no, the whole group gets the full copy, every receiver is bit-equal, and the next sync is a delta again."""
    trainer = Trainer(torch.bfloat16, lr=1e-5)

    def miss(r: weightsync.WeightReceiver) -> int | None:
        for buf in r.buffers.buffers:
            buf.fill_(7)                       # not the base any more ...
        assert r.base is not None
        r.base -= 1                            # ... but an older version's
        return r.base
    with group(False, False) as (sender, peers, _):
        push(sender, peers, trainer)
        trainer.step()
        first = push(sender, peers, trainer)
        peers[1].do(miss)
        assert peers[1].result() == 0
        trainer.step()
        missed = push(sender, peers, trainer)
        trainer.step()
        again = push(sender, peers, trainer)
    assert first.delta and not missed.delta and again.delta
    assert missed.bytes == missed.full_bytes and missed.changed is not None and missed.changed < 0.5


def test_a_new_member_after_a_re_form_gets_the_full_copy() -> None:
    trainer = Trainer(torch.bfloat16, lr=1e-5)
    with group(True) as (sender, peers, port):
        push(sender, peers, trainer)
        trainer.step()
        assert push(sender, peers, trainer).delta
        peers.pop().close()
        assert sender.reset(world_size=3) == 1
        peers += [Peer(port=port, world=3, rank=r, prefetch=r == 2, epoch=1) for r in (1, 2)]
        trainer.step()
        joined = push(sender, peers, trainer)
        trainer.step()
        then = push(sender, peers, trainer)
    assert not joined.delta and joined.changed is None and then.delta


def test_without_the_option_nothing_is_compared() -> None:
    trainer = Trainer(torch.bfloat16, lr=1e-5)
    with group(False, delta=False) as (sender, peers, _):
        push(sender, peers, trainer)
        trainer.step()
        stats = push(sender, peers, trainer)
    assert not stats.delta and stats.changed is None and stats.encode_seconds == 0.0


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_learners_own_push_stream_after_grpo_steps_is_bit_equal(tmp_path: Path, dtype: str) -> None:
    """The trainer's push as it runs (the learner's ``named_tensors`` stream in its compute dtype, snapshotted by
    ``start``) after real GRPO steps (AdamW on the float32 masters): every receiver hash-equal after every sync."""
    learner = step.Trainer(model_path=util.build_tiny(tmp_path / "m"), algorithm=util.algorithm(learningRate=1e-5),
                           dtype=dtype)
    stats = []
    with group(True, False) as (sender, peers, _):
        for s in range(4):
            if s:
                learner.train_step(groups=util.synthetic_groups(step=s, prompts=2, group_size=4))
            for p in peers:
                p.sync()
            want = {n: digest(t) for n, t in learner.named_tensors()}
            stats.append(sender.start(learner.named_tensors(), version=s).result(timeout=90))
            learner.complete_sync()
            for p in peers:
                _, got = p.synced()
                assert got == want, f"{dtype} v{s}: {sorted(n for n in want if got.get(n) != want[n])} differ"
    assert stats[0].changed is None and all(s.changed is not None for s in stats[1:])
    assert all(s.bytes < s.full_bytes if s.delta else s.bytes == s.full_bytes for s in stats)
    if dtype == "float32":   # AdamW moves nearly every float32 element: the sync falls back to full
        assert all(not s.delta and s.changed is not None and s.changed > 0.99 for s in stats[1:])
    else:                    # far fewer bf16 elements change their bits: a delta
        assert all(s.delta and s.changed is not None and s.changed < 0.5 for s in stats[1:])
