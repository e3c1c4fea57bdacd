"""The ``kubeforge`` command: invalid input fails before any process starts; ``kubeforge role`` refuses a bad
environment by variable name; a real verifier process (``kubeforge role verifier``) survives malformed frames on
its ZeroMQ port, keeps scoring, serves /metrics /healthz /readyz and stops cleanly on SIGTERM."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import zmq

from kubeforge.api import contract, load, roleenv
from kubeforge.runtime import config, types, wire
from kubeforge.runtime.launcher import main as launcher_main
from kubeforge.runtime.launcher import ports

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "kubeforge.cli"]

GOOD = {
    "apiVersion": "kubeforge.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "cli"},
    "spec": {"model": {"builtin": "tiny"}, "task": {"copy": {"length": 1, "alphabet": "ab"}},
             "verifiers": [{"name": "answer", "type": "ExactAnswer"}], "algorithm": {"groupSize": 2}},
}


def write(tmp: Path, doc: object, name: str = "job.yaml") -> Path:
    p = tmp / name
    p.write_text(json.dumps(doc))
    return p


def test_invalid_manifest_fails_before_any_process(tmp_path: Path) -> None:
    doc = json.loads(json.dumps(GOOD))
    doc["spec"]["algorithm"] = {"groupSize": 1, "steps": 0, "bogus": 1}
    doc["spec"]["verifiers"] = [{"name": "answer", "type": "Nope"}]
    run_dir = tmp_path / "run"
    proc = subprocess.run([*CLI, "run", str(write(tmp_path, doc)), "--run-dir", str(run_dir)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.startswith("kubeforge:")]
    for field in ("spec.algorithm.groupSize", "spec.algorithm.steps", "spec.algorithm.bogus", "spec.verifiers[0].type"):
        assert sum(field in x for x in lines) == 1, (field, proc.stderr)
    assert proc.stdout == "" and not run_dir.exists()


def test_runtime_combination_checks_and_steps_override(tmp_path: Path) -> None:
    doc = json.loads(json.dumps(GOOD))
    doc["spec"]["roles"] = {"trainer": {"replicas": 3}}
    doc["spec"]["algorithm"]["promptsPerStep"] = 2
    with pytest.raises(load.InvalidRLJob) as err:
        launcher_main.prepare(str(write(tmp_path, doc)), steps=None)
    assert err.value.problems[0].startswith("spec.algorithm.promptsPerStep:")
    job = launcher_main.prepare(str(write(tmp_path, GOOD)), steps=7)
    assert job.spec.algorithm.steps == 7
    with pytest.raises(load.InvalidRLJob) as err:
        launcher_main.prepare(str(write(tmp_path, GOOD)), steps=0)
    assert err.value.problems[0].startswith("spec.algorithm.steps:")


def test_missing_file_and_usage(tmp_path: Path) -> None:
    proc = subprocess.run([*CLI, "run", str(tmp_path / "nope.yaml")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "nope.yaml" in proc.stderr
    proc = subprocess.run([*CLI, "role", "chef"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


def test_role_refuses_bad_environment_by_name(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBEFORGE_")}
    env[contract.ENV_PORT_BASE] = "nope"
    proc = subprocess.run([*CLI, "role", "trainer"], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2
    for var in (contract.ENV_CONFIG, contract.ENV_PORT_BASE, contract.env_peers("generator")):
        assert var in proc.stderr, proc.stderr


def test_crd_subcommand_dispatches() -> None:
    proc = subprocess.run([*CLI, "crd"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "CustomResourceDefinition" in proc.stdout


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except OSError:            # not listening yet
        return 0, ""


def _wait_for(pred, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError("timed out")


def test_running_verifier_survives_fuzzed_frames(tmp_path: Path) -> None:
    job = load.parse(GOOD)
    manifest = write(tmp_path, GOOD)
    bases = ports.allocate(3)
    peers = {r: [roleenv.Peer(host="127.0.0.1", port_base=b)] for r, b in zip(contract.ROLES, bases)}
    env = {**os.environ, **config.role_env(job=job, config_path=str(manifest), role="verifier", index=0, peers=peers)}
    ctx = zmq.Context.instance()
    trainer_in = ctx.socket(zmq.PULL)           # stands in for trainer 0's data port
    trainer_in.bind(f"tcp://127.0.0.1:{peers['trainer'][0].port(contract.PORT_DATA)}")
    proc = subprocess.Popen([*CLI, "role", "verifier"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{peers['verifier'][0].port(contract.PORT_METRICS)}"
    try:
        assert _wait_for(lambda: _get(base + "/readyz")[0] == 200)
        assert _get(base + "/healthz")[0] == 200
        push = ctx.socket(zmq.PUSH)
        push.connect(f"tcp://127.0.0.1:{peers['verifier'][0].port(contract.PORT_DATA)}")
        junk = [b"", b"\x00", b"GET / HTTP/1.0\r\n\r\n", wire.MAGIC + b"\x09\x00\x11", wire.MAGIC + b"\x01\x00\x11\xc1",
                bytes(range(256)) * 3, wire.encode(wire.Ready(role="x", index=0))]
        for frame in junk:
            push.send(frame)
        push.send_multipart([b"a", b"b"])
        group = types.RolloutGroup(
            prompt=types.Prompt(index=5, text="copy: a\n", answer="a"), prompt_token_ids=[1, 2],
            completions=[types.Completion(token_ids=[3], logprobs=[-0.1], text="a"),
                         types.Completion(token_ids=[4], logprobs=[-2.0], text="b")], policy_version=0)
        push.send(wire.encode(wire.Rollout(group=group)))
        assert trainer_in.poll(30000), "no scored group reached the trainer"
        frames = []
        while trainer_in.poll(500):
            frames.append(trainer_in.recv())
        scored = [m for m in (wire.decode(f) for f in frames) if isinstance(m, wire.Scored)]
        assert len(scored) == 1 and scored[0].group.rewards == [1.0, 0.0]
        metrics = _get(base + "/metrics")[1]
        dropped = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                      if line.startswith("kubeforge_rollouts_dropped_total{"))
        assert dropped >= len(junk), metrics
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        trainer_in.close(0)


def test_operator_subcommand_dispatches_argv() -> None:
    proc = subprocess.run([*CLI, "operator", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout.lower()
