"""The env contract (kubeforge.api.roleenv): what the operator renders for a pod and what the launcher sets for a
process are both read back, by the same parser, as the process they describe."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kubeforge.api import contract, load, roleenv
from kubeforge.operator import names
from kubeforge.operator.render import context, env
from kubeforge.runtime import config

DOC = {
    "apiVersion": "kubeforge.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "cfg"},
    "spec": {"model": {"builtin": "tiny"}, "task": {"copy": {}}, "verifiers": [{"name": "a", "type": "ExactAnswer"}],
             "algorithm": {"promptsPerStep": 4},
             "roles": {"generator": {"replicas": 2}, "verifier": {"replicas": 1}, "trainer": {"replicas": 1}}},
}
KEY = bytes(range(32))


def _resolve(entries: list[dict[str, Any]], *, pod: dict[str, Any], secrets: dict[tuple[str, str], str]) \
        -> dict[str, str]:
    """What the kubelet does with a container's env entries: values as written, valueFrom read from the pod
    (downward API: labels, namespace, name) or a Secret."""
    out: dict[str, str] = {}
    for e in entries:
        if "value" in e:
            out[e["name"]] = e["value"]
            continue
        src = e["valueFrom"]
        if "secretKeyRef" in src:
            ref = src["secretKeyRef"]
            out[e["name"]] = secrets[(ref["name"], ref["key"])]
            continue
        path = src["fieldRef"]["fieldPath"]
        if path.startswith("metadata.labels['"):
            out[e["name"]] = pod["labels"][path[len("metadata.labels['"):-2]]
        else:
            out[e["name"]] = pod[path.removeprefix("metadata.")]
    return out


def test_the_operators_rendered_env_is_what_the_runtime_parses(tmp_path: Path) -> None:
    job = load.parse(DOC)
    entries = env.role_env(job, context.RenderContext(namespace="team-a", uid="u", attempt=2), role="generator")
    pod = {"name": "cfg-generator-1", "namespace": "team-a", "labels": {names.LABEL_POD_INDEX: "1"}}
    resolved = _resolve(entries, pod=pod, secrets={(contract.job_key_secret("cfg"), contract.JOB_KEY_SECRET_KEY):
                                                   KEY.hex()})
    parsed = roleenv.parse(resolved)
    assert (parsed.role, parsed.index, parsed.attempt, parsed.job_key) == ("generator", 1, 2, KEY)
    assert (parsed.namespace, parsed.pod_name, parsed.bind_host) == ("team-a", "cfg-generator-1", "0.0.0.0")
    assert parsed.report == roleenv.REPORT_POD_ANNOTATION and parsed.config_path == names.CONFIG_PATH
    assert parsed.peers["generator"][1] == roleenv.Peer(host="cfg-generator-1.cfg.team-a.svc",
                                                        port_base=contract.DEFAULT_PORT_BASE)
    assert [len(parsed.peers[r]) for r in contract.ROLES] == [2, 1, 1]
    # the runtime's own parser (manifest loaded from where the pod mounts it: here a file) takes it as it is
    manifest = tmp_path / "rljob.json"
    manifest.write_text(json.dumps(DOC))
    cfg = config.from_env({**resolved, contract.ENV_CONFIG: str(manifest)})
    assert (cfg.role, cfg.index, cfg.namespace, cfg.job_key, cfg.job_name) == \
        ("generator", 1, "team-a", KEY, "cfg")


def test_local_render_reads_back() -> None:
    peers = {"generator": [roleenv.Peer(host="127.0.0.1", port_base=30000)],
             "verifier": [roleenv.Peer(host="127.0.0.1", port_base=30010)],
             "trainer": [roleenv.Peer(host="127.0.0.1", port_base=30020)]}
    rendered = roleenv.render(role="trainer", index=0, config_path="/x.yaml", job_name="j", peers=peers,
                              port_base=30020, bind_host="127.0.0.1", attempt=1, report=roleenv.REPORT_JSONL,
                              job_key=KEY, run_dir="/run")
    assert all(isinstance(v, str) for v in rendered.values())
    got = roleenv.parse({k: v for k, v in rendered.items() if isinstance(v, str)})
    assert got == roleenv.RoleEnv(role="trainer", index=0, config_path="/x.yaml", job_name="j", namespace=None,
                                  pod_name=None, port_base=30020, bind_host="127.0.0.1", run_dir="/run",
                                  checkpoint_dir=None, attempt=1, report="jsonl",
                                  peers={r: tuple(p) for r, p in peers.items()}, job_key=KEY, local_rank=None)


def test_every_bad_variable_is_named() -> None:
    with pytest.raises(roleenv.EnvError) as err:
        roleenv.parse({contract.ENV_ROLE: "chef", contract.ENV_JOB_KEY: "abc", contract.ENV_ATTEMPT: "-1"})
    named = {p.split(":")[0] for p in err.value.problems}
    assert {contract.ENV_ROLE, contract.ENV_JOB_KEY, contract.ENV_ATTEMPT, contract.ENV_CONFIG} <= named
    assert {contract.env_peers(r) for r in contract.ROLES} <= named
