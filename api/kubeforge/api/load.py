"""Parse RLJob (and GeneratorPool) manifests and explain what is wrong with them, one message per problem, by field
path.

Neighbours: the local launcher and every role call :func:`load_file`; tests call :func:`parse`. Messages follow the
API server's wording (``spec.algorithm.groupSize: Invalid value: 1: should be greater than or equal to 2``) so a
user sees the same words from ``kubeforge run`` and ``kubectl apply``; ``refusal`` and ``EXIT_INVALID`` are how
``kubeforge validate`` and ``kubeforge run`` both report them (stderr, exit 2).
"""
from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import pydantic
import yaml

from kubeforge.api import generatorpool, rljob, validate, validate_pool


_M = TypeVar("_M", bound=pydantic.BaseModel)

#: The exit status of ``kubeforge validate`` and ``kubeforge run`` for a manifest they refuse (or cannot read): 2, the
#: status of a usage error, because ``kubeforge run`` exits 1 when a role fails for good: 1 would not say "your input".
EXIT_INVALID = 2


def refusal(file: str, problems: Iterable[str]) -> str:
    """What ``kubeforge validate`` and ``kubeforge run`` print on stderr when they refuse ``file``: one line per
    problem, ``kubeforge: FILE: path: message``, the same lines from both commands."""
    return "".join(f"kubeforge: {file}: {p}\n" for p in problems)


class InvalidRLJob(ValueError):
    """The manifest is not a valid RLJob; ``problems`` holds one message per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid RLJob:\n" + "\n".join(f"  - {p}" for p in problems))


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).startswith(("function-", "tagged-union")):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out or "<root>"


def _message(err: Any) -> str:
    ctx = err.get("ctx") or {}
    kind = err["type"]
    value = err.get("input")
    if kind == "greater_than_equal":
        return f"Invalid value: {value!r}: should be greater than or equal to {ctx['ge']}"
    if kind == "greater_than":
        return f"Invalid value: {value!r}: should be greater than {ctx['gt']}"
    if kind == "less_than_equal":
        return f"Invalid value: {value!r}: should be less than or equal to {ctx['le']}"
    if kind == "less_than":
        return f"Invalid value: {value!r}: should be less than {ctx['lt']}"
    if kind in ("enum", "literal_error"):
        return f"Unsupported value: {value!r}: supported values: {ctx.get('expected', '')}"
    if kind == "extra_forbidden":
        return "Unknown field: field not declared in schema"
    if kind == "missing":
        return "Required value"
    if kind == "string_pattern_mismatch":
        return f"Invalid value: {value!r}: should match '{ctx['pattern']}'"
    if kind == "string_too_long":
        return f"Too long: may not be more than {ctx['max_length']} characters"
    if kind == "string_too_short":
        return f"Invalid value: {value!r}: should be at least {ctx['min_length']} chars long"
    if kind == "too_short":
        return f"Invalid value: should have at least {ctx['min_length']} items"
    if kind == "too_long":
        return f"Too many: must have at most {ctx['max_length']} items"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    return f"Invalid value: {err['msg']}"


def problems_of(exc: pydantic.ValidationError) -> list[str]:
    """One ``path: message`` line per error, paths in wire (camelCase) names."""
    return [f"{_path(e['loc'])}: {_message(e)}" for e in exc.errors()]


def _schema(doc: Any, model: type[_M]) -> _M:
    """``doc`` validated against ``model``'s schema as the API server would (or :class:`InvalidRLJob`)."""
    if not isinstance(doc, dict):
        raise InvalidRLJob(["<root>: Invalid value: the manifest must be a mapping"])
    try:
        text = json.dumps(doc, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidRLJob([f"<root>: Invalid value: not representable as JSON: {exc}"]) from None
    try:
        # Strict JSON-mode validation, as the API server types values: "5" is not an integer, "yes" not a boolean;
        # by wire (camelCase) names only, as the API server knows no other: `prompts_per_step` is an unknown field.
        return model.model_validate_json(text, strict=True, by_alias=True, by_name=False)
    except pydantic.ValidationError as exc:
        raise InvalidRLJob(problems_of(exc)) from None


def parse(doc: Any) -> rljob.RLJob:
    """Validate a decoded manifest (a dict) into an RLJob or raise :class:`InvalidRLJob`: the schema first, then
    (on a schema-valid job, as the API server runs webhooks only after its schema) the cross-field and semantic
    rules of :mod:`kubeforge.api.validate`."""
    job = _schema(doc, rljob.RLJob)
    semantic = validate.problems(job)
    if semantic:
        raise InvalidRLJob(semantic)
    return job


def parse_pool(doc: Any) -> generatorpool.GeneratorPool:
    """Validate a decoded GeneratorPool manifest into a pool or raise :class:`InvalidRLJob`: the schema, then the
    rules of its pods (``validate_pool.pool_problems``)."""
    pool = _schema(doc, generatorpool.GeneratorPool)
    semantic = validate_pool.pool_problems(pool)
    if semantic:
        raise InvalidRLJob(semantic)
    return pool


Manifest = rljob.RLJob | generatorpool.GeneratorPool


def parse_any(doc: Any) -> Manifest:
    """An RLJob or a GeneratorPool, by the manifest's ``kind`` (absent: an RLJob, as before pools existed)."""
    if isinstance(doc, dict) and doc.get("kind") == generatorpool.GeneratorPool.model_fields["kind"].default:
        return parse_pool(doc)
    return parse(doc)


def attach(jobs: Iterable[rljob.RLJob], pools: Iterable[generatorpool.GeneratorPool]) -> dict[str, list[str]]:
    """Per job name, why it cannot run on the pool it names among ``pools`` (``validate_pool``): only jobs with
    problems are listed. With no pool given at all, a job's pool is unknown here and nothing is said of it."""
    known = {p.metadata.name: p for p in pools}
    out: dict[str, list[str]] = {}
    for job in jobs:
        ref = job.spec.generator_pool
        if ref is None or not known:
            continue
        pool = known.get(ref.name)
        found = [validate_pool.pool_missing(ref.name)] if pool is None else validate_pool.problems(job, pool)
        if found:
            out[job.metadata.name] = found
    return out


class _Loader(yaml.SafeLoader):
    """YAML 1.1 with YAML 1.2's float syntax, so ``1e-5`` is a number (as kubectl reads it), not a string."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[0-9][0-9_]*[eE][-+]?[0-9]+"
               r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."),
)


def _one_document(text: str) -> Any:
    try:
        docs = [d for d in yaml.load_all(text, Loader=_Loader) if d is not None]
    except yaml.YAMLError as exc:
        raise InvalidRLJob([f"<root>: not valid YAML: {exc}"]) from None
    if len(docs) != 1:
        raise InvalidRLJob([f"<root>: expected exactly one YAML document, found {len(docs)}"])
    return docs[0]


def parse_text(text: str) -> rljob.RLJob:
    """Parse YAML (or JSON) text holding one RLJob."""
    return parse(_one_document(text))


def parse_any_text(text: str) -> Manifest:
    """Parse YAML (or JSON) text holding one RLJob or one GeneratorPool."""
    return parse_any(_one_document(text))


def load_file(path: str | pathlib.Path) -> rljob.RLJob:
    """Read and validate the RLJob manifest at ``path``."""
    return parse_text(pathlib.Path(path).read_text())


def check_texts(texts: Mapping[str, str]) -> tuple[dict[str, Manifest], dict[str, list[str]]]:
    """``kubeforge validate FILE...``: each file's text (one RLJob or one GeneratorPool) parsed, then every job
    checked against the pool it names among the files (``attach``). Returns the manifests that parsed and the
    problems per file (only files with problems are listed), files in the order given."""
    parsed: dict[str, Manifest] = {}
    problems: dict[str, list[str]] = {}
    for file, text in texts.items():
        try:
            parsed[file] = parse_any_text(text)
        except InvalidRLJob as exc:
            problems[file] = exc.problems
    jobs = {f: m for f, m in parsed.items() if isinstance(m, rljob.RLJob)}
    pools = [m for m in parsed.values() if isinstance(m, generatorpool.GeneratorPool)]
    found = attach(jobs.values(), pools)
    for file, job in jobs.items():
        if job.metadata.name in found:
            problems[file] = found[job.metadata.name]
    return parsed, {f: problems[f] for f in texts if f in problems}


def dump(obj: Manifest) -> dict[str, Any]:
    """The manifest as the API server would store it (wire names, no unset optional fields)."""
    return obj.model_dump(mode="json", by_alias=True, exclude_none=True)
