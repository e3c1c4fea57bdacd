"""The learner: one HF policy (plus a frozen reference when ``klCoef > 0``), AdamW, and the GRPO train step.

Role: the trainer role loop (``trainer/loop.py``) builds one ``Trainer`` per trainer rank and, per step, calls
``train_step(groups=...)`` with this rank's share of the scored groups (from ``buffer.RolloutBuffer.take``). Rank 0
then streams ``named_tensors()`` to the generators (``weightsync``; every other rank calls ``follow_sync()`` at the
same moment, since a sharded tensor is gathered by all ranks) and every rank calls ``save_checkpoint`` every
``checkpoint.everySteps``. At start every rank calls ``resume`` once. Design: docs/trainer.md.

One step on every rank::

    rows (batch.py) -> all-reduce [loss denominator] -> micro-batches by microBatchTokens
      -> per micro-batch: forward in the compute dtype (policy.py: completion-only, chunked LM head)
         (+ reference logprobs) -> loss variant (grpo/registry.py) -> backward of sum * world / global_denominator
      -> all-reduce [stats] -> DDP: all-reduce gradients (mean) | FSDP: reduce-scattered in the last backward
      -> clip grad norm -> AdamW on float32 masters -> policy_version += 1

Invariants:
- The loss is the exact loss of the union of all ranks' groups, whatever the micro-batching (denominators are
  pure functions of the masks, reduced before any forward).
- Every rank issues the same collectives in the same order, even with no groups: under FSDP every rank runs the
  same number of micro-batches (a rank with fewer runs zero-weighted ones), so all ranks take the same number of
  optimizer steps. DDP replicas stay bit-identical (same start weights: rank 0's are broadcast at construction).
- Parameters and AdamW state are float32 whatever ``dtype`` (the compute dtype) is: see ``precision``. Unsharded
  with a bf16/fp16 ``dtype``, micro-batches run on ``compute_copy.Shadow`` (a compute-dtype copy refreshed after each
  ``optimizer.step()`` and after a resume; gradients land in the float32 masters).
- ``policy_version`` counts optimizer steps since the base model (0 = base weights); it is stamped on the weights
  pushed to the generators and saved in checkpoints together with ``step`` and the caller's data cursor.
- Logprob convention: see ``logprobs``: ``log_softmax(logits / logit_temperature)`` truncated as the sampler's
  topK/topP (``truncation``, from ``algorithm``), the generator's processed logprobs; pass
  ``logit_temperature=spec.algorithm.temperature`` (1.0 when it is 0). The reference model's logprobs (klCoef > 0)
  are untruncated: KL(policy || reference) stays finite when the two kept sets differ.
- Mismatch (``grpo/mismatch``): the step's forwards run on the pre-update weights, so their logprobs against the
  behaviour logprobs are the trainer–sampler mismatch, reported per step (``logprob_mismatch_kl``, ...).
"""
from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import transformers

from kubeforge.api import progress, rljob
from kubeforge.runtime import types
from kubeforge.runtime.grpo import inputs, mismatch, overlong, registry
from kubeforge.runtime.learner import batch, checkpoint, compiled, compute_copy, dynamic_sampling, hf_export, logprobs
from kubeforge.runtime.learner import lora, malloc, materialise, parallel, persist, policy, precision, schedule
from kubeforge.runtime.learner import sharding, truncation, utilisation
from kubeforge.runtime.models import adapter

DTYPES = precision.DTYPES
ADAPTER = "adapter"     # the LoRA adapter's folder inside an export


def load_model(*, path: str | Path, dtype: str, device: torch.device) -> torch.nn.Module:
    """An HF causal LM from a folder (``models.resolve(spec)`` gives it), on ``device``."""
    model: torch.nn.Module = transformers.AutoModelForCausalLM.from_pretrained(
        str(path), dtype=precision.compute_dtype(dtype))
    return model.to(device)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Scale:
    """How the trainer lays out and runs the model (``spec.roles.trainer`` and ``spec.model``)."""

    sharding: str = sharding.DDP
    micro_batch_tokens: int | None = None
    activation_checkpointing: bool = False
    compile: bool = False           # torch.compile of the compute module's decoder blocks (compiled.py)

    @classmethod
    def from_spec(cls, role: rljob.TrainerRole) -> Scale:
        return cls(sharding=str(role.sharding), micro_batch_tokens=role.micro_batch_tokens,
                   activation_checkpointing=role.activation_checkpointing, compile=role.compile)


class Trainer:
    """Policy + optimizer + GRPO step for one data-parallel rank (see module docstring)."""

    def __init__(self, *, model_path: str | Path, algorithm: rljob.AlgorithmSpec, dtype: str = "float32",
                 group: parallel.DataParallel | None = None, device: str = "cpu",
                 logit_temperature: float = 1.0, scale: Scale | None = None,
                 lora: rljob.LoraSpec | None = None, compile_backend: compiled.Backend = "inductor",
                 trainer_epoch: int = 0) -> None:
        malloc.return_freed_memory()     # freed tensors leave the process's RSS (malloc.py; every rank, any sharding)
        self.device = torch.device(device)
        self.trainer_epoch = trainer_epoch   # stamped on checkpoints; claims the store at resume (docs/fencing.md)
        self.group = group or parallel.DataParallel(config=parallel.DistConfig(), device=self.device)
        self.scale = scale or Scale()
        self.variant = registry.variant_for(algorithm.loss)
        self.settings = inputs.LossSettings.from_spec(algorithm)
        self.overlong = overlong.Overlong.from_spec(algorithm)     # DAPO's overlong punishment, or None
        self.max_grad_norm = algorithm.max_grad_norm
        self.max_policy_lag = algorithm.max_policy_lag
        self.logit_temperature = logit_temperature
        self.model_path = Path(model_path)
        self.compute_dtype = precision.compute_dtype(dtype)
        self.sharded = self.scale.sharding == sharding.FSDP and self.group.world_size > 1
        self.lora = lora
        self.model = self._build_model()
        self.reference = self._reference(dtype=dtype)
        self.truncation = truncation.Truncation.of(temperature=algorithm.temperature, top_k=algorithm.top_k,
                                                   top_p=algorithm.top_p)   # the sampler's (logprobs)
        self.policy = policy.Policy(self.model, temperature=logit_temperature, truncation=self.truncation)
        self._place_weights()
        self.params = [p for p in self.policy.parameters() if p.requires_grad]
        # bf16/fp16 compute on a replicated policy: a compute-dtype copy cast once per optimizer step (compute_copy.py)
        self.shadow: compute_copy.Shadow | None = None
        if not self.sharded and self.compute_dtype != precision.MASTER:
            self.shadow = compute_copy.Shadow(self.policy, dtype=self.compute_dtype)
        self._tune_cpu_kernels()
        # the step's FLOPs as run and this process's GEMM peak in the compute dtype (utilisation.py: ``mfu``)
        self.meter = utilisation.Meter(
            config=self.model.config, lora=lora, device=self.device, dtype=self.compute_dtype,
            modules=[self.compute_policy.lm, *([self.reference] if self.reference is not None else [])])
        # compiled: compiled blocks not yet through a whole step (a failure then falls back to eager, once)
        self.compile_state = ""
        if self.scale.compile and not self.sharded:
            compiled.compile_blocks(self.compute_policy.lm, backend=compile_backend)
            self.compile_state = "pending"
        self.base_lr = algorithm.learning_rate
        self.lr_schedule = algorithm.learning_rate_schedule
        self.total_steps = algorithm.steps
        self.optimizer = precision.adamw(self.params, lr=algorithm.learning_rate,
                                         weight_decay=algorithm.weight_decay, device=self.device)
        pad = getattr(self.model.config, "pad_token_id", None)
        self.pad_id = int(pad) if isinstance(pad, int) else 0
        self.step = 0
        self.policy_version = 0
        self._mismatch = [0.0, 0.0, 0.0, 0.0]     # this step's (``_measure``)
        self._stream: sharding.Stream | None = None     # the last stream handed out (see complete_sync)

    def _build_model(self) -> torch.nn.Module:
        """The trained module: float32 masters (on meta when sharded: each rank materialises its shards only, in
        :meth:`_place_weights`), LoRA adapters attached, blocks checkpointed as asked, in train mode."""
        if self.sharded:
            model = materialise.empty(self.model_path)
        else:
            model = load_model(path=self.model_path, dtype="float32", device=self.device)
        if self.lora is not None:
            lora.attach(model, self.lora)
        if self.scale.activation_checkpointing:
            sharding.checkpoint_blocks(model)
        model.train()
        return model

    def _reference(self, *, dtype: str) -> torch.nn.Module | None:
        """The frozen reference policy (``klCoef > 0``), in the compute dtype; None without a KL term."""
        if self.settings.kl_coef <= 0:
            return None
        reference = load_model(path=self.model_path, dtype=dtype, device=self.device).eval()
        reference.requires_grad_(False)
        return reference

    def _place_weights(self) -> None:
        """Sharded: FSDP2 over the ranks, each loading its shards (fresh adapters once they have storage).
        Replicated: rank 0's weights on every rank."""
        if self.sharded:
            sharding.shard(self.policy, lm=self.model, world_size=self.group.world_size, device=self.device,
                           compute_dtype=self.compute_dtype)
            materialise.load(self.model, path=self.model_path, device=self.device, skip=adapter.is_adapter)
            if self.lora is not None:
                lora.initialise(self.model)
        else:
            self.group.broadcast_tensors([p for p in self.model.parameters()])

    def _tune_cpu_kernels(self) -> None:
        """Replicated on CPU: eager attention for short rows of a bf16/fp16 copy (recompute runs the same kernel),
        and each group's prompt once, in any compute dtype (logprobs "Shared prompts")."""
        if self.sharded or self.device.type != "cpu":
            return
        if self.shadow is not None and not self.scale.activation_checkpointing:
            self.compute_policy.eager_attention_max_tokens = policy.EAGER_ATTENTION_MAX_TOKENS
        self.compute_policy.pack_max_tokens = logprobs.PACK_MAX_TOKENS

    # ------------------------------------------------------------ training

    def train_step(self, *, groups: Sequence[types.RolloutGroup],
                   sampling: dynamic_sampling.StepCounts | None = None) -> progress.StepMetrics:
        """One optimizer step on this rank's ``groups`` (possibly none), averaged with every other rank.
        ``sampling``: dynamic sampling's counts of this rank's step (every rank passes them, or none does)."""
        self.meter.refresh()      # before the clock: a peak probed too low is probed again (utilisation.Meter)
        clock = _Clock()
        whole, acc, denominator = self._gradients(groups, clock=clock)
        local = [*acc, float(whole.rewards.sum()), float(whole.rows), float(whole.zero_signal_groups),
                 float(len(groups)), *self._mismatch[:3], float(self.compute_policy.outside.take()),
                 self.meter.take(), self.meter.peak]
        ds = sampling or dynamic_sampling.StepCounts()
        if sampling is not None:    # the groups screened out count in mean_reward; the counts sum over ranks
            local += [ds.screened_reward, float(ds.screened_completions), float(ds.resampled), float(ds.unfilled)]
            ds.rounds = int(self.group.all_reduce_max([float(ds.rounds)])[0])
        g = self.group.all_reduce_sum(local)
        max_ratio = self.group.all_reduce_max([self._mismatch[3]])[0]
        reward_sum, completions = g[6], g[7]
        if sampling is not None:
            reward_sum, completions = g[6] + g[16], g[7] + g[17]
            ds.resampled, ds.unfilled = int(g[18]), int(g[19])
        if not self.sharded:
            self.group.average_gradients(self.params)
        clock.lap("allreduce")
        grad_norm, lr = self._update()
        clock.lap("optimizer")
        tok = max(g[1], 1.0)
        seconds = clock.totals()
        use = utilisation.figures(step_flops=g[14], peak_flops_per_second=g[15], seconds=seconds["total"])
        self.meter.settle(mfu=use["mfu"])
        return progress.StepMetrics(
            step=self.step, policy_version=self.policy_version, loss=g[0] / denominator, kl=g[4] / tok,
            clip_fraction=g[2] / tok, ratio_mean=g[3] / tok, entropy=g[5] / tok, grad_norm=grad_norm,
            mean_reward=reward_sum / max(completions, 1.0), groups=int(g[9]), completions=int(g[7]),
            tokens=int(g[1]), zero_signal_groups=int(g[8]), seconds=seconds, learning_rate=lr,
            resampled_groups=ds.resampled, unfilled_groups=ds.unfilled, resample_rounds=ds.rounds,
            logprob_mismatch_kl=g[10] / tok, logprob_mismatch_max_ratio=max_ratio,
            mismatch_masked_fraction=g[11] / max(g[12], 1.0), truncation_outside_tokens=int(g[13]), **use)

    def _gradients(self, groups: Sequence[types.RolloutGroup], *, clock: _Clock
                   ) -> tuple[batch.Batch, list[float], float]:
        """Collate this rank's ``groups``, agree on the loss denominator and the number of micro-batches, and run
        every forward and backward (gradients into the masters). Returns the whole batch, the summed loss
        statistics and the global denominator."""
        floor = self.policy_version - self.max_policy_lag    # partial rollouts: older tokens are masked out
        rows = batch.rows_of(groups=groups, scale_by_std=self.variant.scale_advantages_by_std,
                             overlong=self.overlong, min_version=floor)
        whole = batch.collate(groups=groups, pad_id=self.pad_id,
                              scale_by_std=self.variant.scale_advantages_by_std, min_version=floor)
        local_den = self.variant.denominator(mask=whole.completion_mask) if rows else 0.0
        micro = batch.micro_batches(rows=rows, pad_id=self.pad_id, max_tokens=self.scale.micro_batch_tokens)
        clock.lap("collate")
        denominator = self.group.all_reduce_sum([local_den])[0]
        runs = len(micro)
        if self.sharded:      # every rank must run as many forward/backward passes (FSDP's collectives)
            runs = int(self.group.all_reduce_max([float(len(micro))])[0])
        clock.lap("allreduce")
        if denominator <= 0:
            raise ValueError("train_step: no completion tokens on any trainer rank")
        self.optimizer.zero_grad(set_to_none=True)
        scale = self.group.world_size / denominator
        try:
            acc = self._accumulate(micro, runs=runs, scale=scale, clock=clock)
        except Exception as exc:          # noqa: BLE001 - only the first compiled step retries, then it re-raises
            if self.compile_state != "pending":
                raise
            self._fall_back_to_eager(exc)
            acc = self._accumulate(micro, runs=runs, scale=scale, clock=clock)
        if self.compile_state == "pending":
            self.compile_state = "compiled"
        return whole, acc, denominator

    def _update(self) -> tuple[float, float]:
        """Clip, then AdamW at this step's scheduled rate; the step and the policy version advance. Returns the
        gradient norm before clipping and the rate."""
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        if sharding.is_sharded(grad_norm):
            grad_norm = grad_norm.full_tensor()  # type: ignore[attr-defined]
        lr = self.base_lr * schedule.factor(self.lr_schedule, step=self.step, steps=self.total_steps)
        for pg in self.optimizer.param_groups:
            pg["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.shadow is not None:
            self.shadow.refresh()
        self.step += 1
        self.policy_version += 1
        return float(grad_norm), lr

    def _accumulate(self, micro: list[batch.Batch], *, runs: int, scale: float,
                    clock: _Clock) -> list[float]:
        """Forward and backward of every micro-batch (gradients into the masters); the summed loss statistics."""
        acc = [0.0] * 6          # loss total, tokens, clip*tokens, ratio*tokens, kl*tokens, entropy sum
        self._mismatch = [0.0, 0.0, 0.0, 0.0]     # k3 sum, masked completions, completions, max ratio
        self.compute_policy.outside.take()
        for i in range(runs):
            real = i < len(micro)
            mb = micro[i] if real else _filler(self.pad_id)
            sharding.set_gradient_sync(self.policy, i == runs - 1)
            out, entropy = self._micro_loss(mb, real=real)
            clock.lap("forward")
            torch.autograd.backward([out.total * (scale if real else 0.0)])
            clock.lap("backward")
            if real:
                n = out.tokens
                for k, v in enumerate((float(out.total.detach()), float(n), out.clip_fraction * n,
                                       out.ratio_mean * n, out.kl * n, entropy)):
                    acc[k] += v
        return acc

    def _fall_back_to_eager(self, exc: BaseException) -> None:
        """The first compiled step failed (compiled.py): blocks back to eager, partial gradients dropped."""
        print(f"trainer: torch.compile failed ({type(exc).__name__}: {str(exc)[:300]}); "
              "spec.roles.trainer.compile falls back to eager", file=sys.stderr, flush=True)
        compiled.uncompile_blocks(self.compute_policy.lm)
        self.compile_state = "failed"
        self.meter.take()       # the failed attempt's passes: the retry counts its own
        self.optimizer.zero_grad(set_to_none=True)
        self.compute_policy.zero_grad(set_to_none=True)

    @property
    def compute_policy(self) -> policy.Policy:
        """The module each micro-batch runs: the compute-dtype copy when there is one, else the policy."""
        if self.shadow is not None:
            return self.shadow.module  # type: ignore[return-value]
        return self.policy

    def _micro_loss(self, mb: batch.Batch, *, real: bool = True) -> tuple[inputs.LossOutput, float]:
        # FSDP casts through its own policy, the shadow is already in the compute dtype: autocast only otherwise
        autocast = torch.float32 if self.sharded or self.shadow is not None else self.compute_dtype
        with precision.autocast(device=self.device, dtype=autocast):
            logp, entropy = self.compute_policy.run(mb, device=self.device)
        positions = int(mb.completion_mask.sum())        # the LM head runs at completion positions only
        self.meter.head(positions=positions, backward=True)
        ref = None
        if self.reference is not None:
            self.meter.head(positions=positions, backward=False)
            with torch.no_grad():
                ref = logprobs.completion_logprobs(model=self.reference, batch=mb,
                                                   temperature=self.logit_temperature, device=self.device).logp
        loss_in = inputs.LossInputs(logp=logp, behaviour_logp=mb.behaviour_logp.to(self.device),
                                    mask=mb.completion_mask.to(self.device),
                                    advantages=mb.advantages.to(self.device), ref_logp=ref)
        if real:
            self._measure(loss_in)
        return self.variant.loss(batch=loss_in, settings=self.settings), float(entropy)

    def _measure(self, b: inputs.LossInputs) -> None:
        """Add a micro-batch's trainer–sampler mismatch (before the update: ``grpo/mismatch``) to the step's."""
        mask = b.mask.to(torch.float32)
        lr = mismatch.log_ratio(logp=b.logp, behaviour_logp=b.behaviour_logp, mask=mask)
        keep = mismatch.keep_of(log_ratio=lr, mask=mask, level=self.settings.mismatch_mask_level,
                                threshold=self.settings.mismatch_mask_threshold)
        st = mismatch.stats(logp=b.logp, behaviour_logp=b.behaviour_logp, mask=mask, keep=keep)
        self._mismatch[0] += st.kl_sum
        self._mismatch[1] += st.masked
        self._mismatch[2] += st.rows
        self._mismatch[3] = max(self._mismatch[3], st.max_ratio)

    # ------------------------------------------------------------ weights out

    def named_tensors(self) -> sharding.Stream:
        """(HF parameter name, full tensor in the compute dtype) of every policy parameter, gathered lazily (a
        ``weightsync.TensorStream``: its ``meta`` first). Tied weights appear once (under the embedding's name),
        as ``named_parameters`` reports them. With LoRA: the adapters only (``...q_proj.lora_A.weight``, ...).
        Sharded: every rank must iterate it (see :meth:`follow_sync`)."""
        self._stream = sharding.Stream(sharding.unique_named(self.model, trainable_only=self.lora is not None),
                                       dtype=self.compute_dtype)
        return self._stream

    def follow_sync(self) -> None:
        """A non-zero rank's part of a weight push: take part in every gather rank 0's stream makes."""
        if self.sharded:
            self.named_tensors().drain()

    def complete_sync(self) -> None:
        """Rank 0, after a push (sent, failed half way, or skipped): finish the gathers of the push's stream, or
        make them all if none was taken, so the other ranks' :meth:`follow_sync` always completes."""
        if self.sharded:
            (self._stream or self.named_tensors()).drain()
        self._stream = None

    @property
    def saves_alone(self) -> bool:
        """Rank 0 can write a checkpoint without the other ranks (everything but a sharded model)."""
        return not self.sharded

    def any_rank(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is True on any (an all-reduce; e.g. a stop request)."""
        return bool(self.group.all_reduce_max([1.0 if flag else 0.0])[0] > 0)

    def agree(self, value: Any) -> Any:
        """Rank 0's JSON ``value`` on every rank (a broadcast; what rank 0 decided, e.g. an export request)."""
        return self.group.broadcast_json(value)

    def export(self, *, directory: str | Path) -> Path | None:
        """Write the policy as an HF folder ``<directory>/export-step-N`` (every rank calls it: sharded tensors are
        gathered by all; rank 0 writes). With LoRA the folder holds the merged model and ``adapter/`` the adapter
        (PEFT layout). Returns the folder on rank 0, None elsewhere; an existing one is kept."""
        target = Path(directory) / hf_export.dir_name(self.step)
        if self.group.broadcast_json(target.is_dir() if self.group.is_main else None):
            return target if self.group.is_main else None
        self._stream = None
        named = sharding.unique_named(self.model)
        metas = sharding.Stream(named, dtype=self.compute_dtype).meta     # shapes only: nothing gathered
        if self.lora is not None:
            metas = [e for e in metas if not adapter.is_adapter(e.name)]
            tensors: Iterator[tuple[str, torch.Tensor]] = lora.merged_tensors(self.model, dtype=self.compute_dtype)
            adapter_tensors = self._adapter_tensors()
        else:
            adapter_tensors = []
            tensors = iter(sharding.Stream(named, dtype=self.compute_dtype))
        if not self.group.is_main:
            for _ in tensors:
                pass
            return None
        sizes = [math.prod(e.shape) * torch.empty((), dtype=e.dtype).element_size() for e in metas]
        spec = self.lora

        def side(tmp: Path) -> None:
            if spec is not None:
                adapter.save_adapter(tmp / ADAPTER, adapter_tensors,
                                     config=adapter.adapter_config(spec, base=str(self.model_path)))
        return hf_export.write(target=target, tensors=tensors, sizes=sizes, config=self.model.config,
                                source=self.model_path, dtype=self.compute_dtype, side=side)

    def _adapter_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """The LoRA adapters, gathered and copied (MBs: the adapters only); no stream is left handed out."""
        stream = self.named_tensors()
        self._stream = None
        return [(n, t.clone()) for n, t in stream]

    # ------------------------------------------------------------ checkpoints

    def save_checkpoint(self, *, directory: str | Path, keep: int, data_cursor: int,
                        extra: Mapping[str, Any] | None = None) -> Path | None:
        """Write a checkpoint of this step: rank 0 alone (DDP), or every rank its shards (FSDP: call on every
        rank). Returns the folder on rank 0, None elsewhere. ``data_cursor`` and ``extra`` (JSON) are the role
        loop's and come back from :meth:`resume`."""
        state = {"step": self.step, "policy_version": self.policy_version, "data_cursor": data_cursor,
                 "rng": checkpoint.capture_rng(), "extra": dict(extra or {})}
        return persist.save(self._parts(), directory=directory, keep=keep, step=self.step, state=state)

    def resume(self, *, directory: str | Path) -> dict[str, Any] | None:
        """Restore the newest complete checkpoint under ``directory`` (found and verified by rank 0). Returns its
        state (``step``, ``policy_version``, ``data_cursor``, ``extra``), or None when there is none."""
        state = persist.restore(self._parts(), directory=directory)
        if state is None:
            return None
        if self.shadow is not None:
            self.shadow.refresh(trainable_only=False)
        self.step = int(state["step"])
        self.policy_version = int(state["policy_version"])
        checkpoint.restore_rng(state["rng"])
        return state

    def _parts(self) -> persist.Parts:
        return persist.Parts(model=self.model, policy=self.policy, optimizer=self.optimizer, params=self.params,
                             group=self.group, layout=self.scale.sharding, epoch=self.trainer_epoch)


def _filler(pad_id: int) -> batch.Batch:
    """A one-row, one-token batch whose loss is weighted 0: keeps a rank's FSDP collectives in step."""
    filler = types.Completion(token_ids=types.token_array([pad_id]), logprobs=types.logprob_array([0.0]), text="")
    row = batch.Row(prompt=[pad_id], completion=filler, advantage=0.0, reward=0.0)
    return batch.collate_rows(rows=[row], pad_id=pad_id)


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
