"""The reference pages generated from the code (docs/refdocs.py, `make refdocs`): docs/troubleshooting.md has an
entry for every reason the operator writes and docs/metrics.md a row for every Prometheus series, both are current,
and no reason hides from the enumeration as a string literal."""
from __future__ import annotations

import ast
import importlib.util
import pathlib
import sys
import types
from typing import Any

import prometheus_client as prom
import pytest

from kubeforge.api import rljob
from kubeforge.operator import metrics as operator_metrics
from kubeforge.operator import observed, reasons, status
from kubeforge.runtime import metrics as runtime_metrics

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("kf_refdocs", ROOT / "docs" / "refdocs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


refdocs: Any = _load()


def test_every_reason_has_its_entry_and_every_entry_a_reason() -> None:
    bad = refdocs.problems()
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("page", ["troubleshooting.md", "metrics.md"])
def test_committed_page_is_the_generated_one(page: str) -> None:
    path = ROOT / "docs" / page
    assert path.read_text() == refdocs.pages()[path], f"docs/{page} is stale: run `make refdocs` (never edit the " \
                                                      "generated part by hand)"
    assert refdocs.main(["--check"]) == 0


def test_a_reason_without_text_fails_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reasons, "NEW_REASON_WITHOUT_TEXT", "NewReasonWithoutText", raising=False)
    bad = refdocs.problems()
    assert any("'NewReasonWithoutText'" in b and "reasons.NEW_REASON_WITHOUT_TEXT" in b and "REFERENCE" in b
               for b in bad), bad
    with pytest.raises(SystemExit, match="NewReasonWithoutText"):
        refdocs.pages()


def test_an_entry_without_a_reason_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    extra = dict(reasons.REFERENCE, NoSuchReason=reasons.Entry(event="Normal", meaning="m", check="c"))
    monkeypatch.setattr(reasons, "REFERENCE", extra)
    assert any("'NoSuchReason'" in b for b in refdocs.problems())


def test_each_reason_has_one_section_and_index_row() -> None:
    text = (ROOT / "docs" / "troubleshooting.md").read_text()
    for value in refdocs.reason_sources():
        assert text.count(f"\n### {value}\n") == 1, value
        assert f"| [`{value}`](#{value.lower()}) |" in text, value


def test_event_types_are_the_ones_posted() -> None:
    """The entries' event types against the tables ``status.transitions`` posts from."""
    for phase in rljob.Phase:
        kind, reason = status._PHASE_EVENT[phase.value]
        assert reasons.REFERENCE[reason].event == kind, reason
    for reason, kind in status._QUEUE_EVENT.items():
        assert reasons.REFERENCE[reason].event == kind, reason
    for reason in observed.STUCK_REASONS:
        assert reasons.REFERENCE[reason].event == "Warning"
        assert f"{reasons.READY}=False" in reasons.REFERENCE[reason].conditions


def _literal_reasons(tree: ast.AST) -> list[tuple[int, str, str]]:
    """``reason="..."`` keyword arguments: (line, the callee, the string)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            callee = ast.unparse(node.func)
            for kw in node.keywords:
                if kw.arg == "reason" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    out.append((node.lineno, callee, kw.value.value))
    return out


def test_no_condition_or_event_reason_is_a_literal() -> None:
    """Condition and event reasons are constants of ``reasons`` (so the enumeration sees them); the only literal
    ``reason=`` allowed is a failure reason on an ``observed.Failure`` (``rljob.FailureReason``, enumerated)."""
    failure_reasons = {r.value for r in rljob.FailureReason}
    bad = []
    for path in sorted((ROOT / "operator" / "kubeforge" / "operator").rglob("*.py")):
        for line, callee, value in _literal_reasons(ast.parse(path.read_text())):
            if not (callee.split(".")[-1] == "Failure" and value in failure_reasons):
                bad.append(f"{path.relative_to(ROOT)}:{line}: {callee}(reason={value!r})")
    assert not bad, "reasons written as literals (make them constants in reasons.py):\n" + "\n".join(bad)


def _collectors(objects: Any) -> list[Any]:
    found = []
    for value in objects:
        metric = getattr(value, "_metric", value)         # runtime_metrics.Family wraps one
        if isinstance(metric, prom.metrics.MetricWrapperBase):
            found.append(metric)
    return found


def test_every_series_is_on_its_registry_and_the_page() -> None:
    """A collector made outside the registries the page reads (the global default one) would be served nowhere
    and listed nowhere: every collector bound in either metrics module is on its registry, and on the page."""
    page = (ROOT / "docs" / "metrics.md").read_text()
    proc = runtime_metrics.Metrics(role="generator", replica=1)
    cases = [(operator_metrics.REGISTRY, _collectors(vars(operator_metrics).values())),
             (proc.registry, _collectors(vars(proc).values()))]
    for registry, collectors in cases:
        names = {s.name.removesuffix("_total") for s in refdocs.series(registry)}
        assert collectors
        for c in collectors:
            assert c._name in names, c._name
            assert f"| `{c._name}{'_total' if c._type == 'counter' else ''}` |" in page, c._name
    assert len(page.split("\n| `kubeforge_")) - 1 == len(refdocs.operator_series()) + len(refdocs.runtime_series())
