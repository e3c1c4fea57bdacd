"""`make images REGISTRY=...`: the images pushed to a real OCI registry, as users publish them for their cluster.

The registry is the CNCF distribution registry (``e2e/build/build.sh registry``: built from its Go module like the
cluster's binaries), served over plain HTTP on loopback. The push goes through ``images/build.sh`` with
``KF_REGISTRY`` (what the Makefile's ``REGISTRY`` sets); the operator image only (the runtime image is pushed by the
same function, and is a GiB). The registry must then serve the manifest of the pushed tag whose config is the
image's config in the archive that ``make images`` printed (the image ID: layers are recompressed on push, the
config is not). Runs in the real-node tier (root, buildah from ``make host-deps``, the image cache it shares with
``e2e/test_helm_install.py``).
"""
from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import tarfile
import time
import urllib.request
from collections.abc import Iterator

import pytest

from kfcluster import binaries

ROOT = pathlib.Path(__file__).resolve().parents[1]
ASKED = os.environ.get("KUBEFORGE_REAL_NODE", "") in ("1", "true", "yes")

pytestmark = [pytest.mark.realnode, pytest.mark.slow, pytest.mark.timeout(3600)]

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not ASKED:
        pytest.skip("the real-node tier (KUBEFORGE_REAL_NODE=1: root, buildah) pushes images")
    binary = binaries.require(["registry"], build=True)["registry"]
    root = tmp_path_factory.mktemp("registry")
    port = free_port()
    config = root / "config.yml"
    config.write_text(json.dumps({   # YAML is a superset of JSON
        "version": 0.1, "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(root / "data")}, "delete": {"enabled": True}},
        "http": {"addr": f"127.0.0.1:{port}"}}))
    log = (root / "registry.log").open("w")
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    host = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://{host}/v2/", timeout=2) as resp:
                    assert resp.status == 200
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"registry did not answer: {(root / 'registry.log').read_text()[-2000:]}")
                time.sleep(0.2)
        yield host
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def archive_config_digest(archive: str) -> str:
    """The config digest of the one image in an OCI archive (index.json -> manifest -> config)."""
    with tarfile.open(archive) as tar:
        def blob(digest: str) -> dict[str, object]:
            f = tar.extractfile("blobs/" + digest.replace(":", "/"))
            assert f is not None
            return json.loads(f.read())  # type: ignore[no-any-return]
        f = tar.extractfile("index.json")
        assert f is not None
        (entry,) = json.loads(f.read())["manifests"]
        manifest = blob(entry["digest"])
        return str(manifest["config"]["digest"])  # type: ignore[index]


def test_make_images_registry_pushes_what_it_built_and_says_how_to_point_the_chart_at_it(registry: str) -> None:
    dest = f"{registry}/team/kubeforge"
    t0 = time.monotonic()
    run = subprocess.run(["bash", str(ROOT / "images" / "build.sh"), "operator"], capture_output=True, text=True,
                         timeout=3000, env={**os.environ, "KF_REGISTRY": dest, "KF_REGISTRY_TLS_VERIFY": "false"})
    assert run.returncode == 0, run.stderr[-4000:]
    ref, archive = run.stdout.strip().splitlines()[-1].split()
    version = ref.rsplit(":", 1)[1]
    assert ref == f"{dest}/operator:{version}" and os.path.isfile(archive)
    assert f"--set image.repository={dest}/operator --set image.tag={version}" in run.stderr
    req = urllib.request.Request(f"http://{registry}/v2/team/kubeforge/operator/manifests/{version}",
                                 headers={"Accept": OCI_MANIFEST + ", application/vnd.docker.distribution.manifest.v2+json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        manifest = json.loads(resp.read())
    assert manifest["config"]["digest"] == archive_config_digest(archive)
    for layer in manifest["layers"]:       # every blob the manifest names is in the registry
        head = urllib.request.Request(f"http://{registry}/v2/team/kubeforge/operator/blobs/{layer['digest']}",
                                      method="HEAD")
        with urllib.request.urlopen(head, timeout=30) as resp:
            assert resp.status == 200
    print(f"IMAGES-PUSH operator {round(time.monotonic() - t0, 1)} s (build cached or not) -> {ref}")


def test_the_makefile_hands_registry_to_the_build() -> None:
    run = subprocess.run(["make", "-n", "images", "REGISTRY=reg.example:5000/ml", "REGISTRY_TLS_VERIFY=false"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "KF_REGISTRY=reg.example:5000/ml KF_REGISTRY_TLS_VERIFY=false" in run.stdout
