"""Loss variants by ``LossType`` (``spec.algorithm.loss``): the only place that maps a name to code.

Each variant also says whether its advantages divide by the group's std (DrGRPO does not).
Neighbours: the trainer calls :func:`variant_for` once at construction.
"""
from __future__ import annotations

import dataclasses
from typing import Protocol

import torch

from kubeforge.api import rljob
from kubeforge.runtime.grpo import dapo, drgrpo, grpo, gspo, inputs


class LossFn(Protocol):
    def __call__(self, *, batch: inputs.LossInputs, settings: inputs.LossSettings) -> inputs.LossOutput: ...


class DenominatorFn(Protocol):
    def __call__(self, *, mask: torch.Tensor) -> float: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class Variant:
    """A loss function, its denominator (a pure function of the completion mask, so a trainer can reduce it over
    micro-batches and ranks before any forward pass) and the advantage normalisation it is defined with."""

    loss: LossFn
    denominator: DenominatorFn
    scale_advantages_by_std: bool


VARIANTS: dict[rljob.LossType, Variant] = {
    rljob.LossType.GRPO: Variant(loss=grpo.loss, denominator=grpo.denominator, scale_advantages_by_std=True),
    rljob.LossType.DR_GRPO: Variant(loss=drgrpo.loss, denominator=drgrpo.denominator, scale_advantages_by_std=False),
    rljob.LossType.DAPO: Variant(loss=dapo.loss, denominator=dapo.denominator, scale_advantages_by_std=True),
    rljob.LossType.GSPO: Variant(loss=gspo.loss, denominator=gspo.denominator, scale_advantages_by_std=True),
}


def variant_for(loss_type: rljob.LossType | str) -> Variant:
    """The variant for a ``LossType`` (or its wire value, e.g. "DrGRPO"); ValueError names the field."""
    try:
        return VARIANTS[rljob.LossType(loss_type)]
    except ValueError:
        known = ", ".join(t.value for t in VARIANTS)
        raise ValueError(f"spec.algorithm.loss: unknown loss {loss_type!r} (known: {known})") from None
