"""The messages of the data plane: one frozen dataclass per kind, and which kind each one is.

Message kinds and directions:

    HELLO    any sender -> receiver   first frame on every connection (transport handshake; never delivered)
    READY    role -> upstream         "I am up and listening" (role, index, policy version)
    ACK      role -> upstream         acknowledges a kind/version (e.g. a SYNC once weights are loaded)
    STOP     anyone -> peer           orderly shutdown, with a reason
    WORK     trainer 0 -> generator   step, expected policy version, prompts [index, text, answer]
    ROLLOUT  generator -> verifier    one RolloutGroup (rewards unset)
    SCORED   verifier -> trainer      one RolloutGroup with rewards and per-verifier scores
    SYNC     trainer 0 -> generator   new policy version and where to join the weight broadcast
    BATCH    generator -> verifier,   many ROLLOUT or SCORED groups column-wise in one frame (``codec.pack``,
             verifier -> trainer      ``batch``): what a sender has ready at once; the transport unpacks it
                                      (never delivered as such)
    ENV_CALL    generator -> verifier's environment server: reset / step / close a batch of episodes
    ENV_ANSWER  environment server -> generator: one reply per episode of a call, or ``busy`` (still working on it)
                (request/reply on their own port, ``agents.hosts.remote_host`` and ``agents.hosts.env_server``)

Neighbours: the role loops build and consume these; ``codec`` turns them into frames and back; ``types`` holds the
plain data (Prompt, Completion, RolloutGroup) that WORK, ROLLOUT and SCORED carry.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Union

from kubeforge.runtime import types


class Kind(enum.IntEnum):
    HELLO = 1
    READY = 2
    ACK = 3
    STOP = 4
    WORK = 16
    ROLLOUT = 17
    SCORED = 18
    SYNC = 19
    BATCH = 20
    ENV_CALL = 21
    ENV_ANSWER = 22


@dataclasses.dataclass(frozen=True, kw_only=True)
class Hello:
    """First frame a transport sender puts on each connection; the receiver records it and does not deliver it."""

    role: str
    index: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ready:
    """A role process is up and listening (sent by the role loops, e.g. generator -> trainer 0)."""

    role: str
    index: int
    policy_version: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ack:
    """Acknowledges message kind ``of`` at ``version`` (e.g. a generator has loaded the weights of SYNC v)."""

    role: str
    index: int
    of: Kind
    version: int
    ok: bool = True
    detail: str = ""


# An Ack of kind READY, ok, with this detail: a generator's "I am alive" beat to trainer 0 (``generator.join``).
ALIVE = "alive"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Stop:
    """Orderly shutdown of the peer."""

    reason: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Work:
    """Prompts to sample for optimizer step ``step``, expected under policy version ``policy_version``."""

    step: int
    policy_version: int
    prompts: tuple[types.Prompt, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rollout:
    """A sampled group on its way to a verifier (``group.rewards`` is None)."""

    group: types.RolloutGroup


@dataclasses.dataclass(frozen=True, kw_only=True)
class Scored:
    """A scored group on its way to trainer rank ``group.prompt.index % trainers`` (rewards set)."""

    group: types.RolloutGroup


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sync:
    """Policy version ``version`` (after step ``step``) is being broadcast: join the weight-sync group.

    ``host``/``port`` is the torch.distributed store of the weight-sync group (trainer 0, ``contract.PORT_WEIGHTS``);
    ``world_size`` counts trainer 0 plus every generator worker; ``backend`` is ``gloo`` or ``nccl``."""

    version: int
    step: int
    host: str
    port: int
    world_size: int
    backend: str = "gloo"
    timeout_s: int = 120
    epoch: int = 0          # the weight-sync group's epoch: a new one each time the membership re-forms
    trainer_epoch: int = 0  # the sender's trainer epoch: generators refuse an older one (docs/fencing.md)
    rank_base: int = 0      # the receiving generator's first rank in this epoch's group; 0: from its index (a
                            # generator found silent is left out of the group, so the live ones are renumbered)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Batch:
    """Several groups in one frame (a transport detail: receivers unpack it and deliver the messages one by one)."""

    messages: tuple[Rollout | Scored, ...]


ENV_OPS = ("reset", "step", "close")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvCall:
    """One batched environment call: ``op`` on the episodes ``ids`` (the caller's episode ids); ``prompts`` (reset)
    or ``texts`` (step: the policy turn) hold one entry per id, the other stays empty; close has neither."""

    call: int
    op: str
    ids: tuple[int, ...]
    prompts: tuple[types.Prompt, ...] = ()
    texts: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvReply:
    """One episode's answer (``agents.hosts.host.Reply`` on the wire): ``messages`` are the reset's start messages or
    the step's observation as (role, content) pairs; ``stepped`` marks a step result (with done, reward, tool counts);
    ``failure`` one of ``agents.hosts.host.FAILURES`` (then the rest is empty)."""

    messages: tuple[tuple[str, str], ...] = ()
    stepped: bool = False
    done: bool = False
    reward: float | None = None
    tool_calls: int = 0
    tool_errors: int = 0
    failure: str = ""
    detail: str = ""
    seconds: float = 0.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvAnswer:
    """The answer to call ``call``: one reply per id, in order; or ``busy`` (no replies): the server is still at it
    (sent every second while a call waits or runs, so a silent server reads as lost, a busy one does not)."""

    call: int
    busy: bool = False
    replies: tuple[EnvReply, ...] = ()


Message = Union[Hello, Ready, Ack, Stop, Work, Rollout, Scored, Sync, Batch, EnvCall, EnvAnswer]

KIND_OF: dict[type, Kind] = {
    Hello: Kind.HELLO, Ready: Kind.READY, Ack: Kind.ACK, Stop: Kind.STOP,
    Work: Kind.WORK, Rollout: Kind.ROLLOUT, Scored: Kind.SCORED, Sync: Kind.SYNC, Batch: Kind.BATCH,
    EnvCall: Kind.ENV_CALL, EnvAnswer: Kind.ENV_ANSWER,
}


def kind_of(msg: Message) -> Kind:
    """The frame kind of a message object."""
    try:
        return KIND_OF[type(msg)]
    except KeyError:
        raise TypeError(f"not a wire message: {type(msg).__name__}") from None
