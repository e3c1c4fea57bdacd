"""The learner: one HF policy (plus a frozen reference when ``klCoef > 0``), AdamW, and the GRPO train step.

Role: the trainer role loop (``roles/trainer.py``) builds one ``Trainer`` per trainer rank and, per step, calls
``train_step(groups=...)`` with this rank's share of the scored groups (from ``buffer.RolloutBuffer.take``). Rank 0
then streams ``named_tensors()`` to the generators (``weightsync``) and calls ``save_checkpoint`` every
``checkpoint.everySteps``. At start every rank calls ``resume`` once.

One step on every rank::

    collate (batch.py) -> forward: current logprobs (+ reference logprobs) -> loss variant (grpo/registry.py)
      -> all-reduce [loss denominator, stats] -> backward of total * world / global_denominator
      -> all-reduce gradients (mean) -> clip grad norm -> AdamW step -> policy_version += 1

Invariants:
- The loss is the exact loss of the union of all ranks' groups (denominators are reduced before backward).
- Every rank issues the same collectives in the same order, even with no groups, so all ranks take the same number
  of optimizer steps and stay bit-identical (same start weights: rank 0's are broadcast at construction).
- ``policy_version`` counts optimizer steps since the base model (0 = base weights); it is stamped on the weights
  pushed to the generators and saved in checkpoints together with ``step`` and the caller's data cursor.
- Logprob convention: see ``logprobs``: ``log_softmax(logits / logit_temperature)``, the generator's processed
  logprobs; pass ``logit_temperature=spec.algorithm.temperature`` (1.0 when it is 0).
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import transformers

from kubeforge.api import rljob
from kubeforge.runtime import types
from kubeforge.runtime.grpo import inputs, registry
from kubeforge.runtime.trainer import batch as batch_mod
from kubeforge.runtime.trainer import checkpoint, logprobs, metrics, parallel

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_model(*, path: str | Path, dtype: str, device: torch.device) -> torch.nn.Module:
    """An HF causal LM from a folder (``models.resolve(spec)`` gives it), on ``device``."""
    model: torch.nn.Module = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=DTYPES[dtype])
    return model.to(device)


class Trainer:
    """Policy + optimizer + GRPO step for one data-parallel rank (see module docstring)."""

    def __init__(self, *, model_path: str | Path, algorithm: rljob.AlgorithmSpec, dtype: str = "float32",
                 group: parallel.DataParallel | None = None, device: str = "cpu",
                 logit_temperature: float = 1.0) -> None:
        self.device = torch.device(device)
        self.group = group or parallel.DataParallel(config=parallel.DistConfig(), device=self.device)
        self.variant = registry.variant_for(algorithm.loss)
        self.settings = inputs.LossSettings.from_spec(algorithm)
        self.max_grad_norm = algorithm.max_grad_norm
        self.logit_temperature = logit_temperature
        self.model = load_model(path=model_path, dtype=dtype, device=self.device)
        self.model.train()
        self.reference: torch.nn.Module | None = None
        if self.settings.kl_coef > 0:
            self.reference = load_model(path=model_path, dtype=dtype, device=self.device).eval()
            self.reference.requires_grad_(False)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=algorithm.learning_rate,
                                           weight_decay=algorithm.weight_decay)
        pad = getattr(self.model.config, "pad_token_id", None)
        self.pad_id = int(pad) if isinstance(pad, int) else 0
        self.step = 0
        self.policy_version = 0
        self.group.broadcast_tensors(self.params)

    # ------------------------------------------------------------ training

    def train_step(self, *, groups: Sequence[types.RolloutGroup]) -> metrics.StepMetrics:
        """One optimizer step on this rank's ``groups`` (possibly none), averaged with every other rank."""
        clock = _Clock()
        batch = batch_mod.collate(groups=groups, pad_id=self.pad_id,
                                  scale_by_std=self.variant.scale_advantages_by_std)
        clock.lap("collate")
        out, entropy = self._local_loss(batch) if batch.rows else (None, 0.0)
        clock.lap("forward")
        n_tok = out.tokens if out else 0
        local = [out.denominator if out else 0.0, float(out.total.detach()) if out else 0.0, float(n_tok),
                 (out.clip_fraction * n_tok) if out else 0.0, (out.ratio_mean * n_tok) if out else 0.0,
                 (out.kl * n_tok) if out else 0.0, entropy * n_tok, float(batch.rewards.sum()), float(batch.rows),
                 float(batch.zero_signal_groups), float(len(groups))]
        g = self.group.all_reduce_sum(local)
        clock.lap("allreduce")
        if g[0] <= 0:
            raise ValueError("train_step: no completion tokens on any trainer rank")
        self.optimizer.zero_grad(set_to_none=True)
        if out is not None:
            torch.autograd.backward([out.total * (self.group.world_size / g[0])])
        clock.lap("backward")
        self.group.average_gradients(self.params)
        clock.lap("allreduce")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.policy_version += 1
        clock.lap("optimizer")
        tok = max(g[2], 1.0)
        return metrics.StepMetrics(
            step=self.step, policy_version=self.policy_version, loss=g[1] / g[0], kl=g[5] / tok,
            clip_fraction=g[3] / tok, ratio_mean=g[4] / tok, entropy=g[6] / tok, grad_norm=float(grad_norm),
            mean_reward=g[7] / max(g[8], 1.0), groups=int(g[10]), completions=int(g[8]), tokens=int(g[2]),
            zero_signal_groups=int(g[9]), seconds=clock.totals())

    def _local_loss(self, batch: batch_mod.Batch) -> tuple[inputs.LossOutput, float]:
        cur = logprobs.completion_logprobs(model=self.model, batch=batch, temperature=self.logit_temperature,
                                           device=self.device)
        ref = None
        if self.reference is not None:
            with torch.no_grad():
                ref = logprobs.completion_logprobs(model=self.reference, batch=batch,
                                                   temperature=self.logit_temperature, device=self.device).logp
        loss_in = inputs.LossInputs(logp=cur.logp, behaviour_logp=batch.behaviour_logp.to(self.device),
                                    mask=batch.completion_mask.to(self.device),
                                    advantages=batch.advantages.to(self.device), ref_logp=ref)
        return self.variant.loss(batch=loss_in, settings=self.settings), cur.entropy

    # ------------------------------------------------------------ weights out

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF parameter name, detached tensor) of every policy parameter, for the weight sender. Tied weights
        appear once (under the embedding's name), as ``named_parameters`` reports them."""
        for name, p in self.model.named_parameters():
            yield name, p.detach()

    # ------------------------------------------------------------ checkpoints

    def save_checkpoint(self, *, directory: str | Path, keep: int, data_cursor: int,
                        extra: Mapping[str, Any] | None = None) -> Path | None:
        """Rank 0 writes a checkpoint of this step (others return None). ``data_cursor`` and ``extra`` (JSON) are
        the role loop's and come back from :meth:`resume`."""
        if not self.group.is_main:
            return None
        state = {"step": self.step, "policy_version": self.policy_version, "data_cursor": data_cursor,
                 "rng": checkpoint.capture_rng(), "extra": dict(extra or {})}
        return checkpoint.save(root=directory, step=self.step, model_state=self.model.state_dict(),
                               optimizer_state=self.optimizer.state_dict(), state=state, keep=keep)

    def resume(self, *, directory: str | Path) -> dict[str, Any] | None:
        """Restore the newest complete checkpoint under ``directory`` (read by rank 0, broadcast to the others).
        Returns its state (``step``, ``policy_version``, ``data_cursor``, ``extra``), or None when there is none."""
        loaded = checkpoint.load_latest(directory) if self.group.is_main else None
        if self.group.is_main and loaded is not None:
            self.model.load_state_dict(loaded.model_state)
            self.optimizer.load_state_dict(loaded.optimizer_state)
        state = self.group.broadcast_json(loaded.state if loaded is not None else None)
        if state is None:
            return None
        if self.group.world_size > 1:
            self._ensure_optimizer_state()
            self.group.broadcast_tensors(self.params)
            self.group.broadcast_tensors(self._optimizer_tensors())
        self.step = int(state["step"])
        self.policy_version = int(state["policy_version"])
        checkpoint.restore_rng(state["rng"])
        return dict(state)

    def _ensure_optimizer_state(self) -> None:
        """Materialise AdamW's lazily created state (as AdamW itself would) so every rank has the same tensors."""
        for p in self.params:
            st = self.optimizer.state[p]
            if not st:
                st["step"] = torch.tensor(0.0, dtype=torch.float32)
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    def _optimizer_tensors(self) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        for p in self.params:
            st = self.optimizer.state[p]
            out.extend(st[k] for k in sorted(st) if isinstance(st[k], torch.Tensor))
        return out


class _Clock:
    """Accumulates wall seconds per phase."""

    def __init__(self) -> None:
        self.t0 = self.last = time.perf_counter()
        self.phases: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self.last
        self.last = now

    def totals(self) -> dict[str, float]:
        return {**self.phases, "total": self.last - self.t0}
