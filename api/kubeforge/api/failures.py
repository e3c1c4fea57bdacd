"""The restart decision: one pure function of the failure policy and the failures seen, used by the operator (pods)
and the local launcher (processes) alike.

```
 failures seen (role, exit code, reason) ──▶ first matching rule per failure (no match: RestartAll)
     ──▶ the most severe action wins: Fail > RestartAll > RestartRole > Ignore
     ──▶ a restart (RestartAll / RestartRole) with maxRestarts used up becomes Fail (BackoffLimitExceeded)
```

Invariants:
- Pure and total: no clock, no I/O; every failure gets exactly one answer.
- ``RestartRole`` on a trainer becomes ``RestartAll``: the trainers hold the job's state (model, optimizer, data
  cursor); they resume together from the last complete checkpoint, and the other roles follow.
- One decision counts at most one restart, however many failures it covers (a node loss that takes three
  generators is one restart); ``Ignore`` and ``Fail`` count none.
- Local exits by signal are mapped as the kubelet reports them: exit code ``128 + signal``, reason ``Error``.
- A preemption (reason ``Preempted``: a pod of the gang preempted for one of higher priority) is the job being
  preempted, not failing: when every failure of a decision is one, its restart (the first matching rule's, by
  default RestartAll: the gang comes back whole and the trainers resume from their stop checkpoint) is not counted
  against ``maxRestarts`` and is never turned into ``BackoffLimitExceeded``; a rule may still say Fail or Ignore.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from kubeforge.api import rljob

Action = rljob.FailureAction
RESTART_ALL, RESTART_ROLE = Action.RESTART_ALL.value, Action.RESTART_ROLE.value
FAIL, IGNORE = Action.FAIL.value, Action.IGNORE.value
SEVERITY = {IGNORE: 0, RESTART_ROLE: 1, RESTART_ALL: 2, FAIL: 3}
BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
FAILED_BY_RULE = "FailedByRule"
PREEMPTED = rljob.FailureReason.PREEMPTED.value


@dataclasses.dataclass(frozen=True, kw_only=True)
class Failure:
    """One failed container or process."""

    role: str
    name: str                      # pod name, or the local process name (role-index)
    exit_code: int | None
    reason: str                    # FailureReason value (anything else matches only rules without onReasons)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Decision:
    """What to do about a set of failures."""

    action: str                              # RestartAll | RestartRole | Fail | Ignore
    restart: tuple[str, ...] = ()            # names to restart (RestartRole), sorted
    counts: bool = False                     # one restart is counted against maxRestarts
    reason: str = ""                         # Fail: BackoffLimitExceeded | FailedByRule
    message: str = ""
    cause: Failure | None = None             # the failure that decided the action
    rule: int | None = None                  # index of the matching rule (None: the default)
    preempted: bool = False                  # every failure is a preemption: a restart is not counted


def from_exit(code: int) -> tuple[int, str]:
    """A local ``Popen.returncode`` as the kubelet would report it: (exit code, reason)."""
    return (128 - code, rljob.FailureReason.ERROR.value) if code < 0 else (code, rljob.FailureReason.ERROR.value)


def matches(rule: rljob.FailureRule, f: Failure) -> bool:
    """Does ``rule`` apply to ``f``? Every criterion given must match; an empty list matches anything."""
    if rule.roles and f.role not in rule.roles:
        return False
    if rule.on_exit_codes and f.exit_code not in rule.on_exit_codes:
        return False
    return not rule.on_reasons or f.reason in rule.on_reasons


def action_for(policy: rljob.FailurePolicySpec, f: Failure) -> tuple[str, int | None]:
    """The action of the first matching rule for one failure, and that rule's index (None: the default)."""
    for i, rule in enumerate(policy.rules):
        if matches(rule, f):
            act = str(rule.action)
            if act == RESTART_ROLE and f.role == rljob.RoleName.TRAINER.value:
                act = RESTART_ALL
            return act, i
    return RESTART_ALL, None


def describe(f: Failure) -> str:
    code = "no exit code" if f.exit_code is None else f"exit code {f.exit_code}"
    return f"{f.role} {f.name} failed ({code}, reason {f.reason})"


def decide(policy: rljob.FailurePolicySpec, failures: Sequence[Failure], *, restarts: int) -> Decision | None:
    """The decision for ``failures`` (None when there are none), given ``restarts`` already counted."""
    if not failures:
        return None
    judged = sorted(((action_for(policy, f), f) for f in failures),
                    key=lambda x: (-SEVERITY[x[0][0]], x[1].name, x[1].reason))
    (action, rule), cause = judged[0]
    what = describe(cause)
    if action == FAIL:
        return Decision(action=FAIL, reason=FAILED_BY_RULE, cause=cause, rule=rule,
                        message=f"{what}: spec.failurePolicy.rules[{rule}] says Fail")
    if action == IGNORE:
        return Decision(action=IGNORE, cause=cause, rule=rule, restart=tuple(sorted({f.name for f in failures})),
                        message=f"{what}: ignored by spec.failurePolicy.rules[{rule}]")
    if all(f.reason == PREEMPTED for f in failures):
        scope = tuple(sorted({f.name for f in failures})) if action == RESTART_ROLE else ()
        where = f"restarting {', '.join(scope)}" if scope else "restarting every role from the last checkpoint"
        return Decision(action=action, restart=scope, counts=False, preempted=True, cause=cause, rule=rule,
                        message=f"{cause.role} {cause.name} preempted: {where} (not counted against maxRestarts)")
    if restarts >= policy.max_restarts:
        return Decision(action=FAIL, reason=BACKOFF_LIMIT_EXCEEDED, cause=cause, rule=rule,
                        message=f"{what} after {restarts} restarts (maxRestarts={policy.max_restarts})")
    scope = tuple(sorted({f.name for (a, _), f in judged if a != FAIL})) if action == RESTART_ROLE else ()
    where = f"restarting {', '.join(scope)}" if scope else "restarting every role from the last checkpoint"
    return Decision(action=action, restart=scope, counts=True, cause=cause, rule=rule,
                    message=f"{what}: {where} (restart {restarts + 1}/{policy.max_restarts})")


__all__ = ["Decision", "Failure", "decide", "from_exit", "matches", "action_for"]
