"""Unit tests of the generated CRD: committed copies are current, the schema is structural and documented, the
CEL rules the API note promises are there, and the CRD's defaults are the model's defaults."""
from __future__ import annotations

import copy
import pathlib
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from kubeforge.api import contract, crd, load

import invalid_manifests  # tests/api: the shared table and its helpers

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMMITTED = (ROOT / "crds" / "kubeforge.dev_rljobs.yaml", ROOT / "helm" / "kubeforge" / "files" / "crds" / "kubeforge.dev_rljobs.yaml")
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))

Node = dict[str, Any]


@pytest.fixture(scope="module")
def schema() -> Node:
    return crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def walk(node: Node, path: str = "") -> Iterator[tuple[str, Node]]:
    """Every schema node with its path (``.spec.roles.trainer``; ``[*]`` for items and map values)."""
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[*]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}[*]")


def at(schema: Node, path: str) -> Node:
    node = schema
    for part in path.strip(".").split("."):
        node = node["properties"][part]
    return node


# ---------------------------------------------------------------- generated == committed


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_crd_is_the_generated_one(path: pathlib.Path) -> None:
    assert path.is_file(), f"{path} missing: run `make crd`"
    assert path.read_text() == crd.render(), f"{path} differs from the model: run `make crd` (never edit by hand)"


def test_docs_field_table_is_current() -> None:
    doc = ROOT / "docs" / "api.md"
    assert crd.with_table(doc.read_text()) == doc.read_text(), "docs/api.md field table is stale: run `make crd`"
    assert crd.main(["--check", *map(str, COMMITTED), "--docs", str(doc)]) == 0


def test_field_table_lists_every_field(schema: Node) -> None:
    table = crd.field_table()
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    described = [p for p, _ in walk(schema["properties"]["spec"]) if p and not p.endswith("[*]")]
    assert len([r for r in rows if r.startswith("| `spec.")]) == len(described)
    for name in ("spec.algorithm.groupSize", "spec.roles.trainer.replicas", "spec.verifiers[].regex.pattern",
                 "status.roles.*.ready", "status.progress.meanReward"):
        assert f"| `{name}` |" in table


def test_check_mode_reports_stale_files(tmp_path: pathlib.Path) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    assert crd.main(["--write", str(good), str(bad)]) == 0
    bad.write_text(bad.read_text().replace("minimum: 2", "minimum: 1"))
    assert crd.main(["--check", str(good)]) == 0
    assert crd.main(["--check", str(good), str(bad)]) == 1
    assert crd.main(["--check", str(tmp_path / "absent.yaml")]) == 1


def test_render_is_yaml_of_the_object() -> None:
    assert yaml.safe_load(crd.render()) == crd.crd()


# ---------------------------------------------------------------- names, subresources, columns


def test_names_and_subresources() -> None:
    spec = crd.crd()["spec"]
    assert crd.crd()["metadata"]["name"] == "rljobs.kubeforge.dev"
    assert spec["group"] == "kubeforge.dev" and spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == "RLJob" and spec["names"]["plural"] == "rljobs"
    assert spec["names"]["shortNames"] == ["rlj"]
    assert spec["names"]["categories"] == list(contract.CATEGORIES)
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}, "scale": {
        "specReplicasPath": ".spec.roles.generator.replicas", "statusReplicasPath": ".status.roles.generator.ready"}}


def test_printer_columns_point_at_status_fields(schema: Node) -> None:
    columns = {c["name"]: c for c in crd.crd()["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert list(columns) == ["Phase", "Ready", "Restarts", "Step", "Reward", "Age"]
    for name, column in columns.items():
        if name == "Age":
            assert column["jsonPath"] == ".metadata.creationTimestamp"
            continue
        node = at(schema, column["jsonPath"])
        assert node["type"] == column["type"] or (node["type"], column["type"]) == ("integer", "number")


# ---------------------------------------------------------------- structural, documented


def test_every_property_has_a_description(schema: Node) -> None:
    # .metadata is the one exception: the API server refuses anything there but metadata.name's type (and doc)
    missing = [p for p, node in walk(schema)
               if not p.endswith("[*]") and p != ".metadata" and not node.get("description")]
    assert not missing, f"properties without a description (kubectl explain): {missing}"


def test_metadata_only_declares_the_name(schema: Node) -> None:
    meta = schema["properties"]["metadata"]
    assert set(meta) == {"type", "properties"} and set(meta["properties"]) == {"name"}
    assert set(meta["properties"]["name"]) == {"type", "description"}


def test_schema_is_structural(schema: Node) -> None:
    problems = []
    for path, node in walk(schema):
        for bad in ("$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "title", "const", "nullable"):
            if bad in node:
                problems.append(f"{path}: {bad}")
        free = node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
        if node.get("x-kubernetes-int-or-string") and "type" in node:
            problems.append(f"{path}: int-or-string with a type")
        if "type" not in node and not free:
            problems.append(f"{path}: no type")
        if node.get("type") == "object" and "properties" in node and "additionalProperties" in node:
            problems.append(f"{path}: properties and additionalProperties")
        if "additionalProperties" in node and not isinstance(node["additionalProperties"], dict):
            problems.append(f"{path}: additionalProperties {node['additionalProperties']!r}")
        if node.get("type") == "array" and "items" not in node:
            problems.append(f"{path}: array without items")
        if node.get("exclusiveMinimum") not in (None, True) or node.get("exclusiveMaximum") not in (None, True):
            problems.append(f"{path}: JSON Schema 2020 exclusive bounds")
    assert not problems


def test_enums_are_closed_and_typed(schema: Node) -> None:
    enums = {p: n for p, n in walk(schema) if "enum" in n}
    for path in (".spec.model.builtin", ".spec.model.dtype", ".spec.algorithm.loss", ".spec.verifiers[*].type",
                 ".spec.gang.backend", ".spec.placement.mode", ".spec.weightSync.backend", ".status.phase"):
        assert path in enums and enums[path]["type"] == "string"


def test_status_is_typed_and_prunes_unknown_fields(schema: Node) -> None:
    status = schema["properties"]["status"]
    assert "x-kubernetes-preserve-unknown-fields" not in status, "kopf bookkeeping must not land in status"
    assert {"phase", "observedGeneration", "conditions", "roles", "progress"} <= set(status["properties"])
    assert status["properties"]["conditions"]["x-kubernetes-list-map-keys"] == ["type"]


def test_free_form_fields(schema: Node) -> None:
    gen = ".spec.roles.generator"
    assert at(schema, f"{gen}.nodeSelector")["additionalProperties"] == {"type": "string"}
    quantity = at(schema, f"{gen}.resources.limits")["additionalProperties"]
    assert quantity["x-kubernetes-int-or-string"] is True and "type" not in quantity and "pattern" in quantity
    tolerations = at(schema, f"{gen}.tolerations")["items"]
    assert tolerations == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


# ---------------------------------------------------------------- CEL rules


def rules(node: Node) -> list[dict[str, str]]:
    return list(node.get("x-kubernetes-validations", []))


def test_root_rules_limit_the_name(schema: Node) -> None:
    root = rules(schema)
    assert all(r["fieldPath"] == ".metadata.name" for r in root)
    assert any(f"size() <= {contract.MAX_JOB_NAME_LENGTH}" in r["rule"] for r in root)
    assert any(".matches(" in r["rule"] for r in root)


@pytest.mark.parametrize("path,rule", [
    (".spec.model", "self == oldSelf"),
    (".spec.algorithm", "self == oldSelf"),
    (".spec.roles.trainer", "self.replicas == oldSelf.replicas"),
])
def test_immutability_rules(schema: Node, path: str, rule: str) -> None:
    found = [r for r in rules(at(schema, path)) if r["rule"] == rule]
    assert found and "is immutable" in found[0]["message"]


def test_generator_and_verifier_replicas_are_mutable(schema: Node) -> None:
    for path, node in walk(schema):
        if path.startswith((".spec.roles.generator", ".spec.roles.verifier")):
            assert not any("oldSelf" in r["rule"] for r in rules(node)), path


def test_transition_rules_always_have_an_old_value(schema: Node) -> None:
    """``oldSelf`` rules run only when the field exists in old and new objects: every step from the root to such
    a field must be required or defaulted, so no update can skip the rule by omitting the field."""
    for path, node in walk(schema):
        if not any("oldSelf" in r["rule"] for r in rules(node)):
            continue
        parent = schema
        for part in path.strip(".").split("."):
            child = parent["properties"][part]
            assert part in parent.get("required", []) or "default" in child, f"{path}: {part} may be absent"
            parent = child


def test_rules_comparing_whole_objects_have_bounded_inputs(schema: Node) -> None:
    """CEL cost: strings and lists under ``self == oldSelf`` carry maxLength/maxItems (or are enums)."""
    for path, node in walk(schema):
        if not any(r["rule"] == "self == oldSelf" for r in rules(node)):
            continue
        for sub_path, sub in walk(node, path):
            if sub.get("type") == "string":
                assert "maxLength" in sub or "enum" in sub, sub_path
            if sub.get("type") == "array":
                assert "maxItems" in sub, sub_path


def test_list_maps(schema: Node) -> None:
    verifiers = at(schema, ".spec.verifiers")
    assert verifiers["x-kubernetes-list-type"] == "map" and verifiers["x-kubernetes-list-map-keys"] == ["name"]
    assert "name" in verifiers["items"]["required"]


def test_cel_rules_use_wire_names(schema: Node) -> None:
    """Every ``self.<field>`` a rule names exists in the schema node it is attached to."""
    for path, node in walk(schema):
        for r in rules(node):
            fields = set(re.findall(r"(?:self|oldSelf)\.(\w+)", r["rule"]))
            known = set(node.get("properties", {})) | ({"metadata"} if path == "" else set())
            assert fields <= known, f"{path}: {r['rule']} names {fields - known}"


# ---------------------------------------------------------------- defaults: CRD == model


def apply_defaults(node: Node, value: Any) -> Any:
    """Structural defaulting as the API server does it: absent properties with a default get it, recursively."""
    if isinstance(value, dict) and "properties" in node:
        for name, sub in node["properties"].items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = apply_defaults(sub, value[name])
    elif isinstance(value, dict) and isinstance(node.get("additionalProperties"), dict):
        for key in value:
            value[key] = apply_defaults(node["additionalProperties"], value[key])
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        return [apply_defaults(node["items"], v) for v in value]
    return value


MINIMAL = {"apiVersion": contract.API_VERSION, "kind": "RLJob", "metadata": {"name": "m"}, "spec": {
    "model": {"builtin": "tiny"}, "task": {"arithmetic": {}}, "verifiers": [{"name": "a", "type": "ExactAnswer"}]}}


@pytest.mark.parametrize("path", [None, *EXAMPLES], ids=lambda p: "minimal" if p is None else p.name)
def test_crd_defaults_equal_model_defaults(schema: Node, path: pathlib.Path | None) -> None:
    doc = copy.deepcopy(MINIMAL) if path is None else yaml.safe_load(path.read_text())
    by_server = apply_defaults(schema["properties"]["spec"], copy.deepcopy(doc["spec"]))
    by_model = load.dump(load.parse(doc))["spec"]
    assert invalid_manifests.compact(by_server) == invalid_manifests.compact(by_model)
