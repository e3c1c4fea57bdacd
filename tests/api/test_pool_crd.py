"""Unit tests of the GeneratorPool CRD: the committed copies (crds/, the chart's files/crds/) are what the typed model
``kubeforge.api.generatorpool`` generates, the schema is structural and documented, its names, columns and CEL rules
are the ones docs/generator-pool.md describes, and its defaults are the model's."""
from __future__ import annotations

import copy
import pathlib
import re
from typing import Any

import pytest
import yaml

from kubeforge.api import contract, crd, generatorpool, load

import invalid_manifests  # tests/api: compact()
from test_crd import apply_defaults, at, rules, walk  # tests/api: the schema walkers of the RLJob CRD's tests

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMMITTED = (ROOT / "crds" / crd.POOL.file_name, ROOT / "helm" / "kubeforge" / "files" / "crds" / crd.POOL.file_name)
Node = dict[str, Any]
MINIMAL = {"apiVersion": contract.API_VERSION, "kind": "GeneratorPool", "metadata": {"name": "shared"},
           "spec": {"model": {"builtin": "smollm2-135m-instruct"}}}


@pytest.fixture(scope="module")
def schema() -> Node:
    return crd.crd(crd.POOL)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_crd_is_the_generated_one(path: pathlib.Path) -> None:
    assert path.is_file(), f"{path} missing: run `make crd`"
    assert path.read_text() == crd.render(crd.POOL), f"{path} differs from the model: run `make crd`"
    assert crd.main(["--kind", "GeneratorPool", "--check", str(path)]) == 0
    assert crd.main(["--check", str(path)]) == 1, "the RLJob's CRD must not pass for the pool's file"


def test_chart_template_emits_every_generated_crd() -> None:
    """The chart's CRD template names each file ``make crd`` writes into files/crds/ (e2e/test_helm.py renders it)."""
    template = (ROOT / "helm" / "kubeforge" / "templates" / "crd.yaml").read_text()
    for kind in crd.KINDS.values():
        assert f'"files/crds/{kind.file_name}"' in template


def test_names_subresources_and_columns(schema: Node) -> None:
    obj = crd.crd(crd.POOL)
    spec = obj["spec"]
    assert obj["metadata"]["name"] == "generatorpools.kubeforge.dev"
    assert spec["group"] == "kubeforge.dev" and spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == "GeneratorPool" and spec["names"]["shortNames"] == ["gpool"]
    (version,) = spec["versions"]
    assert version["subresources"]["scale"] == {"specReplicasPath": ".spec.replicas",
                                                "statusReplicasPath": ".status.readyEngines"}
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert list(columns) == ["Ready", "Jobs", "Adapters", "Util", "Age"]
    for name, column in columns.items():
        if name != "Age":
            node = at(schema, column["jsonPath"])
            assert node["type"] == column["type"] or (node["type"], column["type"]) == ("integer", "number")


def test_fixed_paths_and_bounds(schema: Node) -> None:
    """The paths the API note fixes (spec.model, replicas, maxAdapters, maxLoraRank) with their bounds."""
    assert at(schema, ".spec.model.builtin")["enum"] == ["smollm2-135m-instruct", "tiny"]
    assert "lora" not in at(schema, ".spec.model")["properties"], "a pool's model is a base model"
    assert (at(schema, ".spec.replicas")["minimum"], at(schema, ".spec.maxAdapters")["minimum"]) == (1, 1)
    assert at(schema, ".spec.maxLoraRank")["maximum"] == generatorpool.MAX_LORA_RANK == 512
    for field in ("tensorParallelSize", "kvCacheGib", "resources", "nodeSelector", "tolerations", "image"):
        assert field in schema["properties"]["spec"]["properties"], field
    assert "affinity" not in schema["properties"]["spec"]["properties"], "relative to a job's roles: no pool has any"
    status = schema["properties"]["status"]["properties"]
    assert {"readyEngines", "attachedJobs", "residentAdapters", "utilisation", "conditions"} <= set(status)


def test_documented_and_structural(schema: Node) -> None:
    missing = [p for p, node in walk(schema) if not p.endswith("[*]") and p != ".metadata"
               and not node.get("description")]
    assert not missing
    assert not [p for p, node in walk(schema) if "type" not in node and not node.get("x-kubernetes-int-or-string")
                and not node.get("x-kubernetes-preserve-unknown-fields")]


def test_cel_rules(schema: Node) -> None:
    root = rules(schema)
    assert any(f"size() <= {contract.MAX_POOL_NAME_LENGTH}" in r["rule"] for r in root)
    assert any(r["rule"] == "self == oldSelf" and r["message"] == generatorpool.MSG_POOL_MODEL_IMMUTABLE
               for r in rules(at(schema, ".spec.model")))
    for path, node in walk(schema):
        for r in rules(node):
            fields = set(re.findall(r"(?:self|oldSelf)\.(\w+)", r["rule"]))
            known = set(node.get("properties", {})) | ({"metadata"} if path == "" else set())
            assert fields <= known, f"{path}: {r['rule']} names {fields - known}"


def test_crd_defaults_equal_model_defaults(schema: Node) -> None:
    by_server = apply_defaults(schema["properties"]["spec"], copy.deepcopy(MINIMAL["spec"]))
    by_model = load.dump(load.parse_pool(copy.deepcopy(MINIMAL)))["spec"]
    assert invalid_manifests.compact(by_server) == invalid_manifests.compact(by_model)
    assert by_model["maxAdapters"] == 8 and by_model["maxLoraRank"] == 16 and by_model["replicas"] == 1


def test_printed_crd_is_yaml_of_the_object() -> None:
    assert yaml.safe_load(crd.render(crd.POOL)) == crd.crd(crd.POOL)
