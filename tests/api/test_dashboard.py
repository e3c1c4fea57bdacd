"""The Grafana dashboard (helm/kubeforge/dashboards/kubeforge.json) queries only series the code exports.

Names come from the live registries: the runtime's ``Metrics`` (one per role process) and the operator's
``metrics.REGISTRY``; a renamed series fails here instead of leaving an empty panel.
"""
from __future__ import annotations

import json
import pathlib
import re
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "helm" / "kubeforge" / "dashboards" / "kubeforge.json"
SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")


def exported() -> set[str]:
    """Every sample name the runtime and the operator can expose."""
    runtime_metrics = pytest.importorskip("kubeforge.runtime.metrics")
    operator_metrics = pytest.importorskip("kubeforge.operator.metrics")
    names: set[str] = set()
    for registry in (runtime_metrics.Metrics(role="trainer", replica=0).registry, operator_metrics.REGISTRY):
        for family in registry.collect():
            names.add(family.name)
            names.update(f"{family.name}{s}" for s in SUFFIXES)
    return names


def exprs(dashboard: dict[str, Any]) -> list[str]:
    out = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    out += [v["query"]["query"] for v in dashboard["templating"]["list"] if isinstance(v.get("query"), dict)]
    return out


def test_dashboard_is_valid_json_with_unique_panel_ids() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and dashboard["uid"] == "kubeforge"


def test_every_queried_series_is_exported() -> None:
    names = exported()
    dashboard = json.loads(DASHBOARD.read_text())
    queried = {m for e in exprs(dashboard) for m in re.findall(r"\bkubeforge_\w+", e)}
    assert queried, "no kubeforge series queried"
    assert queried <= names, f"series no code exports: {sorted(queried - names)}"


def test_every_exported_family_is_on_the_dashboard() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    text = " ".join(exprs(dashboard))
    families = {n for n in exported() if not n.endswith(SUFFIXES)}
    missing = sorted(f for f in families if not re.search(rf"\b{f}(_bucket|_sum|_count|_total)?\b", text))
    assert not missing, f"exported series without a panel: {missing}"


def test_no_series_label_collides_with_a_prometheus_target_label() -> None:
    """A series label named ``job`` or ``instance`` arrives renamed (``exported_job``) under the chart's PodMonitor,
    and a query grouping by ``job`` groups by the scrape job: the pool rows once did both, and the endpoint rows
    grouped by ``job``."""
    runtime_metrics = pytest.importorskip("kubeforge.runtime.metrics")
    operator_metrics = pytest.importorskip("kubeforge.operator.metrics")
    for registry in (runtime_metrics.Metrics(role="generator", replica=0).registry, operator_metrics.REGISTRY):
        for collector in set(registry._collector_to_names):
            labelnames = set(getattr(collector, "_labelnames", ()))
            assert not labelnames & {"job", "instance"}, (collector, labelnames)
    dashboard = json.loads(DASHBOARD.read_text())
    for e in exprs(dashboard):
        assert not re.search(r"\bexported_\w+|\bby \([^)]*\bjob\b|\bjob=", e), e


def test_legends_name_labels_once() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    legends = [t.get("legendFormat", "") for p in dashboard["panels"] for t in p.get("targets", [])]
    assert not [f for f in legends if "{{{" in f], "a legend with doubled braces renders them literally"
