"""docs/guide.md's local rehearsal end to end (``make guide-rehearsal``, i.e. ``e2e/guide_rehearsal.py``): real vLLM,
ZeroMQ and torch processes train the model of an HF folder on a JSONL file with the guide's manifest
(``examples/own-model.yaml``, its two paths made local). About 3 minutes on 2 CPU cores.

Margin: the tiny model learns the copy task from ~0.1 to ~1.0 mean reward over 40 steps (docs/guide.md, section
10: 0.11 -> 1.00); the test asks for a gain of more than 0.5 between the first and the last 10 steps, as
``examples/tiny.yaml``'s runs clear by far (docs/launcher.md: 0.04 -> 1.00; the real-pod suite asks > 0.3).
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "e2e" / "guide_rehearsal.py"
STEPS = 40                      # examples/own-model.yaml: spec.algorithm.steps
MARGIN = 0.5


@pytest.mark.slow
@pytest.mark.vllm
def test_guide_rehearsal_prints_the_summary_last_and_the_reward_rises(tmp_path: pathlib.Path) -> None:
    import transformers

    proc = subprocess.run([sys.executable, str(SCRIPT), "--workdir", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=1500, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])          # the LAST line is the summary JSON
    print(f"\nguide rehearsal: reward {summary['reward_first']} -> {summary['reward_last']}, "
          f"kubeforge run {summary['wall_seconds']} s")
    assert summary["succeeded"] is True and summary["steps"] == STEPS
    assert summary["reward_last"] > summary["reward_first"] + MARGIN, summary
    # the run read the guide's manifest with its two paths made local (the launcher refuses a missing file)
    run_dir = pathlib.Path(summary["run_dir"])
    effective = yaml.safe_load((run_dir / "rljob.yaml").read_text())
    assert effective["spec"]["model"]["path"] == str(tmp_path / "models" / "my-model")
    assert effective["spec"]["task"]["jsonl"]["path"] == str(tmp_path / "data" / "train.jsonl")
    groups = [json.loads(ln) for ln in (run_dir / "verifier-0.jsonl").read_text().splitlines()]
    assert len(groups) >= STEPS * effective["spec"]["algorithm"]["promptsPerStep"]     # every group scored
    # the exported model: an HF folder, as the guide's last step copies it off the claim
    export = run_dir / "checkpoints" / f"export-step-{STEPS:09d}"
    assert transformers.AutoConfig.from_pretrained(export).model_type == "qwen2"
    assert (export / "tokenizer.json").is_file()
