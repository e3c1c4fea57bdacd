"""pytest imports test modules by basename (no __init__.py packages, prepend import mode): two test files with the
same name in different folders make `make test` stop at collection ("import file mismatch"). This happened when
tests/operator/test_admission.py and e2e/test_admission.py landed the same day; the unit tier alone never sees it.
"""

from __future__ import annotations

import collections
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_basename() -> None:
    names: dict[str, list[str]] = collections.defaultdict(list)
    for tree in ("tests", "e2e"):
        for path in (ROOT / tree).rglob("test_*.py"):
            names[path.name].append(str(path.relative_to(ROOT)))
    clashes = {name: paths for name, paths in names.items() if len(paths) > 1}
    assert not clashes, f"test modules with the same basename: {clashes}"


def test_every_test_has_a_bound(request: pytest.FixtureRequest) -> None:
    """The root conftest gives every test without its own ``pytest.mark.timeout`` the default bound."""
    import importlib.util

    # by its path: under `make test` the name ``conftest`` is another folder's conftest module
    spec = importlib.util.spec_from_file_location("kf_root_conftest", ROOT / "conftest.py")
    assert spec is not None and spec.loader is not None
    root = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(root)
    marker = request.node.get_closest_marker("timeout")
    assert marker is not None and marker.args == (root.DEFAULT_TIMEOUT_S,) and root.DEFAULT_TIMEOUT_S > 0
