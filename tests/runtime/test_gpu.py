"""The trainer's CUDA paths: a step on the GPU computes the CPU's step, compiled blocks match eager there, a
checkpoint written from the GPU resumes with nothing lost, an export from the GPU loads anywhere, and the held-out
evaluation decodes on the GPU as on the CPU.

These need a CUDA device and are skipped without one (CI has none): run them on a GPU machine with
``pytest -m gpu``. Stated tolerances: float32 CPU vs GPU within 1e-4 relative on the loss and 1e-3 on the
gradient norm (different kernels, reduction orders); bf16 compiled vs eager as in test_trainer_compiled.py; a
resumed step equal to the uninterrupted one bit for bit, under CUDA's deterministic kernels.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch
import transformers

import _trainer_util as util
from kubeforge.api import rljob
from kubeforge.runtime import models, tasks, types
from kubeforge.runtime.learner import step
from kubeforge.runtime.trainer import evaluate

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

GPU = "cuda:0"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return util.build_tiny(tmp_path_factory.mktemp("tiny") / "model")


def test_a_step_on_the_gpu_computes_the_cpu_step(tiny: Path) -> None:
    """The CPU packs each group's prompt once; the GPU runs every row whole: two computations, one result."""
    gs = util.synthetic_groups(step=0, prompts=3, group_size=4)
    cpu = step.Trainer(model_path=tiny, algorithm=util.algorithm(), device="cpu").train_step(groups=gs)
    gpu_trainer = step.Trainer(model_path=tiny, algorithm=util.algorithm(), device=GPU)
    gpu = gpu_trainer.train_step(groups=gs)
    assert all(p.device.type == "cuda" for p in gpu_trainer.model.parameters())
    assert gpu.loss == pytest.approx(cpu.loss, rel=1e-4, abs=1e-6)
    assert gpu.grad_norm == pytest.approx(cpu.grad_norm, rel=1e-3)
    assert gpu.entropy == pytest.approx(cpu.entropy, rel=1e-4)
    assert gpu.tokens == cpu.tokens


def test_compiled_blocks_match_eager_on_the_gpu(tiny: Path) -> None:
    torch._dynamo.reset()
    eager = step.Trainer(model_path=tiny, algorithm=util.algorithm(), dtype="bfloat16", device=GPU)
    comp = step.Trainer(model_path=tiny, algorithm=util.algorithm(), dtype="bfloat16", device=GPU,
                        scale=step.Scale(compile=True))
    for s in range(2):
        gs = util.synthetic_groups(step=s, prompts=3, group_size=4)
        me, mc = eager.train_step(groups=gs), comp.train_step(groups=gs)
        assert comp.compile_state == "compiled"              # no fallback to eager
        assert mc.loss == pytest.approx(me.loss, rel=0.02, abs=2e-3)
        assert mc.grad_norm == pytest.approx(me.grad_norm, rel=0.05)


@pytest.fixture
def deterministic() -> Iterator[None]:
    """CUDA's deterministic kernels for one test (warn-only where torch has none). Without them two runs of the
    same step from the same state differ: the embedding's backward adds with atomics in whatever order they land
    (measured on an H100: 6e-6 apart after one bf16 step, 2e-9 in float32, between two trainers resumed from one
    checkpoint)."""
    before, warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.use_deterministic_algorithms(before, warn_only=warn)


def test_a_checkpoint_written_on_the_gpu_resumes_with_nothing_lost(tiny: Path, tmp_path: Path,
                                                                  deterministic: None) -> None:
    """bf16 compute, fused AdamW on the GPU: the resumed trainer holds the saved weights and optimizer state, on the
    GPU, and its next step is the uninterrupted one's, bit for bit."""
    algo = util.algorithm()
    first = step.Trainer(model_path=tiny, algorithm=algo, dtype="bfloat16", device=GPU)
    for s in range(2):
        first.train_step(groups=util.synthetic_groups(step=s, prompts=3, group_size=4))
    first.save_checkpoint(directory=tmp_path, keep=2, data_cursor=6)
    saved = [p.detach().clone() for p in first.model.parameters()]
    saved_opt = [[t.clone() for _, t in sorted(st.items())] for st in first.optimizer.state.values()]
    nxt = util.synthetic_groups(step=2, prompts=3, group_size=4)
    uninterrupted = first.train_step(groups=nxt)

    resumed = step.Trainer(model_path=tiny, algorithm=algo, dtype="bfloat16", device=GPU)
    state = resumed.resume(directory=tmp_path)
    assert state is not None and state["step"] == 2 and state["data_cursor"] == 6
    assert all(torch.equal(a, b) for a, b in zip(saved, resumed.model.parameters(), strict=True))
    restored = [[t for _, t in sorted(st.items())] for st in resumed.optimizer.state.values()]
    assert len(restored) == len(saved_opt) > 0
    for was, now in zip(saved_opt, restored, strict=True):
        assert all(t.device.type == "cuda" and torch.equal(a, t) for a, t in zip(was, now, strict=True))
    after = resumed.train_step(groups=nxt)
    assert after.step == uninterrupted.step == 3
    assert (after.loss, after.grad_norm) == (uninterrupted.loss, uninterrupted.grad_norm)
    for (n, a), (_, b) in zip(first.model.named_parameters(), resumed.model.named_parameters(), strict=True):
        assert torch.equal(a, b), n


def test_an_export_from_the_gpu_loads_on_the_cpu(tiny: Path, tmp_path: Path) -> None:
    t = step.Trainer(model_path=tiny, algorithm=util.algorithm(), dtype="bfloat16", device=GPU)
    t.train_step(groups=util.synthetic_groups(step=0, prompts=3, group_size=4))
    folder = t.export(directory=tmp_path)
    assert folder is not None
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(folder))
    ours = dict(t.model.named_parameters())
    for n, p in loaded.named_parameters():
        assert p.device.type == "cpu"
        assert torch.equal(p.detach().float(), ours[n].detach().to("cpu", torch.bfloat16).float()), n


def test_evaluation_on_the_gpu_gives_the_cpu_answers() -> None:
    path = models.resolve(rljob.ModelSpec(builtin="tiny"))
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    prompts = evaluate.held_out(tasks.stream(rljob.TaskSpec.model_validate({"copy": {}, "seed": 0})),
                                rljob.EvaluationSpec(prompts=6, firstIndex=1000))
    answers = {}
    for device in ("cpu", GPU):
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path)).to(device)
        v = _Seen()
        e = evaluate.Evaluator(model=model, tokenizer=tok, prompts=prompts, verifier=v, max_new_tokens=5,
                               chat_template=False, device=torch.device(device))
        r = e.run()
        assert (r.accuracy, r.prompts) == (1.0, 6)
        answers[device] = v.seen
    assert answers[GPU] == answers["cpu"] and any(answers["cpu"])


class _Seen:
    """A verifier that keeps what it was shown and scores it 1."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def score(self, prompt: types.Prompt, completions: Sequence[str]) -> list[float]:
        self.seen.extend(completions)
        return [1.0 for _ in completions]
