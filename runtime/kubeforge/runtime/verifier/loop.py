"""The verifier role's loop: rollout groups in, one batched scoring call per group, scored groups out.

```
 generators ──ROLLOUT──▶ inbox ──score(group)──▶ SCORED ──▶ trainer rank (prompt.index % trainers)
```

Groups that arrived together (one BATCH frame: ``inbox.pending``) are scored one by one and leave together: one
BATCH per trainer rank (``wire.pack``). Nothing waits for more groups than were already there.

Neighbours: ``verifiers.score_group`` does the scoring (injected as ``score``); ``transport`` gives the inbox and
the sender towards the trainer ranks; ``verifier.start`` wires the real parts.

Invariants: malformed frames never reach this loop (the transport refuses and counts them); a message of a kind
the verifier does not expect is counted and skipped; a group whose scoring raises is counted and skipped (its
prompt is re-issued by the trainer's buffer rules), so one bad group never stops the role. A group with an episode
lost to infrastructure (``infra.reason``: its environment server died or went silent) is not scored: it goes on with
placeholder rewards (``infra.unscored``), its scores are not observed, and the trainer keeps it out of training. STOP
ends the loop;
so does ``should_stop`` (SIGTERM), even while a send to a dead trainer blocks.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from kubeforge.runtime import infra, transport, types, wire

POLL_SECONDS = 0.2
SEND_RETRY_SECONDS = 1.0


class VerifierObserver(Protocol):
    def scored(self, *, group: types.RolloutGroup, seconds: float) -> None: ...
    def unexpected(self, *, kind: str) -> None: ...
    def failed(self, *, error: BaseException) -> None: ...


def run(*, inbox: transport.Receiver, trainers: transport.Sender,
        score: Callable[[types.RolloutGroup], types.RolloutGroup], observer: VerifierObserver,
        should_stop: Callable[[], bool] = lambda: False, beat: Callable[[str], None] = lambda activity: None,
        deadline: float | None = None) -> None:
    """Serve until STOP (or ``should_stop``)."""
    while not should_stop():
        beat("idle")
        msg = inbox.recv(timeout=POLL_SECONDS)
        if msg is None:
            continue
        arrived = [msg]
        while inbox.pending:   # the rest of the frame msg came in: already here, no wait
            more = inbox.recv(timeout=0)
            if more is None:
                break
            arrived.append(more)
        out: dict[int, list[wire.Message]] = {}
        for msg in arrived:
            if isinstance(msg, wire.Stop):
                return
            if not isinstance(msg, wire.Rollout):
                observer.unexpected(kind=type(msg).__name__)
                continue
            if infra.reason(msg.group) is not None:      # a pod was lost, not the policy's doing: no score
                scored = infra.unscored(msg.group)
            else:
                started = time.monotonic()
                try:
                    scored = score(msg.group)
                except Exception as exc:  # a verifier bug on one group must not take the role down
                    observer.failed(error=exc)
                    continue
                observer.scored(group=scored, seconds=time.monotonic() - started)
            out.setdefault(scored.prompt.index % trainers.peers, []).append(wire.Scored(group=scored))
        for to, msgs in out.items():
            for frame in wire.pack(msgs):
                if not _send(trainers, frame, to=to, should_stop=should_stop, deadline=deadline):
                    return


def _send(trainers: transport.Sender, frame: bytes, *, to: int, should_stop: Callable[[], bool],
          deadline: float | None = None) -> bool:
    """Send, waiting as long as it takes (nothing is dropped), but look at ``should_stop`` between tries: a trainer
    that died leaves the send blocked, and SIGTERM must still end the role. False when stopped unsent; after
    ``deadline`` seconds unsent, ``TransportTimeout`` propagates (the role exits non-zero: no wait lasts)."""
    until = None if deadline is None else time.monotonic() + deadline
    while True:
        try:
            trainers.send_frame(frame, to=to, timeout=SEND_RETRY_SECONDS)
            return True
        except transport.TransportTimeout:
            if should_stop():
                return False
            if until is not None and time.monotonic() > until:
                raise
