"""The env contract: ``config.role_env`` (what the launcher sets) round-trips through ``config.from_env`` (what every
role reads), and every bad variable is reported by name, all at once."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kubeforge.api import contract, load, roleenv
from kubeforge.runtime import config

DOC = {
    "apiVersion": "kubeforge.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "cfg"},
    "spec": {"model": {"builtin": "tiny"}, "task": {"copy": {}}, "verifiers": [{"name": "a", "type": "ExactAnswer"}],
             "algorithm": {"promptsPerStep": 4},
             "roles": {"generator": {"replicas": 2}, "verifier": {"replicas": 1}, "trainer": {"replicas": 2}}},
}


def peers() -> dict[str, list[roleenv.Peer]]:
    peer = roleenv.Peer
    return {"generator": [peer(host="127.0.0.1", port_base=30000), peer(host="127.0.0.1", port_base=30010)],
            "verifier": [peer(host="v-0.svc", port_base=29500)],
            "trainer": [peer(host="t-0", port_base=31000), peer(host="t-1", port_base=31010)]}


@pytest.fixture()
def manifest(tmp_path: Path) -> Path:
    p = tmp_path / "job.json"
    p.write_text(json.dumps(DOC))
    return p


def env_for(manifest: Path, role: str = "trainer", index: int = 1) -> dict[str, str]:
    job = load.load_file(manifest)
    return config.role_env(job=job, config_path=str(manifest), role=role, index=index, peers=peers(),
                           run_dir="/tmp/run", checkpoint_dir="/tmp/ck", attempt=3)


def test_round_trip(manifest: Path) -> None:
    cfg = config.from_env(env_for(manifest))
    assert (cfg.role, cfg.index, cfg.attempt, cfg.port_base) == ("trainer", 1, 3, 31010)
    assert cfg.replicas("generator") == 2 and cfg.replicas("trainer") == 2
    assert cfg.peer("verifier", 0).address(contract.PORT_DATA) == "tcp://v-0.svc:29501"
    assert cfg.bind_address(contract.PORT_CONTROL) == "tcp://127.0.0.1:31012"
    assert cfg.checkpoint_dir == "/tmp/ck" and str(cfg.run_dir) == "/tmp/run"
    assert cfg.report == roleenv.REPORT_JSONL and cfg.name == "trainer-1"
    assert cfg.spec.algorithm.prompts_per_step == 4


def test_defaults_are_the_pod_defaults(manifest: Path) -> None:
    env = env_for(manifest)
    for key in (contract.ENV_PORT_BASE, contract.ENV_BIND_HOST, contract.ENV_CHECKPOINT_DIR, contract.ENV_REPORT,
                contract.ENV_RUN_DIR, contract.ENV_ATTEMPT):
        del env[key]
    cfg = config.from_env(env)
    assert cfg.port_base == contract.DEFAULT_PORT_BASE and cfg.bind_host == "0.0.0.0"
    assert cfg.checkpoint_dir == "/checkpoints" and cfg.report == roleenv.REPORT_STDOUT and cfg.attempt == 0


def test_every_problem_named_at_once(manifest: Path) -> None:
    env = env_for(manifest)
    env[contract.ENV_ROLE] = "chef"
    env[contract.ENV_PORT_BASE] = "x"
    env[contract.env_peers("verifier")] = "nohost,ok:1"
    env[contract.env_replicas("trainer")] = "5"
    env[contract.ENV_REPORT] = "carrier-pigeon"
    with pytest.raises(config.ConfigError) as err:
        config.from_env(env)
    text = "\n".join(err.value.problems)
    for needle in (contract.ENV_ROLE, contract.ENV_PORT_BASE, f"{contract.env_peers('verifier')}[0]",
                   contract.env_replicas("trainer"), contract.ENV_REPORT):
        assert needle in text, (needle, text)


def test_index_outside_world_and_missing_config(manifest: Path, tmp_path: Path) -> None:
    env = env_for(manifest, role="generator", index=1)
    env[contract.ENV_INDEX] = "2"
    env[contract.ENV_CONFIG] = str(tmp_path / "missing.yaml")
    with pytest.raises(config.ConfigError) as err:
        config.from_env(env)
    assert any(p.startswith(contract.ENV_INDEX) for p in err.value.problems)
    assert any(p.startswith(f"{contract.ENV_CONFIG}: Not found") for p in err.value.problems)


def test_invalid_manifest_problems_name_field_paths(manifest: Path) -> None:
    doc = json.loads(json.dumps(DOC))
    doc["spec"]["algorithm"] = {"groupSize": 1, "promptsPerStep": 1}
    manifest.write_text(json.dumps(doc))
    with pytest.raises(config.ConfigError) as err:
        config.from_env(env_for_raw(manifest))
    text = "\n".join(err.value.problems)
    assert "spec.algorithm.groupSize" in text


def env_for_raw(manifest: Path) -> dict[str, str]:
    env = {contract.ENV_ROLE: "verifier", contract.ENV_CONFIG: str(manifest)}
    for role, ps in peers().items():
        env[contract.env_peers(role)] = ",".join(p.render() for p in ps)
    return env


@pytest.mark.parametrize("patch,field", [
    ({"model": {"path": "/nonexistent/model"}}, "spec.model.path"),
    ({"task": {"jsonl": {"path": "/nonexistent.jsonl"}}}, "spec.task.jsonl.path"),
])
def test_runtime_local_problems(patch: dict[str, object], field: str) -> None:
    doc = json.loads(json.dumps(DOC))
    doc["spec"].update(patch)
    problems = config.local_problems(load.parse(doc).spec)
    assert len(problems) == 1 and problems[0].startswith(field + ":"), problems


@pytest.mark.parametrize("role,expected", [
    ("generator", ["spec.model.path"]),
    ("trainer", ["spec.model.path", "spec.task.jsonl.path"]),
    ("verifier", []),
    (None, ["spec.model.path", "spec.task.jsonl.path"]),      # the local launcher checks every file
])
def test_each_role_checks_only_the_files_it_reads(role: str | None, expected: list[str]) -> None:
    """A pod mounts only its role's volumes (docs/guide.md): a verifier pod has neither the model nor the JSONL."""
    doc = json.loads(json.dumps(DOC))
    doc["spec"].update({"model": {"path": "/nonexistent/model"}, "task": {"jsonl": {"path": "/nonexistent.jsonl"}}})
    problems = config.local_problems(load.parse(doc).spec, role=role)
    assert [p.split(":")[0] for p in problems] == expected, problems


def test_a_verifier_pod_starts_without_the_model_and_data_volumes(tmp_path: Path) -> None:
    doc = json.loads(json.dumps(DOC))
    doc["spec"].update({"model": {"path": "/nonexistent/model"}, "task": {"jsonl": {"path": "/nonexistent.jsonl"}}})
    manifest = tmp_path / "job.json"
    manifest.write_text(json.dumps(doc))
    assert config.from_env(env_for_raw(manifest)).role == "verifier"
    with pytest.raises(config.ConfigError) as err:
        config.from_env(env_for(manifest, role="generator", index=0))
    assert [p.split(":")[0] for p in err.value.problems] == ["spec.model.path"], err.value.problems


@pytest.mark.parametrize("patch,field", [
    ({"algorithm": {"promptsPerStep": 1}}, "spec.algorithm.promptsPerStep"),
    ({"algorithm": {"maxPolicyLag": 0}, "weightSync": {"everySteps": 3}}, "spec.algorithm.maxPolicyLag"),
])
def test_cross_field_rules_refuse_in_every_role(patch: dict[str, object], field: str, tmp_path: Path) -> None:
    """The API model's rules (kubeforge.api.validate) reach a role through load.parse: exit before any socket."""
    doc = json.loads(json.dumps(DOC))
    doc["spec"].update(patch)
    manifest = tmp_path / "job.json"
    manifest.write_text(json.dumps(doc))
    with pytest.raises(config.ConfigError) as err:
        config.from_env(env_for_raw(manifest))
    assert any(p.startswith(field + ":") for p in err.value.problems), err.value.problems
