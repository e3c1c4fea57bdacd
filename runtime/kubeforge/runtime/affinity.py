"""CPU pinning of a role process: ``KUBEFORGE_CPUS`` ("0,2-3") -> affinity and thread pools of that size.

Role: ``spec.schedule.mode: Disaggregated`` gives each role its own cores. The local launcher writes the CPU list
of every process into the env contract (``launcher.placement``); the role applies it first thing in
``role.run``, before torch or vLLM start a thread pool, so every thread they make inherits the mask and the
pools are as wide as the cores the role owns (no oversubscription). Without the variable nothing changes.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence

from kubeforge.api import contract

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def parse(text: str) -> list[int]:
    """``"0,2-3"`` -> ``[0, 2, 3]`` (ValueError names the variable on anything else)."""
    out: set[int] = set()
    try:
        for part in (p.strip() for p in text.split(",")):
            lo, sep, hi = part.partition("-")
            first, last = int(lo), int(hi) if sep else int(lo)
            if first < 0 or last < first:
                raise ValueError(part)
            out.update(range(first, last + 1))
    except ValueError:
        raise ValueError(f"{contract.ENV_CPUS}: Invalid value: {text!r}: expected CPU ids like 0,2-3") from None
    return sorted(out)


def render(cpus: Iterable[int]) -> str:
    """``[0, 2, 3]`` -> ``"0,2,3"`` (what :func:`parse` reads)."""
    return ",".join(str(c) for c in sorted(set(cpus)))


def apply(cpus: Sequence[int], *, environ: dict[str, str] | None = None) -> None:
    """Pin this process to ``cpus`` and size the thread pools to them (torch's too if it is imported already)."""
    env = os.environ if environ is None else environ
    os.sched_setaffinity(0, set(cpus))
    for var in THREAD_VARS:
        env[var] = str(len(cpus))
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(len(cpus))


def apply_text(text: str | None) -> list[int] | None:
    """:func:`apply` the contract's CPU list (``RoleConfig.cpus``) when it is set; returns it (None: not set,
    nothing changed)."""
    text = (text or "").strip()
    if not text:
        return None
    cpus = parse(text)
    apply(cpus)
    return cpus
