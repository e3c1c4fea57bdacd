"""The stop agreement across trainer ranks (2 real DDP processes over gloo on CPU): SIGTERM reaching one rank while
it trains a step makes both ranks finish that same step, stop there and write one stop checkpoint (rank 0 writes
DDP's), within the bound; a resume continues at the next step. The single-rank case is
``test_roles_inprocess.py::test_sigterm_writes_a_stop_checkpoint_and_the_resume_repeats_and_loses_no_step``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import _trainer_util as util
from kubeforge.api import progress
from kubeforge.runtime.learner import checkpoint

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return util.build_tiny(tmp_path_factory.mktemp("tiny") / "model")


def run(tiny: Path, out: Path, *, steps: int, term_rank: int, term_at: int) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    port = util.free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(HERE / "_trainer_util.py"), "stop-worker", "--model", str(tiny), "--out", str(out),
           "--ckpt", str(out.parent / "ckpt"), "--world", "2", "--port", str(port), "--steps", str(steps),
           "--prompts", "5", "--term-rank", str(term_rank), "--term-at", str(term_at)]
    procs = [subprocess.Popen([*cmd, "--rank", str(r)], env=env) for r in range(2)]
    assert [p.wait(timeout=900) for p in procs] == [0, 0]      # a hang guard: 2 loaded cores took 6.5 min
    return [json.loads((out / f"stop-rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
@pytest.mark.parametrize("term_rank", [1, 0])
def test_sigterm_on_one_rank_stops_both_after_the_same_step_with_one_checkpoint(tiny: Path, tmp_path: Path,
                                                                               term_rank: int) -> None:
    first = run(tiny, tmp_path / "a", steps=5, term_rank=term_rank, term_at=1)    # SIGTERM while step 2 trains
    for r in first:
        assert r["stopped"] is not None and r["stopped"].startswith("SIGTERM after step 2"), r
        assert r["trained"] == [0, 1]                           # neither rank took step 3
    told = first[term_rank]
    assert told["sigterm_to_end_s"] is not None and told["sigterm_to_end_s"] < 45.0   # the stop_within bound
    assert "stop checkpoint of step 2 written" in first[0]["stopped"]
    ckpts = sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("step-"))
    assert ckpts == [checkpoint.dir_name(2)] and (tmp_path / "ckpt" / ckpts[0] / "COMPLETE").exists()
    again = run(tiny, tmp_path / "b", steps=5, term_rank=term_rank, term_at=-1)          # no SIGTERM: resumes
    assert [r["stopped"] for r in again] == [None, None]
    assert again[0]["trained"] == again[1]["trained"] == [2, 3, 4]                # each step once over both runs
    records = [progress.StepRecord.decode(line) for d in ("a", "b")
               for line in (tmp_path / d / "steps.jsonl").read_text().splitlines()]
    assert [r.step for r in records if r is not None] == [1, 2, 3, 4, 5]
