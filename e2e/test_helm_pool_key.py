"""A real ``helm upgrade`` keeps the pool master key (docs/generator-pool.md, "keys, derived"; issue 40).

The chart makes the master key Secret once (``templates/pool-master-key.yaml``: 32 random bytes, kept across
upgrades by ``lookup``). ``lookup`` answers only against a real API server (``helm template`` and ``--dry-run``
see nothing), so this installs the chart on the test cluster's API server (kwok tier: the operator's pod need not
run; the operator here is a host process holding the key the chart made, as the chart's pod would mount it),
attaches a job to a pool so the operator writes the job's key Secret, then ``helm upgrade`` with a changed value:
the Secret's data are unchanged, and the job's key derived from the key read back after the upgrade (by an operator
restarted on it, as the upgraded Deployment's new pod is) is still the one in the Secret its pods reference.
A new key would have moved every pool's and job's key to a new Secret name and cut running jobs off their engines.
"""
from __future__ import annotations

import base64
import hashlib
import pathlib
import uuid
from collections.abc import Iterator

import pytest

import installed
from kfcluster import binaries, harness, lifecycle
from kfcluster.harness import wait
from kubeforge.api import poolkeys
from test_pool_cluster import COSCHEDULING, key_ref, pool, pool_job, secret_text, uid

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]
#: The chart's webhook off: its operator pod does not run on kwok, and a webhook with failurePolicy Fail would refuse
#: every RLJob the session's other suites create while this release is installed.
SETS = ("webhook.enabled=false",)


@pytest.fixture
def release(kube_cluster: lifecycle.Cluster, tmp_path: pathlib.Path) -> Iterator[tuple[installed.Release, str]]:
    if not (binaries.bin_dir() / "helm").is_file():
        pytest.skip(f"helm is not built at {binaries.bin_dir()} (run e2e/build/build.sh helm)")
    k = harness.K(kubectl=kube_cluster.kubectl.binary, kubeconfig=kube_cluster.kubeconfig)
    k.ensure_crd()
    jobs_ns = k.namespace(f"poolkey-{uuid.uuid4().hex[:6]}")
    rel = installed.install(kube_cluster, watch=(jobs_ns,), workdir=tmp_path, wait=False, on_real_node=False,
                            extra=SETS)
    yield rel, jobs_ns
    k.run("delete", "rljobs", "--all", "-n", jobs_ns, "--wait=false", check=False)
    rel.uninstall()
    k.run("delete", "namespace", jobs_ns, "--wait=false", check=False)


def _master(k: harness.K, rel: installed.Release) -> tuple[bytes, str]:
    """The master key in the chart's Secret and the digest of the Secret's data."""
    data = k.get("secret", f"{rel.name}-kubeforge-pool-master-key", "-n", rel.namespace)["data"]
    return base64.b64decode(data["key"]), hashlib.sha256(repr(sorted(data.items())).encode()).hexdigest()


def test_helm_upgrade_keeps_the_pool_master_key_and_the_job_keys_derived_from_it(
        kube_cluster: lifecycle.Cluster, release: tuple[installed.Release, str], tmp_path: pathlib.Path) -> None:
    rel, ns = release
    k = harness.K(kubectl=kube_cluster.kubectl.binary, kubeconfig=kube_cluster.kubeconfig)
    master, digest = _master(k, rel)
    assert len(master) == 32
    key_file = tmp_path / "operator" / "master.key"
    key_file.parent.mkdir()
    key_file.write_bytes(master)
    key_file.chmod(0o600)
    extra = (f"--namespace={ns}", "--no-webhook", *COSCHEDULING, f"--pool-master-key-file={key_file}")
    op = harness.Operator(kubeconfig=kube_cluster.kubeconfig, extra=extra, log_path=key_file.parent / "op.log")
    op.start()
    try:
        k.apply(pool(ns))
        k.apply(pool_job(ns, "job-a"))
        ref = wait("job-a's key Secret", lambda: key_ref(k, ns, "job-a") != "job-a-key" and key_ref(k, ns, "job-a"))
        op.stop()

        installed.helm(kube_cluster, rel.home, "upgrade", rel.name, str(installed.CHART), "--namespace",
                       rel.namespace, *installed.values(image=None, watch=(ns,), on_real_node=False,
                                                        extra=(*SETS, "workers=3")))
        deploy = k.get("deployment", f"{rel.name}-kubeforge", "-n", rel.namespace)
        assert "--workers=3" in deploy["spec"]["template"]["spec"]["containers"][0]["args"], "the value changed"
        after, after_digest = _master(k, rel)
        assert after_digest == digest and after == master, "helm upgrade drew a new pool master key"

        # the operator restarted on the key read back (as the upgraded Deployment's pod mounts it) derives the
        # same job key, so the Secret the job's pods reference still holds the key its engines derive
        key_file.write_bytes(after)
        op.start()
        pool_key = poolkeys.pool_key(after, namespace=ns, pool="shared", uid=uid(k, "generatorpool", ns, "shared"))
        job_key = poolkeys.job_key(pool_key, namespace=ns, job="job-a", uid=uid(k, "rljob", ns, "job-a"))
        assert ref == f"job-a-key-{poolkeys.key_id(job_key)}" and secret_text(k, ns, ref, "key") == job_key.hex()
        # its trainer StatefulSet rendered again by that operator points at the same Secret
        k.run("delete", "statefulset", "job-a-trainer", "-n", ns)
        again = wait("job-a's trainer StatefulSet again", lambda: key_ref(k, ns, "job-a") if k.run(
            "get", "statefulset", "job-a-trainer", "-n", ns, check=False).returncode == 0 else None, timeout_s=120)
        assert again == ref
    finally:
        op.stop()
