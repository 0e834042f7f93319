"""Fixtures of the Kubernetes adapter's tests."""

from __future__ import annotations

import pytest
from fake_kube_api import DEFAULT_RESOURCES, FakeKubeAPI


@pytest.fixture
def dra_api():
    """A fake API server serving the default kinds and DRA (resource.k8s.io/v1), as a 1.34+ cluster does;
    fresh per test."""
    running = FakeKubeAPI().start()
    running.resources = set(DEFAULT_RESOURCES)
    yield running.with_dra()
    running.stop()
