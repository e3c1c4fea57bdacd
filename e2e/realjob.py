"""The tiny RLJob of ``examples/tiny.yaml``, made to run in real pods on the real test node.

Role: a pure manifest builder for the real-pod e2e run (``e2e/run_real.py``, ``e2e/test_e2e_real.py``). It adds,
per role, what a pod on the busybox base image needs to run the project from the host: the host Python and the
project's ``.venv`` through read-only hostPath mounts (``node.realnode.venv_python_parts``), the node selector of
the real node, and for the trainer a hostPath checkpoint directory that outlives its pods. No GPU limits, no kwok
toleration: the fake GPU nodes keep their taint, so every pod lands on the real node.

Neighbours: ``node.realnode`` (the node's label, base image, pod parts), the operator's renderer (a role's
``command`` replaces the ``kubeforge`` executable, args stay ``role <role>``), ``run_real`` (applies the result).

Invariants:
- ``command`` is ``sh -c WRAPPER <venv python>``: the wrapper runs ``python -m kubeforge.cli role <role>`` as a
  *child* of the shell (PID 1), forwards SIGTERM/SIGINT to it and exits with its status (128 + signal when killed).
  A process that is PID 1 of its container ignores every signal it has no handler for, so only a child can be
  killed from ``kubectl exec`` with a chosen signal, and only a forwarding PID 1 lets pods stop at once.
- The generator runs vLLM without torch.compile (``enforceEager`` and ``TORCHDYNAMO_DISABLE=1``, which also turns
  vLLM's compiled sampler helpers eager): inductor needs a C++ compiler at run time and the base image has none.
  It gets the host's ``lscpu`` (vLLM's CPU worker reads the CPU topology from ``lscpu --json``; busybox has none).
- ``image_parts(ref)`` instead runs every role from the runtime image itself (its Python, its libraries, its lscpu):
  what a user's cluster runs (``run_real.py --runtime-image``).
- The input dict is never mutated; the same inputs give the same manifest.
"""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import yaml

from node import realnode

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "tiny.yaml"
ROLES = ("generator", "verifier", "trainer")
CONTAINER_CHECKPOINTS = "/checkpoints"
CHECKPOINT_VOLUME = "kf-checkpoints"
LSCPU = "/usr/bin/lscpu"

#: PID 1 of every role container: start the role as a child, forward TERM/INT, exit with the child's status.
#: The child's PID is written to ``ROLE_PID_FILE`` (what a test kills; busybox here has no pgrep).
ROLE_PID_FILE = "/tmp/kubeforge-role.pid"
WRAPPER = (
    '"$0" -m kubeforge.cli "$@" & child=$!\n'
    f"echo $child > {ROLE_PID_FILE}\n"
    "trap 'kill -TERM $child 2>/dev/null' TERM INT\n"
    "wait $child; status=$?\n"
    "while kill -0 $child 2>/dev/null; do wait $child; status=$?; done\n"
    "exit $status\n"
)


#: The runtime image's own interpreter (images/runtime/Containerfile): ``image_parts`` runs the project as the image
#: carries it, no host mount.
IMAGE_PYTHON = "/opt/kubeforge/bin/python"


def image_parts(image: str) -> realnode.PodParts:
    """Pod parts running the roles from a runtime image (``make images`` imports it into the real node) instead of
    the busybox base image with the host's venv mounted: what the image carries is what runs."""
    return realnode.PodParts(python=IMAGE_PYTHON, volumes=[], volume_mounts=[], env=[], image=image)


def load_tiny(path: pathlib.Path = TINY) -> dict[str, Any]:
    """The example manifest as a dict."""
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict), f"{path}: not a mapping"
    return doc


def role_template(role: dict[str, Any], *, parts: realnode.PodParts, extra_env: dict[str, str],
                  volumes: list[dict[str, Any]], mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """``role`` (a ``spec.roles.<role>`` dict) plus image, command, env, volumes and node selector for the real node."""
    out = copy.deepcopy(role)
    out["image"] = parts.image
    out["command"] = ["/bin/sh", "-c", WRAPPER, parts.python]
    # by name, the role's own entries kept whole (a ``valueFrom`` one too: examples/hf-token-secret.yaml)
    env = {e["name"]: dict(e) for e in out.get("env", [])}
    env.update({e["name"]: dict(e) for e in parts.env})
    env.update({k: {"name": k, "value": v} for k, v in extra_env.items()})
    out["env"] = list(env.values())
    out["volumes"] = [*out.get("volumes", []), *copy.deepcopy(parts.volumes), *volumes]
    out["volumeMounts"] = [*out.get("volumeMounts", []), *copy.deepcopy(parts.volume_mounts), *mounts]
    out["nodeSelector"] = {**out.get("nodeSelector", {}), realnode.NODE_LABEL: "true"}
    out["tolerations"] = [*out.get("tolerations", []), dict(realnode.REAL_NODE_TOLERATION)]
    limits = out.get("resources", {}).get("limits", {})
    assert not any("gpu" in k for k in limits), f"real-node roles get no GPU limits: {limits}"
    return out


def manifest(*, name: str, namespace: str, checkpoint_dir: pathlib.Path, parts: realnode.PodParts | None = None,
             base: dict[str, Any] | None = None, steps: int | None = None) -> dict[str, Any]:
    """The tiny RLJob for real pods: every role on the real node, checkpoints in ``checkpoint_dir`` on the host.

    ``checkpoint_dir`` must be an absolute host path (a hostPath volume, created when missing); ``steps``
    overrides ``spec.algorithm.steps`` when given.
    """
    if not checkpoint_dir.is_absolute():
        raise ValueError(f"checkpoint_dir must be absolute, got {checkpoint_dir}")
    parts = parts or realnode.venv_python_parts()
    doc = copy.deepcopy(base if base is not None else load_tiny())
    doc["metadata"] = {**doc.get("metadata", {}), "name": name, "namespace": namespace}
    spec = doc["spec"]
    if steps is not None:
        spec["algorithm"]["steps"] = steps
    spec["checkpoint"] = {**spec.get("checkpoint", {}), "path": CONTAINER_CHECKPOINTS}
    roles = spec.setdefault("roles", {})
    for role in ROLES:
        vols: list[dict[str, Any]] = []
        mounts: list[dict[str, Any]] = []
        if role == "trainer":
            vols = [{"name": CHECKPOINT_VOLUME, "hostPath": {"path": str(checkpoint_dir), "type": "DirectoryOrCreate"}}]
            mounts = [{"name": CHECKPOINT_VOLUME, "mountPath": CONTAINER_CHECKPOINTS}]
        if role == "generator" and parts.image == realnode.BASE_IMAGE:   # the runtime image has its own lscpu
            vols = [{"name": "kf-lscpu", "hostPath": {"path": LSCPU, "type": "File"}}]
            mounts = [{"name": "kf-lscpu", "mountPath": LSCPU, "readOnly": True}]
        env = {"TORCHDYNAMO_DISABLE": "1"} if role == "generator" else {}
        roles[role] = role_template(roles.get(role) or {}, parts=parts, extra_env=env, volumes=vols, mounts=mounts)
    roles["generator"]["enforceEager"] = True
    return doc
