"""weightsync.delta: every encoding round-trips bit for bit (bf16, float32 and the other dtypes that travel, special
values included: -0.0, NaN payloads, infinities), the cheapest encoding is chosen and FULL whenever a delta is not
smaller, and a payload that does not fit its tensor is refused, never applied half way."""
from __future__ import annotations

import struct

import hypothesis
import pytest
import torch
from hypothesis import strategies as st

from kubeforge.runtime.weightsync import delta, metadata, protocol

FUZZ = hypothesis.settings(max_examples=200, deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow])

F32_SPECIAL = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7FC00001, 0xFFBFFFFF, 0x7F800001,
               0x00000001, 0x80000001]   # +0, -0, +inf, -inf, quiet NaN, NaN payloads (quiet, negative, signalling)
BF16_SPECIAL = [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7FC1, 0xFFBF, 0x7F81, 0x0001, 0x8001]
WIDTH = {torch.float32: 32, torch.bfloat16: 16, torch.float16: 16, torch.float64: 64, torch.int64: 64,
         torch.int32: 32, torch.int8: 8, torch.uint8: 8}
SPECIAL = {torch.float32: F32_SPECIAL, torch.bfloat16: BF16_SPECIAL}


def from_bits(words: list[int], dtype: torch.dtype) -> torch.Tensor:
    """A tensor of ``dtype`` holding exactly these bit patterns (unsigned words of the dtype's width)."""
    width = WIDTH[dtype]
    signed = [w - (1 << width) if w >= 1 << (width - 1) else w for w in words]
    ints = torch.tensor(signed, dtype={8: torch.int8, 16: torch.int16, 32: torch.int32, 64: torch.int64}[width])
    return ints.view(dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(delta.bits(a), delta.bits(b)))


def round_trip(new: torch.Tensor, base: torch.Tensor) -> tuple[delta.Encoding, int, torch.Tensor]:
    enc, count, mask = delta.choose(new, base)
    size = delta.payload_bytes(enc=enc, numel=new.numel(), count=count, elem=new.element_size())
    payload = torch.full((size,), 0xAB, dtype=torch.uint8)
    delta.encode(new, enc=enc, count=count, mask=mask, out=payload)
    got = base.clone()
    delta.apply(got, enc=enc, count=count, payload=payload)
    return enc, count, got


@st.composite
def pairs(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    """(base, new) of one dtype: random bit patterns with special values mixed in, some elements changed."""
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float32, torch.bfloat16, torch.float32, torch.float16,
                                  torch.float64, torch.int64, torch.int8]))
    width = WIDTH[dtype]
    word = st.one_of(st.integers(0, (1 << width) - 1), st.sampled_from(SPECIAL.get(dtype, [0, 1])))
    n = draw(st.integers(1, 300))
    base = draw(st.lists(word, min_size=n, max_size=n))
    new = list(base)
    for i in draw(st.lists(st.integers(0, n - 1), max_size=n)):
        new[i] = draw(word)
    shape = draw(st.sampled_from([(n,), (1, n)] + ([(n // 3, 3)] if n % 3 == 0 else [])))
    return from_bits(base, dtype).reshape(shape), from_bits(new, dtype).reshape(shape)


@FUZZ
@hypothesis.given(pairs())
def test_every_delta_round_trips_bit_for_bit(pair: tuple[torch.Tensor, torch.Tensor]) -> None:
    base, new = pair
    enc, count, got = round_trip(new, base)
    assert same_bits(got, new)
    assert count == int((delta.bits(new) != delta.bits(base)).sum())
    elem, n = new.element_size(), new.numel()
    sizes = {e: delta.payload_bytes(enc=e, numel=n, count=count, elem=elem) for e in delta.Encoding}
    assert sizes[enc] == min(sizes.values())                       # the cheapest
    assert (enc is delta.Encoding.FULL) == (min(sizes[delta.Encoding.INDEX], sizes[delta.Encoding.MASK]) >= n * elem)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("enc", list(delta.Encoding))
def test_each_encoding_carries_signed_zeros_and_nan_payloads(dtype: torch.dtype, enc: delta.Encoding) -> None:
    """Forced encodings (not just the cheapest): +0 -> -0, a NaN to another NaN payload, inf -> -inf all travel;
    float equality would have called the first two unchanged."""
    special = SPECIAL[dtype]
    base = from_bits(special * 20, dtype)
    new_words = list(special * 20)
    new_words[0], new_words[4], new_words[2] = special[1], special[5], special[3]   # +0->-0, NaN->NaN', +inf->-inf
    new = from_bits(new_words, dtype)
    mask = delta.changed(new, base)
    assert int(mask.sum()) == 3 and not bool(torch.equal(mask, new.ne(base)))   # float != misses -0.0, sees NaN
    size = delta.payload_bytes(enc=enc, numel=new.numel(), count=3, elem=new.element_size())
    payload = torch.empty(size, dtype=torch.uint8)
    delta.encode(new, enc=enc, count=3, mask=mask, out=payload)
    got = base.clone()
    delta.apply(got, enc=enc, count=3, payload=payload)
    assert same_bits(got, new)
    delta.apply(got, enc=enc, count=3, payload=payload)   # a delta sets, never adds: twice is once
    assert same_bits(got, new)
    if dtype is torch.float32:
        assert struct.pack("<f", float(got[0])) == struct.pack("<I", special[1])


def test_sizes_and_the_choice_follow_the_documented_rule() -> None:
    # bf16, 1000 elements (2000 bytes full)
    assert delta.cheapest(numel=1000, count=0, elem=2) is delta.Encoding.INDEX        # nothing changed: 0 bytes
    assert delta.payload_bytes(enc=delta.Encoding.INDEX, numel=1000, count=0, elem=2) == 0
    assert delta.payload_bytes(enc=delta.Encoding.INDEX, numel=1000, count=10, elem=2) == 24 + 40
    assert delta.payload_bytes(enc=delta.Encoding.MASK, numel=1000, count=10, elem=2) == 24 + 125
    assert delta.cheapest(numel=1000, count=10, elem=2) is delta.Encoding.INDEX
    assert delta.cheapest(numel=1000, count=300, elem=2) is delta.Encoding.MASK      # 600 + 125 < 600 + 1200
    assert delta.cheapest(numel=1000, count=940, elem=2) is delta.Encoding.FULL      # 1880 + 125 >= 2000
    assert delta.cheapest(numel=1000, count=1000, elem=4) is delta.Encoding.FULL     # Adam in float32
    assert delta.cheapest(numel=1, count=1, elem=4) is delta.Encoding.FULL           # 8 + 4 > 4
    # past 2^31 - 1 elements positions are int64
    n = 1 << 31
    assert delta.payload_bytes(enc=delta.Encoding.INDEX, numel=n, count=2, elem=2) == 8 + 16


def test_a_payload_that_does_not_fit_is_refused_and_the_base_untouched() -> None:
    base = torch.zeros(64, dtype=torch.float32)
    new = base.clone()
    new[[3, 9]] = 1.0
    enc, count, mask = delta.choose(new, base)
    assert enc is delta.Encoding.INDEX and count == 2
    payload = torch.empty(delta.payload_bytes(enc=enc, numel=64, count=2, elem=4), dtype=torch.uint8)
    delta.encode(new, enc=enc, count=count, mask=mask, out=payload)
    forged = payload.clone()
    forged[8:12].view(torch.int32)[0] = 64          # a position past the end
    bad_bits = torch.empty(delta.payload_bytes(enc=delta.Encoding.MASK, numel=64, count=2, elem=4), dtype=torch.uint8)
    delta.encode(new, enc=delta.Encoding.MASK, count=2, mask=mask, out=bad_bits)
    bad_bits[-1] = 0xFF                             # eight more bits than the count says
    cases = [(enc, 2, payload[:-1]), (enc, 3, payload), (enc, 2, forged), (delta.Encoding.MASK, 2, bad_bits),
             (delta.Encoding.FULL, 0, payload)]
    for e, c, p in cases:
        got = base.clone()
        with pytest.raises(protocol.WeightSyncError, match="weight sync delta"):
            delta.apply(got, enc=e, count=c, payload=p)
        assert same_bits(got, base)
    with pytest.raises(protocol.WeightSyncError, match="against a base"):
        delta.choose(new.to(torch.bfloat16), base)


def test_a_bf16_copy_of_small_float32_updates_changes_less_than_the_masters() -> None:
    """Why deltas pay in bf16: an Adam-sized step (1e-4 relative here) changes every float32 master but rounds to
    the same bf16 bits for most elements."""
    g = torch.Generator().manual_seed(0)
    master = torch.randn(100_000, generator=g)
    stepped = master + master.abs() * 1e-4 * torch.randn(100_000, generator=g).sign()
    f32 = int(delta.changed(stepped, master).sum()) / master.numel()
    bf16 = int(delta.changed(stepped.bfloat16(), master.bfloat16()).sum()) / master.numel()
    assert f32 > 0.99 and bf16 < 0.2
    enc, _, got = round_trip(stepped.bfloat16(), master.bfloat16())
    assert enc is not delta.Encoding.FULL and same_bits(got, stepped.bfloat16())


def _offer_meta(entry: dict[str, object], *, dbuckets: list[int], base: int = 4) -> bytes:
    full = {"name": "w", "shape": [1000], "dtype": "bfloat16", "bucket": 0, "offset": 0}
    return metadata.encode_meta(version=5, entries=[{**full, **entry}], bucket_sizes=[2000],
                                offer=metadata.Offer(base=base, buckets=dbuckets))


def test_an_offered_delta_the_sender_writes_is_accepted() -> None:
    raw = _offer_meta({"enc": "index", "count": 10, "dbucket": 0, "doffset": 0}, dbuckets=[24 + 40])
    assert metadata.decode_sync_meta(raw)[3] == metadata.Offer(base=4, buckets=[64])
    unchanged = _offer_meta({"enc": "index", "count": 0, "dbucket": -1, "doffset": 0}, dbuckets=[])
    assert metadata.decode_sync_meta(unchanged)[3] == metadata.Offer(base=4, buckets=[])
    assert metadata.decode_sync_meta(metadata.encode_meta(version=5, entries=[], bucket_sizes=[]))[3] is None


@pytest.mark.parametrize("entry, dbuckets, base", [
    ({"enc": "index", "count": 10, "dbucket": 0, "doffset": 0}, [65], 4),     # a bucket larger than its payloads
    ({"enc": "index", "count": 10, "dbucket": 0, "doffset": 0}, [63], 4),     # a payload past its bucket
    ({"enc": "index", "count": 10, "dbucket": 0, "doffset": 8}, [72], 4),     # unaligned
    ({"enc": "index", "count": 1001, "dbucket": 0, "doffset": 0}, [8 + 4004], 4),   # more changes than elements
    ({"enc": "zip", "count": 10, "dbucket": 0, "doffset": 0}, [64], 4),       # an unknown encoding
    ({"enc": "index", "count": 0, "dbucket": 0, "doffset": 0}, [], 4),        # no bytes, yet a bucket
    ({"enc": "index", "count": 10, "dbucket": 1, "doffset": 0}, [64], 4),     # a bucket that does not exist
    ({"enc": "index", "count": 10, "doffset": 0}, [64], 4),                   # no place
    ({"enc": "index", "count": 10, "dbucket": 0, "doffset": 0}, [64], -1),    # no version is negative
    ({"enc": "index", "count": 10, "dbucket": 0, "doffset": 0}, [0, 64], 4),  # an empty bucket
])
def test_a_malformed_delta_offer_is_refused(entry: dict[str, object], dbuckets: list[int], base: int) -> None:
    with pytest.raises(protocol.WeightSyncError, match="delta"):
        metadata.decode_sync_meta(_offer_meta(entry, dbuckets=dbuckets, base=base))
