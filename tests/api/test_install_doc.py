"""docs/install.md stays usable: the RLJob it applies is valid, and every `--set` it passes names a chart value.

The user path it describes (chart + images + kubeconfig) is what e2e/test_helm_install.py runs on the real node;
this guards the page itself against drift when the API or the chart's values change.
"""
from __future__ import annotations

import pathlib
import re
from typing import Any

import yaml

from kubeforge.api import load

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "install.md").read_text()
VALUES = yaml.safe_load((ROOT / "helm" / "kubeforge" / "values.yaml").read_text())


def test_the_documented_rljob_is_valid() -> None:
    m = re.search(r"^kubectl apply -n (\S+) -f (examples/\S+\.yaml)$", DOC, re.M)
    assert m, "no `kubectl apply -n NS -f examples/...` of the first job in docs/install.md"
    doc = yaml.safe_load((ROOT / m.group(2)).read_text())
    doc["metadata"]["namespace"] = m.group(1)
    job = load.parse(doc)
    # the page waits for that job by name (a wait, not `get -w`: e2e/test_docs_install.py runs the block verbatim)
    assert job.metadata.name == "tiny" and f"kubectl -n {m.group(1)} wait rljob/tiny" in DOC
    assert job.spec.gang.backend == "None"        # runs on a plain cluster: no gang scheduler to install first


def test_every_documented_set_names_a_chart_value() -> None:
    keys = re.findall(r"--set(?:-string)? '?([A-Za-z][\w.]*)=", DOC)
    assert {"image.repository", "runtimeImage", "replicas", "watchNamespaces"} <= set(keys), keys
    for key in keys:
        node: Any = VALUES
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"--set {key}: not in helm/kubeforge/values.yaml"
            node = node[part]
