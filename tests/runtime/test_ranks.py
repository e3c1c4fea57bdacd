"""Several trainer ranks per pod (``spec.roles.trainer.ranksPerPod``, or one per GPU): the env contract expands the
trainer pods into ranks (``config.from_env``), and the pod's own process supervises its ranks (``trainer/ranks.py``,
real child processes). The ranks training together over real torch.distributed: test_launcher's
``test_two_ranks_in_one_trainer_process_learn`` (slow, vllm)."""
from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

import pytest

from kubeforge.api import contract, load, rljob
from kubeforge.runtime import config
from kubeforge.runtime.trainer import ranks

import test_config as tc


def manifest(tmp_path: Path, **trainer: object) -> Path:
    doc = copy.deepcopy(tc.DOC)
    doc["spec"]["roles"]["trainer"].update(trainer)
    p = tmp_path / "job.json"
    p.write_text(json.dumps(doc))
    return p


def test_trainer_pods_expand_into_ranks_for_every_role(tmp_path: Path) -> None:
    m = manifest(tmp_path, ranksPerPod=2)
    env = tc.env_for(m, role="trainer", index=1)
    pod = config.from_env(env)
    assert pod.supervises and pod.index == 2 and pod.pod_index == 1       # the pod process: rank 2's ports
    rank = config.from_env({**env, contract.ENV_LOCAL_RANK: "1"})
    assert not rank.supervises and (rank.index, rank.pod_index, rank.local_rank) == (3, 1, 1)
    assert rank.port_base == 31010 + contract.PORTS_PER_PROCESS and rank.name == "trainer-3"
    assert rank.replicas("trainer") == 4
    assert [p.render() for p in rank.peers["trainer"]] == ["t-0:31000", "t-0:31010", "t-1:31010", "t-1:31020"]
    verifier = config.from_env(tc.env_for(m, role="verifier", index=0))      # sends to every rank
    assert verifier.replicas("trainer") == 4 and not verifier.supervises
    assert verifier.peer("trainer", 3).address(contract.PORT_DATA) == "tcp://t-1:31021"


def test_ranks_default_to_the_gpu_count_and_one(tmp_path: Path) -> None:
    assert rljob.TrainerRole().ranks() == 1
    gpu = rljob.TrainerRole.model_validate({"replicas": 2, "resources": {"limits": {"nvidia.com/gpu": 4}}})
    assert (gpu.ranks(), gpu.world()) == (4, 8)
    plain = config.from_env(tc.env_for(manifest(tmp_path), role="trainer", index=1))
    assert not plain.supervises and plain.index == 1 and plain.port_base == 31010


def test_a_local_rank_outside_the_pod_is_refused(tmp_path: Path) -> None:
    env = tc.env_for(manifest(tmp_path, ranksPerPod=2), role="trainer", index=0)
    with pytest.raises(config.ConfigError, match=contract.ENV_LOCAL_RANK):
        config.from_env({**env, contract.ENV_LOCAL_RANK: "2"})


def test_rules_name_the_fields() -> None:
    doc = copy.deepcopy(tc.DOC)
    doc["spec"]["roles"]["trainer"].update(ranksPerPod=4)                  # world 8 > promptsPerStep 4
    with pytest.raises(load.InvalidRLJob, match=r"spec.algorithm.promptsPerStep: .* x 4 ranks per pod"):
        load.parse(doc)
    doc["spec"]["roles"]["trainer"] = {"replicas": 1, "ranksPerPod": 2, "resources": {"limits": {"nvidia.com/gpu": 1}}}
    with pytest.raises(load.InvalidRLJob, match=r"spec.roles.trainer.ranksPerPod: Invalid value: 2: should equal"):
        load.parse(doc)


def code(script: str) -> list[str]:
    return [sys.executable, "-c", "import os, sys, time\n" + script]


def test_supervisor_runs_every_rank_and_passes_a_failure_on(tmp_path: Path) -> None:
    out = tmp_path / "ranks"
    out.mkdir()
    ok = code(f"open(os.path.join({str(out)!r}, os.environ['{contract.ENV_LOCAL_RANK}']), 'w').close()")
    assert ranks.supervise(ranks=3, environ={}, name="t", argv=ok) == 0
    assert sorted(p.name for p in out.iterdir()) == ["0", "1", "2"]
    # rank 1 fails with 3: the others (sleeping) are stopped at once and the pod exits 3
    failing = code(f"sys.exit(3) if os.environ['{contract.ENV_LOCAL_RANK}'] == '1' else time.sleep(60)")
    t0 = time.monotonic()
    assert ranks.supervise(ranks=3, environ={}, name="t", argv=failing, grace_s=5) == 3
    assert time.monotonic() - t0 < 30
