"""Real server binaries run by tests (Prometheus, VictoriaMetrics, vmalert), and the comparison of
reports read back from them."""

from __future__ import annotations

import subprocess
import urllib.request
from pathlib import Path

import numpy as np
import pytest

# Report summary figures that are shares or per-unit prices: equal within 1% whichever way the
# samples were read (rollups or raw).
COMPARED_FIGURES = ("idle_share", "efficiency_score", "unattributed_share", "utilisation", "allocation_ratio",
                    "idle_cost_share", "cost_per_gpu_hour")


class ServerProcess:
    """A server process with its log; ``ready()`` polls its readiness URL, ``stop()`` always ends it."""

    def __init__(self, argv: list[str], log: Path, ready_url: str) -> None:
        self.log, self.ready_url = log, ready_url
        self.process = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT)

    def ready(self) -> bool:
        if self.process.poll() is not None:
            pytest.fail(f"{self.log.name}: exited with {self.process.returncode}: {self.log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(self.ready_url, timeout=1) as response:
                return response.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def assert_reports_agree(from_rollup, from_raw) -> None:
    """The four reports built from the two ledgers give the same figures within 1%."""
    from gpuwarden.analytics import build_report

    for kind in ("idle", "efficiency", "cost", "chargeback"):
        a, b = build_report(kind, from_rollup).summary, build_report(kind, from_raw).summary
        for key in COMPARED_FIGURES:
            if key in a and a[key] is not None and np.isfinite(a[key]):
                assert a[key] == pytest.approx(b[key], rel=0.01, abs=1e-3), (kind, key)
        if kind == "idle":
            for reason, hours in b["idle_gpu_hours_by_reason"].items():
                assert a["idle_gpu_hours_by_reason"][reason] / a["gpu_hours"] == pytest.approx(
                    hours / b["gpu_hours"], abs=0.01), reason
