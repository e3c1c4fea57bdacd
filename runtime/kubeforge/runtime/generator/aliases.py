"""Receive-buffer aliases for the swap reload's shadow: which shadow tensors are, byte for byte, one place of the
weight receiver's buffers, learned from the copies a build's own loaders made.

Role: a shadow build (``swap_reload.ShadowModel.build``) hands every received tensor (a view of the receive buffers)
to the model's loaders, which copy it into the shadow's model-format tensors, then packs each layer's kernel from
those. For most tensors the loader's copy is an identity: same dtype, both contiguous, and the tensors of a fused
layer (q, k and v; gate and up) lie back to back in one bucket as they do in the fused weight. Such a shadow tensor
can *be* that place of the buffers: the next sync lands in it directly, a loader's copy onto it becomes a no-op
(torch skips a copy onto the very same data), and the shadow holds no copy of those weights of its own. A received
tensor whose every byte went, by identity copies, into such aliases and nowhere else is *routed*: later builds of the
same layout need not hand it to the loaders at all, and a layer all of whose tensors are aliases is built as soon
as the last of them has landed (:class:`Plan`).

Neighbours: ``swap_reload`` records a build with :class:`Recorder` and asks :func:`learn` for the :class:`Plan`,
keyed by :func:`layout_key` (names, dtypes, shapes and places of the sync's tensors, and the buffers themselves);
``weightsync.Staged`` gives the entries and the receive buffers (:func:`layout`).

Invariants:
- A plan is used only for a sync whose layout key equals the one it was learned from (same buffers, same places), so
  every alias is a view of memory that holds exactly that tensor's bytes once the sync has landed.
- Nothing here writes to the receive buffers (they are the base a lossless delta is applied to): an alias is only
  read by the packing, and a loader's copy onto it is skipped as a copy onto itself.
- What the recorder cannot prove an identity (a cast, a partial or strided copy, a fill, any other write) leaves
  that tensor a copy of its own, and the tensors it came from keep going through the loaders; a write computed from
  anything but a received tensor as it lies (a transform) routes nothing at all, since its sources are unknown.
"""
from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kubeforge.runtime import weightsync

LayoutKey = tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a sync's tensors lie: ``places`` (bucket, byte offset, bytes), in the order they are handed out, in
    ``buffers``; ``key`` says which plan fits."""

    key: LayoutKey
    places: list[tuple[int, int, int]]
    buffers: list[torch.Tensor]


def layout(staged: weightsync.Staged) -> Layout:
    return Layout(key=layout_key(staged.entries, staged.full), places=staged.places(), buffers=staged.full)


def layout_key(entries: Sequence[dict[str, Any]], buffers: Sequence[torch.Tensor]) -> LayoutKey:
    """What a plan holds for: each tensor's name, dtype, shape and place, and the buffers (address and size)."""
    return (tuple((e["name"], e["dtype"], tuple(e["shape"]), int(e["bucket"]), int(e["offset"])) for e in entries),
            tuple((int(b.data_ptr()), int(b.numel())) for b in buffers))


@dataclasses.dataclass(frozen=True)
class Copy:
    """One copy a loader made from the buffers: ``nbytes`` from byte ``src`` of bucket ``bucket`` to byte ``dst`` of
    the shadow tensor with id ``target``; ``identity``: same dtype and shape, both contiguous (bytes as they are)."""

    target: int
    dst: int
    nbytes: int
    bucket: int
    src: int
    identity: bool = True


class Recorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """While active (on this thread): every write into one of ``targets`` (the shadow's tensors, each owning its
    storage). A copy from the buffers is a :class:`Copy`; any other write makes its target ``foreign``, and one
    computed from anything but the buffers (a cast or transform of a received tensor, a mix) also makes the
    loaders ``opaque``: which received tensors it came from is unknown."""

    def __init__(self, *, targets: Sequence[torch.Tensor], buffers: Sequence[torch.Tensor]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.targets = {_storage(t): t for t in targets}
        self.buffers = list(buffers)
        self.buckets = {_storage(b): i for i, b in enumerate(buffers)}
        self.copies: list[Copy] = []
        self.foreign: set[int] = set()
        self.opaque = False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        written = _written(func, args, kwargs)
        for dst in written:
            target = self.targets.get(_storage(dst))
            if target is None or dst.numel() == 0:   # not the shadow's, or writes nothing
                continue
            copy = self._copy(target, dst, args[1]) if func is torch.ops.aten.copy_.default else None
            if copy is not None:
                self.copies.append(copy)
            if copy is None or not copy.identity:
                self.foreign.add(id(target))
            if copy is None and _inputs(args, kwargs, written):   # computed from tensors the recorder cannot place
                self.opaque = True
        return func(*args, **kwargs)

    def _copy(self, target: torch.Tensor, dst: torch.Tensor, src: Any) -> Copy | None:
        bucket = self.buckets.get(_storage(src)) if isinstance(src, torch.Tensor) else None
        if bucket is None:
            return None
        identity = (src.dtype == dst.dtype and tuple(src.shape) == tuple(dst.shape) and src.is_contiguous()
                    and dst.is_contiguous())
        start = int(src.data_ptr() - self.buffers[bucket].data_ptr())
        return Copy(target=id(target), dst=int(dst.data_ptr() - target.data_ptr()),
                    nbytes=dst.numel() * dst.element_size() if identity else _span(src), bucket=bucket, src=start,
                    identity=identity)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one build learned. ``views``: id(shadow tensor) -> (bucket, byte offset) it may alias. ``routed``: the
    entries (by index) whose every byte went, by identity copies, into aliased tensors and nowhere else: later
    builds need not hand them to the loaders (empty when the loaders were ``opaque``). ``ready``: entry index ->
    the layers all of whose tensors are aliased and whole once that entry has landed."""

    key: LayoutKey
    views: dict[int, tuple[int, int]]
    routed: frozenset[int]
    ready: dict[int, list[Any]]


def learn(*, key: LayoutKey, recorder: Recorder, places: Sequence[tuple[int, int, int]],
          layers: Sequence[tuple[Any, Sequence[torch.Tensor]]], rebound: set[int]) -> Plan:
    """The plan of a recorded build. ``places``: each received tensor's (bucket, byte offset, bytes), in the order
    they are handed out; ``layers``: each packed layer (in build order) with its shadow tensors; ``rebound``: ids of
    shadow tensors whose memory the build replaced (never aliased)."""
    by_target: dict[int, list[Copy]] = {}
    for c in recorder.copies:
        by_target.setdefault(c.target, []).append(c)
    tensors = {id(t): t for t in recorder.targets.values()}
    views = {}
    for tid, copies in by_target.items():
        place = _place(tensors[tid], copies, recorder.buffers)
        if place is not None and tid not in recorder.foreign and tid not in rebound:
            views[tid] = place
    starts = _entry_starts(places)
    routed = frozenset() if recorder.opaque else _routed(places, recorder.copies, views, starts)
    ready: dict[int, list[Any]] = {}
    for layer, layer_tensors in layers:   # built by the plan only when no loader will touch it any more
        feeding = {i for t in layer_tensors for c in by_target.get(id(t), []) for i in _entries_of(starts, places, c)}
        if layer_tensors and all(id(t) in views for t in layer_tensors) and feeding <= routed:
            ready.setdefault(max(feeding), []).append(layer)
    return Plan(key=key, views=views, routed=routed, ready=ready)


def alias(tensor: torch.Tensor, buffers: Sequence[torch.Tensor], place: tuple[int, int]) -> None:
    """Point ``tensor`` (keeping its object and attributes) at its place in the buffers."""
    bucket, offset = place
    nbytes = tensor.numel() * tensor.element_size()
    tensor.data = buffers[bucket][offset:offset + nbytes].view(tensor.dtype).view(tensor.shape)


def is_alias(tensor: torch.Tensor, buffers: Sequence[torch.Tensor], place: tuple[int, int]) -> bool:
    bucket, offset = place
    return _storage(tensor) == _storage(buffers[bucket]) and (
        int(tensor.data_ptr()) == int(buffers[bucket].data_ptr()) + offset)


def _place(target: torch.Tensor, copies: list[Copy], buffers: Sequence[torch.Tensor]) -> tuple[int, int] | None:
    """Where ``target`` lies whole in one bucket if its copies cover it exactly, back to back, at one shift."""
    nbytes = target.numel() * target.element_size()
    if (not target.is_contiguous() or target.storage_offset() != 0
            or target.untyped_storage().nbytes() != nbytes or len({c.bucket for c in copies}) != 1):
        return None
    copies = sorted(copies, key=lambda c: c.dst)
    shift = copies[0].src - copies[0].dst
    at = 0
    for c in copies:
        if c.dst != at or c.src - c.dst != shift:
            return None
        at += c.nbytes
    bucket = copies[0].bucket
    if at != nbytes or shift < 0 or shift + nbytes > buffers[bucket].numel() or shift % 16:
        return None
    return bucket, shift


def _routed(places: Sequence[tuple[int, int, int]], copies: list[Copy], views: dict[int, tuple[int, int]],
            starts: dict[int, tuple[list[int], list[int]]]) -> frozenset[int]:
    """The entries covered whole by identity copies into aliased tensors, with no other copy from them."""
    spans: dict[int, list[tuple[int, int]]] = {}
    spoiled: set[int] = set()
    for c in copies:
        for i in _entries_of(starts, places, c):
            _, offset, n = places[i]
            if not c.identity or c.target not in views:
                spoiled.add(i)
            spans.setdefault(i, []).append((max(offset, c.src), min(offset + n, c.src + c.nbytes)))
    routed = set()
    for i, (_, offset, n) in enumerate(places):
        if i in spoiled or n == 0:
            continue
        at = offset
        for a, b in sorted(spans.get(i, [])):
            if a > at:
                break
            at = max(at, b)
        if at >= offset + n:
            routed.add(i)
    return frozenset(routed)


def _entry_starts(places: Sequence[tuple[int, int, int]]) -> dict[int, tuple[list[int], list[int]]]:
    """Per bucket: the entries' byte offsets (sorted) and their indices."""
    per: dict[int, list[tuple[int, int]]] = {}
    for i, (bucket, offset, _) in enumerate(places):
        per.setdefault(bucket, []).append((offset, i))
    return {b: ([o for o, _ in sorted(v)], [i for _, i in sorted(v)]) for b, v in per.items()}


def _entries_of(starts: dict[int, tuple[list[int], list[int]]], places: Sequence[tuple[int, int, int]],
                c: Copy) -> list[int]:
    """The indices of the entries a copy read bytes of."""
    offsets, indices = starts.get(c.bucket, ([], []))
    first = max(0, bisect.bisect_right(offsets, c.src) - 1)
    out = []
    for k in range(first, bisect.bisect_left(offsets, c.src + c.nbytes)):
        _, offset, n = places[indices[k]]
        if max(offset, c.src) < min(offset + n, c.src + c.nbytes):
            out.append(indices[k])
    return out


def _span(t: torch.Tensor) -> int:
    """Bytes from a view's first element to the end of its last (strides included)."""
    if t.numel() == 0:
        return 0
    return (sum((d - 1) * st for d, st in zip(t.shape, t.stride())) + 1) * t.element_size()


def _storage(t: torch.Tensor) -> int:
    return int(t.untyped_storage().data_ptr())


def _inputs(args: Any, kwargs: dict[str, Any], written: list[torch.Tensor]) -> bool:
    """The op reads a tensor other than the ones it writes (a fill or zero of its own target reads none)."""
    values = [*args, *kwargs.values()]
    flat = [v for x in values for v in (x if isinstance(x, (list, tuple)) else (x,))]
    return any(isinstance(v, torch.Tensor) and all(v is not w for w in written) for v in flat)


def _written(func: Any, args: Any, kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors an op writes to (its schema's mutable arguments, ``out=`` included)."""
    out: list[torch.Tensor] = []
    schema = getattr(func, "_schema", None)
    for i, a in enumerate(schema.arguments if schema is not None else ()):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(a.name)
        for v in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(v, torch.Tensor):
                out.append(v)
    return out
