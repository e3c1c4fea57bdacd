"""Golden-file tests of the pure renderers: every example and every gang backend, byte for byte.

Regenerate after an intended change with ``UPDATE_GOLDEN=1 pytest tests/operator`` and review the diff.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib

import pytest
import yaml

import opbuilders
from kubeforge.api import load, rljob
from kubeforge.operator import render
from kubeforge.operator.render import context
from kubeforge.operator.render import pool as pool_render

GOLDEN = pathlib.Path(__file__).parent / "golden"
# gang_backend: what gang.backend Auto resolves to on the test cluster (PodGroups served, a scheduler named); the
# manifests here name their backend, so it matters only to the Auto cases (and hf-token-secret, an Auto example).
CTX = context.RenderContext(namespace="ns", uid="00000000-0000-0000-0000-000000000001", attempt=0,
                            image="kubeforge/runtime:test", gang_backend="Coscheduling")

CASES = {
    "tiny": (lambda: opbuilders.job("tiny"), CTX),
    "arith": (lambda: opbuilders.job("arithmetic-smollm2"), CTX),
    "tiny-volcano": (lambda: opbuilders.job("tiny", spec__gang__backend="Volcano", spec__gang__queue="rl"), CTX),
    "tiny-kai": (lambda: opbuilders.job("tiny", spec__gang__backend="KAI"), CTX),
    "tiny-kueue": (lambda: opbuilders.job("tiny", spec__gang__backend="Kueue", spec__gang__queue="team-a"), CTX),
    "tiny-nogang": (lambda: opbuilders.job("tiny", spec__gang__backend="None"), CTX),
    "tiny-suspended": (lambda: opbuilders.job("tiny", spec__suspend=True),
                       context.RenderContext(namespace="ns", uid=CTX.uid, image=CTX.image, attempt=2,
                                             active=False, gang_active=False, gang_backend="Coscheduling")),
    # gang.backend Auto (issue 37 item 3): unresolved or resolved to None -> no PodGroup, no pod-group label
    "tiny-auto-none": (lambda: opbuilders.job("tiny", spec__gang__backend="Auto"),
                       dataclasses.replace(CTX, gang_backend="None")),
    # Auto resolved to Coscheduling, the operator naming its scheduler: the PodGroup, schedulerName on every pod
    "tiny-coscheduling-scheduler": (lambda: opbuilders.job("tiny", spec__gang__backend="Auto"),
                                    dataclasses.replace(CTX, coscheduling_scheduler="scheduler-plugins")),
    # the job's own gang.schedulerName wins over the backend's (volcano)
    "tiny-scheduler-name": (lambda: opbuilders.job("tiny", spec__gang__backend="Volcano",
                                                   spec__gang__schedulerName="volcano-gpu"), CTX),
    # env valueFrom (Secret and ConfigMap keys) and envFrom (with a prefix), issue 37 item 5
    "tiny-env-sources": (lambda: opbuilders.job("tiny", spec__roles__trainer={
        "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}},
                {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode",
                                                                    "optional": True}}},
                {"name": "PLAIN", "value": "1"}, {"name": "EMPTY"}],
        "envFrom": [{"secretRef": {"name": "api-keys"}},
                    {"prefix": "CFG_", "configMapRef": {"name": "settings", "optional": True}}]}), CTX),
    # the operator's default imagePullSecrets on every role pod; the trainer's own list wins
    "tiny-pull-secrets": (lambda: opbuilders.job("tiny", spec__roles__trainer={
        "imagePullSecrets": [{"name": "trainer-registry"}]}),
        dataclasses.replace(CTX, image_pull_secrets=("registry-a", "registry-b"))),
    "hf-token-secret": (lambda: _example("hf-token-secret"), CTX),   # examples/: its trainer reads a Secret
    "tiny-placement": (lambda: opbuilders.job(
        "tiny", spec__placement={"topologyKey": "topology.kubeforge.dev/rack", "mode": "Preferred",
                                 "exclusive": True},
        spec__roles__generator={"replicas": 2, "resources": {"limits": {"nvidia.com/gpu": 2}},
                                "nodeSelector": {"pool": "gpu"},
                                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                                 "effect": "NoSchedule"}],
                                "command": ["/venv/bin/python", "-m", "kubeforge.cli"],
                                "env": [{"name": "EXTRA", "value": "1"}]}), CTX),
    "tiny-checkpoint-claim": (lambda: opbuilders.job(
        "tiny", spec__checkpoint={"path": "/ckpt", "everySteps": 5, "claimName": "shared-ckpt"}), CTX),
    "tiny-checkpoint-template": (lambda: opbuilders.job(
        "tiny", spec__checkpoint={"path": "/ckpt", "volumeClaimTemplate": {
            "storage": "2Gi", "storageClassName": "local-path", "accessModes": ["ReadWriteOnce"]}},
        spec__roles__trainer={"replicas": 2}), CTX),
    # generators beyond minReplicas: a StatefulSet of their own outside the gang (ordinals from the minimum)
    "tiny-surplus": (lambda: opbuilders.job("tiny", spec__roles__generator={"replicas": 4, "minReplicas": 1}), CTX),
    "tiny-surplus-gated": (lambda: opbuilders.job("tiny", spec__roles__generator={"replicas": 4, "minReplicas": 1}),
                           context.RenderContext(namespace="ns", uid=CTX.uid, image=CTX.image,
                                                 surplus_active=False)),
    "tiny-surplus-volcano": (lambda: opbuilders.job("tiny", spec__gang__backend="Volcano", spec__gang__queue="rl",
                                                    spec__roles__generator={"replicas": 3, "minReplicas": 2}), CTX),
    "tiny-surplus-kai": (lambda: opbuilders.job("tiny", spec__gang__backend="KAI",
                                                spec__roles__generator={"replicas": 3, "minReplicas": 2}), CTX),
    # a LoRA job on a GeneratorPool of 2 engines (docs/generator-pool.md): no generators of its own, its roles dial
    # the pool's engines, the pool's pods may reach its pods; its key Secret named by its derived key's fingerprint
    "tiny-pool": (lambda: opbuilders.job("tiny", spec__model__lora={"rank": 8},
                                         spec__generatorPool={"name": "shared"}),
                  dataclasses.replace(CTX, pool_engines=2, pool_port_base=29510, key_secret="tiny-key-0123456789")),
    # the user's agent in pods of its own (docs/agents.md, "Agents in their own pods"): <job>-agent outside the
    # gang, the agent key and not the job key, the generators' agent key and pod IP
    # spec.sandbox (docs/sandboxes.md): a code task scored by CodeExecution in a warm pool of sandbox pods
    "tiny-sandbox": (lambda: opbuilders.job(
        "tiny", spec__task={"code": {}, "seed": 0}, spec__algorithm__maxNewTokens=64,
        spec__verifiers=[{"name": "tests", "type": "CodeExecution", "codeExecution": {"timeoutSeconds": 5}}],
        spec__sandbox={"replicas": 2, "slots": 16, "maxRunSeconds": 20, "nodeSelector": {"pool": "cpu"}}), CTX),
    "tiny-agent": (lambda: opbuilders.job(
        "tiny", spec__environment={"type": "Agent", "reward": "Verifiers"}, spec__roles__generator={"replicas": 2},
        spec__agent={"replicas": 3, "concurrency": 8, "program": ["python", "/agent/run.py"],
                     "image": "registry.example/agent:1", "env": [{"name": "MODE", "value": "train"}],
                     "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}), CTX),
}

#: GeneratorPools rendered by ``render.pool`` (their own golden files, ``pool-<case>.yaml``).
POOL_CTX = pool_render.PoolContext(namespace="ns", uid=CTX.uid, image=CTX.image, key_id="0123456789")
POOL_CASES = {
    "shared": ({"model": {"builtin": "smollm2-135m-instruct"}, "replicas": 1, "maxAdapters": 8, "maxLoraRank": 16},
               POOL_CTX),
    # GPUs and tensor parallelism (/dev/shm), placement, its own image and pull secret, env, a model on a PVC
    "gpu": ({"model": {"path": "/models/base", "dtype": "bfloat16"}, "replicas": 2, "maxAdapters": 16,
             "maxLoraRank": 40, "tensorParallelSize": 2, "maxModelLen": 4096,
             "resources": {"limits": {"nvidia.com/gpu": 2}}, "nodeSelector": {"pool": "gpu"},
             "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
             "image": "registry.example/runtime:gpu", "imagePullSecrets": [{"name": "pull"}],
             "env": [{"name": "EXTRA", "value": "1"}],
             "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "models"}}],
             "volumeMounts": [{"name": "models", "mountPath": "/models"}], "priorityClassName": "high"},
            dataclasses.replace(POOL_CTX, image_pull_secrets=("default-pull",))),
    # two attached jobs served (docs/generator-pool.md): the jobs file (their identities) and manifests
    "members": ({"model": {"builtin": "tiny"}, "replicas": 2, "maxAdapters": 2, "maxLoraRank": 8},
                dataclasses.replace(POOL_CTX, attached=("job-a", "job-b"), members=tuple(
                    pool_render.Member(job=opbuilders.job("tiny", metadata__name=n, spec__model__lora={"rank": 8},
                                                          spec__generatorPool={"name": "members"}),
                                       uid=u, port_base=b)
                    for n, b, u in (("job-a", 29510, "uid-a"), ("job-b", 29530, "uid-b"))))),
}


def _example(name: str) -> rljob.RLJob:
    doc = yaml.safe_load((pathlib.Path(__file__).parents[2] / "examples" / f"{name}.yaml").read_text())
    doc["metadata"]["namespace"] = "ns"
    return load.parse(doc)


def dump(case: str) -> str:
    make, ctx = CASES[case]
    out = render.render(make(), ctx)
    return yaml.safe_dump_all([{"desired": list(out.desired)}, {"absent": list(out.absent)}], sort_keys=True)


def pool_dump(case: str) -> str:
    spec, ctx = POOL_CASES[case]
    doc = {"apiVersion": "kubeforge.dev/v1alpha1", "kind": "GeneratorPool", "metadata": {"name": case}, "spec": spec}
    return yaml.safe_dump_all(list(pool_render.render(load.parse_pool(doc), ctx)), sort_keys=True)


@pytest.mark.parametrize("case", sorted(POOL_CASES))
def test_pool_golden(case: str) -> None:
    path = GOLDEN / f"pool-{case}.yaml"
    text = pool_dump(case)
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}: run with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"pool {case} differs from {path} (UPDATE_GOLDEN=1 to accept)"


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case: str) -> None:
    path = GOLDEN / f"{case}.yaml"
    text = dump(case)
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}: run with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{case} differs from {path} (UPDATE_GOLDEN=1 to accept)"


def test_render_is_deterministic() -> None:
    assert dump("arith") == dump("arith")
