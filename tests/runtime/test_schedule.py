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


def test_colocated_gives_the_generator_every_core_unless_the_user_chose(tmp_path: pathlib.Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Colocated: the generators' phase has the cores to themselves, so each pool is its share of the launcher's
    CPUs (vLLM on CPU would serve with one thread); Overlapped and Disaggregated set no width here; a width in the
    launcher's environment or the role's env wins."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    run = rundir.create(job_name="sched", explicit=str(tmp_path / "run"))

    def widths(j: rljob.RLJob, cpus: list[int]) -> dict[str, str | None]:
        specs = launcher.process_specs(job=j, run=run, attempt=0, bases=list(range(5)), cpus=cpus)
        return {s.name: s.env.get("OMP_NUM_THREADS") for s in specs}

    colocated = job({"mode": "Colocated"}).spec.schedule
    assert placement.threads(colocated, cpus=[0, 1, 2]) == {"generator": 3}
    assert placement.threads(colocated, cpus=[0, 1, 2], generators=2) == {"generator": 1}   # they sample at once
    got = widths(job({"mode": "Colocated"}), [0, 1, 2, 3])                                 # DOC: 2 generators
    assert got == {"trainer-0": None, "trainer-1": None, "verifier-0": None, "generator-0": "2", "generator-1": "2"}
    assert set(widths(job(None), [0, 1, 2]).values()) == {None}
    assert set(widths(job({"mode": "Disaggregated"}), [0, 1, 2, 3]).values()) == {None}   # the role pins itself
    doc = json.loads(json.dumps(DOC))
    doc["spec"]["schedule"] = {"mode": "Colocated"}
    doc["spec"]["roles"]["generator"]["env"] = [{"name": "OMP_NUM_THREADS", "value": "1"}]
    assert widths(load.parse(doc), [0, 1, 2, 3])["generator-0"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert widths(job({"mode": "Colocated"}), [0, 1, 2, 3])["generator-0"] == "3"


def test_role_env_reaches_the_local_process(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``spec.roles.<role>.env`` applies to local processes as to pods, over the launcher's own environment."""
    doc = json.loads(json.dumps(DOC))
    doc["spec"]["roles"]["trainer"]["env"] = [{"name": "KF_TEST_FLAG", "value": "on"}]
    monkeypatch.setenv("KF_TEST_FLAG", "launcher")
    run = rundir.create(job_name="sched", explicit=str(tmp_path / "run"))
    specs = launcher.process_specs(job=load.parse(doc), run=run, attempt=0, bases=list(range(5)), cpus=[0, 1])
    trainer = next(s for s in specs if s.name == "trainer-0")
    assert trainer.env["KF_TEST_FLAG"] == "on" and trainer.env[contract.ENV_ROLE] == "trainer"
    assert {s.env["KF_TEST_FLAG"] for s in specs if s.role != "trainer"} == {"launcher"}


def test_parse_render_round_trip_and_bad_lists() -> None:
    assert affinity.parse("0,2-3, 5") == [0, 2, 3, 5]
    assert affinity.render([3, 0, 2, 2]) == "0,2,3"
    for bad in ("", "a", "3-1", "-1", "0,,1"):
        with pytest.raises(ValueError, match=contract.ENV_CPUS):
            affinity.parse(bad)


def test_a_process_pins_itself_and_sizes_torch_threads_from_the_env() -> None:
    """In a fresh interpreter (torch imported after, as in a role): affinity, OMP_NUM_THREADS and torch's pool."""
    cpu = min(os.sched_getaffinity(0))
    code = ("import os, sys; from kubeforge.runtime import affinity; got = affinity.apply_text(os.environ['KUBEFORGE_CPUS']); "
            "import torch; print(got, sorted(os.sched_getaffinity(0)), os.environ['OMP_NUM_THREADS'], "
            "torch.get_num_threads())")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, contract.ENV_CPUS: str(cpu)},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == [f"[{cpu}]", f"[{cpu}]", "1", "1"]
