"""An agent written with the OpenAI Agents SDK (``examples/agents/calculator_agent.py``, no kubeforge import) runs
unchanged through the endpoint, and trains in ``kubeforge run`` as the agent process of ``spec.agent``.

The SDK lives in ``.venv-agents`` (``make venv-agents``; docs/agents.md, "Agents in their own pods" says why): the
tests skip without it. The first test scripts the model's replies (SmolLM2's own chat template, tool-call format
and all) so it checks in seconds that the SDK's function tool ran and its result went back into the one recorded
token sequence; the slow one runs the example on vLLM for two steps and checks that the episodes were recorded and
trained on (not that the model learned).
"""
from __future__ import annotations

import ast
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from _toolcall_util import smollm2_template
from kubeforge.runtime.agents import endpoint
from test_agents_endpoint_tools import serve

ROOT = pathlib.Path(__file__).resolve().parents[2]
AGENT = ROOT / "examples" / "agents" / "calculator_agent.py"
EXAMPLE = ROOT / "examples" / "agent-calculator.yaml"
PYTHON = ROOT / ".venv-agents" / "bin" / "python"
needs_sdk = pytest.mark.skipif(not PYTHON.exists(), reason=f"no agents interpreter at {PYTHON}: make venv-agents")
CALL = '<tool_call>[{"name": "calculate", "arguments": {"expression": "715 * 266"}}]</tool_call>'


def test_the_agent_imports_no_kubeforge() -> None:
    tree = ast.parse(AGENT.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "agents" in names and not [n for n in names if n.startswith("kubeforge")], names


@needs_sdk
def test_the_sdk_agent_calls_its_function_tool_through_the_endpoint() -> None:
    ep, sampler, tok = serve(smollm2_template(), [CALL, "190190"])
    try:
        eid = ep.open_episode()
        env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"),
               "OPENAI_BASE_URL": ep.base_url(eid), "OPENAI_API_KEY": "unused", "OPENAI_DEFAULT_MODEL": "policy",
               "OPENAI_AGENTS_DISABLE_TRACING": "1"}
        proc = subprocess.run([str(PYTHON), str(AGENT)], input="What is 715 * 266?", env=env, capture_output=True,
                              text=True, timeout=900)
        rec = ep.close_episode(eid)
    finally:
        ep.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "190190"
    (branch,) = rec.branches           # the SDK echoed the call and sent the tool's result: one token sequence
    first, second = branch.calls
    assert second.reason == endpoint.chat.EXTENDS and first.sampled_ids == sampler.samples[0]
    assert "<tool_response>\n190190\n</tool_response>" in second.delta_text   # the real function tool's result
    prompt = tok.decode(list(first.prompt_ids))
    assert '"name": "calculate"' in prompt and "What is 715 * 266?" in prompt     # tools rendered by the template
    assert ep.refused == {}


@pytest.mark.long      # make test-long: 4-9 min on 2 loaded cores (docs/testing.md); the agent's calls in this file
@pytest.mark.slow
@pytest.mark.vllm
@needs_sdk
def test_kubeforge_run_trains_on_the_sdk_agent(tmp_path: pathlib.Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "kubeforge.cli", "run", str(EXAMPLE), "--steps", "2",
                           "--run-dir", str(run_dir)], cwd=ROOT, capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["steps"] == 2 and out["succeeded"], out
    log = (run_dir / "logs" / "generator-0.log").read_text()
    batches = re.findall(r"agents: (\d+) rollouts in [\d.]+ s, (\d+) ok, endpoint (\{.*\})", log)
    assert len(batches) >= 2, log[-3000:]
    assert all(int(ok) > 0 for _, ok, _ in batches), batches          # the SDK's programs ran to their end
    answered = [int(m) for m in re.findall(r"'answered': (\d+)", log)]
    assert answered and answered[-1] >= 8, answered                   # its model calls were served and recorded
    assert out["completions"] == 2 * 2 * 4 and out["infra_masked_rollouts"] == 0, out
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r.get("step")]
    assert [r["step"] for r in steps][-2:] == [1, 2], steps           # the trainer took them, step by step
    assert all(r["completions"] == 8 and r["tokens"] > 0 for r in steps[-2:]), steps
