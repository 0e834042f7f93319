"""Real server binaries run by tests (Prometheus, VictoriaMetrics, vmalert), and the comparison of
reports read back from them."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from polling import wait_for as _wait_for

from gpuwarden.analytics import IdleParams

# Report summary figures that are shares or per-unit prices: equal within 1% whichever way the
# samples were read (rollups or raw).
COMPARED_FIGURES = ("idle_share", "efficiency_score", "unattributed_share", "utilisation", "allocation_ratio",
                    "idle_cost_share", "cost_per_gpu_hour")


def binary(name: str, package: str) -> str:
    """The path of a server binary from Debian ``package``: skip without it, fail on CI."""
    path = shutil.which(name)
    if path is None:
        reason = f"{name} not installed (Debian package {package!r}; .ci/run installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}; CI=true, so this is a failure, not a skip", pytrace=False)
        pytest.skip(reason)
    return path


# Scrape-time relabelling that gives each series a ``project`` label from its pod's name (as a
# cluster would from the pod's labels): the project then reaches the rollups without the pod.
ROOT = Path(__file__).resolve().parents[1]
PROJECT_FROM_POD = [{"source_labels": ["pod"], "regex": "([a-z]+)-[0-9]+", "target_label": "project",
                     "replacement": "$1"}]


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


def rollup_window(times: list[list[float]], rollup_seconds: float, lag_seconds: float) -> tuple[pd.Timestamp, pd.Timestamp]:
    """The (start, end] that the rollups recorded at ``times`` (per series) cover: each covers the
    ``rollup_seconds`` ending ``lag_seconds`` before it was recorded (the rules' offset)."""
    first = min(min(t) for t in times) - rollup_seconds - lag_seconds
    last = max(max(t) for t in times) - lag_seconds
    one_ms = pd.Timedelta(milliseconds=1)
    return pd.Timestamp(first, unit="s", tz="UTC") + one_ms, pd.Timestamp(last, unit="s", tz="UTC") + one_ms


def assert_reports_agree(from_rollup, from_raw) -> None:
    """The four reports built from the two ledgers give the same figures within 1%, and charge each
    team and each (team, project) the same share of the cost within 1 point."""
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
    for table, keys in (("by_team", ["team"]), ("by_team_project", ["team", "project"])):
        shares = {}
        for name, ledger in (("rollup", from_rollup), ("raw", from_raw)):
            frame = build_report("chargeback", ledger).tables[table]
            cost = frame.assign(**{k: frame[k].astype(object).fillna("-") for k in keys}).groupby(keys)["cost"].sum()
            shares[name] = cost / cost.sum()
        assert set(shares["rollup"].index) == set(shares["raw"].index), table
        gap = (shares["rollup"] - shares["raw"].reindex(shares["rollup"].index)).abs().max()
        assert gap < 0.01, (table, gap)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(condition, timeout: float, what: str, interval: float = 0.2):
    """Servers answer errors while starting: keep polling through them."""
    return _wait_for(condition, timeout, what, interval, tolerate_errors=True)


class PrometheusServer(ServerProcess):
    """A real Prometheus on 127.0.0.1 with a temp config and TSDB; ``stop()`` always kills it."""

    def __init__(self, tmp: Path, targets: list[str], rule_files: list[Path], scrape_interval: str = "1s") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [{
                "job_name": "gpuwarden",
                "scrape_interval": scrape_interval,
                "static_configs": [{"targets": targets, "labels": {"cluster": "sim"}}],
                "metric_relabel_configs": PROJECT_FROM_POD,
            }],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        super().__init__(
            [binary("prometheus", "prometheus"), f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            tmp / "prometheus.log", f"{self.url}/-/ready")


FAST_PARAMS = IdleParams(hoard_grace="0s")


def fast_rules(tmp: Path) -> list[Path]:
    """The shipped rules at 1 s evaluations (the recording rules generated for a 1 s interval and
    5 s rollups, so that their seconds stay seconds), so rule series appear within seconds."""
    from gpuwarden.analytics.promrules import render_recording_rules

    out = []
    for path in sorted((ROOT / "rules").glob("*.rules.yml")):
        target = tmp / path.name
        if "recording" in path.name:
            # No hoarding grace: the 1 s state rule looks back one evaluation, and a static fleet
            # is in the same state from its first sample (no warm-up to tell rollups from raw).
            target.write_text(render_recording_rules(FAST_PARAMS, interval_seconds=1, rollup_seconds=5))
        else:
            rules = yaml.safe_load(path.read_text())
            for group in rules["groups"]:
                group["interval"] = "1s"
            target.write_text(yaml.safe_dump(rules))
        out.append(target)
    return out
