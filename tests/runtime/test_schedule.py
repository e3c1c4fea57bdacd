"""spec.schedule: the API rules, the launcher's CPU plan, and a role pinning itself from the env contract."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from kubeforge.api import contract, load, rljob
from kubeforge.runtime import affinity
from kubeforge.runtime.launcher import main as launcher
from kubeforge.runtime.launcher import placement, rundir

DOC = {"apiVersion": "kubeforge.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "sched"},
       "spec": {"model": {"builtin": "tiny"}, "task": {"copy": {}}, "verifiers": [{"name": "a", "type": "ExactAnswer"}],
                "roles": {"generator": {"replicas": 2}, "trainer": {"replicas": 2}}}}


def job(schedule: dict[str, object] | None) -> rljob.RLJob:
    doc = json.loads(json.dumps(DOC))
    if schedule is not None:
        doc["spec"]["schedule"] = schedule
    return load.parse(doc)


def test_default_is_overlapped_and_generator_cpus_needs_disaggregated() -> None:
    assert job(None).spec.schedule.mode == rljob.ScheduleMode.OVERLAPPED
    with pytest.raises(load.InvalidRLJob) as err:
        job({"mode": "Colocated", "generatorCpus": 1})
    assert any(p.startswith("spec.schedule") and rljob.MSG_GENERATOR_CPUS_MODE in p for p in err.value.problems)
    with pytest.raises(load.InvalidRLJob):
        job({"mode": "Sideways"})


def test_crd_carries_the_same_rule() -> None:
    schema = rljob.ScheduleSpec.model_json_schema(by_alias=True)
    assert {"rule": "!has(self.generatorCpus) || self.mode == 'Disaggregated'",
            "message": rljob.MSG_GENERATOR_CPUS_MODE} in schema["x-kubernetes-validations"]


def test_plan_splits_disaggregated_and_pins_nothing_otherwise() -> None:
    four = [0, 1, 2, 3]
    for mode in ("Overlapped", "Colocated"):
        assert placement.plan(job({"mode": mode}).spec.schedule, cpus=four) == {}
    half = placement.plan(job({"mode": "Disaggregated"}).spec.schedule, cpus=[3, 1, 0, 2])
    assert half == {"generator": [0, 1], "verifier": [0, 1], "trainer": [2, 3]}
    one = placement.plan(job({"mode": "Disaggregated", "generatorCpus": 1}).spec.schedule, cpus=four)
    assert one["generator"] == [0] and one["trainer"] == [1, 2, 3]
    assert placement.plan(job({"mode": "Disaggregated"}).spec.schedule, cpus=[5, 9])["trainer"] == [9]


@pytest.mark.parametrize("schedule,cpus,field", [
    ({"mode": "Disaggregated"}, [0], "spec.schedule.mode"),
    ({"mode": "Disaggregated", "generatorCpus": 2}, [0, 1], "spec.schedule.generatorCpus"),
])
def test_impossible_split_is_refused_naming_the_field(schedule: dict[str, object], cpus: list[int],
                                                      field: str) -> None:
    problems = placement.problems(job(schedule).spec.schedule, cpus=cpus)
    assert len(problems) == 1 and problems[0].startswith(field + ":"), problems
    with pytest.raises(ValueError, match=field):
        placement.plan(job(schedule).spec.schedule, cpus=cpus)


def test_launcher_writes_each_process_its_cpus(tmp_path: pathlib.Path) -> None:
    run = rundir.create(job_name="sched", explicit=str(tmp_path / "run"))
    specs = launcher.process_specs(job=job({"mode": "Disaggregated"}), run=run, attempt=0, bases=list(range(5)),
                                   cpus=[0, 1, 2, 3])
    got = {s.name: s.env.get(contract.ENV_CPUS) for s in specs}
    assert got == {"trainer-0": "2,3", "trainer-1": "2,3", "verifier-0": "0,1", "generator-0": "0,1",
                   "generator-1": "0,1"}
    plain = launcher.process_specs(job=job(None), run=run, attempt=0, bases=list(range(5)), cpus=[0, 1, 2, 3])
    assert all(contract.ENV_CPUS not in s.env for s in plain)


def test_parse_render_round_trip_and_bad_lists() -> None:
    assert affinity.parse("0,2-3, 5") == [0, 2, 3, 5]
    assert affinity.render([3, 0, 2, 2]) == "0,2,3"
    for bad in ("", "a", "3-1", "-1", "0,,1"):
        with pytest.raises(ValueError, match=contract.ENV_CPUS):
            affinity.parse(bad)


def test_a_process_pins_itself_and_sizes_torch_threads_from_the_env() -> None:
    """In a fresh interpreter (torch imported after, as in a role): affinity, OMP_NUM_THREADS and torch's pool."""
    cpu = min(os.sched_getaffinity(0))
    code = ("import os, sys; from kubeforge.runtime import affinity; got = affinity.apply_from_env(os.environ); "
            "import torch; print(got, sorted(os.sched_getaffinity(0)), os.environ['OMP_NUM_THREADS'], "
            "torch.get_num_threads())")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, contract.ENV_CPUS: str(cpu)},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == [f"[{cpu}]", f"[{cpu}]", "1", "1"]
