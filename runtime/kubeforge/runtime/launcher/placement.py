"""Which CPUs each local role process may use (``spec.schedule``): pure, from the CPUs the launcher may use.

- Overlapped, Colocated: no pinning (every process sees every core; Colocated keeps them from running at once
  through the trainer's schedule, ``roles.trainer``).
- Disaggregated: generators and verifiers on the first ``generatorCpus`` CPUs (default half, at least one), the
  trainers on the rest; each process gets its side's list in ``KUBEFORGE_CPUS`` (``runtime.affinity``).

Thread pools (:func:`threads`): under Colocated the generator samples while the trainer waits, so its phase has
every core; vLLM on CPU serves with one torch thread unless ``OMP_NUM_THREADS`` says otherwise, so each generator
is told its share of the launcher's CPUs (all of them for one generator; generators sample at the same time). Overlapped keeps vLLM's single thread (the trainer computes beside it); Disaggregated
sizes every pool to the pinned list already.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from kubeforge.api import rljob

GENERATOR_SIDE = ("generator", "verifier")


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity mask, not the machine's count)."""
    return sorted(os.sched_getaffinity(0))


def problems(schedule: rljob.ScheduleSpec, *, cpus: Sequence[int]) -> list[str]:
    """What makes ``schedule`` impossible on ``cpus`` (one message per problem, naming the field)."""
    if schedule.mode != rljob.ScheduleMode.DISAGGREGATED:
        return []
    if len(cpus) < 2:
        return [f"spec.schedule.mode: Invalid value: 'Disaggregated': needs at least 2 CPUs here, this launcher "
                f"may use {len(cpus)}"]
    n = schedule.generator_cpus
    if n is not None and n >= len(cpus):
        return [f"spec.schedule.generatorCpus: Invalid value: {n}: must leave the trainers at least one of the "
                f"{len(cpus)} CPUs this launcher may use"]
    return []


def plan(schedule: rljob.ScheduleSpec, *, cpus: Sequence[int]) -> Mapping[str, list[int]]:
    """Role -> its CPU list; empty when the mode pins nothing. ValueError when :func:`problems` has any."""
    bad = problems(schedule, cpus=cpus)
    if bad:
        raise ValueError("; ".join(bad))
    if schedule.mode != rljob.ScheduleMode.DISAGGREGATED:
        return {}
    ordered = sorted(cpus)
    n = schedule.generator_cpus or max(1, len(ordered) // 2)
    generator_side, trainer_side = ordered[:n], ordered[n:]
    return {**{r: generator_side for r in GENERATOR_SIDE}, "trainer": trainer_side}


def threads(schedule: rljob.ScheduleSpec, *, cpus: Sequence[int], generators: int = 1) -> Mapping[str, int]:
    """Role -> the width of each of its processes' thread pools (``OMP_NUM_THREADS``) where the mode decides one
    (``generators``: how many generator processes share ``cpus``); empty otherwise."""
    if schedule.mode != rljob.ScheduleMode.COLOCATED:
        return {}
    return {"generator": max(1, len(cpus) // max(1, generators))}
