"""``examples/hf-token-secret.yaml`` in real pods: a token from a Secret reaches the trainer, and nowhere else.

The test makes, in the job's namespace before the job: the Secret ``hf-token`` (key ``token``: a random token it
generated), a ConfigMap, and two ``kubernetes.io/dockerconfigjson`` Secrets. It installs the operator with the chart
(``run_real.run``, namespaced mode) and ``rolePods.imagePullSecrets={<one of them>}``, applies the example and waits
for Succeeded. The example is changed only where the real node needs it (``realjob.manifest``: the host's venv, the
node selector, the signal-forwarding wrapper; the generator eager) and where this test adds its own checks:

- the trainer's command is the example's proof line (its shell script up to ``exec``: the token's length and the
  first 12 hex digits of its SHA-256, on stderr) followed by the harness's wrapper, instead of the runtime image's
  tini, which the busybox base image has not;
- the trainer also reads one ConfigMap key (``valueFrom.configMapKeyRef``) and the whole ConfigMap (``envFrom`` with
  a prefix), and prints those two values (random, not secret) on one more line;
- the verifier names its own ``imagePullSecrets``, which wins over the chart's default.

Checks: the job Succeeds at the example's steps; the trainer's log line reports the length and SHA-256 prefix the
test computes from its token; the token itself is in no pod's log, the operator's log, the RLJob's status or the
pod objects (which hold only the reference); the ConfigMap's values arrived; generator and trainer pods carry the
chart's default pull secret, the verifier pods its own. The base image is on the node already, so no pull uses the
secrets: what is shown is that every role pod names them. Cluster and skip rules as ``test_e2e_real``.
``test_secret_job_*`` (no marker) check the manifest builder without a cluster.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import pathlib
import re
import secrets
from typing import Any

import pytest
import yaml

import guide_rehearsal
import realjob
import run_real
from kfcluster import lifecycle
from kubeforge.api import load
from node import realnode

EXAMPLE = realjob.ROOT / "examples" / "hf-token-secret.yaml"
TOKEN_SECRET, TOKEN_KEY = "hf-token", "token"      # what the example reads
SETTINGS = "kf-e2e-settings"                        # the test's ConfigMap
ENV_FROM_PREFIX = "KF_E2E_ALL_"
PULL_DEFAULT, PULL_VERIFIER = "kf-e2e-registry", "kf-e2e-verifier-registry"
PROOF = re.compile(r"kubeforge: HF_TOKEN received: (\d+) characters, sha256 ([0-9a-f]{12})")
SETTINGS_LINE = re.compile(r"kubeforge-e2e: configMapKeyRef=(\S*) envFrom=(\S*)")
#: The test's own line, after the example's: the two ConfigMap-fed variables of ``with_test_parts``.
SETTINGS_ECHO = (f'echo "kubeforge-e2e: configMapKeyRef=$KF_E2E_MODE envFrom=${ENV_FROM_PREFIX}GREETING" >&2\n')
#: Where ``realjob.manifest`` changes a role (as for examples/tiny.yaml) and where this test adds to one.
ROLE_EXTRAS = ("image", "command", "env", "envFrom", "volumes", "volumeMounts", "nodeSelector", "tolerations",
               "enforceEager", "imagePullSecrets")


def load_example() -> dict[str, Any]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    assert isinstance(doc, dict), EXAMPLE
    return doc


def proof_line(example: dict[str, Any]) -> str:
    """The example trainer's shell script up to its ``exec`` of the image's entrypoint: the proof line."""
    command = example["spec"]["roles"]["trainer"]["command"]
    script = command[2]
    assert command[:2] == ["/bin/sh", "-c"] and isinstance(script, str) and " exec " in script, command
    return script.split(" exec ", 1)[0].rstrip() + "\n"


def with_test_parts(job: dict[str, Any], *, prelude: str) -> dict[str, Any]:
    """``job`` (``realjob.manifest`` of the example) with the trainer's command ``prelude`` + the test's ConfigMap line
    + the harness's wrapper, the trainer's ConfigMap-fed variables, and the verifier's own pull secret."""
    out = copy.deepcopy(job)
    roles = out["spec"]["roles"]
    trainer = roles["trainer"]
    shell, flag, wrapper, python = trainer["command"]
    assert (shell, flag, wrapper) == ("/bin/sh", "-c", realjob.WRAPPER), trainer["command"]
    trainer["command"] = [shell, flag, prelude + SETTINGS_ECHO + wrapper, python]
    trainer["env"] = [*trainer["env"],
                      {"name": "KF_E2E_MODE", "valueFrom": {"configMapKeyRef": {"name": SETTINGS, "key": "MODE"}}}]
    trainer["envFrom"] = [{"configMapRef": {"name": SETTINGS}, "prefix": ENV_FROM_PREFIX}]
    roles["verifier"]["imagePullSecrets"] = [{"name": PULL_VERIFIER}]
    return out


def docker_config(name: str, *, namespace: str) -> dict[str, Any]:
    """A ``kubernetes.io/dockerconfigjson`` Secret for a registry no pull reaches (the image is on the node)."""
    auth = base64.b64encode(f"kubeforge:{secrets.token_hex(8)}".encode()).decode()
    config = {"auths": {"registry.kubeforge.invalid": {"auth": auth}}}
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
            "metadata": {"name": name, "namespace": namespace},
            "stringData": {".dockerconfigjson": json.dumps(config)}}


# ------------------------------------------------------------------------------------------- without a cluster


FAKE_PARTS = realnode.PodParts(
    python="/repo/.venv/bin/python", env=[{"name": "HOME", "value": "/tmp"}],
    volumes=[{"name": "kf-host-0", "hostPath": {"path": "/repo", "type": "Directory"}}],
    volume_mounts=[{"name": "kf-host-0", "mountPath": "/repo", "readOnly": True}])


def test_secret_job_keeps_the_examples_secret_reference_and_proof_line() -> None:
    example = load_example()
    job = with_test_parts(realjob.manifest(name="hf-token-secret", namespace="ns", base=example, parts=FAKE_PARTS,
                                           checkpoint_dir=pathlib.Path("/w/checkpoints")), prelude=proof_line(example))
    load.parse(job)
    diffs = guide_rehearsal.differences(example, job)
    assert diffs and all(d == ("metadata", "namespace") or (d[:2] == ("spec", "roles") and d[3] in ROLE_EXTRAS)
                         for d in diffs), diffs
    trainer = job["spec"]["roles"]["trainer"]
    assert trainer["env"][0] == example["spec"]["roles"]["trainer"]["env"][0]     # HF_TOKEN from the Secret, as is
    assert trainer["command"][2].startswith(proof_line(example)) and trainer["command"][2].endswith(realjob.WRAPPER)
    assert job["spec"]["algorithm"] == example["spec"]["algorithm"]


# ------------------------------------------------------------------------------------------- in real pods


class SecretRun:
    def __init__(self, *, result: run_real.Result, token: str, settings: dict[str, str],
                 workdir: pathlib.Path) -> None:
        self.result, self.token, self.settings, self.workdir = result, token, settings, workdir

    def role_pods(self, role: str) -> list[dict[str, Any]]:
        return [p for p in self.result.pods if p["metadata"]["labels"].get(run_real.LABEL_ROLE) == role]


@pytest.fixture(scope="module")
def secret_run(cluster: lifecycle.Cluster, tmp_path_factory: pytest.TempPathFactory) -> SecretRun:
    workdir = tmp_path_factory.mktemp("secrets-real")
    token = "hf_" + secrets.token_urlsafe(30)
    settings = {"MODE": secrets.token_hex(6), "GREETING": secrets.token_hex(6)}
    example = load_example()

    def prepare(ns: str) -> None:
        objects = [
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": TOKEN_SECRET, "namespace": ns},
             "stringData": {TOKEN_KEY: token}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": SETTINGS, "namespace": ns},
             "data": settings},
            docker_config(PULL_DEFAULT, namespace=ns), docker_config(PULL_VERIFIER, namespace=ns)]
        cluster.kubectl.apply("\n---\n".join(json.dumps(o) for o in objects))

    result = run_real.run(cluster=cluster, workdir=workdir, base=EXAMPLE, kill_after_step=None, timeout_s=1500,
                          chart_values=(f"rolePods.imagePullSecrets={{{PULL_DEFAULT}}}",), prepare=prepare,
                          adapt=lambda job: with_test_parts(job, prelude=proof_line(example)))
    print("SECRETS-REAL " + json.dumps(result.figures()))
    return SecretRun(result=result, token=token, settings=settings, workdir=workdir)


@pytest.mark.realnode
@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(1800)
class TestInRealPods:
    def test_secret_example_succeeds(self, secret_run: SecretRun) -> None:
        st = secret_run.result.status
        assert st.get("phase") == "Succeeded", json.dumps(st)[:2000]
        assert st["progress"]["step"] == secret_run.result.steps == load_example()["spec"]["algorithm"]["steps"]

    def test_trainer_reports_the_tokens_length_and_digest(self, secret_run: SecretRun) -> None:
        found = [m.groups() for text in secret_run.result.trainer_logs for m in PROOF.finditer(text)]
        want = (str(len(secret_run.token)), hashlib.sha256(secret_run.token.encode()).hexdigest()[:12])
        assert found and all(f == want for f in found), (found, want)

    def test_the_token_is_in_no_log_status_or_pod_object(self, secret_run: SecretRun) -> None:
        res = secret_run.result
        texts = {"status": json.dumps(res.status), "pods": json.dumps(res.pods),
                 "failures": json.dumps(res.failures)}
        texts.update({p.name: p.read_text(errors="replace") for p in secret_run.workdir.glob("*.log")})
        assert "operator.log" in texts and any(name.startswith("trainer-") for name in texts), sorted(texts)
        assert not [name for name, text in texts.items() if secret_run.token in text]
        for pod in secret_run.role_pods("trainer"):    # the pod holds the reference, the kubelet the value
            env = pod["spec"]["containers"][0]["env"]
            assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": TOKEN_SECRET, "key": TOKEN_KEY}}} in env

    def test_config_map_key_and_env_from_reach_the_trainer(self, secret_run: SecretRun) -> None:
        found = {m.groups() for text in secret_run.result.trainer_logs for m in SETTINGS_LINE.finditer(text)}
        assert found == {(secret_run.settings["MODE"], secret_run.settings["GREETING"])}, found

    def test_role_pods_carry_the_charts_pull_secret_unless_the_role_names_its_own(self, secret_run: SecretRun) -> None:
        want = {"generator": PULL_DEFAULT, "trainer": PULL_DEFAULT, "verifier": PULL_VERIFIER}
        for role, name in want.items():
            pods = secret_run.role_pods(role)
            assert pods, f"no {role} pod seen"
            assert all(p["spec"].get("imagePullSecrets") == [{"name": name}] for p in pods), (role, name)
