"""LoRA end to end through a real vLLM engine: after an adapter-only sync the generator's greedy outputs and
logprobs equal the trainer's adapted (= merged) policy's."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.vllm
def test_adapter_sync_makes_the_engine_serve_the_trainers_policy() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(HERE / "_lora_engine_check.py")], env=env, capture_output=True,
                          text=True, timeout=900)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["error"] is None and out["version"] == 2 and out["lora_request"] == "policy-v2"
    assert out["sent_bytes"] == out["received_bytes"] == out["adapter_bytes"]     # the adapter only
    assert out["adapter_bytes"] < out["full_model_bytes"] / 4
    moved = 0.0
    for row in out["rows"]:
        assert row["trainer_argmax_equal"]                 # greedy tokens are the trainer policy's argmax
        assert row["engine"] == pytest.approx(row["trainer"], abs=2e-3)
        moved = max(moved, max(abs(a - b) for a, b in zip(row["before_engine"], row["before_trainer_now"])))
    assert moved > 1e-2                                    # and the adapter changed the policy the engine serves
