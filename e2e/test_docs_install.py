"""The docs are the test: the shell blocks of the install path, run verbatim against the test cluster's real node.

``docs_blocks.INSTALL_PATH`` names the sections (README's cluster quickstart, docs/install.md's install and
upgrade steps, docs/guide.md's cluster steps); every ```` ```bash ```` block in them runs as the reader would paste it:
``bash -euo pipefail`` on the block's text, ``KUBECONFIG`` of the test cluster, ``kubectl`` and ``helm`` from the
cluster build cache and the venv's ``kubeforge`` on ``PATH``. A docs edit that breaks a command fails here, naming
the block (``file:line``) and its output.

What the test provides, because the reader's cluster has it and the test cluster does not:
- **a cluster without kubeforge**: RLJob CRDs other suites of the session applied are handed to the release (Helm's
  adoption metadata), as ``e2e/test_helm_install.py`` does;
- **schedulable nodes**: the real node's NoSchedule taint (it keeps pods meant for the kwok GPU nodes off it) is
  lifted while the blocks run and put back after; the kwok nodes keep theirs, so every pod of the docs lands on the
  real node;
- **a registry** for docs/install.md's ``REGISTRY``: the CNCF distribution registry on loopback (plain HTTP,
  ``REGISTRY_TLS_VERIFY=false``), which the node's containerd pulls from;
- for docs/guide.md, **the reader's files and storage**: a folder holding ``my-model`` (the tiny model as a Hugging
  Face folder, ``e2e/guide_rehearsal.py``) and ``train.jsonl`` beside ``examples`` and ``helm`` of this checkout (the
  blocks' cwd; the other docs run in the repo root), PersistentVolumes on the real node for the guide's claims (a
  StorageClass's work), and ``busybox:1.36`` (the upload pod's image) tagged from the node's busybox image (no
  registry outside is reachable here).
Between docs the release, its namespaces and their jobs are removed, so each doc starts from a cluster without it.

Runs in the real-node tier under the real-node lock (one real node per machine; ``flock /tmp/kubeforge-realnode.lock``
around pytest), on the session's cluster with its real node (``cluster`` fixture).
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

import docs_blocks
from kfcluster import binaries, lifecycle
from node import realnode

pytestmark = [pytest.mark.realnode, pytest.mark.slow, pytest.mark.timeout(7200)]
ROOT = docs_blocks.ROOT
BLOCK_TIMEOUT_S = 2400
NAMESPACES = ("rl-jobs", "kubeforge-system")
# both CRDs the chart installs; the session's other suites apply them from crds/ (kfcluster K.ensure_crd)
CRDS = ("crd/rljobs.kubeforge.dev", "crd/generatorpools.kubeforge.dev")


def log(msg: str) -> None:
    print(f"[docs-test {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Reader:
    """Runs blocks as a reader would, against one cluster."""

    def __init__(self, cluster: lifecycle.Cluster, *, registry: str, logs: pathlib.Path) -> None:
        self.cluster, self.logs = cluster, logs
        path = os.pathsep.join([str(binaries.bin_dir()), os.path.dirname(sys.executable), os.environ.get("PATH", "")])
        self.env = {**os.environ, "KUBECONFIG": cluster.kubeconfig, "PATH": path, "REGISTRY": f"{registry}/kubeforge",
                    "REGISTRY_TLS_VERIFY": "false"}
        if os.environ.get("PYTHONPATH"):   # a worktree's sources first (relative entries would follow the cwd)
            self.env["PYTHONPATH"] = os.pathsep.join(str((ROOT / p).resolve())
                                                     for p in os.environ["PYTHONPATH"].split(os.pathsep) if p)

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["kubectl", *args], env=self.env, capture_output=True, text=True, timeout=300,
                              check=check)

    def run(self, block: docs_blocks.Block, *, cwd: pathlib.Path) -> None:
        out = self.logs / f"{block.name.replace('/', '_').replace(':', '-')}.log"
        log(f"{block.name} ({block.section}) ...")
        t0 = time.monotonic()
        with open(out, "w") as f:
            proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block.text], cwd=cwd, env=self.env, stdout=f,
                                  stderr=subprocess.STDOUT, timeout=BLOCK_TIMEOUT_S, check=False)
        text = out.read_text(errors="replace")
        log(f"{block.name}: exit {proc.returncode} in {time.monotonic() - t0:.1f}s")
        if block.expect_error:
            assert proc.returncode != 0 and block.expect_error in text, (
                f"{block.name} should fail printing {block.expect_error!r}; exit {proc.returncode}:\n{text[-3000:]}")
        else:
            assert proc.returncode == 0, (f"{block.name} ({block.section}) failed, exit {proc.returncode}:\n"
                                          f"{block.text}\n--- output:\n{text[-4000:]}\n{self.diagnose()}")

    def diagnose(self) -> str:
        parts = [self.kubectl("get", "pods,rljobs,events", "-A", "-o", "wide", check=False).stdout[-3000:]]
        return "--- cluster:\n" + "\n".join(parts)

    def uninstall(self) -> None:
        """Back to a cluster without kubeforge: jobs deleted while an operator may still run, the release, the
        namespaces (finalizers of jobs whose operator is gone removed), the CRD handed to no release."""
        self.kubectl("delete", "rljobs", "--all", "-n", "rl-jobs", "--wait=false", check=False)
        subprocess.run(["helm", "uninstall", "kubeforge", "-n", "kubeforge-system", "--wait"], env=self.env,
                       capture_output=True, text=True, timeout=300, check=False)
        for job in self.kubectl("get", "rljobs", "-n", "rl-jobs", "-o", "name", check=False).stdout.split():
            self.kubectl("patch", job, "-n", "rl-jobs", "--type=merge", "-p", '{"metadata":{"finalizers":null}}',
                         check=False)
        self.kubectl("delete", "namespace", *NAMESPACES, "--ignore-not-found", "--timeout=300s", check=False)
        self.kubectl("delete", "pv", "-l", "kubeforge.dev/docs-test=true", "--ignore-not-found", check=False)
        self.adopt_crd()

    def adopt_crd(self) -> None:
        """Every CRD the chart installs that the session already has is marked the release's (Helm's adoption
        metadata), or the documented `helm install` refuses it (it did for the GeneratorPool CRD, once the other
        suites applied it too)."""
        for crd in CRDS:
            if self.kubectl("get", crd, check=False).returncode == 0:
                self.kubectl("annotate", "--overwrite", crd, "meta.helm.sh/release-name=kubeforge",
                             "meta.helm.sh/release-namespace=kubeforge-system")
                self.kubectl("label", "--overwrite", crd, "app.kubernetes.io/managed-by=Helm")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The distribution registry on loopback, plain HTTP (the node's containerd pulls from 127.0.0.1 over HTTP)."""
    binary = binaries.require(["registry"], build=True)["registry"]
    root = tmp_path_factory.mktemp("registry")
    port = free_port()
    config = root / "config.yml"
    config.write_text(json.dumps({"version": 0.1, "log": {"level": "warn"},
                                  "storage": {"filesystem": {"rootdirectory": str(root / "data")}},
                                  "http": {"addr": f"127.0.0.1:{port}"}}))
    with open(root / "registry.log", "w") as out:
        proc = subprocess.Popen([binary, "serve", str(config)], stdout=out, stderr=subprocess.STDOUT)
        try:
            yield f"127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def reader(cluster: lifecycle.Cluster, registry: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reader]:
    r = Reader(cluster, registry=registry, logs=tmp_path_factory.mktemp("docs-logs"))
    node = realnode.NODE_NAME
    taint = f"{realnode.NODE_LABEL}=true:NoSchedule"
    r.uninstall()
    r.kubectl("taint", "node", node, f"{taint}-")
    try:
        yield r
    finally:
        r.uninstall()
        r.kubectl("taint", "node", node, taint, "--overwrite", check=False)


def run_doc(reader: Reader, doc: str, *, cwd: pathlib.Path = ROOT) -> None:
    blocks = [b for b in docs_blocks.install_path() if b.doc == doc]
    assert blocks, f"no blocks in {doc}"
    try:
        for block in blocks:
            if block.skip:
                log(f"{block.name}: skipped ({block.skip})")
                continue
            reader.run(block, cwd=cwd)
    finally:
        reader.uninstall()


def test_readme_cluster_quickstart(reader: Reader) -> None:
    run_doc(reader, "README.md")


def test_install_md(reader: Reader) -> None:
    run_doc(reader, "docs/install.md")


@pytest.fixture
def guide_workdir(reader: Reader, tmp_path: pathlib.Path) -> pathlib.Path:
    """The reader's folder for docs/guide.md: their model folder and JSONL beside this checkout's examples and chart;
    PersistentVolumes on the real node for the guide's claims; the upload pod's busybox image on the node."""
    import guide_rehearsal

    guide_rehearsal.make_model_folder(tmp_path / "my-model")
    guide_rehearsal.make_jsonl(tmp_path / "train.jsonl")
    for name in ("examples", "helm"):
        (tmp_path / name).symlink_to(ROOT / name)
    storage = tmp_path / "volumes"
    for claim, size in (("kubeforge-models", "20Gi"), ("kubeforge-data", "1Gi"), ("own-model-checkpoints", "20Gi")):
        d = storage / claim
        d.mkdir(parents=True)
        d.chmod(0o777)      # the upload pod and the role pods run as UID 1000; hostPath gets no fsGroup
        pv = {"apiVersion": "v1", "kind": "PersistentVolume",
              "metadata": {"name": f"docs-{claim}", "labels": {"kubeforge.dev/docs-test": "true"}},
              "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
                       "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                       "claimRef": {"namespace": "rl-jobs", "name": claim},
                       "local": {"path": str(d)},
                       "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                           {"key": realnode.NODE_LABEL, "operator": "In", "values": ["true"]}]}]}}}}
        subprocess.run(["kubectl", "apply", "-f", "-"], input=json.dumps(pv), env=reader.env, text=True,
                       capture_output=True, timeout=60, check=True)
    tag_busybox()
    # the images in the reader's registry (guide.md, "What you need"; docs/install.md pushes them the same way)
    subprocess.run(["make", "-s", "images", f"REGISTRY={reader.env['REGISTRY']}"], cwd=ROOT, env=reader.env,
                   check=True, timeout=BLOCK_TIMEOUT_S)
    return tmp_path


def tag_busybox() -> None:
    workdir = pathlib.Path("/run/kubeforge-node/workdir").read_text().strip()
    sock = f"{workdir}/node/containerd/containerd.sock"
    ctr = shutil.which("ctr") or "ctr"
    subprocess.run([ctr, "--address", str(sock), "-n", "k8s.io", "images", "tag", "--force",
                    "kubeforge.local/base:1", "docker.io/library/busybox:1.36"], check=True, capture_output=True,
                   text=True, timeout=60)


def test_guide_md(reader: Reader, guide_workdir: pathlib.Path) -> None:
    run_doc(reader, "docs/guide.md", cwd=guide_workdir)
    export = guide_workdir / "my-model-rl"
    assert (export / "config.json").is_file(), f"the exported model did not come out: {sorted(guide_workdir.iterdir())}"

