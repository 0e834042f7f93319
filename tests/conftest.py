"""Shared test fixtures.

``data_dir``: the real trace folder (``../shared/data`` from the repository root, or
``$GPUWARDEN_DATA``). Tests that need it skip with a clear reason when it is absent, except on CI
(``CI=true``), where a missing folder is a failure: CI must never go green by skipping.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from builders import FakeBackend
from gpuwarden.exporter import ExporterService

ROOT = Path(__file__).resolve().parents[1]


def _trace_dir() -> Path:
    env = os.environ.get("GPUWARDEN_DATA")
    return Path(env) if env else ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real trace data folder; skip (or fail on CI) when it is missing."""
    path = _trace_dir()
    if not (path / "h200" / "phase_trace.csv").is_file():
        reason = f"real trace data not found at {path} (expected ../shared/data from the repo root, or set GPUWARDEN_DATA)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}; CI=true, so this is a failure, not a skip", pytrace=False)
        pytest.skip(reason)
    return path


# The exporter on a fake GPU backend, stopped after the test: the exporter's tests and the CLI's
# bad-input probes start one.
@pytest.fixture
def started():
    services: list[ExporterService] = []

    def start(backend: FakeBackend, **kwargs) -> ExporterService:
        kwargs.setdefault("interval_seconds", 60.0)
        service = ExporterService(backend, port=0, node_name="node-a", **kwargs)
        services.append(service.start())
        return service

    yield start
    for service in services:
        service.stop()
