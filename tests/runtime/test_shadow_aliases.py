"""The swap reload's receive-buffer aliases (``generator.aliases``), on plain tensors: what a recorded build's copies
prove (identity copies, fused pieces back to back), what they do not (casts, fills, gaps, partial or transformed
copies), and that an alias is the buffers' memory while a copy onto it changes nothing. The engine's own builds
through a plan are checked against a fresh engine in test_weightsync.py."""
from __future__ import annotations

from typing import Any

import torch

from kubeforge.runtime import weightsync
from kubeforge.runtime.generator import aliases


def _layout(specs: list[tuple[str, tuple[int, ...], torch.dtype, int, int]],
            sizes: list[int]) -> tuple[list[dict[str, Any]], list[torch.Tensor], list[torch.Tensor]]:
    """Entries (name, shape, dtype, bucket, offset), the bucket buffers filled with random bytes, and each entry's
    view (what the receiver hands the loaders)."""
    g = torch.Generator().manual_seed(0)
    buffers = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g) for n in sizes]
    entries, views = [], []
    for name, shape, dtype, bucket, offset in specs:
        nbytes = torch.empty(shape, dtype=dtype).numel() * torch.empty((), dtype=dtype).element_size()
        entries.append({"name": name, "shape": list(shape), "dtype": str(dtype).removeprefix("torch."),
                        "bucket": bucket, "offset": offset})
        views.append(buffers[bucket][offset:offset + nbytes].view(dtype).view(shape))
    return entries, buffers, views


def _places(entries: list[dict[str, Any]], views: list[torch.Tensor]) -> list[tuple[int, int, int]]:
    return [(e["bucket"], e["offset"], v.numel() * v.element_size()) for e, v in zip(entries, views)]


def test_identity_copies_alias_route_and_make_each_layer_ready_at_its_last_tensor() -> None:
    entries, buffers, (q, k, v, o, norm) = _layout(
        [("q", (4, 4), torch.float32, 0, 0), ("k", (2, 4), torch.float32, 0, 64), ("v", (2, 4), torch.float32, 0, 96),
         ("o", (4, 4), torch.float32, 1, 0), ("norm", (4,), torch.float32, 1, 64)], [128, 80])
    qkv, o_w, norm_w = torch.zeros(8, 4), torch.zeros(4, 4), torch.zeros(4)
    recorder = aliases.Recorder(targets=[qkv, o_w, norm_w], buffers=buffers)
    with recorder:   # what vLLM's fused and default loaders do
        qkv.narrow(0, 0, 4).copy_(q)
        qkv.narrow(0, 4, 2).copy_(k)
        qkv.narrow(0, 6, 2).copy_(v)
        o_w.copy_(o)
        norm_w.copy_(norm)
    key = aliases.layout_key(entries, buffers)
    plan = aliases.learn(key=key, recorder=recorder, places=_places(entries, [q, k, v, o, norm]),
                         layers=[("qkv_proj", [qkv]), ("o_proj", [o_w])], rebound=set())
    assert plan.views == {id(qkv): (0, 0), id(o_w): (1, 0), id(norm_w): (1, 64)}
    assert plan.routed == {0, 1, 2, 3, 4}
    assert plan.ready == {2: ["qkv_proj"], 3: ["o_proj"]}
    assert not recorder.foreign and not recorder.opaque

    aliases.alias(qkv, buffers, (0, 0))
    assert aliases.is_alias(qkv, buffers, (0, 0)) and torch.equal(qkv, torch.cat([q, k, v]))
    before = buffers[0].clone()
    qkv.narrow(0, 4, 2).copy_(k)    # a loader's copy onto the alias: the very same bytes, nothing written
    assert torch.equal(buffers[0], before)
    v.add_(1)                       # the next sync lands in the buffers: the alias sees it
    assert torch.equal(qkv[6:], v)


def test_casts_fills_gaps_partial_and_transformed_copies_are_not_aliased() -> None:
    entries, buffers, views = _layout(
        [("cast", (4, 4), torch.bfloat16, 0, 0), ("emb", (3, 4), torch.float32, 0, 32),
         ("q", (2, 4), torch.float32, 0, 80), ("k", (2, 4), torch.float32, 0, 128),   # a gap of 16 bytes before k
         ("half", (2, 4), torch.float32, 0, 160), ("plain", (2, 4), torch.float32, 0, 192)], [224])
    cast, emb, q, k, half, plain = views
    cast_w, emb_w, qk_w, half_w, plain_w = (torch.zeros(4, 4), torch.zeros(4, 4), torch.zeros(4, 4),
                                            torch.zeros(4, 4), torch.zeros(2, 4))
    recorder = aliases.Recorder(targets=[cast_w, emb_w, qk_w, half_w, plain_w], buffers=buffers)
    with recorder:
        cast_w.copy_(cast)                          # bfloat16 into float32
        emb_w[:3].copy_(emb)                        # vocabulary padding: the rows past the tensor are zeroed
        emb_w[3:].fill_(0)
        emb_w[4:].fill_(0)                          # an empty write: writes nothing
        qk_w[:2].copy_(q)
        qk_w[2:].copy_(k)
        half_w[:2].copy_(half)                      # half of its target only
        plain_w.copy_(plain)
    plan = aliases.learn(key=aliases.layout_key(entries, buffers), recorder=recorder,
                         places=_places(entries, views), layers=[("plain", [plain_w]), ("qk", [qk_w])], rebound=set())
    assert plan.views == {id(plain_w): (0, 192)}
    assert recorder.foreign == {id(cast_w), id(emb_w)} and not recorder.opaque   # a fill reads no received tensor
    assert plan.routed == {5} and plan.ready == {5: ["plain"]}

    with recorder:
        plain_w.copy_(plain * 2)                    # computed from a received tensor: its source is unknown
    opaque = aliases.learn(key=aliases.layout_key(entries, buffers), recorder=recorder,
                           places=_places(entries, views), layers=[("plain", [plain_w])], rebound=set())
    assert recorder.opaque and opaque.views == {} and opaque.routed == frozenset() and opaque.ready == {}


def test_a_rebound_tensor_is_not_aliased_and_its_tensors_keep_the_loaders() -> None:
    entries, buffers, (a,) = _layout([("a", (4, 4), torch.float32, 0, 0)], [64])
    a_w = torch.zeros(4, 4)
    recorder = aliases.Recorder(targets=[a_w], buffers=buffers)
    with recorder:
        a_w.copy_(a)
    plan = aliases.learn(key=aliases.layout_key(entries, buffers), recorder=recorder, places=_places(entries, [a]),
                         layers=[("a", [a_w])], rebound={id(a_w)})
    assert plan.views == {} and plan.routed == frozenset() and plan.ready == {}


def test_the_layout_key_names_places_and_buffers_and_a_staged_sync_says_where_its_tensors_lie() -> None:
    entries, buffers, views = _layout([("a", (2, 4), torch.float32, 0, 0), ("b", (4,), torch.bfloat16, 0, 32)], [48])
    key = aliases.layout_key(entries, buffers)
    moved = [dict(entries[0]), {**entries[1], "offset": 16}]
    assert aliases.layout_key(moved, buffers) != key
    assert aliases.layout_key(entries, [b.clone() for b in buffers]) != key     # other memory: another plan
    staged = weightsync.Staged(version=1, entries=entries, buffers=buffers, bytes=40, seconds=0.0)
    layout = aliases.layout(staged)
    assert layout.key == key and layout.places == [(0, 0, 32), (0, 32, 8)] and layout.buffers is buffers
    for (name, t), view in zip(staged.tensors(), views):
        assert t.data_ptr() == view.data_ptr() and t.dtype == view.dtype
