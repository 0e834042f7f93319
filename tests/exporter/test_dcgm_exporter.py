"""gpuwarden over what a DEFAULT dcgm-exporter serves, end to end through a real Prometheus.

A fault scenario written as dcgm-exporter would serve it (``tests/dcgm_scenario.py``: no ECC or
NVLink error counters, no SM activity, the last XID as a gauge, no gpuwarden series) is backfilled
into a real TSDB with ``promtool tsdb create-blocks-from openmetrics``; Prometheus serves it, and
``gpuwarden health scan`` and ``gpuwarden report idle`` run against it as a user would run them.
Checked against the scenario's ground truth: every fatal XID event and every GPU that fell off the
bus is found, no cordon is recommended on a healthy GPU, a node gone silent is a note and not a
GPU finding, idle GPUs are not "starved", bad series are notes, and every GPU-hour is accounted.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
import yaml

from dcgm_scenario import A100, UNKNOWN_MODEL, Device, Scenario, openmetrics, scenario
from polling import wait_for
from servers import ServerProcess, binary

from gpuwarden.analytics.health.catalogue import CORDONING_ACTIONS, XID_RULES
from gpuwarden.fleet.gpu_catalogue import gpu_catalogue

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Price-tier labels as kube-state-metrics serves them (only the labels its allowlist names).
NODE_TIER_LABELS = {"dgx-a": {"label_karpenter_sh_capacity_type": "spot"}, "dgx-b": {"label_gpuwarden_io_price_tier": "owned"}}


def node_labels(fleet) -> str:
    """kube_node_labels of the scenario's nodes (two with a tier label), every 5 minutes."""
    lines = ["# TYPE kube_node_labels gauge"]
    for node in sorted({d.node for d in fleet.devices}):
        labels = ",".join(f'{k}="{v}"' for k, v in {"node": node, "job": "kube-state-metrics",
                                                   **NODE_TIER_LABELS.get(node, {})}.items())
        lines += [f"kube_node_labels{{{labels}}} 1 {t}" for t in range(fleet.start_s, fleet.end_s, 300)]
    return "\n".join(lines) + "\n"


@contextmanager
def serving(tmp: Path, text: str):
    """A real Prometheus over ``text`` (OpenMetrics with timestamps) backfilled into a TSDB."""
    prometheus, promtool = binary("prometheus", "prometheus"), binary("promtool", "prometheus")
    (tmp / "scenario.om").write_text(text)
    done = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(tmp / "scenario.om"), str(tmp / "tsdb")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    port = _free_port()
    (tmp / "prometheus.yml").write_text(yaml.safe_dump({"global": {"scrape_interval": "1h"}}))
    server = ServerProcess([prometheus, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                            "--storage.tsdb.retention.time=10y", f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                           tmp / "prometheus.log", f"http://127.0.0.1:{port}/-/ready")
    try:
        wait_for(server.ready, 60, "prometheus /-/ready over the backfilled blocks", interval=0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def past_hours_end_s() -> int:
    """Whole hours, ending an hour ago: in the past, so Prometheus' head never overlaps the blocks."""
    return (int(time.time()) // 3600 - 1) * 3600


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dcgm")
    end_s = past_hours_end_s()
    fleet = scenario(end_s - 6 * 3600)
    assert fleet.end_s == end_s
    with serving(tmp, openmetrics(fleet).replace("# EOF\n", node_labels(fleet) + "# EOF\n")) as url:
        yield {"fleet": fleet, "url": url, "tmp": tmp}


def gpuwarden(backfilled, *argv: str) -> dict:
    """Run the CLI as a user would, on the scenario's window; its JSON output."""
    fleet = backfilled["fleet"]
    until = pd.Timestamp(fleet.end_s, unit="s", tz="UTC").isoformat()
    command = [sys.executable, "-m", "gpuwarden.cli", *argv, "--source", "prometheus", "--prometheus-url", backfilled["url"],
               "--since", f"{fleet.hours:g}h", "--until", until, "--format", "json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, f"{' '.join(command)}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def health(backfilled):
    return gpuwarden(backfilled, "health", "scan", "--all")


def test_every_fatal_xid_event_is_found_from_the_last_xid_gauge(backfilled, health):
    truth = backfilled["fleet"].truth()
    found = {(f["gpu_uuid"], f["kind"]): f for f in health["findings"]}
    assert truth["xid_events"], "the scenario must hold fatal XIDs"
    for uuid, code in truth["xid_events"]:
        finding = found.get((uuid, XID_RULES[code].kind))
        assert finding is not None, f"XID {code} on {uuid} not found; findings: {sorted(found)}"
        assert finding["evidence"]["xid"] == code
        assert finding["evidence"]["events"] == 1  # XID 74 came twice: the same value again is not visible
    apps = {(e["gpu_uuid"], e["kind"]) for e in health["application_events"]}
    assert {(uuid, XID_RULES[code].kind) for uuid, code in truth["application_events"]} <= apps
    assert not {f["kind"] for f in health["findings"]} & {XID_RULES[c].kind for c in (13, 31, 43, 45, 68)}
    assert any("DCGM_FI_DEV_XID_ERRORS" in n and "same code again" in n for n in health["notes"])


def test_a_gpu_whose_series_stop_while_its_node_mates_report_is_a_finding(backfilled, health):
    truth = backfilled["fleet"].truth()
    lost = {f["gpu_uuid"] for f in health["findings"] if f["kind"] == "gpu-series-lost"}
    assert lost == truth["lost"]
    # A whole node going silent is the exporter or the node: a note, no GPU finding on it.
    silent = {d.uuid for d in backfilled["fleet"].devices if d.node in truth["silent_nodes"]}
    assert not {f["gpu_uuid"] for f in health["findings"]} & silent
    assert any(n.startswith("node dgx-d: no series") for n in health["notes"])


def test_no_cordon_is_recommended_on_a_healthy_gpu(backfilled, health):
    truth = backfilled["fleet"].truth()
    cordoning = {a.value for a in CORDONING_ACTIONS}
    wrongly = [f for f in health["findings"] if f["recommended_action"] in cordoning and f["gpu_uuid"] in truth["healthy"]]
    assert wrongly == []
    assert health["summary"]["cordon_or_drain"] >= len(truth["xid_events"] - {(u, 94) for u, _ in truth["xid_events"]})


def test_the_scan_says_which_detectors_it_could_not_run_and_which_series_it_skipped(health):
    notes = "\n".join(health["notes"])
    assert "no ECC counters in this source: HBM degradation is seen only through row remaps" in notes
    assert "no NVLink error counters" in notes and "no throttle reasons" in notes
    assert 'gpu="4"}: no UUID label: skipped' in notes
    assert "gpu label 'nvidia4' is not a number: skipped" in notes
    assert f"model {UNKNOWN_MODEL!r} is not in the GPU catalogue" in notes and "kept" in notes
    assert "DCGM_FI_DEV_PCIE_REPLAY_COUNTER" in notes and "went backwards" in notes


@pytest.fixture(scope="module")
def price_book(backfilled) -> Path:
    """The bundled price book does not know the prototype: the user prices it (a model no book
    knows is kept in the samples; pricing it is the user's call)."""
    book = backfilled["tmp"] / "prices.yaml"
    book.write_text(yaml.safe_dump({"models": {
        "NVIDIA H100 80GB HBM3": {"on-demand": 6.88, "reserved": 4.3, "spot": 2.75, "owned": {"capex": 32000}},
        A100: {"on-demand": 4.1, "reserved": 2.6, "spot": 1.6, "owned": {"capex": 15000}},
        UNKNOWN_MODEL: {"on-demand": 9.0, "reserved": 6.0, "spot": 4.0, "owned": {"capex": 40000}}}}))
    return book


def test_the_idle_report_accounts_every_gpu_hour_and_calls_no_idle_gpu_starved(backfilled, price_book):
    fleet = backfilled["fleet"]
    report = gpuwarden(backfilled, "report", "idle", "--price-book", str(price_book))
    summary, states = report["summary"], {row["state"]: row["gpu_hours"] for row in report["tables"]["states"]}
    catalogue = gpu_catalogue()
    step_h = 1 / 60

    def share(device) -> float:  # a MIG instance is its compute slices' share of the GPU
        if device.mig is None:
            return 1.0
        return catalogue.mig_profiles(device.model)[device.mig[1]].compute_slices / catalogue.compute_slices(device.model)

    devices = fleet.valid()
    hours = {id(d): (fleet.stop_s(d) - fleet.start_s) / 3600 * share(d) for d in devices}
    assert summary["gpu_hours"] == pytest.approx(sum(hours.values()), abs=len(devices) * step_h)
    assert sum(states.values()) == pytest.approx(summary["gpu_hours"], rel=1e-9)
    assert report["quality"]["rows_dropped_unidentified"] == 0
    # Pod attribution: dgx-d's exporter labels no pod anywhere, so its GPUs' owner is unknown; the
    # other exporters map pods, so their pod-less GPUs are unallocated.
    unknown = sum(hours[id(d)] for d in devices if d.node == "dgx-d")
    assert summary["unattributed_gpu_hours"] == pytest.approx(unknown, abs=4 * step_h)
    free = sum(hours[id(d)] for d in devices if d.pod is None and d.node != "dgx-d")
    assert states["unallocated"] == pytest.approx(free, abs=len(devices) * step_h)
    assert any(n.startswith("pod attribution: auto") and "dgx-d" in n for n in report["notes"])
    # GPUs at a few percent with no pod are idle or underutilised, never starved; the one
    # data-loader-bound pod is.
    starved = sum(hours[id(d)] for d in devices if d.load == "starved")
    assert states["starved"] == pytest.approx(starved, abs=len(devices) * step_h)


def test_the_user_overrides_the_attribution_rule(backfilled, price_book):
    report = gpuwarden(backfilled, "report", "idle", "--price-book", str(price_book), "--pod-attribution", "on")
    assert report["summary"]["unattributed_gpu_hours"] == 0
    assert any(n.startswith("pod attribution: --pod-attribution on") for n in report["notes"])


def test_node_tier_labels_from_kube_state_metrics_price_the_cost_report(backfilled, price_book):
    report = gpuwarden(backfilled, "report", "cost", "--price-book", str(price_book))
    tiers = {(row["pool"], row["model"]): row["tier"] for row in report["tables"]["by_pool"]}
    h100 = "NVIDIA H100 80GB HBM3"
    assert tiers[("dgx-a", h100)] == "spot" and tiers[("dgx-b", h100)] == "owned"
    assert tiers[("dgx-c", h100)] == "on-demand"  # no label, no inventory rule: the default, said
    (note,) = [n for n in report["notes"] if n.startswith("price tiers: ")]
    assert "1 node(s) from label gpuwarden.io/price-tier" in note and "1 node(s) from label karpenter.sh/capacity-type" in note
    assert "at the default tier on-demand" in note
    assert any(n.startswith(f"price book: {price_book} (sha256 ") for n in report["notes"])


XID_74_AT_H = (0.5, 1.2)  # two NVLink XIDs of one code: the last-XID gauge shows only the first


@pytest.fixture(scope="module")
def counted(tmp_path_factory):
    """Two hours of one node whose dcgm-exporter also serves DCGM_EXP_XID_ERRORS_COUNT (XIDs per
    code over its 5-minute window; a code's series only while its window holds one)."""
    end_s = past_hours_end_s()
    fleet = Scenario([Device("dgx-x", "0", "GPU-counted-0000", pod="train-x-0", xids=[(h, 74) for h in XID_74_AT_H]),
                      Device("dgx-x", "1", "GPU-quiet-0001", pod="train-x-1")], {}, end_s - 2 * 3600, hours=2)
    device = fleet.devices[0]
    labels = ",".join(f'{k}="{v}"' for k, v in {**device.labels("10.0.0.10:9400"), "xid": "74",
                                                 "window_size_in_ms": "300000"}.items())
    lines = ["# TYPE DCGM_EXP_XID_ERRORS_COUNT gauge"]
    for t in range(fleet.start_s, fleet.end_s, 30):
        count = sum(0 <= t - (fleet.start_s + h * 3600) < 300 for h in XID_74_AT_H)
        lines += [f"DCGM_EXP_XID_ERRORS_COUNT{{{labels}}} {count} {t}"] if count else []
    text = openmetrics(fleet).replace("# EOF\n", "\n".join(lines) + "\n# EOF\n")
    with serving(tmp_path_factory.mktemp("xid-count"), text) as url:
        yield {"fleet": fleet, "url": url}


def test_the_windowed_xid_count_sees_a_code_twice(counted):
    scan = gpuwarden(counted, "health", "scan", "--all")
    (finding,) = [f for f in scan["findings"] if f["gpu_uuid"] == "GPU-counted-0000" and f["evidence"].get("xid") == 74]
    assert finding["evidence"]["events"] == len(XID_74_AT_H), scan["notes"]
    assert not [f for f in scan["findings"] if f["gpu_uuid"] == "GPU-quiet-0001"]
    assert any("DCGM_EXP_XID_ERRORS_COUNT" in n and "1 GPU(s)" in n for n in scan["notes"])
