"""The loop's checkpoint writes: every ``checkpoint.everySteps`` and after the last step, and on SIGTERM the stop
checkpoint, written only within its bound.

Role: ``trainer.loop.Loop`` owns one :class:`Saves` on every rank; the learner writes (``learner.step.Trainer.
save_checkpoint``: rank 0 alone when replicated, every rank its shards when sharded). Here: which rank writes a
stop checkpoint, and whether it fits.

Invariants (the loop's docstring has the whole stop story):
- The stop checkpoint is written only if SIGTERM's age plus the last write's duration stays within
  ``stop_within`` (below the pod's grace period), else skipped: the resume repeats the steps since the last one.
- Nothing is written twice: a stop after a checkpoint of the same steps writes nothing.
- A sharded write needs every rank: abandoned alone (a collect interrupted on one rank) it is skipped, and after an
  agreed stop rank 0's decision holds on every rank (``agree``: one broadcast).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from kubeforge.runtime.learner import base


class Where(Protocol):
    """The loop's settings this needs (``trainer.loop.Settings``)."""

    @property
    def rank(self) -> int: ...
    @property
    def world(self) -> int: ...
    @property
    def checkpoint_dir(self) -> str: ...
    @property
    def checkpoint_keep(self) -> int: ...
    @property
    def stop_within(self) -> float: ...


class Saves:
    """This rank's checkpoint writes: the newest cursor written and how long the last write took."""

    def __init__(self, *, learner: base.Learner, beat: Callable[[str], None]) -> None:
        self.learner = learner
        self.beat = beat
        self.saved_cursor = -1            # the data cursor of the newest checkpoint this run wrote or resumed
        self.save_seconds = 0.0           # how long the last checkpoint write took

    def save(self, s: Where, *, cursor: int) -> None:
        self.beat("checkpoint")
        t0 = time.monotonic()
        self.learner.save_checkpoint(directory=s.checkpoint_dir, keep=s.checkpoint_keep, data_cursor=cursor)
        self.save_seconds = time.monotonic() - t0
        self.saved_cursor = cursor

    def on_stop(self, s: Where, *, trained: int, collective: bool, stopped_at: float | None) -> str:
        """The stop checkpoint of ``trained`` steps (data cursor ``trained``), within ``stop_within`` of SIGTERM
        (``stopped_at``, time.monotonic); ``collective``: every rank is here (after an agreed stop), else only
        this rank (an abandoned collect). Returns what happened, for the log."""
        if trained <= max(self.saved_cursor, 0):
            return f"checkpoint of step {trained} already complete" if trained else "nothing trained yet"
        if not collective and s.world > 1 and not getattr(self.learner, "saves_alone", True):
            return "no stop checkpoint: the sharded write needs every rank"
        if not collective and s.rank != 0 and getattr(self.learner, "saves_alone", True):
            return "rank 0 writes the stop checkpoint"
        age = time.monotonic() - stopped_at if stopped_at is not None else 0.0
        fits = age + self.save_seconds <= s.stop_within
        agree = getattr(self.learner, "agree", None)
        if collective and s.world > 1 and agree is not None:
            fits = bool(agree(fits))          # rank 0 decides: a sharded write needs every rank or none
        if not fits:
            msg = (f"no stop checkpoint: SIGTERM {age:.1f}s ago + last write {self.save_seconds:.1f}s > "
                   f"{s.stop_within:.0f}s; the resume repeats the steps after {max(self.saved_cursor, 0)}")
            print(f"trainer-{s.rank}: {msg}", flush=True)
            return msg
        self.save(s, cursor=trained)
        msg = (f"stop checkpoint of step {trained} written in {self.save_seconds:.2f}s, "
               f"{age + self.save_seconds:.1f}s after SIGTERM")
        print(f"trainer-{s.rank}: {msg}", flush=True)
        return msg
