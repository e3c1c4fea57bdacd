"""The CustomResourceDefinitions of kubeforge's kinds, generated from the typed models (the YAML in crds/ is never
edited by hand).

Role: turn a model's ``model_json_schema(by_alias=True)`` (JSON Schema 2020-12 with ``$defs``) into a *structural*
OpenAPI v3 schema the API server accepts, and wrap it in the CRD object. Two kinds (``KINDS``): the RLJob
(``RLJOB``, the default) and the GeneratorPool (``POOL``, ``--kind GeneratorPool``). ``make crd`` writes each to
``crds/kubeforge.dev_<plural>.yaml`` and copies it into the Helm chart; ``kubeforge crd`` prints one; the unit
tests check that the committed files equal what this module generates.

Neighbours: ``kubeforge.api.rljob`` and ``kubeforge.api.generatorpool`` (the models, their descriptions, bounds,
enums and CEL rules), ``kubeforge.api.contract`` (group, version, names, categories). Nothing else feeds the schemas.

Translation rules (``_convert``):
  $ref                     -> inlined; the field's description comes first, the type's docstring after it
  anyOf [X, null]          -> X, not nullable: the API server prunes a null in a non-nullable field before
                              defaulting, so ``null`` means "unset" as ``None`` does in the model, and the
                              stored object carries no nulls, like ``load.dump`` (``nullable: true`` would
                              store them; checked on kube-apiserver 1.34: CEL's ``has()`` is false either way)
  anyOf [integer, string]  -> ``x-kubernetes-int-or-string: true`` (resource quantities; the string's pattern,
                              if any, is kept: it applies to string values only)
  exclusiveMinimum: n      -> ``minimum: n, exclusiveMinimum: true`` (OpenAPI v3.0 spelling)
  additionalProperties     -> false: dropped (the API server prunes, or refuses with strict field
                              validation); true: ``x-kubernetes-preserve-unknown-fields``; a schema: kept
  title, const             -> dropped
Any other keyword raises: a new model feature must be taught here rather than silently lost.

Invariants: every property carries a description (``kubectl explain``); every node has a type (structural);
defaults are those of the model, including nested objects built by a default factory (written out in full),
so fields that carry ``self == oldSelf`` rules are always present in old and new objects; status holds only the typed
status model (kopf keeps its own bookkeeping in annotations).
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import pathlib
import sys
from collections.abc import Sequence
from typing import Any

import pydantic
import pydantic.json_schema
import yaml
from pydantic_core import core_schema

from kubeforge.api import contract, generatorpool, rljob

CRD_NAME = f"{contract.PLURAL}.{contract.GROUP}"        # the RLJob's (``RLJOB.crd_name``)

_KEEP = frozenset({
    "type", "description", "default", "enum", "format", "pattern", "minimum", "maximum", "minLength", "maxLength",
    "minItems", "maxItems", "required", "x-kubernetes-validations", "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys", "x-kubernetes-preserve-unknown-fields", "x-kubernetes-int-or-string",
})
_DROP = frozenset({"title", "const"})

PRINTER_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Lifecycle phase."},
    {"name": "Ready", "type": "string", "jsonPath": ".status.ready", "description": "Ready roles / roles."},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts", "description": "Job restarts so far."},
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step",
     "description": "Last completed optimizer step."},
    {"name": "Reward", "type": "number", "jsonPath": ".status.progress.meanReward",
     "description": "Mean reward of the last step."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
)

POOL_PRINTER_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "Ready", "type": "string", "jsonPath": ".status.ready", "description": "Ready engines / engines."},
    {"name": "Jobs", "type": "integer", "jsonPath": ".status.attached", "description": "Attached RLJobs."},
    {"name": "Adapters", "type": "integer", "jsonPath": ".status.residentAdapters",
     "description": "Adapters resident in the engines."},
    {"name": "Util", "type": "number", "jsonPath": ".status.utilisation",
     "description": "Share of time the engines spent generating."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Kind:
    """One kind's CRD: its model, names, printer columns, subresources and the source folder its header names."""

    model: type[pydantic.BaseModel]
    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    columns: tuple[dict[str, Any], ...]
    subresources: dict[str, Any]
    name_description: str
    source: str

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{contract.GROUP}"

    @property
    def file_name(self) -> str:
        """The file ``make crd`` writes (in crds/ and the chart's files/crds/)."""
        return f"{contract.GROUP}_{self.plural}.yaml"


RLJOB = Kind(
    model=rljob.RLJob, kind=contract.KIND, plural=contract.PLURAL, singular=contract.SINGULAR,
    short_names=contract.SHORT_NAMES, columns=PRINTER_COLUMNS,
    # `kubectl scale rljob/NAME --replicas N` sets the generators (elastic; see docs/failures.md)
    subresources={"status": {}, "scale": {"specReplicasPath": ".spec.roles.generator.replicas",
                                          "statusReplicasPath": ".status.roles.generator.ready"}},
    name_description=f"The job's name: a DNS-1035 label of at most {contract.MAX_JOB_NAME_LENGTH} characters, as "
    "the names of the job's children derive from it.", source="api/kubeforge/api/rljob/")
POOL = Kind(
    model=generatorpool.GeneratorPool, kind=contract.POOL_KIND, plural=contract.POOL_PLURAL,
    singular=contract.POOL_SINGULAR, short_names=contract.POOL_SHORT_NAMES, columns=POOL_PRINTER_COLUMNS,
    # `kubectl scale generatorpool/NAME --replicas N` sets the engines
    subresources={"status": {}, "scale": {"specReplicasPath": ".spec.replicas",
                                          "statusReplicasPath": ".status.readyEngines"}},
    name_description=f"The pool's name: a DNS-1035 label of at most {contract.MAX_POOL_NAME_LENGTH} characters, "
    "as the names of the pool's children derive from it.", source="api/kubeforge/api/generatorpool/")
KINDS = {k.kind: k for k in (RLJOB, POOL)}


def header(kind: Kind = RLJOB) -> str:
    """The comment line every generated CRD file starts with."""
    return f"# Generated by `make crd` (kubeforge.api.crd) from {kind.source}. Do not edit by hand.\n"


HEADER = header(RLJOB)


def _root_descriptions(kind: Kind) -> dict[str, str]:
    return {
        "apiVersion": "APIVersion defines the versioned schema of this representation of an object "
                      f"({contract.API_VERSION}).",
        "kind": f"Kind is the REST resource this object represents ({kind.kind}).",
        "metadata.name": kind.name_description,
    }


class _Generator(pydantic.json_schema.GenerateJsonSchema):
    """JSON schema generation that also reports defaults built by a ``default_factory``.

    A nested model's default is written out in full (the API server validates a default, CEL rules included,
    without applying the nested defaults first); empty lists and maps and ``None`` give no default (absent means
    empty or unset on both sides).
    """

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        if "default_factory" in schema and not schema.get("default_factory_takes_data"):
            value = schema["default_factory"]()  # type: ignore[call-arg]
        else:
            value = schema.get("default", pydantic.json_schema.NoDefault)
        if isinstance(value, pydantic.BaseModel):
            value = _compact(value.model_dump(mode="json", by_alias=True, exclude_none=True))
        if value is None or value in ([], {}):
            return pydantic.json_schema.NoDefault
        return value


def _compact(value: Any) -> Any:
    """``value`` without empty lists and maps, at every depth."""
    if isinstance(value, dict):
        out = {k: _compact(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in ({}, [])}
    if isinstance(value, list):
        return [_compact(v) for v in value]
    return value


def json_schema(kind: Kind = RLJOB) -> dict[str, Any]:
    """The model's JSON schema (wire names, defaults from factories included)."""
    return kind.model.model_json_schema(by_alias=True, schema_generator=_Generator)


def _join(first: str | None, second: str | None) -> str | None:
    """A field's description followed by its type's docstring, without repeating either."""
    if not first or not second or second in first:
        return first or second
    if first in second:
        return second
    return f"{first} {second}"


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline ``$ref`` and flatten ``anyOf``; what is left is one plain JSON Schema node."""
    node = dict(node)
    if "$ref" in node:
        target = copy.deepcopy(defs[node.pop("$ref").rsplit("/", 1)[-1]])
        described = _join(node.pop("description", None), target.pop("description", None))
        rules = node.pop("x-kubernetes-validations", []) + target.pop("x-kubernetes-validations", [])
        node = {**target, **node}
        if described:
            node["description"] = described
        if rules:
            node["x-kubernetes-validations"] = rules
        return _resolve(node, defs)
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        types = sorted(str(o.get("type")) for o in options)
        if types == ["integer", "string"]:
            patterns = [o["pattern"] for o in options if "pattern" in o]
            return {**node, "x-kubernetes-int-or-string": True, **({"pattern": patterns[0]} if patterns else {})}
        if len(options) != 1:
            raise ValueError(f"cannot express anyOf {options} in a structural schema")
        inner = _resolve(options[0], defs)
        rules = inner.pop("x-kubernetes-validations", []) + node.pop("x-kubernetes-validations", [])
        merged = {**inner, **node}
        merged["description"] = _join(node.get("description"), inner.get("description"))
        if rules:
            merged["x-kubernetes-validations"] = rules
        return {k: v for k, v in merged.items() if v is not None}
    return node


def _convert(node: dict[str, Any], defs: dict[str, Any], path: str) -> dict[str, Any]:
    """One JSON Schema node -> one structural OpenAPI v3 node (recursively)."""
    node = _resolve(node, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "properties":
            out[key] = {name: _convert(sub, defs, f"{path}.{name}") for name, sub in value.items()}
        elif key == "items":
            out[key] = _convert(value, defs, f"{path}[*]")
        elif key == "additionalProperties":
            if isinstance(value, dict):
                out[key] = _convert(value, defs, f"{path}[*]")
            elif value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "x-kubernetes-validations":
            out[key] = [_rule(r) for r in value]
        elif key in _KEEP:
            out[key] = value
        else:
            raise ValueError(f"{path}: JSON Schema keyword {key!r} has no structural translation")
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if "properties" in out and "x-kubernetes-preserve-unknown-fields" in out:
        raise ValueError(f"{path}: both properties and free-form fields")
    return _ordered(out)


_ORDER = ("type", "description", "default", "enum", "format", "pattern", "minimum", "exclusiveMinimum", "maximum",
          "exclusiveMaximum", "minLength", "maxLength", "minItems", "maxItems", "required")


def _rule(rule: dict[str, Any]) -> dict[str, Any]:
    """A CEL rule with its keys in the order the Kubernetes docs write them."""
    order = ("rule", "message", "messageExpression", "fieldPath", "reason", "optionalOldSelf")
    unknown = set(rule) - set(order)
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)} in CEL rule {rule}")
    return {k: rule[k] for k in order if k in rule}


def _ordered(node: dict[str, Any]) -> dict[str, Any]:
    """Keys in a fixed reading order (type and description first, nested schemas and rules last)."""
    rank = {k: i for i, k in enumerate(_ORDER)}
    return dict(sorted(node.items(), key=lambda kv: (rank.get(kv[0], len(_ORDER)), kv[0])))


def openapi_schema(kind: Kind = RLJOB) -> dict[str, Any]:
    """The structural ``openAPIV3Schema`` of an object of ``kind`` (apiVersion, kind, metadata, spec, status)."""
    source = json_schema(kind)
    described = _root_descriptions(kind)
    defs = source.get("$defs", {})
    props = source["properties"]
    spec = _convert(props["spec"], defs, "spec")
    status = _convert(props["status"], defs, "status")
    status.pop("default", None)
    root: dict[str, Any] = {
        "type": "object",
        "description": source["description"],
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": described["apiVersion"]},
            "kind": {"type": "string", "description": described["kind"]},
            # a CRD may only say that metadata.name is a string (the API server refuses a description here)
            "metadata": {"type": "object", "properties": {
                "name": {"type": "string", "description": described["metadata.name"]}}},
            "spec": spec,
            "status": status,
        },
    }
    if source.get("x-kubernetes-validations"):
        root["x-kubernetes-validations"] = [_rule(r) for r in source["x-kubernetes-validations"]]
    return root


def crd(kind: Kind = RLJOB) -> dict[str, Any]:
    """The CustomResourceDefinition object of ``kind``."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": kind.crd_name,
            "labels": {"app.kubernetes.io/name": "kubeforge", "app.kubernetes.io/part-of": "kubeforge"},
        },
        "spec": {
            "group": contract.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": kind.singular,
                "shortNames": list(kind.short_names),
                "categories": list(contract.CATEGORIES),
            },
            "versions": [{
                "name": contract.VERSION,
                "served": True,
                "storage": True,
                "subresources": copy.deepcopy(kind.subresources),
                "additionalPrinterColumns": [dict(c) for c in kind.columns],
                "schema": {"openAPIV3Schema": openapi_schema(kind)},
            }],
        },
    }


def render(kind: Kind = RLJOB) -> str:
    """The CRD of ``kind`` as the YAML text committed in crds/ and in the Helm chart."""
    return header(kind) + yaml.safe_dump(crd(kind), sort_keys=False, width=120, allow_unicode=True)


# ---------------------------------------------------------------- the field table of docs/api.md

TABLE_BEGIN = "<!-- fields:begin (generated by `make crd` from the model; do not edit) -->"
TABLE_END = "<!-- fields:end -->"


def _type_of(node: dict[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "int-or-string"
    if node.get("type") == "array":
        return f"[]{_type_of(node.get('items', {}))}"
    if node.get("type") == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map[string]{_type_of(node['additionalProperties'])}"
    return str(node.get("type", "object"))


def _constraints(node: dict[str, Any], *, required: bool) -> str:
    out = ["**required**"] if required else []
    if "enum" in node:
        out.append(" \\| ".join(f"`{v}`" for v in node["enum"]))
    for key, word in (("minimum", ">="), ("maximum", "<=")):
        if key in node:
            strict = node.get(f"exclusive{key[:1].upper()}{key[1:]}")
            out.append(f"{word.rstrip('=') if strict else word} {node[key]}")
    if "pattern" in node:
        out.append(f"pattern `{node['pattern']}`")
    for key, word in (("minLength", "min length"), ("maxLength", "max length"), ("minItems", "min items"),
                      ("maxItems", "max items")):
        if key in node:
            out.append(f"{word} {node[key]}")
    if "default" in node and not isinstance(node["default"], dict):
        out.append(f"default `{json.dumps(node['default'])}`")
    keys = node.get("x-kubernetes-list-map-keys")
    if keys:
        out.append(f"unique by `{', '.join(keys)}`")
    out += [f"CEL: {r['message']}" for r in node.get("x-kubernetes-validations", [])]
    return "; ".join(out)


def _rows(node: dict[str, Any], path: str) -> list[str]:
    rows = []
    required = set(node.get("required", []))
    for name, sub in node.get("properties", {}).items():
        here = f"{path}.{name}"
        desc = " ".join(str(sub.get("description", "")).split()).replace("|", "\\|")
        rows.append(f"| `{here}` | {_type_of(sub)} | {_constraints(sub, required=name in required)} | {desc} |")
        target = sub.get("items") if sub.get("type") == "array" else sub.get("additionalProperties", sub)
        if isinstance(target, dict) and "properties" in target:
            rows += _rows(target, f"{here}[]" if sub.get("type") == "array" else
                          (f"{here}.*" if target is not sub else here))
    return rows


def field_table(kind: Kind = RLJOB) -> str:
    """The Markdown table of every field of spec and status (path, type, constraints, description)."""
    schema = openapi_schema(kind)
    head = ["| field | type | constraints | description |", "|---|---|---|---|"]
    return "\n".join(head + _rows(schema["properties"]["spec"], "spec") +
                     _rows(schema["properties"]["status"], "status")) + "\n"


def with_table(doc: str, kind: Kind = RLJOB) -> str:
    """``doc`` with the text between the table markers replaced by the current table of ``kind``."""
    begin, end = doc.index(TABLE_BEGIN) + len(TABLE_BEGIN), doc.index(TABLE_END)
    return doc[:begin] + "\n" + field_table(kind) + doc[end:]


def _stale(paths: Sequence[str], text: str) -> list[str]:
    return [p for p in paths if not pathlib.Path(p).is_file() or pathlib.Path(p).read_text() != text]


def main(argv: Sequence[str] | None = None) -> int:
    """``kubeforge crd``: print the CRD; ``--write FILE...`` writes it; ``--check FILE...`` fails when stale."""
    parser = argparse.ArgumentParser(prog="kubeforge crd", description="Print a CRD generated from its typed "
                                     "model (the RLJob's by default).")
    parser.add_argument("--kind", choices=sorted(KINDS), default=RLJOB.kind, help="the kind whose CRD to print, "
                        "write or check (default RLJob)")
    parser.add_argument("--write", nargs="+", metavar="FILE", help="write the CRD to these files")
    parser.add_argument("--check", nargs="+", metavar="FILE",
                        help="exit 1 when a file differs from the generated CRD (run `make crd`)")
    parser.add_argument("--docs", metavar="MARKDOWN", help="refresh the field table between the markers in this "
                        "Markdown file (with --write), or check it (with --check)")
    parser.add_argument("--table", action="store_true", help="print the Markdown field table instead")
    args = parser.parse_args(argv)
    text = render(KINDS[args.kind])
    if args.table:
        sys.stdout.write(field_table(KINDS[args.kind]))
        return 0
    if args.check:
        stale = _stale(args.check, text)
        doc = pathlib.Path(args.docs).read_text() if args.docs else ""
        if args.docs and with_table(doc, KINDS[args.kind]) != doc:
            stale.append(args.docs)
        for path in stale:
            print(f"{path}: differs from what the model generates; run `make crd`", file=sys.stderr)
        return 1 if stale else 0
    if args.write:
        for path in args.write:
            pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
            pathlib.Path(path).write_text(text)
        if args.docs:
            pathlib.Path(args.docs).write_text(with_table(pathlib.Path(args.docs).read_text(), KINDS[args.kind]))
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
