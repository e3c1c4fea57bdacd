"""How close a train step came to the machine's limit: its FLOPs as run, over its time, over the measured peak.

Role: ``step.Trainer`` builds one :class:`Meter` over the modules a step runs (the compute policy, the reference
model if any); a forward pre-hook on each one's decoder records every decoder pass (``flops.Work``) and the step
adds the LM head's positions (:meth:`Meter.head`). At the end of a step the trainer all-reduces this rank's
:meth:`Meter.take` (FLOPs) and ``peak`` (its measured GEMM FLOP/s) and :func:`figures` turns the sums and the
step's wall time into ``StepMetrics``' ``flops``, ``flops_per_second``, ``peak_flops_per_second`` and ``mfu``.
Neighbours: ``flops`` (the count, pure), ``peak`` (the probe).

Invariant: ``mfu = sum of ranks' FLOPs / step seconds / sum of ranks' peaks``: the step's FLOP/s against what the
ranks' cores could do in the same time in the same dtype.
"""
from __future__ import annotations

from typing import Any

import torch

from kubeforge.api import rljob
from kubeforge.runtime.learner import flops, peak


class Meter:
    """Counts one step's FLOPs on this rank (module docstring)."""

    def __init__(self, *, config: Any, modules: list[torch.nn.Module], lora: rljob.LoraSpec | None,
                 device: torch.device, dtype: torch.dtype) -> None:
        self.shape = flops.Shape.of(config)
        self.training = flops.Training(base_trained=lora is None, lora_rank=lora.rank if lora else 0,
                                       lora_targets=tuple(lora.target_modules) if lora else ())
        self.work = flops.Work()
        self.device, self.dtype = device, dtype
        self.peak = peak.gemm_flops_per_second(device=device, dtype=dtype)
        self._peak_low = False      # the last step ran faster than the peak: probe again before the next (settle)
        for module in modules:
            decoder: torch.nn.Module = module.get_decoder()  # type: ignore[operator]
            decoder.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = kwargs.get("inputs_embeds")
        if x is None:
            x = kwargs.get("input_ids", args[0] if args else None)
        if x is None:
            return
        rows, queries = int(x.shape[0]), int(x.shape[1])
        past = kwargs.get("past_key_values")
        cached = int(past.get_seq_length()) if past is not None else 0
        self.work.decoder(rows=rows, queries=queries, keys=queries + cached, backward=torch.is_grad_enabled())

    def head(self, *, positions: int, backward: bool) -> None:
        """The LM head ran over ``positions`` (and will run its backward when ``backward``)."""
        self.work.head(positions=positions, backward=backward)

    def settle(self, *, mfu: float | None) -> None:
        """After a step: an ``mfu`` above 1 means the peak was probed while something else held the cores (in
        Colocated mode the trainer is built while the engine starts beside it); :meth:`refresh` probes again."""
        self._peak_low = mfu is not None and mfu > 1.0

    def refresh(self) -> None:
        """Before a step, outside its clock: probe the peak again if the last step showed it too low (the best
        probe is kept, so a busy moment never lowers it)."""
        if self._peak_low:
            self.peak = peak.remeasure(device=self.device, dtype=self.dtype)
            self._peak_low = False

    def take(self) -> float:
        """This rank's FLOPs since the last call."""
        done = flops.step_flops(self.shape, self.work, self.training)
        self.work = flops.Work()
        return float(done)


def figures(*, step_flops: float, peak_flops_per_second: float, seconds: float) -> dict[str, float | None]:
    """``StepMetrics``' utilisation fields from the ranks' summed FLOPs and peaks and the step's wall seconds."""
    achieved = step_flops / seconds if seconds > 0 else None
    mfu = achieved / peak_flops_per_second if achieved is not None and peak_flops_per_second > 0 else None
    return {"flops": step_flops, "flops_per_second": achieved, "peak_flops_per_second": peak_flops_per_second,
            "mfu": mfu}
