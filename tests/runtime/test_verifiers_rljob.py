"""``spec.environment.type: Verifiers`` in an RLJob: ``examples/tiny-verifiers.yaml`` (``examples/envs/vf_guess_number``,
written against the ``verifiers`` library alone) trains through the generator's endpoint on real vLLM.

- In process: the generator's sampler (``primeintellect.sampler.from_engine``, as ``generator.start`` builds it) over
  the shared tiny engine, with vLLM's own outputs audited: every policy span of every group holds exactly ids vLLM
  sampled for that episode's call (and their logprobs), the environment tokens between them are masked (logprob
  0.0, outside the spans), each group's prompt ids are the prompt vLLM was given first, and the environment reward
  is the library's rule recomputed from the recorded replies.
- End to end: ``kubeforge run examples/tiny-verifiers.yaml --steps 3`` (generator, verifier and trainer processes):
  the groups reach the trainer (three steps of 32 completions) and the summary carries the episode figures.
"""
from __future__ import annotations

import collections
import json
import os
import pathlib
import re
import subprocess
import sys
from typing import Any

import pytest

from kubeforge.api import load
from kubeforge.runtime import types
from kubeforge.runtime.agents import primeintellect

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny-verifiers.yaml"
ENVS = str(ROOT / "examples" / "envs")
PYTHON = primeintellect.adapter.default_python(ROOT)
needs_envs = pytest.mark.skipif(not PYTHON.exists(), reason=f"no environments interpreter at {PYTHON}: make venv-envs")


def _reward(replies: list[str], secret: int, turns: int) -> float:
    """vf_guess_number's rule, recomputed here from the recorded replies."""
    for k, text in enumerate(replies[:turns], start=1):
        found = re.findall(r"-?\d+", text)
        if found and int(found[-1]) == secret:
            return (turns - k + 1) / turns
    return 0.0


@pytest.mark.vllm
@needs_envs
def test_the_generators_verifiers_sampler_records_what_vllm_sampled(tiny_engine: Any) -> None:
    spec = load.load_file(str(EXAMPLE)).spec
    assert spec.environment is not None
    env = primeintellect.sampler.environment(spec.environment, python=PYTHON, paths=(ENVS,))
    sampler = primeintellect.sampler.from_engine(tiny_engine, spec=spec, audit=True, env=env)
    prompts = [types.Prompt(index=i, text="unused", answer="1") for i in range(4)]
    try:
        assert env.check() == 64
        groups = sampler.sample(prompts)
        audit = sampler.endpoint.sampler.audit       # type: ignore[attr-defined]
    finally:
        sampler.close()
    assert audit is not None
    vllm_calls = collections.Counter((a.prompt_ids, a.token_ids, a.logprobs) for a in audit)
    recorded: collections.Counter[tuple[Any, ...]] = collections.Counter()
    n = spec.algorithm.group_size
    assert len(groups) == 4 and all(len(g.completions) == n for g in groups)
    for g, group in enumerate(groups):
        assert group.policy_spans is not None and group.episode_stats is not None
        outcomes = sampler.outcomes[g * n:(g + 1) * n]
        for o, comp, spans, stats in zip(outcomes, group.completions, group.policy_spans, group.episode_stats):
            assert o.ok and o.finish_reason == "stop", o.error
            branch = o.recording.final
            assert branch is not None and len(o.recording.branches) == 1
            assert tuple(group.prompt_token_ids) == branch.prompt_ids == audit_prompt(branch)
            ids, lps = list(comp.token_ids), list(comp.logprobs)
            for call, (s, e) in zip(branch.calls, spans):
                assert tuple(ids[s:e]) == call.sampled_ids and tuple(lps[s:e]) == call.logprobs
                recorded[(call.prompt_ids, call.sampled_ids, call.logprobs)] += 1
            inside = {i for s, e in spans for i in range(s, e)}
            assert all(lps[i] == 0.0 for i in range(len(ids)) if i not in inside)
            assert len(ids) - len(inside) == sum(len(c.delta_ids) for c in branch.calls)
            secret = 1 + (o.task * 7919) % 2
            assert stats.env_reward == _reward([c.content for c in branch.calls], secret, 2) == o.reward
            assert stats.turns == len(branch.calls) in (1, 2)
    assert recorded == vllm_calls                    # every call recorded is one vLLM made, and no other
    assert sampler.stats.failures == {}


def audit_prompt(branch: Any) -> tuple[int, ...]:
    return tuple(branch.calls[0].prompt_ids)


@pytest.mark.slow
@pytest.mark.vllm
@needs_envs
def test_kubeforge_run_trains_on_a_verifiers_environment(tmp_path: pathlib.Path) -> None:
    run_dir = tmp_path / "run"
    env = dict(os.environ, **{primeintellect.adapter.ENV_PATH: ENVS, primeintellect.adapter.ENV_PYTHON: str(PYTHON)})
    proc = subprocess.run([sys.executable, "-m", "kubeforge.cli", "run", str(EXAMPLE), "--steps", "3",
                           "--run-dir", str(run_dir)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["steps"] == 3 and out["succeeded"] and out["completions"] == 3 * 4 * 8, out
    assert 1.0 <= out["episode_turns_mean"] <= 2.0, out
    assert out["env_masked_tokens"] > 0 and out["tool_calls_total"] == 0, out
    log = (run_dir / "logs" / "generator-0.log").read_text()
    batches = re.findall(r"verifiers: (\d+) rollouts in [\d.]+ s, (\d+) ok", log)
    assert len(batches) >= 3 and all(int(ok) == int(n) for n, ok in batches), batches
