"""pytest fixtures: one cluster per test session, one namespace per test.

Role: glue between pytest and ``lifecycle``. ``kube_cluster`` (session) uses the cluster that
``KUBECONFIG`` names when it is set and answers /readyz, and otherwise starts a private cluster
once (see ``choose_session_cluster``); e2e/conftest.py stops a private one at session end. ``stock_cluster``
(session) is a second cluster whose only scheduler is the stock kube-scheduler (``scheduler: default``: no
Coscheduling, no PodGroup CRD), ``KF_STOCK_CLUSTER_NAME`` or a private ``kf-stock-<pid>``; ``scheduler_variant``
runs a test once on each (``kube_cluster`` and ``stock_cluster``). Neighbours: ``testing`` holds the
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
        return lifecycle.healthy(str(workdir))
    cached = binaries.bin_dir() / "kubectl"
    kubectl = str(cached) if cached.is_file() else shutil.which("kubectl")
    if not kubectl:
        return None
    k = kube.Kubectl(binary=kubectl, kubeconfig=kubeconfig)
    if not k.readyz():
        return None
    return lifecycle.Cluster(name="external", workdir=str(workdir), kubeconfig=kubeconfig, server="", ports={},
                             bin_dir=os.path.dirname(kubectl), kwok_dir="")


def choose_session_cluster(env: dict[str, str] | os._Environ[str]) -> str | None:
    """Decide, once per pytest process, which kfcluster every ``cfg.from_env()`` in it will mean.

    1. ``KF_CLUSTER_NAME`` set: that one. 2. ``KUBECONFIG`` names a kfcluster work dir: that one.
    3. The default cluster (``make cluster-up``) answers: that one, left running.
    4. Otherwise a private ``kf-pytest-<pid>``: started on first use, stopped at session end.
    Returns the work dir to stop at the end (case 4), else None. Mutates ``env`` (KF_CLUSTER_*).
    """
    if env.get("KF_CLUSTER_NAME"):
        return None
    kubeconfig = env.get("KUBECONFIG", "")
    if kubeconfig and (pathlib.Path(kubeconfig).resolve().parent / "cluster.json").is_file():
        workdir = pathlib.Path(kubeconfig).resolve().parent
        env["KF_CLUSTER_ROOT"], env["KF_CLUSTER_NAME"] = str(workdir.parent), workdir.name
        return None
    default = cfg.from_env(env)
    if lifecycle.healthy(default.workdir):
        return None
    env["KF_CLUSTER_NAME"] = f"kf-pytest-{os.getpid()}"
    return cfg.from_env(env).workdir


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[lifecycle.Cluster]:
    """The test cluster: the one ``KUBECONFIG`` names when it answers (kind, or any other), else the
    kfcluster chosen by ``choose_session_cluster`` (started here if needed; e2e/conftest.py stops it)."""
    kubeconfig = os.environ.get("KUBECONFIG", "")
    if kubeconfig and os.path.isfile(kubeconfig):
        external = _external_cluster(kubeconfig)
        if external:
            yield external
            return
    if os.environ.get("KF_NO_BUILD") == "1":
        binaries.require(build=False)
    yield lifecycle.up(cfg.from_env())


@pytest.fixture(scope="session")
def stock_cluster() -> Iterator[lifecycle.Cluster]:
    """A kfcluster whose only scheduler is the stock kube-scheduler (``make cluster-up SCHEDULER=default``): the
    cluster ``KF_STOCK_CLUSTER_NAME`` names (started if it is not running, left running), else a private
    ``kf-stock-<pid>`` started here and stopped at session end (``KF_KEEP_CLUSTER=1`` keeps it)."""
    named = os.environ.get("KF_STOCK_CLUSTER_NAME", "")
    config = cfg.from_env(name=named or f"kf-stock-{os.getpid()}", scheduler=cfg.SCHEDULER_DEFAULT,
                          real_node=False, kueue=False)
    if os.environ.get("KF_NO_BUILD") == "1":
        binaries.require(binaries.STOCK_CONTROL_PLANE, build=False)
    cluster = lifecycle.up(config)
    yield cluster
    if not named and os.environ.get("KF_KEEP_CLUSTER") != "1":
        lifecycle.down(workdir=cluster.workdir)


@pytest.fixture(scope="session", params=[cfg.SCHEDULER_COSCHEDULING, cfg.SCHEDULER_DEFAULT])
def scheduler_variant(request: pytest.FixtureRequest) -> lifecycle.Cluster:
    """The session's cluster (Coscheduling), then the stock-scheduler one: a test taking this runs on both
    (ids ``coscheduling`` and ``default``)."""
    name = "kube_cluster" if request.param == cfg.SCHEDULER_COSCHEDULING else "stock_cluster"
    return request.getfixturevalue(name)  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def kueue_cluster(kube_cluster: lifecycle.Cluster) -> lifecycle.Cluster:
    """The session's kfcluster with Kueue's manager running in it (started on first use, stopped with the
    cluster; ``kfcluster.kueue``). Skips on a cluster kfcluster did not start (kind: install Kueue there)."""
    from kfcluster import kueue

    if not os.path.isfile(os.path.join(kube_cluster.workdir, "cluster.json")):
        pytest.skip("Kueue is started only in a kfcluster")
    return kueue.start(kube_cluster)


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
