"""Unit tests of the pure parts of kfcluster (no cluster, no binaries)."""

from __future__ import annotations

import json

import pytest

from kfcluster import config as cfg
from kfcluster import render

BINS = {k: f"/b/{k}" for k in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl",
                               "kwok", "kube-scheduler-stock")}
PORTS = {k: 1000 + i for i, k in enumerate(("etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager",
                                            "kube-scheduler", "kwok-controller"))}


def _doc(config: cfg.ClusterConfig) -> dict:
    return render.kwokctl_config(config=config, bins=BINS, ports=PORTS, scheduler_config_path="/s.yaml",
                                 k8s_version="v1.34.10")


def _patch(doc: dict, component: str) -> dict[str, tuple[str, bool]]:
    for p in doc["componentsPatches"]:
        if p["name"] == component:
            return {a["key"]: (a["value"], a["override"]) for a in p["extraArgs"]}
    return {}


def test_default_pool_is_four_8gpu_nodes_in_two_zones() -> None:
    items = render.node_list([cfg.NodePool()])["items"]
    assert [i["metadata"]["name"] for i in items] == [f"kwok-gpu-{i}" for i in range(4)]
    assert {i["metadata"]["labels"][cfg.ZONE_LABEL] for i in items} == {"zone-a", "zone-b"}
    assert all(i["status"]["capacity"]["nvidia.com/gpu"] == "8" for i in items)
    assert all(i["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake" for i in items)


@pytest.mark.parametrize(("index", "zone", "rack"), [
    (0, "zone-a", "zone-a-block-0-rack-0"), (1, "zone-b", "zone-b-block-0-rack-0"),
    (2, "zone-a", "zone-a-block-0-rack-1"), (3, "zone-b", "zone-b-block-0-rack-1"),
    (4, "zone-a", "zone-a-block-0-rack-0"),
])
def test_topology_labels_follow_the_index(index: int, zone: str, rack: str) -> None:
    labels = render.node_labels(cfg.NodePool(), index)
    assert (labels[cfg.ZONE_LABEL], labels[cfg.RACK_LABEL]) == (zone, rack)


def test_kwok_manages_only_fake_nodes_and_extra_flags_override_or_append() -> None:
    doc = _doc(cfg.ClusterConfig(extra_kwok_args={"v": "4", "node-lease-parallelism": "2"}))
    kwok = _patch(doc, "kwok-controller")
    assert kwok["manage-all-nodes"] == ("false", True)
    # kwokctl's binary runtime passes only --manage-all-nodes=true: the selector must be appended.
    assert kwok["manage-nodes-with-annotation-selector"] == ("kwok.x-k8s.io/node=fake", False)
    assert kwok["v"] == ("4", True) and kwok["node-lease-parallelism"] == ("2", False)


def test_apiserver_bind_and_kubelet_flags_go_through_components_patches() -> None:
    doc = _doc(cfg.ClusterConfig(apiserver_bind_address="0.0.0.0", apiserver_cert_sans=("10.88.0.1",),
                                 extra_apiserver_args={"kubelet-preferred-address-types": "InternalIP,Hostname"}))
    api = _patch(doc, "kube-apiserver")
    assert api["bind-address"] == ("0.0.0.0", True)
    assert api["kubelet-preferred-address-types"] == ("InternalIP,Hostname", False)
    assert doc["options"]["kubeApiserverCertSANs"] == ["10.88.0.1"]
    assert doc["options"]["bindAddress"] == "127.0.0.1"
    assert _patch(_doc(cfg.ClusterConfig()), "kube-apiserver") == {}


def test_controller_manager_runs_without_leader_election_and_takes_extra_flags() -> None:
    doc = _doc(cfg.ClusterConfig(extra_controller_manager_args={"kube-api-qps": "500", "v": "2"}))
    assert _patch(doc, "kube-controller-manager") == {"leader-elect": ("false", False), "kube-api-qps": ("500", False),
                                                      "v": ("2", True)}
    assert _patch(_doc(cfg.ClusterConfig()), "kube-controller-manager") == {"leader-elect": ("false", False)}
    env = cfg.from_env({"KF_CONTROLLER_MANAGER_EXTRA_ARGS": "kube-api-qps=300,kube-api-burst=600"})
    assert env.extra_controller_manager_args == {"kube-api-qps": "300", "kube-api-burst": "600"}


def test_scale_options_lift_client_limits_and_widen_kwok() -> None:
    config = cfg.ClusterConfig(disable_qps_limits=True, kwok_pod_parallelism=32, kwok_node_lease_parallelism=16)
    assert _doc(config)["options"]["disableQPSLimits"] is True
    assert "disableQPSLimits" not in _doc(cfg.ClusterConfig())["options"]
    text = render.kwokctl_config_text(_doc(config), render.kwok_config(config))
    docs = text.split("\n---\n")
    assert json.loads(docs[1]) == {"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
                                   "options": {"podPlayStageParallelism": 32, "nodeLeaseParallelism": 16}}
    assert render.kwok_config(cfg.ClusterConfig()) is None
    env = cfg.from_env({"KF_DISABLE_QPS_LIMITS": "1", "KF_KWOK_POD_PARALLELISM": "16"})
    assert (env.disable_qps_limits, env.kwok_pod_parallelism) == (True, 16)
    with pytest.raises(ValueError, match="kwok_pod_parallelism"):
        cfg.ClusterConfig(kwok_pod_parallelism=-1)


def test_config_text_is_json_plus_all_stages() -> None:
    text = render.kwokctl_config_text(_doc(cfg.ClusterConfig()))
    head, _, rest = text.partition("\n---\n")
    assert json.loads(head)["kind"] == "KwokctlConfiguration"
    for stage in ("node-initialize", "node-heartbeat", "pod-ready", "pod-complete", "pod-delete",
                  "pod-container-running-failed", "container-restart"):
        assert f"name: {stage}\n" in rest


def test_scheduler_uses_coscheduling_for_queue_sort_and_retries_unschedulable_pods() -> None:
    config = cfg.ClusterConfig()
    plugins = render.scheduler_config(config)["profiles"][0]["plugins"]
    assert plugins["queueSort"] == {"enabled": [{"name": "Coscheduling"}], "disabled": [{"name": "*"}]}
    assert render.scheduler_flags(config)["pod-max-in-unschedulable-pods-duration"] == "10s"


def test_stock_scheduler_variant_names_no_plugin_and_runs_the_stock_binary() -> None:
    config = cfg.from_env({"KF_SCHEDULER": "default"})
    assert config.scheduler == "default" and not config.coscheduling
    assert render.scheduler_config(config)["profiles"] == [{"schedulerName": "default-scheduler"}]
    assert "Coscheduling" not in json.dumps(render.scheduler_config(config))
    assert _doc(config)["options"]["kubeSchedulerBinary"] == "/b/kube-scheduler-stock"
    assert _doc(cfg.ClusterConfig())["options"]["kubeSchedulerBinary"] == "/b/kube-scheduler"
    from kfcluster import binaries
    assert "kube-scheduler" not in binaries.control_plane("default")
    assert binaries.control_plane("coscheduling") == binaries.CONTROL_PLANE


@pytest.mark.parametrize(("field", "kwargs"), [
    ("name", {"name": "Bad_Name"}),
    ("scheduler", {"scheduler": "volcano"}),
    ("apiserver_bind_address", {"apiserver_bind_address": "10.88.0.1"}),
    ("kubeconfig_server", {"kubeconfig_server": "http://x"}),
])
def test_bad_config_names_the_field(field: str, kwargs: dict) -> None:
    with pytest.raises(ValueError, match=field):
        cfg.ClusterConfig(**kwargs)


def test_env_flags_parse_and_errors_name_the_variable() -> None:
    config = cfg.from_env({"KF_NODES": "6", "KF_GPUS_PER_NODE": "4", "KF_ZONES": "z1,z2,z3",
                           "KF_APISERVER_EXTRA_ARGS": "kubelet-client-key=/k.pem,v=2"})
    assert (config.nodes[0].count, config.nodes[0].gpus, config.nodes[0].zones) == (6, 4, ("z1", "z2", "z3"))
    assert config.extra_apiserver_args == {"kubelet-client-key": "/k.pem", "v": "2"}
    with pytest.raises(ValueError, match="KF_NODES"):
        cfg.from_env({"KF_NODES": "four"})
    with pytest.raises(ValueError, match="KF_KWOK_EXTRA_ARGS"):
        cfg.from_env({"KF_KWOK_EXTRA_ARGS": "novalue"})


def test_yaml_text_round_trips_and_survives_appended_keys() -> None:
    yaml = pytest.importorskip("yaml")
    doc = render.scheduler_config(cfg.ClusterConfig())
    text = render.yaml_text(doc) + 'clientConnection:\n  kubeconfig: "/k"\n'  # what kwokctl appends
    assert yaml.safe_load(text) == {**doc, "clientConnection": {"kubeconfig": "/k"}}


def test_a_binary_is_trusted_only_with_a_matching_stamp(tmp_path, monkeypatch) -> None:
    from kfcluster import binaries

    monkeypatch.setenv("KUBEFORGE_CACHE", str(tmp_path))
    bin_dir = binaries.bin_dir()
    (bin_dir / ".stamp").mkdir(parents=True)
    for name in ("etcd", "kubectl"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    (bin_dir / ".stamp" / "etcd").write_text(binaries.expected_version("etcd"))
    (bin_dir / ".stamp" / "kubectl").write_text("v0.0.1")  # stale
    assert binaries.missing(["etcd", "kubectl", "kwok"]) == ["kubectl", "kwok"]


def test_kueue_config_binds_loopback_and_needs_no_secret_mount() -> None:
    from kfcluster import kueue

    doc = kueue.config(ports={"kueue-health": 1, "kueue-metrics": 2, "kueue-webhook": 3}, cert_dir="/w/certs")
    assert doc["apiVersion"] == "config.kueue.x-k8s.io/v1beta2" and doc["namespace"] == "kueue-system"
    assert doc["health"]["healthProbeBindAddress"] == "127.0.0.1:1" and doc["metrics"]["bindAddress"] == "127.0.0.1:2"
    assert doc["webhook"] == {"port": 3, "host": "127.0.0.1", "certDir": "/w/certs"}
    assert doc["internalCertManagement"] == {"enable": False} and doc["leaderElection"] == {"leaderElect": False}
    assert doc["integrations"]["frameworks"] == ["batch/job"]
