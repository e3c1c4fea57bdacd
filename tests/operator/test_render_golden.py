"""Golden-file tests of the pure renderers: every example and every gang backend, byte for byte.

Regenerate after an intended change with ``UPDATE_GOLDEN=1 pytest tests/operator`` and review the diff.
"""
from __future__ import annotations

import os
import pathlib

import pytest
import yaml

import opbuilders
from kubeforge.operator import render
from kubeforge.operator.render import context

GOLDEN = pathlib.Path(__file__).parent / "golden"
CTX = context.RenderContext(namespace="ns", uid="00000000-0000-0000-0000-000000000001", attempt=0,
                            image="kubeforge/runtime:test")

CASES = {
    "tiny": (lambda: opbuilders.job("tiny"), CTX),
    "arith": (lambda: opbuilders.job("arithmetic-smollm2"), CTX),
    "tiny-volcano": (lambda: opbuilders.job("tiny", spec__gang__backend="Volcano", spec__gang__queue="rl"), CTX),
    "tiny-kai": (lambda: opbuilders.job("tiny", spec__gang__backend="KAI"), CTX),
    "tiny-kueue": (lambda: opbuilders.job("tiny", spec__gang__backend="Kueue", spec__gang__queue="team-a"), CTX),
    "tiny-nogang": (lambda: opbuilders.job("tiny", spec__gang__backend="None"), CTX),
    "tiny-suspended": (lambda: opbuilders.job("tiny", spec__suspend=True),
                       context.RenderContext(namespace="ns", uid=CTX.uid, image=CTX.image, attempt=2,
                                             active=False, gang_active=False)),
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
}


def dump(case: str) -> str:
    make, ctx = CASES[case]
    out = render.render(make(), ctx)
    return yaml.safe_dump_all([{"desired": list(out.desired)}, {"absent": list(out.absent)}], sort_keys=True)


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
