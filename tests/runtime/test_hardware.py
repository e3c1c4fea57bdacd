"""The warning for a half-precision dtype that this CPU only emulates (runtime.hardware)."""
from __future__ import annotations

from pathlib import Path

from kubeforge.runtime import hardware

AVX2 = frozenset("fpu sse sse2 avx avx2 fma".split())
AMX = AVX2 | {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}


def test_bf16_on_a_cpu_without_native_bf16_is_named_with_the_field_and_the_fast_value() -> None:
    w = hardware.slow_dtype_warning("bfloat16", flags=AVX2)
    assert w is not None and "spec.model.dtype" in w and "amx_bf16" in w and "float32" in w
    assert hardware.slow_dtype_warning("float16", flags=AVX2) is not None
    assert hardware.slow_dtype_warning("bfloat16", flags=AMX) is None
    assert hardware.slow_dtype_warning("bfloat16", flags=frozenset({"avx512_bf16"})) is None
    assert hardware.slow_dtype_warning("float16", flags=AMX) is not None     # AMX-BF16 alone does not make fp16 fast
    assert hardware.slow_dtype_warning("float32", flags=AVX2) is None


def test_cpu_flags_reads_the_first_cpu_and_unknown_flags_claim_nothing(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: X\nflags\t\t: fpu avx2 amx_bf16\n\nprocessor\t: 1\nflags\t: fpu\n")
    assert hardware.cpu_flags(info) == frozenset({"fpu", "avx2", "amx_bf16"})
    assert hardware.cpu_flags(tmp_path / "missing") is None
    (tmp_path / "arm").write_text("processor\t: 0\nFeatures\t: fp asimd\n")
    assert hardware.cpu_flags(tmp_path / "arm") is None
    assert hardware.slow_dtype_warning("bfloat16", flags=None) == hardware.slow_dtype_warning(
        "bfloat16", flags=hardware.cpu_flags())                           # None: this host's own flags
