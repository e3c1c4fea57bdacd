"""Rank 0's held-out accuracy through a run: when the evaluator runs, and what each step's record carries of it.

```
 fresh start:  evaluate → base accuracy (step 1's record carries it as eval_accuracy_base)
 after step n: every evaluation.everySteps and after the last: evaluate → eval_seconds, evaluated
               every record: eval_accuracy, the latest (carried forward between evaluations)
```

Neighbours: ``trainer.loop`` calls :meth:`HeldOutAccuracy.before_first_step` and :meth:`HeldOutAccuracy.after_step`;
the evaluator itself is ``trainer.evaluate.Evaluator`` (``trainer.start`` builds it on rank 0 when
``spec.evaluation`` is set); ``trainer.report`` writes the records. Ranks other than 0, and jobs without
``spec.evaluation``, have no evaluator: nothing runs and the records carry nothing of it.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubeforge.api import progress


class HeldOutAccuracy:
    """``evaluate()`` runs the held-out evaluation now (the result has ``accuracy`` and ``seconds``); None: none."""

    def __init__(self, *, evaluate: Callable[[], Any] | None, every: int,
                 beat: Callable[[str], None] = lambda activity: None) -> None:
        self.evaluate = evaluate
        self.every = every
        self.beat = beat                  # the role's heartbeat: an evaluation is progress, not a hang
        self.base: float | None = None    # held-out accuracy before the first step (fresh start)
        self.last: float | None = None    # the latest held-out accuracy (carried in every record)

    def before_first_step(self) -> None:
        if self.evaluate is None:
            return
        self.beat("evaluate")
        self.base = self.last = float(self.evaluate().accuracy)

    def after_step(self, record: progress.StepRecord, *, done: int, last: bool) -> None:
        """Held-out accuracy every ``every`` steps and after the last; every record carries the latest
        (``eval_accuracy``), the step's own evaluation time, and the first also the base accuracy."""
        if self.evaluate is None:
            return
        if done % max(self.every, 1) == 0 or last:
            self.beat("evaluate")
            result = self.evaluate()
            self.last = float(result.accuracy)
            record.eval_seconds = float(result.seconds)
            record.evaluated = True
        if self.last is not None:
            record.eval_accuracy = self.last
        if done == 1 and self.base is not None:
            record.eval_accuracy_base = self.base
