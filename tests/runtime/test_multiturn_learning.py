"""The tiny model learns a two-turn game end to end: ``kubeforge run examples/tiny-multiturn.yaml`` (real vLLM,
verifier and trainer processes; the environments in the two verifiers' environment servers, each over its worker
processes: the generator's episodes step there over ZeroMQ, docs/agents.md "Where environments run"). GuessNumber over 1..2:
a right first guess earns 1.0, a right second guess (after "higher"/"lower") 0.5.

Measured on 2 busy vCPUs (docs/agents.md, "Figures"): mean reward of the first 10 steps -> the last 10 went from
0.05 to 0.61 in 522 s, turns per episode 1.96 -> 1.52; the margin leaves room for a slower start."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kubeforge.runtime.launcher import summary

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "kubeforge.cli"]
MARGIN = 0.3


@pytest.mark.long   # a 40-step learning run: the long tier (docs/testing.md)
@pytest.mark.slow
@pytest.mark.vllm
def test_the_tiny_model_learns_a_two_turn_game(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.run([*CLI, "run", str(ROOT / "examples" / "tiny-multiturn.yaml"), "--run-dir", str(run_dir)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["steps"] == 40 and out["succeeded"], out
    assert out["reward_last"] >= out["reward_first"] + MARGIN, out
    assert 1.0 <= out["episode_turns_mean"] <= 2.0, out
    assert out["env_masked_tokens"] > 0, out          # second turns carried the environment's hint, masked
    records = summary.read_records(run_dir / "metrics.jsonl")
    assert all(r.episode_turns_mean is not None for r in records)
    # learning shows as fewer turns: the last steps end more episodes at the first guess than the first steps did
    first = sum(r.episode_turns_mean or 0 for r in records[:10]) / 10
    last = sum(r.episode_turns_mean or 0 for r in records[-10:]) / 10
    assert last < first, (first, last)
    assert (run_dir / "reward.png").exists() or any(run_dir.glob("*.png"))
    # the environments stepped in the verifiers (both of them), not beside the generator
    served = {}
    for log in sorted((run_dir / "logs").glob("verifier-*.log")):
        m = re.search(r"environment server: (\d+) resets, (\d+) steps", log.read_text(errors="replace"))
        assert m is not None, f"{log.name}: no environment server summary"
        served[log.name] = (int(m.group(1)), int(m.group(2)))
    assert len(served) == 2 and all(resets > 0 and steps > 0 for resets, steps in served.values()), served
