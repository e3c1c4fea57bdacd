"""The TRL side of ``bench_vs_trl.py``: TRL's own GRPOTrainer on an RLJob manifest's model, task and settings.

Runs inside TRL's venv (``.venv-trl``, made by ``bench_vs_trl.py``; kubeforge is installed there without its
dependencies only so that both sides draw prompts from the same task stream and score with the same verifiers).

    .venv-trl/bin/python bench/helpers/trl_grpo.py MANIFEST MODEL_DIR OUT.jsonl

What is matched to the kubeforge run: model folder (kubeforge's converted SmolLM2), prompts (``tasks.stream``,
prompts of step s are ``[s*P, (s+1)*P)`` in order, no shuffling), chat template, group size, prompts per step,
max new tokens, temperature, top-p, learning rate and its schedule (kubeforge's own ``learner.schedule.factor``
as a LambdaLR: warm-up, Constant or Cosine, identical per step), weight decay, grad-norm clip, clip epsilon, KL
coefficient, the GRPO loss (per-sequence mean: TRL ``loss_type="grpo"``, rewards scaled by the group's std),
the reward (kubeforge's ``Scorer``: the weighted sum of the manifest's verifiers), dtype (float32, or bfloat16
autocast over float32 masters, TRL's ``bf16=True``) and seed. TRL generates with transformers' ``generate`` on
the same model (its vLLM mode needs a GPU server or a colocated vLLM that its venv cannot hold here).

Writes one JSON line per optimizer step: ``step``, ``time`` (wall clock at the step's end), ``seconds``
{generate, score, train, sync, total}, ``completions``, ``tokens`` (completion tokens), ``mean_reward``,
``learning_rate`` (the rate the optimizer stepped with, as kubeforge's metrics record it).

With ``spec.evaluation`` in the manifest, the policy is evaluated exactly as kubeforge's trainer does it (the
same ``trainer.evaluate.Evaluator``: greedy answers to the same held-out prompts, the same verifier, under the
same autocast) before the first step, every ``everySteps`` and after the last; such a step's line carries
``eval_accuracy`` (the first also ``eval_accuracy_base``) and ``eval_seconds``; the evaluation happens after the
step's ``time`` is taken, as in kubeforge.
"""
from __future__ import annotations

import json
import pathlib
import sys
import time
from typing import Any

import torch
import transformers
import yaml
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from kubeforge.api import rljob
from kubeforge.runtime import types
from kubeforge.runtime.tasks import registry as tasks
from kubeforge.runtime.learner import schedule
from kubeforge.runtime.trainer import evaluate
from kubeforge.runtime.verifiers import registry as verifier_registry
from kubeforge.runtime.verifiers import score


class TimedGRPOTrainer(GRPOTrainer):  # type: ignore[misc]
    """GRPOTrainer that records, per optimizer step, the time spent generating, scoring and the rest (train)."""

    def __init__(self, *args: Any, out: pathlib.Path, lr_factor: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kf_lr_factor = lr_factor       # step (0-based optimizer step) -> multiplier of the learning rate
        self.kf_out = out
        self.kf_phase: dict[str, float] = {"generate": 0.0, "score": 0.0}
        self.kf_tokens = 0
        self.kf_rewards: list[float] = []
        self.kf_step_start = time.perf_counter()
        self.kf_eval: tuple[evaluate.Evaluator, int, int] | None = None   # evaluator, every, last step
        self.kf_eval_base: float | None = None
        self.kf_eval_last: float | None = None
        self.kf_lr_used: float | None = None     # the rate the optimizer stepped with (its pre-step hook)

    def kf_evaluate(self, step: int) -> dict[str, Any]:
        """kubeforge's held-out evaluation when due (step 0: before the first step), as its trainer records it:
        every line carries the latest accuracy, the first also the base one."""
        if self.kf_eval is None:
            return {}
        ev, every, last = self.kf_eval
        out: dict[str, Any] = {}
        if step == 0 or step % every == 0 or step == last:
            res = ev.run()
            self.kf_eval_last = res.accuracy
            if step == 0:
                self.kf_eval_base = res.accuracy
                return {}
            out["eval_seconds"] = res.seconds
        out["eval_accuracy"] = self.kf_eval_last
        if step == 1 and self.kf_eval_base is not None:
            out["eval_accuracy_base"] = self.kf_eval_base
        return out

    def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:  # noqa: ANN401
        """The manifest's learning-rate schedule, step for step as kubeforge's trainer applies it (the scheduler
        has stepped ``s`` times before optimizer step ``s``)."""
        if self.kf_lr_factor is None or self.lr_scheduler is not None:
            return super().create_scheduler(num_training_steps, optimizer)
        opt = optimizer or self.optimizer
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(opt, self.kf_lr_factor)
        inner = getattr(opt, "optimizer", opt)     # accelerate's wrapper has no hooks of its own; its inner does
        inner.register_step_pre_hook(lambda o, *_: setattr(self, "kf_lr_used", o.param_groups[0]["lr"]))
        self._created_lr_scheduler = True
        return self.lr_scheduler

    def _generate(self, prompts: list) -> Any:  # noqa: ANN401
        t0 = time.perf_counter()
        out = super()._generate(prompts)
        self.kf_phase["generate"] += time.perf_counter() - t0
        return out

    def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> Any:
        t0 = time.perf_counter()
        out = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self.kf_phase["score"] += time.perf_counter() - t0
        self.kf_tokens += sum(len(c) for c in completion_ids_list)
        return out

    def kf_step_end(self, step: int) -> None:
        now = time.perf_counter()
        total = now - self.kf_step_start
        gen, sc = self.kf_phase["generate"], self.kf_phase["score"]
        n = len(self.kf_rewards)
        rec = {"step": step, "time": time.time(), "completions": n, "tokens": self.kf_tokens,
               "mean_reward": sum(self.kf_rewards) / max(n, 1), "learning_rate": self.kf_lr_used,
               "seconds": {"generate": gen, "score": sc, "train": total - gen - sc, "sync": 0.0, "total": total}}
        rec.update(self.kf_evaluate(step))
        with self.kf_out.open("a") as fh:
            fh.write(json.dumps(rec) + "\n")
        self.kf_phase = {"generate": 0.0, "score": 0.0}
        self.kf_tokens = 0
        self.kf_rewards = []
        self.kf_step_start = time.perf_counter()


class StepClock(transformers.TrainerCallback):  # type: ignore[misc]
    def __init__(self) -> None:
        self.trainer: TimedGRPOTrainer | None = None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        assert self.trainer is not None
        if state.global_step == 0 and not getattr(self, "started", False):
            self.started = True
            self.trainer.kf_evaluate(0)
            self.trainer.kf_step_start = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        assert self.trainer is not None
        self.trainer.kf_step_end(state.global_step)


def main() -> None:
    manifest, model_dir, out = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
    job = rljob.RLJob.model_validate(yaml.safe_load(pathlib.Path(manifest).read_text()))
    spec, algo = job.spec, job.spec.algorithm
    stream = tasks.stream(spec.task)
    n_prompts = algo.prompts_per_step * algo.steps
    prompts = [stream.prompt_at(k) for k in range(n_prompts)]
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": p.text}] if spec.task.chat_template else p.text,
                               "answer": p.answer, "index": p.index} for p in prompts])
    scorer = score.Scorer(spec.verifiers)
    holder: dict[str, TimedGRPOTrainer] = {}

    def reward(prompts: list[Any], completions: list[Any], answer: list[str], index: list[int],
               **_: Any) -> list[float]:
        out_r: list[float] = []
        for c, a, k in zip(completions, answer, index):
            text = c[-1]["content"] if isinstance(c, list) else str(c)
            group = types.RolloutGroup(prompt=types.Prompt(index=int(k), text="", answer=a), prompt_token_ids=[],
                                       completions=[types.Completion(token_ids=[], logprobs=[], text=text)],
                                       policy_version=0)
            out_r.append(scorer.score_group(group)[0][0])
        holder["t"].kf_rewards.extend(out_r)
        return out_r

    bf16 = spec.model.dtype.value == "bfloat16" if hasattr(spec.model.dtype, "value") else spec.model.dtype == "bfloat16"
    torch.manual_seed(spec.task.seed)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    cfg = GRPOConfig(
        output_dir=str(out.parent / "trl-output"), report_to="none", save_strategy="no", logging_steps=1,
        use_cpu=True, bf16=bf16, seed=spec.task.seed, data_seed=spec.task.seed,
        max_steps=algo.steps, per_device_train_batch_size=algo.prompts_per_step * algo.group_size,
        gradient_accumulation_steps=1, num_generations=algo.group_size, shuffle_dataset=False,
        max_completion_length=algo.max_new_tokens, temperature=algo.temperature, top_p=algo.top_p,
        learning_rate=algo.learning_rate, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=algo.weight_decay, max_grad_norm=algo.max_grad_norm, epsilon=algo.clip_epsilon,
        beta=algo.kl_coef, loss_type="grpo", scale_rewards="group", num_iterations=1,
        dataloader_num_workers=0, disable_tqdm=True, log_completions=False,
    )
    clock = StepClock()
    trainer = TimedGRPOTrainer(model=model, processing_class=tok, reward_funcs=[reward], args=cfg,
                               train_dataset=data, callbacks=[clock], out=out,
                               lr_factor=lambda s: schedule.factor(algo.learning_rate_schedule, step=s, steps=algo.steps))
    holder["t"] = trainer
    if spec.evaluation is not None:
        ev = spec.evaluation
        trainer.kf_eval = (evaluate.Evaluator(
            model=trainer.model, tokenizer=tok, prompts=evaluate.held_out(stream, ev),
            verifier=verifier_registry.build_inner(evaluate.verifier_spec(spec)),
            max_new_tokens=ev.max_new_tokens or algo.max_new_tokens, chat_template=spec.task.chat_template,
            compute_dtype=torch.bfloat16 if bf16 else torch.float32), ev.every_steps, algo.steps)
    clock.trainer = trainer
    out.write_text("")
    trainer.train()


if __name__ == "__main__":
    main()
