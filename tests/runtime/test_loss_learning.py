"""DAPO (dynamic sampling on) and GSPO (the paper's clip range) learn the tiny example end to end: ``kubeforge run``
of ``examples/tiny.yaml`` with the loss changed, real vLLM, verifier and trainer processes. Each run takes 2 (GSPO)
to 8 (DAPO) minutes on 2 busy vCPUs (DAPO generates up to 4x as many groups once the reward saturates: every group
is then all-correct and refilled maxRounds times)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeforge.runtime.launcher import summary

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "kubeforge.cli"]
# measured (docs/runtime.md, "Loss variants"), mean reward of the first 10 -> last 10 steps: DAPO 0.17 -> 1.00,
# GSPO 0.03 -> 0.95; the margin leaves room for a slower start
MARGIN = 0.5

LOSSES: dict[str, dict[str, Any]] = {
    "DAPO": {"loss": "DAPO", "clipEpsilon": 0.2, "clipEpsilonHigh": 0.28},
    "GSPO": {"loss": "GSPO", "clipEpsilon": 3.0e-4, "clipEpsilonHigh": 4.0e-4},
}


@pytest.mark.long   # whole learning runs of the non-default losses: the long tier (docs/testing.md)
@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_loss_variant_learns_the_tiny_example(tmp_path: Path, loss: str) -> None:
    doc = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    doc["spec"]["algorithm"].update(LOSSES[loss])
    path = tmp_path / f"tiny-{loss.lower()}.yaml"
    path.write_text(yaml.safe_dump(doc))
    run_dir = tmp_path / "run"
    proc = subprocess.run([*CLI, "run", str(path), "--run-dir", str(run_dir)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["steps"] == 40 and out["succeeded"]
    assert out["reward_last"] >= out["reward_first"] + MARGIN, out
    records = summary.read_records(run_dir / "metrics.jsonl")
    if loss == "DAPO":          # dynamic sampling is on by default: groups without signal were replaced
        assert sum(r.resampled_groups for r in records) > 0
        assert all(r.resample_rounds <= 3 for r in records)
    else:
        assert all(r.resampled_groups == 0 for r in records)
