"""pytest fixtures: one cluster per test session, one namespace per test.

Role: glue between pytest and ``lifecycle``. ``kube_cluster`` (session) uses the cluster that
``KUBECONFIG`` names when it is set and answers /readyz, and otherwise starts a private cluster
(``kf-pytest-<pid>``) once and stops it at the end of the session. Neighbours: ``testing`` holds the
wait helpers and manifest builders tests use.
Invariant: tests that take these fixtures must be marked ``cluster``; unit runs (``-m "not cluster"``)
never start anything. Set ``KF_NO_BUILD=1`` to fail fast instead of building missing binaries.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import uuid
from collections.abc import Iterator

import pytest

from kfcluster import binaries, kube, lifecycle, testing
from kfcluster import config as cfg


def _external_cluster(kubeconfig: str) -> lifecycle.Cluster | None:
    """A Cluster for the KUBECONFIG the user set, if it answers; kfcluster work dirs are reused as is."""
    workdir = pathlib.Path(kubeconfig).resolve().parent
    if (workdir / "cluster.json").is_file():
        try:
            cluster = lifecycle.Cluster.load(str(workdir))
            return cluster if cluster.kubectl.readyz() else None
        except (OSError, ValueError, RuntimeError):
            return None
    cached = binaries.bin_dir() / "kubectl"
    kubectl = str(cached) if cached.is_file() else shutil.which("kubectl")
    if not kubectl:
        return None
    k = kube.Kubectl(binary=kubectl, kubeconfig=kubeconfig)
    if not k.readyz():
        return None
    return lifecycle.Cluster(name="external", workdir=str(workdir), kubeconfig=kubeconfig, server="", ports={},
                             bin_dir=os.path.dirname(kubectl), kwok_dir="")


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[lifecycle.Cluster]:
    """The test cluster: the one ``KUBECONFIG`` names (if reachable) or a private one for this session."""
    kubeconfig = os.environ.get("KUBECONFIG", "")
    if kubeconfig and os.path.isfile(kubeconfig):
        external = _external_cluster(kubeconfig)
        if external:
            yield external
            return
    if os.environ.get("KF_NO_BUILD") == "1":
        binaries.require(build=False)
    config = cfg.from_env(name=f"kf-pytest-{os.getpid()}")
    cluster = lifecycle.up(config)
    try:
        yield cluster
    finally:
        lifecycle.down(workdir=cluster.workdir)


@pytest.fixture(scope="session")
def api_client(kube_cluster: lifecycle.Cluster):  # type: ignore[no-untyped-def]
    """A ``kubernetes.client.ApiClient`` for the test cluster."""
    from kubernetes import client, config

    return config.new_client_from_config(config_file=kube_cluster.kubeconfig)


@pytest.fixture()
def namespace(request: pytest.FixtureRequest, api_client) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """A fresh namespace for one test (default ServiceAccount present); deleted afterwards."""
    from kubernetes import client

    base = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    name = f"{base}-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api_client)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    testing.wait_for_service_account(api_client, namespace=name)
    yield name
    core.delete_namespace(name, propagation_policy="Background")
