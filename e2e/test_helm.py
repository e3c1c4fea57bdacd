"""The Helm chart (helm/kubeforge): lint, render for the cluster's Kubernetes version, check what it grants, and
(marker ``cluster``) have the real API server accept every rendered object with a server-side dry run.

helm and kubectl come from the test cluster's binary cache (``e2e/build/build.sh helm`` builds helm; ``make
cluster-up`` builds kubectl); without them these tests skip and say so.
"""
from __future__ import annotations

import base64
import importlib.util
import os
import pathlib
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import yaml

from kfcluster import binaries
from kubeforge.api import contract, crd, load

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "kubeforge"
KUBE_VERSION = binaries.versions()["K8S_VERSION"]
RELEASE, RELEASE_NS = "kf", "kubeforge-system"

Obj = dict[str, Any]


def tool(name: str) -> pathlib.Path:
    path = binaries.bin_dir() / name
    if not path.is_file():
        pytest.skip(f"{name} is not built at {path} (run e2e/build/build.sh {name})")
    return path


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HELM_CACHE_HOME": "/tmp/kubeforge-helm/cache", "HELM_CONFIG_HOME": "/tmp/kubeforge-helm/config",
           "HELM_DATA_HOME": "/tmp/kubeforge-helm/data"}
    return subprocess.run([str(tool("helm")), *args], capture_output=True, text=True, timeout=120, env=env)


def render(*sets: str, include_crds: bool = True, release: str = RELEASE) -> list[Obj]:
    args = ["template", release, str(CHART), "--namespace", RELEASE_NS, "--kube-version", KUBE_VERSION]
    args += ["--include-crds"] if include_crds else []
    for s in sets:
        args += ["--set", s]
    run = helm(*args)
    assert run.returncode == 0, run.stderr
    return [d for d in yaml.safe_load_all(run.stdout) if d]


def one(objs: Sequence[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}"
    return found[0]


NAMESPACED = ("watchNamespaces={team-a,team-b}",)
MONITORING = ("metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true",
              "metrics.dashboard.enabled=true")


# ---------------------------------------------------------------- lint and render (helm only)


@pytest.mark.parametrize("sets", [(), NAMESPACED, MONITORING], ids=["defaults", "namespaced", "monitoring"])
def test_helm_lint(sets: tuple[str, ...]) -> None:
    args = ["lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION]
    for s in sets:
        args += ["--set", s]
    run = helm(*args)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("bad", ["workers=0", "logFormat=xml", "watchNamespaces={Team_A}", "metrics.port=0"])
def test_values_schema_refuses_bad_values(bad: str) -> None:
    run = helm("template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, "--set", bad)
    assert run.returncode != 0 and "values don't meet the specifications of the schema" in run.stderr, run.stderr


@pytest.mark.parametrize("kind", [crd.RLJOB, crd.POOL], ids=lambda k: k.kind)
def test_chart_installs_the_generated_crd(kind: crd.Kind) -> None:
    """Each CRD is a template (upgraded with the release), kept on uninstall unless crds.keep=false."""
    got = one(render(include_crds=False), "CustomResourceDefinition", kind.crd_name)
    want = crd.crd(kind)
    assert got["spec"] == want["spec"] and got["metadata"]["name"] == want["metadata"]["name"]
    assert got["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert "annotations" not in one(render("crds.keep=false"), "CustomResourceDefinition", kind.crd_name)["metadata"]
    assert not [o for o in render("crds.install=false") if o["kind"] == "CustomResourceDefinition"]
    assert not (CHART / "crds").exists(), "Helm never upgrades crds/: the CRD lives in files/crds and a template"


def notes(tmp_path: pathlib.Path, *sets: str) -> str:
    """The chart's NOTES.txt as `helm install` prints it (helm template renders it only as a template file)."""
    import shutil
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "NOTES.txt").rename(chart / "notes.txt")
    (chart / "templates" / "notes.yaml").write_text('notes: {{ tpl (.Files.Get "notes.txt") . | quote }}\n')
    args = ["template", RELEASE, str(chart), "--namespace", RELEASE_NS, "--kube-version", KUBE_VERSION,
            "--show-only", "templates/notes.yaml"]
    run = helm(*args, *(a for s in sets for a in ("--set", s)))
    assert run.returncode == 0, run.stderr
    return str(yaml.safe_load(run.stdout)["notes"])


def test_notes_lead_to_a_job_that_runs_on_a_plain_cluster_in_a_watched_namespace(tmp_path: pathlib.Path) -> None:
    text = notes(tmp_path, "watchNamespaces={rl-jobs,other}")
    assert "kubectl apply -n rl-jobs -f examples/quickstart.yaml" in text
    job = load.load_file(ROOT / "examples" / "quickstart.yaml")
    assert job.spec.gang.backend == "None" and job.spec.checkpoint.claim_name is None   # nothing to install first
    assert job.spec.checkpoint.volume_claim_template is None and job.spec.model.builtin is not None
    assert "make images" in text                              # the default image names are `make images`' names
    wide = notes(tmp_path / "2", "runtimeImage=registry.example/kubeforge/runtime:0.1.0-cpu")
    assert "kubectl apply -n default -f examples/quickstart.yaml" in wide and "make images" not in wide


def test_default_images_are_the_names_make_images_gives() -> None:
    objs = render()
    dep = one(objs, "Deployment")
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert container["image"] == f"kubeforge.local/operator:{version}"
    assert f"--runtime-image=kubeforge.local/runtime:{version}-cpu" in container["args"]
    build = (ROOT / "images" / "build.sh").read_text()
    assert 'ref="kubeforge.local/$name:$VERSION"' in build and 'ref="$ref-cpu"' in build


def test_operator_deployment() -> None:
    deploy = one(render(), "Deployment")
    spec = deploy["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}, "kopf has no leader election"
    (container,) = spec["template"]["spec"]["containers"]
    args = container["args"]
    assert args[0] == "operator" and "--all-namespaces" in args
    assert "--runtime-image=kubeforge.local/runtime:0.1.0-cpu" in args and "--metrics-port=8080" in args
    assert container["image"] == "kubeforge.local/operator:0.1.0"
    assert {p["name"] for p in container["ports"]} == {"metrics", "health", "webhook"}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert spec["template"]["spec"]["serviceAccountName"] == one(render(), "ServiceAccount")["metadata"]["name"]


@pytest.mark.parametrize(("release", "sets", "fullname"), [
    ("kubeforge", (), "kubeforge"),              # the docs' `helm install kubeforge ...`
    ("kf", (), "kf-kubeforge"),
    ("team-kubeforge", (), "team-kubeforge"),
    ("kf", ("fullnameOverride=rl-operator",), "rl-operator"),
])
def test_object_names_follow_the_documented_fullname(release: str, sets: tuple[str, ...], fullname: str) -> None:
    """docs/install.md "Names": `<fullname>` is `<release>-kubeforge`, or the release alone when it contains
    `kubeforge`; the docs' can-i line, Lease, ClusterRole and metrics Service names are read off it."""
    assert "`<fullname>` is `<release>-kubeforge`, or the release name alone" in (ROOT / "docs" / "install.md").read_text()
    objs = render(*sets, "replicas=2", release=release)   # two replicas: the leader-election Lease is rendered
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    assert {("ServiceAccount", fullname), ("Deployment", fullname), ("ClusterRole", f"{fullname}-cluster-reads"),
            ("Service", f"{fullname}-metrics"), ("Service", f"{fullname}-webhook")} <= names, sorted(names)
    args = one(objs, "Deployment", fullname)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--leader-lease={fullname}" in args


def test_operator_flags_are_ones_it_parses() -> None:
    main = pytest.importorskip("kubeforge.operator.main")
    for sets in ((), NAMESPACED):
        (container,) = one(render(*sets), "Deployment")["spec"]["template"]["spec"]["containers"]
        opts = main.parse_args(container["args"][1:])
        assert opts.metrics_port == 8080 and opts.health_port == 8081
        assert opts.namespaces == (("team-a", "team-b") if sets else ())


def rules_by_resource(rules: Sequence[Obj]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def test_rbac_is_least_privilege_and_covers_the_operator() -> None:
    objs = render()
    granted = rules_by_resource(one(objs, "ClusterRole", f"{RELEASE}-kubeforge")["rules"])
    assert all("*" not in verbs for verbs in granted.values()) and ("*", "*") not in granted
    assert not any(r == "nodes" for _, r in granted), "nothing beyond what the operator touches"
    assert granted[("", "secrets")] == {"create"}, "the job key Secret is created once, never read back"
    write = {"get", "list", "watch", "create", "patch", "delete"}
    assert granted[("kubeforge.dev", "rljobs")] >= {"get", "list", "watch", "patch"}
    assert granted[("kubeforge.dev", "rljobs/status")] >= {"patch"}
    assert granted[("kubeforge.dev", "generatorpools")] == {"get", "list", "watch", "patch"}   # patch: the finalizer
    assert granted[("kubeforge.dev", "generatorpools/status")] == {"get", "patch"}
    assert granted[("", "pods")] == {"get", "list", "watch", "patch", "delete"}   # delete: a pod lost with its node
    assert "create" in granted[("", "events")]
    apply = pytest.importorskip("kubeforge.operator.apply")
    for (api_version, kind), plural in apply.KINDS.items():
        group = api_version.rpartition("/")[0]
        # Lease: the leader Role (test below); RLJob and GeneratorPool: the users' objects, read and patched only
        if kind in ("Pod", "Event", "Lease", "Secret", contract.KIND, contract.POOL_KIND):
            continue
        assert granted.get((group, plural), set()) >= write, f"{kind} ({api_version}): {granted.get((group, plural))}"
    assert granted[("kueue.x-k8s.io", "workloads/status")] == {"get", "patch"}      # eviction, Finished
    # cluster-scoped reads, in both modes: kopf's scanning, node loss (docs/node-loss.md: the Ready condition of a
    # not-ready pod's node), Kueue's flavors and priority classes (cluster-scoped: a Role could not grant them)
    for mode in (objs, render(*NAMESPACED)):
        reads = rules_by_resource(one(mode, "ClusterRole", f"{RELEASE}-kubeforge-cluster-reads")["rules"])
        assert reads == {("", "namespaces"): {"list", "watch"},
                         ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
                         ("", "nodes"): {"get"}, ("kueue.x-k8s.io", "resourceflavors"): {"get"},
                         ("kueue.x-k8s.io", "workloadpriorityclasses"): {"get"}}
    (container,) = one(objs, "Deployment", f"{RELEASE}-kubeforge")["spec"]["template"]["spec"]["containers"]
    assert "--node-loss-grace-seconds=60" in container["args"]


def test_the_pool_master_key_is_made_once_and_mounted_into_the_operator_only() -> None:
    """docs/generator-pool.md, "keys, derived": 32 random bytes in a Secret of the release namespace, kept across
    upgrades (lookup) and by an uninstall, mounted where the operator's flag reads it; or a Secret of the user's."""
    main = pytest.importorskip("kubeforge.operator.main")
    objs = render()
    secret = one(objs, "Secret", f"{RELEASE}-kubeforge-pool-master-key")
    assert len(base64.b64decode(secret["data"]["key"])) == 32
    assert secret["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    pod = one(objs, "Deployment", f"{RELEASE}-kubeforge")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    key_file = pathlib.PurePosixPath(main.parse_args(container["args"][1:]).pool_master_key_file)
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(key_file.parent)]
    assert mount["readOnly"] is True and key_file.name == "key"
    (vol,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert vol["secret"]["secretName"] == secret["metadata"]["name"]
    assert one(render(), "Secret", secret["metadata"]["name"])["data"]["key"] != \
        secret["data"]["key"], "drawn at random where no release exists yet to look up"
    mine = render("poolMasterKey.existingSecret=my-key")
    assert not [o for o in mine if o["kind"] == "Secret" and "pool-master-key" in o["metadata"]["name"]]
    pod = one(mine, "Deployment", f"{RELEASE}-kubeforge")["spec"]["template"]["spec"]
    assert [v["secret"]["secretName"] for v in pod["volumes"] if v["name"] == mount["name"]] == ["my-key"]


def test_the_admission_webhook_is_wired() -> None:
    """docs/security.md: a Service in front of the operator's webhook port, a chart-made certificate, and the
    configuration sending RLJob CREATE/UPDATE there (failurePolicy and namespaceSelector from values)."""
    objs = render()
    cfg = one(objs, "ValidatingWebhookConfiguration", f"{RELEASE}-kubeforge")
    (hook,) = cfg["webhooks"]
    assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None" and "namespaceSelector" not in hook
    assert hook["clientConfig"]["service"] == {"name": f"{RELEASE}-kubeforge-webhook", "namespace": RELEASE_NS,
                                               "path": "/validate.rljobs", "port": 443}
    assert hook["clientConfig"]["caBundle"] and hook["rules"][0]["resources"] == ["rljobs"]
    secret = one(objs, "Secret", f"{RELEASE}-kubeforge-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["data"]["ca.crt"] == hook["clientConfig"]["caBundle"], "kept for upgrades (lookup)"
    (container,) = one(objs, "Deployment", f"{RELEASE}-kubeforge")["spec"]["template"]["spec"]["containers"]
    assert "--webhook-cert-dir=/etc/kubeforge-webhook" in container["args"]
    # every replica answers reviews (standbys too); the Service routes only to ready ones, ready = serving
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "webhook", "scheme": "HTTPS"}
    selective = render("webhook.failurePolicy=Ignore", "webhook.namespaceSelector.matchLabels.team=a")
    (hook,) = one(selective, "ValidatingWebhookConfiguration", f"{RELEASE}-kubeforge")["webhooks"]
    assert hook["failurePolicy"] == "Ignore" and hook["namespaceSelector"] == {"matchLabels": {"team": "a"}}
    off = render("webhook.enabled=false")
    assert not [o for o in off if o["kind"] == "ValidatingWebhookConfiguration"]
    (container,) = one(off, "Deployment", f"{RELEASE}-kubeforge")["spec"]["template"]["spec"]["containers"]
    assert "--no-webhook" in container["args"]


def test_namespaced_mode_uses_roles() -> None:
    objs = render(*NAMESPACED)
    # besides the watched namespaces, one Role reads the kubelets' Leases in kube-node-lease (docs/recovery.md)
    roles = [o for o in objs if o["kind"] == "Role"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["kube-node-lease", "team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in objs if b["kind"] == "RoleBinding") == \
        ["kube-node-lease", "team-a", "team-b"]
    (leases,) = [r for r in roles if r["metadata"]["namespace"] == "kube-node-lease"]
    assert leases["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"]}]
    assert sorted(o["metadata"]["name"] for o in objs if o["kind"] == "ClusterRole") == \
        [f"{RELEASE}-kubeforge-cluster-reads"]
    for role in roles:     # a Role's rule on a cluster-scoped resource grants nothing: none may hold one
        assert not {r for _, r in rules_by_resource(role["rules"])} & {"nodes", "namespaces", "resourceflavors",
                                                                        "workloadpriorityclasses"}, role["rules"]


def granted_by_scope(objs: Sequence[Obj], *, jobs_namespaces: Sequence[str]) -> set[tuple[str, str, str, Any]]:
    """(verb, group, resource, access.Scope) of every rule the rendered chart grants the operator's account: the
    ClusterRoles (cluster-scoped resources: CLUSTER; the main one of cluster-wide mode: JOBS), the Roles in the
    watched namespaces (JOBS: each must grant the same) and in the release namespace (RELEASE)."""
    access = pytest.importorskip("kubeforge.operator.access")
    out: set[tuple[str, str, str, Any]] = set()
    per_ns: dict[str, set[tuple[str, str, str]]] = {}
    for o in objs:
        if o["kind"] not in ("Role", "ClusterRole"):
            continue
        flat = {(v, g, r) for (g, r), verbs in rules_by_resource(o["rules"]).items() for v in verbs}
        if o["kind"] == "ClusterRole":
            scope = access.Scope.CLUSTER if o["metadata"]["name"].endswith("-cluster-reads") else access.Scope.JOBS
        elif o["metadata"]["namespace"] == RELEASE_NS:
            scope = access.Scope.RELEASE
        elif o["metadata"]["namespace"] == "kube-node-lease":
            scope = access.Scope.NODE_LEASES
        else:
            per_ns.setdefault(o["metadata"]["namespace"], set()).update(flat)
            scope = access.Scope.JOBS
        out |= {(*k, scope) for k in flat}
    if jobs_namespaces:
        assert sorted(per_ns) == sorted(jobs_namespaces) and len({frozenset(v) for v in per_ns.values()}) == 1, per_ns
    return out


@pytest.mark.parametrize("mode", ["clusterwide", "namespaced"])
def test_chart_rbac_is_exactly_the_operators_needs(mode: str) -> None:
    """The chart grants what ``kubeforge.operator.access.NEEDS`` lists (checked against the code by
    tests/operator/test_access.py), no more and no less, in each mode; leader election's Lease with replicas > 1."""
    access = pytest.importorskip("kubeforge.operator.access")
    sets = ("replicas=2", *(NAMESPACED if mode == "namespaced" else ()))
    got = granted_by_scope(render(*sets), jobs_namespaces=["team-a", "team-b"] if mode == "namespaced" else [])
    want = access.flat()
    assert got == want, {"chart lacks": sorted(map(str, want - got)), "chart grants beyond": sorted(map(str, got - want))}
    single = granted_by_scope(render(*sets[1:]), jobs_namespaces=["team-a", "team-b"] if sets[1:] else [])
    assert single == {k for k in want if k[3] is not access.Scope.RELEASE}, "the Lease Role only with an election"


def test_monitoring_objects() -> None:
    objs = render(*MONITORING)
    assert one(objs, "ServiceMonitor")["spec"]["endpoints"][0]["port"] == "metrics"
    pod_monitor = one(objs, "PodMonitor")
    assert pod_monitor["spec"]["selector"]["matchLabels"] == {contract.LABEL_MANAGED_BY: contract.MANAGED_BY}
    dashboard = one(objs, "ConfigMap", f"{RELEASE}-kubeforge-dashboard")
    assert dashboard["data"]["kubeforge.json"].strip() == (CHART / "dashboards" / "kubeforge.json").read_text().strip()
    assert not [o for o in render() if o["kind"] in ("ServiceMonitor", "PodMonitor")], "off by default"


# ---------------------------------------------------------------- the real API server accepts the objects


@pytest.fixture(scope="module")
def namespaces(kube_cluster: Any) -> Iterator[list[str]]:
    """The release namespace and the two watched ones, created for real (dry runs need them), then deleted."""
    kubectl = tool("kubectl")
    suffix = uuid.uuid4().hex[:5]
    names = [f"{RELEASE_NS}-{suffix}", f"team-a-{suffix}", f"team-b-{suffix}"]
    env = {**os.environ, "KUBECONFIG": kube_cluster.kubeconfig}
    for name in names:
        subprocess.run([str(kubectl), "create", "namespace", name], check=True, capture_output=True, env=env)
    yield names
    subprocess.run([str(kubectl), "delete", "namespace", *names, "--wait=false"], capture_output=True, env=env)


@pytest.mark.cluster
@pytest.mark.parametrize("mode", ["clusterwide", "namespaced"])
def test_api_server_accepts_the_rendered_chart(kube_cluster: Any, namespaces: list[str], mode: str) -> None:
    release_ns, team_a, team_b = namespaces
    sets = ["metrics.dashboard.enabled=true"] + ([f"watchNamespaces={{{team_a},{team_b}}}"] if mode == "namespaced"
                                                   else [])
    args = ["template", RELEASE, str(CHART), "--namespace", release_ns, "--kube-version", KUBE_VERSION,
            "--include-crds"]
    for s in sets:
        args += ["--set", s]
    rendered = helm(*args)
    assert rendered.returncode == 0, rendered.stderr
    run = subprocess.run([str(tool("kubectl")), "apply", "--server-side", "--dry-run=server",
                          "--field-manager=kubeforge-e2e", "--force-conflicts", "-f", "-"], input=rendered.stdout, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "KUBECONFIG": kube_cluster.kubeconfig})
    assert run.returncode == 0, run.stderr
    kinds = [line.split("/")[0] for line in run.stdout.splitlines() if "serverside-applied" in line]
    expected = len([d for d in yaml.safe_load_all(rendered.stdout) if d])
    assert len(kinds) == expected, run.stdout


def test_two_replicas_elect_a_leader() -> None:
    """replicas > 1 turns leader election on: a Lease Role in the release namespace, RollingUpdate, the flags."""
    objs = render("replicas=2")
    spec = one(objs, "Deployment")["spec"]
    assert spec["replicas"] == 2 and spec["strategy"] == {"type": "RollingUpdate"}
    (container,) = spec["template"]["spec"]["containers"]
    main = pytest.importorskip("kubeforge.operator.main")
    opts = main.parse_args(container["args"][1:])
    assert opts.leader_elect and opts.leader_lease == f"{RELEASE}-kubeforge"
    assert (opts.leader_lease_s, opts.leader_renew_s) == (6, 2.0)
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"] if "valueFrom" in e}
    assert env["POD_UID"] == "metadata.uid", "the Lease's owner (gone with the leader's pod)"
    role = one(objs, "Role", f"{RELEASE}-kubeforge-leader")
    assert role["metadata"]["namespace"] == RELEASE_NS
    assert rules_by_resource(role["rules"]) == {("coordination.k8s.io", "leases"): {"get", "create", "update", "delete"}}
    assert "--leader-elect" not in one(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]


@pytest.mark.cluster
def test_cluster_wide_rbac_can_i(kube_cluster: Any, namespaces: list[str]) -> None:
    """Cluster-wide mode (watchNamespaces empty), the chart's RBAC applied for real: what the operator's account may
    do anywhere (``kubectl auth can-i --as``), and that it suffices to create a job's Role and RoleBinding (RBAC's
    escalation check: one grants only what one holds) without `escalate`, `bind` or `update`."""
    release_ns, job_ns, _ = namespaces
    release = f"kfrbac{uuid.uuid4().hex[:5]}"
    env = {**os.environ, "KUBECONFIG": kube_cluster.kubeconfig}
    kubectl = str(tool("kubectl"))

    def k(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([kubectl, *args], input=stdin, capture_output=True, text=True, timeout=120, env=env)

    rendered = helm("template", release, str(CHART), "--namespace", release_ns, "--kube-version", KUBE_VERSION,
                    "--show-only", "templates/rbac.yaml", "--show-only", "templates/serviceaccount.yaml")
    assert rendered.returncode == 0, rendered.stderr
    objs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    # in both modes one Role (and its binding) in kube-node-lease: the kubelets' Leases, read (docs/recovery.md)
    assert {o["kind"] for o in objs} == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    assert {o["metadata"]["namespace"] for o in objs if o["kind"] in ("Role", "RoleBinding")} == {"kube-node-lease"}
    applied = k("apply", "-f", "-", stdin=rendered.stdout)
    assert applied.returncode == 0, applied.stderr
    account = f"system:serviceaccount:{release_ns}:{release}-kubeforge"
    try:
        def can(*args: str) -> bool:
            return k("auth", "can-i", *args, f"--as={account}").stdout.strip() == "yes"

        for ns in (job_ns, "kube-system"):     # a jobs' namespace and one of the cluster's own
            for verb in ("get", "list", "watch"):
                assert not can(verb, "secrets", "-n", ns), (verb, ns)
            for verb in ("create", "update"):     # delete: a pod lost with its node (docs/node-loss.md)
                assert not can(verb, "pods", "-n", ns), (verb, ns)
            assert not can("create", "pods", "--subresource=exec", "-n", ns)
            assert not can("patch", "pods", "--subresource=status", "-n", ns)
            assert not can("update", "statefulsets", "-n", ns) and not can("update", "rljobs", "-n", ns)
            assert not can("escalate", "roles", "-n", ns) and not can("bind", "clusterroles", "-n", ns)
            assert not can("get", "deployments", "-n", ns) and not can("create", "leases", "-n", ns)
        assert can("get", "nodes") and not can("patch", "nodes") and not can("list", "nodes")
        assert not can("create", "clusterroles") and not can("create", "namespaces")
        # what it must hold to grant it (the per-job Role names the job's pods): get/patch on pods, no more
        assert can("patch", "pods", "-n", job_ns) and can("create", "roles", "-n", job_ns)
        # and that is enough: as the operator, create a job's Role and RoleBinding (rendered by the operator)
        render_mod = pytest.importorskip("kubeforge.operator.render.rbac")
        context = pytest.importorskip("kubeforge.operator.render.context")
        spec = importlib.util.spec_from_file_location("kubeforge_invalid_manifests_rbac",
                                                      ROOT / "tests" / "api" / "invalid_manifests.py")
        assert spec and spec.loader
        table = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = table       # its dataclasses look their module up
        spec.loader.exec_module(table)
        job = load.parse(table.valid())
        ctx = context.RenderContext(namespace=job_ns, uid="00000000-0000-0000-0000-0000000000aa")
        docs = [{**o, "metadata": {k_: v for k_, v in o["metadata"].items() if k_ != "ownerReferences"}}
                for o in render_mod.objects(job, ctx)]
        run = k("apply", "--server-side", "--field-manager=kubeforge-operator", f"--as={account}", "-f", "-",
                stdin="\n---\n".join(yaml.safe_dump(d) for d in docs))
        assert run.returncode == 0, run.stderr
        k("delete", "-n", job_ns, "role,rolebinding,serviceaccount", "-l", f"{contract.LABEL_JOB}={job.metadata.name}")
    finally:
        k("delete", "-f", "-", stdin=rendered.stdout)


def test_watched_namespaces_are_created_restricted_and_kept() -> None:
    """`helm install --set 'watchNamespaces={rl-jobs}'` (docs/install.md) on a cluster without rl-jobs: the chart
    creates it (its Role goes there), enforcing `restricted`, kept on uninstall; never the release namespace (Helm's
    --create-namespace), nothing with createWatchNamespaces=false. An existing namespace is left alone (``lookup``:
    e2e/test_rbac.py, against a real API server)."""
    objs = render(f"watchNamespaces={{team-a,{RELEASE_NS}}}")
    (ns,) = [o for o in objs if o["kind"] == "Namespace"]
    assert ns["metadata"]["name"] == "team-a"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert ns["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert not [o for o in render(*NAMESPACED, "createWatchNamespaces=false") if o["kind"] == "Namespace"]
    assert not [o for o in render() if o["kind"] == "Namespace"]
