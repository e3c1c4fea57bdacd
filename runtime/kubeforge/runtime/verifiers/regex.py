"""Regex: 1 when the completion matches the pattern (anywhere, or the whole completion with fullMatch), else 0.

Neighbours: ``registry`` builds it for ``type: Regex`` from ``VerifierSpec.regex``; the API model refuses a pattern
that does not compile (naming the field); a pattern the runtime engine refuses fails the build the same way.

Time limit: the whole group gets ``timeout_s``; a completion whose match runs out of time (catastrophic
backtracking) scores NaN, which the Scorer turns into the verifier's fallback score and counts. Two ways, same
limit:
- on the main thread (the verifier role's loop): the standard ``re`` engine under a ``SIGALRM`` interval timer
  armed once per group (``re`` checks signals while it backtracks, so the handler's exception stops the match);
  cheap, one timer per group;
- elsewhere (threads, or while another interval timer is armed): the ``regex`` engine's own per-match ``timeout``
  (about 7 us more per match), with what is left of the group's budget.
After a timeout the remaining completions of the group get ``MIN_SLICE_S`` each on the ``regex`` engine. The
SIGALRM handler stays installed between groups (the timer is disarmed): code that arms its own interval timer
installs its own handler, as math-verify does.
"""
from __future__ import annotations

import math
import re
import signal
import threading
import time
from typing import Any, Callable, Sequence

import regex as regex_engine

from kubeforge.runtime import types

DEFAULT_TIMEOUT_S = 1.0
MIN_SLICE_S = 0.001  # a completion reached after the group's budget is spent still gets this long


class _Expired(Exception):
    pass


def _expire(signum: int, frame: Any) -> None:
    raise _Expired()


def _alarm_usable() -> bool:
    return (threading.current_thread() is threading.main_thread()
            and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0))


class Regex:
    def __init__(self, *, pattern: str, full_match: bool = False, field: str = "regex.pattern",
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        try:
            self._re = regex_engine.compile(pattern)
        except regex_engine.error as e:
            raise ValueError(f"{field}: invalid regular expression {pattern!r}: {e}") from None
        try:
            std = re.compile(pattern)
            self._std: Callable[[str], Any] | None = std.fullmatch if full_match else std.search
        except re.error:
            self._std = None
        self._match = self._re.fullmatch if full_match else self._re.search
        self.timeout_s = timeout_s
        self.timeouts = 0

    def score(self, prompt: types.Prompt, completions: Sequence[str]) -> list[float]:
        if self._std is not None and _alarm_usable():
            return self._score_alarm(self._std, completions)
        return self._score_engine(completions, time.monotonic() + self.timeout_s)

    def _score_alarm(self, match: Callable[[str], Any], completions: Sequence[str]) -> list[float]:
        out: list[float] = []
        expired = False
        if signal.getsignal(signal.SIGALRM) is not _expire:
            signal.signal(signal.SIGALRM, _expire)   # left installed: re-installing per group costs more than it
        try:
            signal.setitimer(signal.ITIMER_REAL, self.timeout_s)
            try:
                for c in completions:
                    out.append(1.0 if match(c) is not None else 0.0)
                signal.setitimer(signal.ITIMER_REAL, 0.0)
            except _Expired:
                expired = True
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0.0)
        if expired and len(out) < len(completions):
            self.timeouts += 1
            out.append(math.nan)
            out += self._score_engine(completions[len(out):], 0.0)
        return out

    def _score_engine(self, completions: Sequence[str], deadline: float) -> list[float]:
        out: list[float] = []
        for c in completions:
            try:
                hit = self._match(c, timeout=max(deadline - time.monotonic(), MIN_SLICE_S))
            except TimeoutError:
                self.timeouts += 1
                out.append(math.nan)
                continue
            out.append(1.0 if hit is not None else 0.0)
        return out
