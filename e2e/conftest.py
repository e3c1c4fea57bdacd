"""Fixtures for tests against the real test control plane (see kfcluster.fixtures)."""

pytest_plugins = ["kfcluster.fixtures"]
