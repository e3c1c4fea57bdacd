"""The local launcher refuses every manifest of the shared table, naming the field (the API server side of the
same table is e2e/test_crd_validation.py)."""
from __future__ import annotations

import pytest

import invalid_manifests
from kubeforge.api import load


def test_the_base_manifest_is_valid() -> None:
    load.parse(invalid_manifests.valid())


def test_the_table_is_large_and_ids_unique() -> None:
    ids = [c.id for c in invalid_manifests.CASES]
    assert len(ids) >= 30
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("case", invalid_manifests.CASES, ids=lambda c: c.id)
def test_launcher_refuses_naming_the_field(case: invalid_manifests.Case) -> None:
    with pytest.raises(load.InvalidRLJob) as info:
        load.parse(case.manifest())
    problems = info.value.problems
    assert problems, "an InvalidRLJob must carry at least one problem"
    # every problem names the case's field (the case breaks one rule only) ...
    assert all(p.startswith(case.path) for p in problems), problems
    # ... and one says what the API server says
    assert any(case.message.lower() in p.lower() for p in problems), problems
