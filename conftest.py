"""Root conftest: the default time bound of every test.

The test-cluster package ``kfcluster`` (in e2e/) is importable from every test tree through pytest's ``pythonpath``
(pyproject.toml). Shared cluster fixtures live in e2e/conftest.py; tests outside e2e/ that need the cluster can use
them via ``from kfcluster.fixtures import kube_cluster, namespace, api_client``.
"""

# No test waits without bound: every test that does not set its own ``pytest.mark.timeout`` gets this one (setup,
# call and teardown together; pytest-timeout). The longest items of `make test` take ~3.5 min (a cluster fixture's
# setup); a cold machine builds the images inside one, so the bound is generous. A hang then fails its test with a
# stack dump instead of holding CI until its own limit (a fuzzing send once blocked forever after the run it
# targeted had finished).
DEFAULT_TIMEOUT_S = 2700


def pytest_collection_modifyitems(items: list) -> None:  # type: ignore[type-arg]
    import pytest

    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_TIMEOUT_S))
