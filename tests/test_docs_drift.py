"""Docs drift: what README.md, docs/*.md, the chart's NOTES.txt and the examples' comments name must exist.

Checked, each against the code rather than a list kept here:
- ``make TARGET`` (in code): TARGET is a rule of the Makefile (``VAR=value`` words are variables, ``-s`` options);
- ``kubeforge SUBCOMMAND --flag`` (in code, the command word ``kubeforge``, a path ending in ``/kubeforge`` or
  ``python -m kubeforge.cli``): the subcommand and every flag exist in the argparse parsers of ``kubeforge.cli``
  (and, for the subcommands that pass their arguments through, the parser they pass them to);
- ``--set KEY=...`` and backticked ``KEY=value`` whose first part is a top-level key of the chart's values: KEY
  exists in ``helm/kubeforge/values.yaml`` (an empty map there takes any sub-key);
- repository paths: a word in code that starts with a top-level folder of the repository (``docs/``, ``e2e/``,
  ...) or is a top-level file exists (``path::name`` and ``path:name`` also need ``name`` defined in that file);
- RLJob fields (``spec.…``, ``status.…``, ``.status.…``, ``rljob.spec.…``): the path exists in the typed model
  ``kubeforge.api.rljob`` (or, for a pool's fields, ``kubeforge.api.generatorpool``) by wire name (``[]``, ``*``
  and ``<role>`` stand for any item or key; a map takes any key).

"In code" means an inline code span (which may wrap lines) or a line of a fenced block; paths are also checked in
plain-text sources (NOTES.txt, examples' comments). Words with placeholders (``<x>``, ``$X``, ``*``, ``...``) are
skipped, so are URLs and absolute or home paths. Run ``python tests/test_docs_drift.py`` for the counts.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import functools
import importlib
import pathlib
import re
import subprocess
import types
import typing
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pydantic
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
KINDS = ("make", "cli", "set", "path", "field")


# ------------------------------------------------------------------------------------------------ sources


def doc_paths(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """Every document scanned: globbed, so a new page is scanned without a change here."""
    paths = [root / "README.md", *sorted((root / "docs").glob("*.md")),
             root / "helm/kubeforge/templates/NOTES.txt", *sorted((root / "examples").glob("*.yaml"))]
    return [p for p in paths if p.is_file()]


@dataclasses.dataclass(frozen=True)
class Snippet:
    """A piece of a document: an inline code ``span``, one line of ``code`` (a fenced block's line without its
    comment, a line of a plain-text source) or ``prose`` around code (a comment: only paths are checked in it)."""

    line: int
    text: str
    kind: str


_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
_FENCE = re.compile(r"^\s*(```|~~~)")


def _spans(text: str, first_line: int) -> Iterator[Snippet]:
    for m in _SPAN.finditer(text):
        line = first_line + text.count("\n", 0, m.start())
        yield Snippet(line, m.group(2).replace("\n", " ").strip(), "span")


def _comment(comment: str, n: int) -> Iterator[Snippet]:
    yield from _spans(comment, n)
    yield Snippet(n, _SPAN.sub(" ", comment), "prose")


def _code_line(line: str, n: int) -> Iterator[Snippet]:
    """A line of code: the command part, then the spans and prose of its comment."""
    code, hashed, comment = _split_comment(line)
    yield Snippet(n, code, "code")
    if hashed:
        yield from _comment(comment, n)


def _split_comment(line: str) -> tuple[str, bool, str]:
    m = re.search(r"(^|\s)#", line)
    return (line, False, "") if m is None else (line[:m.start()], True, line[m.end():])


def snippets(name: str, text: str) -> Iterator[Snippet]:
    """The code of one document, by its kind (Markdown, plain text, YAML comments)."""
    if name.endswith(".md"):
        in_fence, prose_start = False, 1
        prose: list[str] = []
        for n, line in enumerate(text.splitlines(), 1):
            if _FENCE.match(line):
                if not in_fence:
                    yield from _spans("\n".join(prose), prose_start)
                    prose = []
                in_fence, prose_start = not in_fence, n + 1
                continue
            if in_fence:
                yield from _code_line(line, n)
            else:
                prose.append(line)
        yield from _spans("\n".join(prose), prose_start)
    elif name.endswith((".yaml", ".yml")):
        for n, line in enumerate(text.splitlines(), 1):
            _, hashed, comment = _split_comment(line)
            if hashed:
                yield from _comment(comment, n)
    else:   # plain text (NOTES.txt): template actions out; "Label:   command" lines hold code, the rest is prose
        for n, line in enumerate(text.splitlines(), 1):
            line = re.sub(r"\{\{.*?\}\}", " ", line)
            m = re.match(r"^([^:]*:\s{2,})(.*?)(\s{2,}.*)?$", line)
            if m:
                yield Snippet(n, m.group(2), "code")
                yield Snippet(n, m.group(1) + (m.group(3) or ""), "prose")
            else:
                yield Snippet(n, line, "prose")


# ------------------------------------------------------------------------------------------------ words


_PLACEHOLDER = re.compile(r"[<>*?$]|\.\.\.|…|\{|\}|^[A-Z][A-Z_]*$")
_TRAIL = ".,;:)]}'\"`!"


def words(text: str) -> list[str]:
    return [w.strip("'\"`(").rstrip(_TRAIL) for w in text.split()]


def commands(snippet: str) -> Iterator[list[str]]:
    """The shell commands in ``snippet``, each as its words from the command word on (environment assignments and
    wrappers such as ``sudo`` dropped)."""
    text = re.sub(r"^\s*\$\s+", "", snippet)
    for seg in re.split(r"&&|\|\||[;|()`]|\$\(", text):
        ws = [w for w in seg.replace('"', " ").replace("'", " ").split()]
        while ws and (re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", ws[0]) or ws[0] in {"sudo", "env", "time", "exec",
                                                                               "nohup", "command", "eval"}):
            ws = ws[1:]
        if ws:
            yield ws


# ------------------------------------------------------------------------------------------------ make


@functools.cache
def make_targets(makefile: pathlib.Path = ROOT / "Makefile") -> frozenset[str]:
    """Every target the Makefile defines (rules and .PHONY names; pattern and variable targets left out)."""
    out: set[str] = set()
    for line in makefile.read_text().splitlines():
        m = re.match(r"^([^\s:#=][^:=]*?)\s*::?(?!=)(.*)$", line)
        if not m or line.startswith("\t"):
            continue
        names = m.group(1).split()
        if names == [".PHONY"]:
            out.update(m.group(2).split())
        else:
            out.update(n for n in names if "$" not in n and "%" not in n and not n.startswith("."))
    return frozenset(out)


def make_refs(cmd: Sequence[str]) -> list[str]:
    """Targets named by one ``make ...`` command (options, their arguments and ``VAR=value`` skipped)."""
    if not cmd or cmd[0] != "make":
        return []
    out, skip = [], False
    for w in cmd[1:]:
        w = w.rstrip(_TRAIL)
        if skip:
            skip = False
        elif w.startswith("#") or w.startswith(">") or w.startswith("2>"):
            break
        elif w in {"-C", "-f", "-j"}:
            skip = True
        elif w.startswith("-") or "=" in w or not w or _PLACEHOLDER.search(w):
            continue
        elif re.fullmatch(r"[A-Za-z0-9][\w.-]*", w):
            out.append(w)
        else:
            break
    return out


# ------------------------------------------------------------------------------------------------ kubeforge CLI


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


@contextlib.contextmanager
def _capturing_parsers() -> Iterator[None]:
    """Make ``ArgumentParser.parse_args`` raise the parser instead of parsing."""
    original = argparse.ArgumentParser.parse_args

    def capture(self: argparse.ArgumentParser, *a: Any, **k: Any) -> Any:
        raise _Captured(self)

    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]


def parser_of(target: str) -> argparse.ArgumentParser:
    """The parser that ``module:function`` builds when called with no arguments."""
    module, _, func = target.partition(":")
    fn = getattr(importlib.import_module(module), func)
    with _capturing_parsers():
        try:
            fn([])
        except _Captured as c:
            return c.parser
    raise AssertionError(f"{target} built no argparse parser")


#: Subcommands whose arguments ``kubeforge.cli`` passes through unparsed, and the function that parses them (the
#: same function the dispatched entrypoint calls; checked below against the CLI's own parser and source).
PASSTHROUGH = {"operator": "kubeforge.operator.main:parse_args", "crd": "kubeforge.api.crd:main"}


@functools.cache
def cli_parsers() -> dict[str, argparse.ArgumentParser]:
    """Subcommand -> the parser of its arguments, from ``kubeforge.cli``'s own parser."""
    from kubeforge import cli

    sub = next(a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction))
    out: dict[str, argparse.ArgumentParser] = {}
    for name, p in sub.choices.items():
        out[name] = parser_of(PASSTHROUGH[name]) if name in PASSTHROUGH else p
    return out


def cli_problems(cmd: Sequence[str]) -> tuple[int, list[str]]:
    """(tokens checked, problems) of one command whose first word is the ``kubeforge`` command."""
    if not cmd:
        return 0, []
    head = cmd[0].rsplit("/", 1)[-1]
    if head in {"python", "python3", "python3.11"} and cmd[1:3] == ["-m", "kubeforge.cli"]:
        cmd = ["kubeforge", *cmd[3:]]
    elif head in {"python", "python3", "python3.11"} and cmd[1:3] == ["-m", "kubeforge.operator"]:
        cmd = ["kubeforge", "operator", *cmd[3:]]
    elif head != "kubeforge":
        return 0, []
    args = [w.rstrip(_TRAIL) for w in cmd[1:]]
    args = args[:next((i for i, w in enumerate(args) if w.startswith("#")), len(args))]
    if not args or _PLACEHOLDER.search(args[0]) or not re.fullmatch(r"[a-z][a-z-]*", args[0]):
        return 0, []
    parsers = cli_parsers()
    sub = args[0]
    if sub not in parsers:
        return 1, [f"`kubeforge {sub}`: no such subcommand (kubeforge.cli has {', '.join(sorted(parsers))})"]
    known = parsers[sub]._option_string_actions
    checked, out = 1, []
    for w in args[1:]:
        if not w.startswith("-") or w == "-" or w == "--" or _PLACEHOLDER.search(w.split("=")[0]):
            continue
        flag = w.split("=", 1)[0]
        checked += 1
        if flag not in known:
            out.append(f"`kubeforge {sub} {flag}`: no such flag of `kubeforge {sub}`")
    return checked, out


# ------------------------------------------------------------------------------------------------ Helm values


@functools.cache
def helm_values(path: pathlib.Path = ROOT / "helm/kubeforge/values.yaml") -> dict[str, Any]:
    return yaml.safe_load(path.read_text()) or {}


def value_key_problem(key: str, values: dict[str, Any] | None = None) -> str | None:
    """None when ``key`` (dotted, ``[n]`` indexes allowed) names a value of the chart, else why not."""
    node: Any = helm_values() if values is None else values
    parts = re.sub(r"\[\d*\]", "", key).split(".")
    for i, part in enumerate(parts):
        if isinstance(node, dict) and not node and i > 0:
            return None                                   # an empty map: any key
        if isinstance(node, list):
            node = node[0] if node else {}
            if not node:
                return None
        if not isinstance(node, dict) or part not in node:
            return f"`{key}`: no value `{'.'.join(parts[:i + 1])}` in helm/kubeforge/values.yaml"
        node = node[part]
    return None


def set_keys(snippet: str) -> list[str]:
    """Keys of every ``--set``/``--set-string``/``--set-json`` in ``snippet`` (several per flag, comma-separated)."""
    out = []
    for m in re.finditer(r"--set(?:-string|-json|-file)?(?:=|\s+)['\"]?(\S+)", snippet):
        for assignment in re.split(r",(?![^{]*\})", m.group(1).strip("'\"")):
            key = assignment.split("=", 1)[0]
            if key and not _PLACEHOLDER.search(key):
                out.append(key)
    return out


def value_assignments(span: str) -> list[str]:
    """A span that is only ``key=value`` (or ``--set`` is elsewhere) whose key starts with a top-level value."""
    m = re.fullmatch(r"([A-Za-z][\w]*(?:\.[\w\[\]]+)+)=\S*", span.strip())
    if m and m.group(1).split(".")[0] in helm_values():
        return [m.group(1)]
    return []


# ------------------------------------------------------------------------------------------------ paths


@functools.cache
def top_level(root: pathlib.Path = ROOT) -> tuple[frozenset[str], frozenset[str]]:
    """(top-level folders, top-level files) the repository tracks."""
    try:
        files = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout
        names = [f for f in files.splitlines() if f]
    except (OSError, subprocess.CalledProcessError):
        names = [p.name + ("/x" if p.is_dir() else "") for p in root.iterdir() if not p.name.startswith(".")]
    dirs = {n.split("/", 1)[0] for n in names if "/" in n}
    return frozenset(d for d in dirs if not d.startswith(".")), frozenset(n for n in names if "/" not in n)


def path_candidates(text: str) -> list[str]:
    """Words of ``text`` that name a repository path: a top-level folder and more, or a top-level file."""
    dirs, files = top_level()
    out = []
    for w in words(text):
        w = re.sub(r"^(?:-[-\w]*=|[\w-]+=)", "", w)          # --manifest=examples/x.yaml, MANIFEST=examples/x
        w = re.sub(r"#.*$", "", w)
        base = w.split("::")[0].split(":")[0]
        if not base or _PLACEHOLDER.search(w) or "//" in w or base.startswith(("/", "~", ".")):
            continue
        if base in files or (base.split("/")[0] in dirs and "/" in base):
            out.append(w)
    return out


#: The source folders each hold one package of their name, which docs name by the folder alone
#: (``operator/observed.py`` for ``operator/kubeforge/operator/observed.py``).
PACKAGE_FOLDERS = ("api", "operator", "runtime")


def resolve(base: str, root: pathlib.Path = ROOT) -> tuple[pathlib.Path, str] | None:
    """The file or folder ``base`` names, and the symbol it names inside (``module.attr`` form), or None."""
    top, _, rest = base.partition("/")
    stems = [base] + ([f"{top}/kubeforge/{top}/{rest}"] if top in PACKAGE_FOLDERS and rest else [])
    for stem in stems:
        for cand, symbol in ((stem, ""), (stem + ".py", ""), *(((stem.rsplit(".", 1)[0] + ".py",
                                                                  stem.rsplit(".", 1)[1]),) if "." in stem else ())):
            if (root / cand).exists():
                return root / cand, symbol
    return None


def path_problem(word: str, root: pathlib.Path = ROOT) -> str | None:
    base, _, symbol = word.partition("::")
    if not symbol and re.fullmatch(r"[^:]+:[A-Za-z_]\w*", base):
        base, _, symbol = base.partition(":")
    found = resolve(base.rstrip("/"), root) if base.rstrip("/") else None
    if found is None:
        return f"`{word}`: no such file or folder in the repository"
    path, attr = found
    for name in (symbol.split("::")[-1].split("[")[0], attr.split(".")[0]):
        if name and path.suffix == ".py" and not re.search(
                rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(name)}\b|^{re.escape(name)}\s*[:=]",
                path.read_text(), re.M):
            return f"`{word}`: `{name}` is not defined in {path.relative_to(root)}"
    return None


# ------------------------------------------------------------------------------------------------ RLJob fields


_FIELD = re.compile(r"(?<![\w./-])\.?(?:rljob\.)?((?:spec|status)(?:\.(?:\{[\w,]+\}|[\w*<>\-]+)(?:\[\d*\])?)+)")


def field_paths(span: str) -> list[str]:
    """RLJob field paths in a span (``a.{b,c}`` expanded); ``status.x`` where ``x`` is a Python name (snake_case
    or UPPER_CASE: the operator's ``status`` module) is left out."""
    out = []
    for m in _FIELD.finditer(span):
        path = m.group(1).rstrip(".")
        while path.endswith(">") and path.count(">") > path.count("<"):
            path = path[:-1]                                # `<spec.checkpoint.path>/...`: the placeholder's end
        if re.match(r"status\.(?:[a-z]+_\w*|[A-Z_]+)\b", path) or path.endswith((".py", ".md", ".yaml")):
            continue
        todo = [path]
        while todo:
            p = todo.pop()
            b = re.search(r"\{([\w,]+)\}", p)
            if b:
                todo += [p[:b.start()] + alt + p[b.end():] for alt in b.group(1).split(",")]
            else:
                out.append(p)
    return out


def _unwrap(tp: Any) -> list[Any]:
    """The concrete types behind an annotation (Optional, unions, Annotated)."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return [t for a in typing.get_args(tp) for t in _unwrap(a) if t is not type(None)]
    return [tp]


def _model_field(model: type[pydantic.BaseModel], name: str) -> Any:
    for fname, info in model.model_fields.items():
        if name in (info.alias, fname) or (info.alias is None and name == fname):
            return info.annotation
    return None


def field_problem(path: str, root_model: type[pydantic.BaseModel] | None = None) -> str | None:
    """None when ``path`` (``spec.algorithm.topP``, ``status.roles.<role>.ready``, ``spec.verifiers[].name``) is a
    field of the RLJob model, or of the GeneratorPool model (``spec.maxAdapters``); else why not."""
    if root_model is None:
        from kubeforge.api import generatorpool, rljob
        why = field_problem(path, rljob.RLJob)
        if why is None or field_problem(path, generatorpool.GeneratorPool) is None:
            return None
        return why.replace("in the RLJob model (kubeforge.api.rljob)", "in the RLJob model (kubeforge.api.rljob) "
                           "nor in the GeneratorPool model (kubeforge.api.generatorpool)")
    parts = [p for p in re.sub(r"\[\d*\]", "", path).split(".") if p]
    current: list[Any] = [root_model]
    for i, part in enumerate(parts):
        wild = bool(re.fullmatch(r"\*|<[\w-]+>", part))
        nxt: list[Any] = []
        for tp in current:
            origin = typing.get_origin(tp)
            if origin in (list, tuple, Sequence):
                nxt += [a for arg in typing.get_args(tp)[:1] for a in _unwrap(arg)]
                tp = nxt.pop() if nxt else Any
                origin = typing.get_origin(tp)
            if tp is Any or (origin is dict and typing.get_args(tp)[1:] in ((Any,), ())):
                return None                                 # free form: any key below
            if origin is dict:
                values = _unwrap(typing.get_args(tp)[1])
                if not any(typing.get_origin(v) in (dict, list) or (isinstance(v, type) and issubclass(
                        v, pydantic.BaseModel)) for v in values):
                    return None                             # a map of scalars: its keys may hold dots
                nxt += values
            elif isinstance(tp, type) and issubclass(tp, pydantic.BaseModel):
                if wild:
                    nxt += [t for f in tp.model_fields.values() for t in _unwrap(f.annotation)]
                    continue
                ann = _model_field(tp, part)
                if ann is not None:
                    nxt += _unwrap(ann)
                elif tp.model_config.get("extra") == "allow":
                    return None
        if not nxt:
            return f"`{path}`: no field `{'.'.join(parts[:i + 1])}` in the RLJob model (kubeforge.api.rljob)"
        if any(t is Any for t in nxt):
            return None
        current = nxt
    return None


# ------------------------------------------------------------------------------------------------ the scan


@dataclasses.dataclass(frozen=True)
class Problem:
    doc: str
    line: int
    kind: str
    message: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.kind} {self.message}"


def check_text(name: str, text: str) -> tuple[list[Problem], Counter[str]]:
    """Every problem of one document (``name`` as shown in messages; its suffix picks the format) and how many
    tokens of each kind were checked."""
    problems: list[Problem] = []
    counts: Counter[str] = Counter()

    def check(kind: str, line: int, items: Sequence[str], judge: Callable[[str], str | None]) -> None:
        for item in items:
            counts[kind] += 1
            why = judge(item)
            if why:
                problems.append(Problem(name, line, kind, why))

    targets = make_targets()
    for s in snippets(name, text):
        if s.kind == "prose":
            check("path", s.line, path_candidates(s.text), path_problem)
            continue
        for cmd in commands(s.text):
            if cmd[0] in ("helm", "--set", "--set-string", "--set-json"):
                check("set", s.line, set_keys(" ".join(cmd)), value_key_problem)
            check("make", s.line, make_refs(cmd),
                  lambda t: None if t in targets else f"`make {t}`: no such target in the Makefile")
            n, why = cli_problems(cmd)
            counts["cli"] += n
            problems += [Problem(name, s.line, "cli", w) for w in why]
        span = s.kind == "span"
        if span:
            check("set", s.line, value_assignments(s.text), value_key_problem)
        check("path", s.line, path_candidates(s.text), path_problem)
        if span:
            check("field", s.line, field_paths(s.text), field_problem)
    return problems, counts


def scan(paths: Sequence[pathlib.Path] | None = None) -> tuple[list[Problem], Counter[str]]:
    problems: list[Problem] = []
    counts: Counter[str] = Counter()
    for p in doc_paths() if paths is None else paths:
        found, n = check_text(str(p.relative_to(ROOT)), p.read_text())
        problems += found
        counts += n
    return problems, counts


# ------------------------------------------------------------------------------------------------ tests


def test_a_placeholder_around_a_field_is_read_as_the_field() -> None:
    assert field_paths("`<spec.checkpoint.path>/export-step-<step>/`") == ["spec.checkpoint.path"]
    assert field_paths("`status.roles.<role>.ready`") == ["status.roles.<role>.ready"]


def test_docs_name_only_what_exists() -> None:
    problems, counts = scan()
    assert not problems, "docs name what does not exist:\n" + "\n".join(map(str, problems))
    for kind in KINDS:
        assert counts[kind] > 0, f"no {kind} token found in the docs: the scan itself is broken"


def test_every_doc_page_is_scanned() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in doc_paths()}
    assert {"README.md", "docs/api.md", "helm/kubeforge/templates/NOTES.txt"} <= names
    assert {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")} <= names


def test_passthrough_subcommands_match_the_cli() -> None:
    """PASSTHROUGH names exactly the subcommands the CLI does not parse, and the function each dispatches to
    reaches the parser used here."""
    from kubeforge import cli

    sub = next(a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction))
    unparsed = {n for n, p in sub.choices.items() if not p.add_help}
    assert unparsed == set(PASSTHROUGH)
    source = pathlib.Path(cli.__file__).read_text()
    dispatched = dict(re.findall(r'args_in\[0\] == "(\w+)":\s*raise SystemExit\(_dispatch\("([\w.:]+)"', source))
    assert set(dispatched) == set(PASSTHROUGH)
    for name, target in PASSTHROUGH.items():
        module = target.partition(":")[0]
        chain = {dispatched[name].partition(":")[0]}
        tree = ast.parse(pathlib.Path(importlib.import_module(dispatched[name].partition(":")[0]).__file__ or "")
                         .read_text())
        chain |= {f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
                  for a in n.names}
        assert module in chain, f"`kubeforge {name}` dispatches to {dispatched[name]}, not through {module}"


@pytest.mark.parametrize(("text", "kind", "token"), [
    ("Run `kubeforge run --no-such-flag x.yaml` first.\n", "cli", "--no-such-flag"),
    ("```bash\n.venv/bin/kubeforge operator --all-namespaces --no-such-flag\n```\n", "cli", "--no-such-flag"),
    ("Then `kubeforge frobnicate x.yaml`.\n", "cli", "frobnicate"),
    ("`python -m kubeforge.operator --leader-elect --no-such-flag`\n", "cli", "--no-such-flag"),
    ("```bash\nmake demo\nmake no-such-target REGISTRY=x\n```\n", "make", "no-such-target"),
    ("helm install k helm/kubeforge\n`--set image.no_such_key=1`\n", "set", "image.no_such_key"),
    ("Turn on `metrics.noSuchMonitor.enabled=true`.\n", "set", "metrics.noSuchMonitor"),
    ("See `docs/no-such-page.md`.\n", "path", "docs/no-such-page.md"),
    ("`e2e/test_helm.py::test_no_such_test`\n", "path", "test_no_such_test"),
    ("Set `spec.algorithm.noSuchField`.\n", "field", "spec.algorithm.noSuchField"),
    ("`status.roles.<role>.{ready,noSuch}`\n", "field", "noSuch"),
    ("the status's `status.token`\n", "field", "status.token"),
])
def test_an_invented_token_fails(text: str, kind: str, token: str) -> None:
    problems, _ = check_text("docs/probe.md", "intro\n\n" + text)
    assert problems, f"an invented {kind} passed: {text!r}"
    p = problems[0]
    assert (p.doc, p.kind) == ("docs/probe.md", kind) and token in p.message and p.line >= 3, str(p)
    assert str(p).startswith(f"docs/probe.md:{p.line}: {kind} ")


@pytest.mark.parametrize("text", [
    "`kubeforge run examples/tiny.yaml --run-dir runs/x --steps 3`",
    "```bash\neval \"$(make -s cluster-up)\"\nmake images REGISTRY=registry.example/x  # push\n"
    "make venv EXTRA=gpu\n```",
    "`kubeforge operator -n team-a --leader-elect --webhook-port=9443`, `kubeforge crd --table`",
    "`python -m kubeforge.cli validate -`",
    "`helm install kubeforge helm/kubeforge --set 'watchNamespaces={a,b}' --set podAnnotations.x=y`",
    "`--set metrics.serviceMonitor.enabled=true`, `resources.limits.memory=1Gi`",
    "`examples/tiny.yaml`, `e2e/test_helm.py::test_cluster_wide_rbac_can_i`, `kubeforge.api.crd:main`",
    "`spec.roles.generator.resources.limits`, `status.roles.*.ready`, `.status.progress.step`, "
    "`spec.verifiers[].regex.pattern`, `kubectl explain rljob.spec.algorithm`, `metadata.name`, "
    "`status.PLACEMENT_REASONS`, `spec.roles.trainer.env[].name`, `operator/status.py:substance`",
    "`spec.roles.trainer.resources.limits.nvidia.com/gpu`, `spec.task.jsonl.path`, `spec.model.path`",
    "`/checkpoints`, `~/.cache/kubeforge/`, `https://example.com/docs/x.md`, `docs/*.md`, `runs/<name>/`",
])
def test_what_exists_passes(text: str) -> None:
    problems, _ = check_text("docs/probe.md", text + "\n")
    assert not problems, "\n".join(map(str, problems))


def test_a_wrapped_span_is_one_token_at_its_first_line() -> None:
    problems, _ = check_text("docs/probe.md", "a\nb `--set\nmetrics.noSuch=true` c\n")
    assert [(p.line, p.kind) for p in problems] == [(2, "set")]


def test_makefile_parse_finds_targets_not_variables() -> None:
    targets = make_targets()
    assert {"demo", "test", "venv", "crd", "images"} <= targets
    assert not {"SHELL", "PY", "VENV", "STAMP", ".PHONY"} & targets


if __name__ == "__main__":
    found, checked = scan()
    print("\n".join(map(str, found)) or "no problems")
    print(dict(sorted(checked.items())))
