"""spec.roles.trainer.compile (learner/compiled.py): compiled decoder blocks compute the eager step within bf16
rounding, compile once for every block and batch shape, fall back to eager when compiling fails, and leave the
held-out evaluation's generation eager."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

import _trainer_util as util
from kubeforge.api import rljob
from kubeforge.runtime import models, tasks, types
from kubeforge.runtime.learner import batch as batch_mod
from kubeforge.runtime.learner import compiled, step
from kubeforge.runtime.trainer import evaluate


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return util.build_tiny(tmp_path_factory.mktemp("tiny") / "model")


def _counting(inner: Callable[..., Any]) -> tuple[list[int], Callable[..., Any]]:
    """A dynamo backend that counts the graphs it is given and compiles them with ``inner``."""
    seen: list[int] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        seen.append(1)
        return inner(gm, example_inputs)
    return seen, backend


def _eager_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    return gm.forward


def _grads(t: step.Trainer, b: batch_mod.Batch, w: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    t.model.zero_grad(set_to_none=True)
    logp, _ = t.compute_policy.run(b, device=t.device)
    (logp * w).sum().backward()
    return logp.detach(), {n: p.grad.clone() for n, p in t.model.named_parameters() if p.grad is not None}


def _rel(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    num = sum(float(((a[n] - b[n]) ** 2).sum()) for n in b)
    return (num / sum(float((b[n] ** 2).sum()) for n in b)) ** 0.5


def test_scale_reads_the_field() -> None:
    role = rljob.TrainerRole.model_validate({"compile": True})
    assert step.Scale.from_spec(role).compile is True
    assert step.Scale.from_spec(rljob.TrainerRole()).compile is False


def test_inductor_blocks_match_eager_within_bf16_rounding_and_compile_once(tiny: Path) -> None:
    """Stated tolerance: logprobs within 0.02 nats, gradients within 5% (global norm), the steps' losses within 2%;
    both blocks and two batch shapes share the graphs compiled at the first call (dynamic shapes)."""
    from torch._inductor.compile_fx import compile_fx

    torch._dynamo.reset()
    seen, backend = _counting(compile_fx)
    eager = step.Trainer(model_path=tiny, algorithm=util.algorithm(), dtype="bfloat16")
    comp = step.Trainer(model_path=tiny, algorithm=util.algorithm(), dtype="bfloat16",
                        scale=step.Scale(compile=True), compile_backend=backend)
    assert comp.compile_state == "pending" and compiled.is_compiled(comp.compute_policy.lm)
    assert not compiled.is_compiled(comp.policy.lm)          # the float32 masters (evaluation's model) stay eager
    for s in range(2):                                       # two steps: two different batch shapes
        gs = util.synthetic_groups(step=s, prompts=3, group_size=4)
        b = batch_mod.collate(groups=gs, pad_id=eager.pad_id, scale_by_std=True)
        w = torch.randn(b.completion_ids.shape, generator=torch.Generator().manual_seed(s)) * b.completion_mask
        (lp_e, g_e), (lp_c, g_c) = _grads(eager, b, w), _grads(comp, b, w)
        m = b.completion_mask > 0
        assert float((lp_c - lp_e)[m].abs().max()) < 0.02
        assert g_c.keys() == g_e.keys() and _rel(g_c, g_e) < 0.05
        me, mc = eager.train_step(groups=gs), comp.train_step(groups=gs)
        assert mc.loss == pytest.approx(me.loss, rel=0.02, abs=2e-3)
        assert mc.grad_norm == pytest.approx(me.grad_norm, rel=0.05)
    assert comp.compile_state == "compiled"
    assert 1 <= len(seen) <= 2, seen          # one forward graph (+ its backward is compiled inside, not a new one)


def test_a_failing_compile_falls_back_to_eager_and_gives_the_eager_step(tiny: Path,
                                                                        capfd: pytest.CaptureFixture[str]) -> None:
    torch._dynamo.reset()

    def broken(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        raise RuntimeError("no compiler here")

    eager = step.Trainer(model_path=tiny, algorithm=util.algorithm(), dtype="bfloat16")
    comp = step.Trainer(model_path=tiny, algorithm=util.algorithm(), dtype="bfloat16",
                        scale=step.Scale(compile=True), compile_backend=broken)
    for s in range(2):
        gs = util.synthetic_groups(step=s, prompts=3, group_size=4)
        me, mc = eager.train_step(groups=gs), comp.train_step(groups=gs)
        assert mc.loss == me.loss and mc.grad_norm == me.grad_norm        # the eager step, bit for bit
    assert comp.compile_state == "failed" and not compiled.is_compiled(comp.compute_policy.lm)
    for (n, a), b in zip(eager.model.named_parameters(), comp.model.parameters()):
        assert torch.equal(a, b), n
    assert "torch.compile failed" in capfd.readouterr().err


def test_float32_compiles_the_policy_itself_and_evaluation_generates_eagerly() -> None:
    torch._dynamo.reset()
    seen, backend = _counting(_eager_backend)
    path = models.resolve(rljob.ModelSpec(builtin="tiny"))
    t = step.Trainer(model_path=path, algorithm=util.algorithm(), scale=step.Scale(compile=True),
                     compile_backend=backend)
    assert t.shadow is None and compiled.is_compiled(t.policy.lm)     # float32: the policy is what runs
    comps = [types.Completion(token_ids=[5, 6, 7], logprobs=[-1.0] * 3, text="") for _ in range(2)]
    g = types.RolloutGroup(prompt=types.Prompt(index=0, text="", answer=""), prompt_token_ids=[3, 4],
                           completions=comps, policy_version=0, rewards=[0.0, 1.0])
    t.train_step(groups=[g])
    graphs = len(seen)
    assert graphs >= 1 and t.compile_state == "compiled"
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    prompts = evaluate.held_out(tasks.stream(rljob.TaskSpec.model_validate({"copy": {}, "seed": 0})),
                                rljob.EvaluationSpec(prompts=3, firstIndex=1000))

    class Half:
        def score(self, prompt: types.Prompt, completions: Sequence[str]) -> list[float]:
            return [0.5 for _ in completions]

    ev = evaluate.Evaluator(model=t.policy.lm, tokenizer=tok, prompts=prompts, verifier=Half(),  # type: ignore[arg-type]
                            max_new_tokens=3, chat_template=False)
    assert ev.run().accuracy == 1.0
    assert len(seen) == graphs                                 # generation compiled nothing
