"""A progress bar fed by the trainer's metrics JSONL: step, mean reward, completions/s (on stderr).

Neighbour: trainer rank 0's JSONL reporter appends one record per step; :class:`Progress` tails that file, so
the launcher needs no channel of its own to the trainer. stdout stays free for the final summary line.
"""
from __future__ import annotations

import pathlib
import sys

from kubeforge.api import progress


class Progress:
    """Tails ``metrics`` and renders a tqdm bar; tolerant of truncation (a resumed trainer rewrites the file)."""

    def __init__(self, *, metrics: pathlib.Path, total: int, enabled: bool = True) -> None:
        from tqdm import tqdm

        self._path = metrics
        self._offset = 0
        self._partial = ""
        self.last: progress.StepRecord | None = None
        self._first_time: float | None = None
        self._done = 0
        self._bar = tqdm(total=total, file=sys.stderr, disable=not enabled, unit="step", dynamic_ncols=True)

    def poll(self) -> None:
        """Read new complete lines and update the bar."""
        if not self._path.exists():
            return
        size = self._path.stat().st_size
        if size < self._offset:        # rewritten on resume
            self._offset, self._partial = 0, ""
        with self._path.open() as f:
            f.seek(self._offset)
            chunk = f.read()
            self._offset = f.tell()
        lines = (self._partial + chunk).split("\n")
        self._partial = lines.pop()
        for line in lines:
            rec = progress.StepRecord.decode(line)
            if rec is not None:
                self._update(rec)

    def _update(self, rec: progress.StepRecord) -> None:
        if self._first_time is None:
            self._first_time = rec.time
            self._done = 0
        else:
            self._done += rec.completions
        dt = rec.time - self._first_time
        rate = self._done / dt if dt > 0 else 0.0
        self._bar.n = rec.step
        reward = rec.mean_reward
        post = {"reward": f"{reward:.3f}" if reward is not None else "-", "completions_s": f"{rate:.1f}"}
        if rec.eval_accuracy is not None:
            post["eval_acc"] = f"{rec.eval_accuracy:.2f}"
        self._bar.set_postfix(post, refresh=False)
        self._bar.refresh()
        self.last = rec

    def note(self, text: str) -> None:
        """A line above the bar (restarts, failures)."""
        self._bar.write(text, file=sys.stderr)

    def close(self) -> None:
        self._bar.close()
