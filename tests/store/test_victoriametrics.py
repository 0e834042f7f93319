"""The same integration path against a second real backend: VictoriaMetrics single node.

Debian's ``victoria-metrics`` scrapes a real exporter on the simulated fleet (its
``-promscrape.config`` takes Prometheus' scrape config), Debian's ``vmalert`` evaluates the
generated recording rules against it and writes the recorded series back (remote write), and
``PrometheusSource`` reads both through VictoriaMetrics' Prometheus query API: raw samples
agree with the fleet the exporter served, the four reports from the rollups agree with the same
reports from raw samples within 1%, and ``gpuwarden report`` answers against it.
One VictoriaMetrics and one vmalert per module; each is polled for readiness, never slept on.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import yaml

from gpuwarden.analytics import IdleParams, build_ledger
from gpuwarden.analytics.promrules import render_recording_rules
from gpuwarden.cli import main
from gpuwarden.exporter import ExporterService
from gpuwarden.sim.backend import SimGpuBackend
from gpuwarden.sim.config import SimConfig
from gpuwarden.cli.simfleet import simulated_fleet
from gpuwarden.store.prometheus import PrometheusSource
from servers import PROJECT_FROM_POD, ServerProcess, assert_reports_agree, binary, rollup_window
from servers import free_port, wait_for

PARAMS = IdleParams(hoard_grace="0s")  # as the 1 s rules below: no warm-up on a static fleet


@pytest.fixture(scope="module")
def vm(data_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("victoriametrics")
    victoria, vmalert = binary("victoria-metrics", "victoria-metrics"), binary("vmalert", "victoria-metrics")
    fleet = simulated_fleet(SimConfig(nodes=2, gpus_per_node=8, warmup_days=0.5, data_dir=data_dir))
    fleet.step()
    exporter = ExporterService(SimGpuBackend(fleet), interval_seconds=0.5, host="127.0.0.1", port=0).start()
    processes: list[ServerProcess] = []
    try:
        target = exporter.url.split("//", 1)[1].rsplit("/metrics", 1)[0]
        (tmp / "scrape.yml").write_text(yaml.safe_dump({"scrape_configs": [{
            "job_name": "gpuwarden", "scrape_interval": "1s",
            "static_configs": [{"targets": [target], "labels": {"cluster": "sim"}}],
            "metric_relabel_configs": PROJECT_FROM_POD}]}))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        processes.append(ServerProcess([
            victoria, f"-storageDataPath={tmp / 'data'}", f"-httpListenAddr=127.0.0.1:{port}",
            f"-promscrape.config={tmp / 'scrape.yml'}", "-search.latencyOffset=0s", "-search.disableCache",
            "-loggerLevel=ERROR"], tmp / "victoria-metrics.log", f"{url}/health"))
        wait_for(processes[0].ready, 30, "victoria-metrics /health")
        (tmp / "rules.yml").write_text(render_recording_rules(PARAMS, interval_seconds=1, rollup_seconds=5))
        alert_port = free_port()
        processes.append(ServerProcess([
            vmalert, f"-rule={tmp / 'rules.yml'}", f"-datasource.url={url}", f"-remoteWrite.url={url}",
            f"-httpListenAddr=127.0.0.1:{alert_port}", "-remoteWrite.flushInterval=200ms", "-datasource.queryStep=0s",
            "-loggerLevel=ERROR"], tmp / "vmalert.log", f"http://127.0.0.1:{alert_port}/health"))
        wait_for(processes[1].ready, 30, "vmalert /health")
        source = PrometheusSource(url, step=1, lookback="2s", timeout=15, retries=1, backoff=0.05, rollups=False)
        devices = len(fleet.latest)
        wait_for(lambda: (source.query("count(DCGM_FI_DEV_FB_USED)") or [{"value": [0, "0"]}])[0]["value"][1] == str(devices),
                 30, "every device scraped by victoria-metrics")
        yield {"url": url, "source": source, "fleet": fleet, "devices": devices}
    finally:
        for process in reversed(processes):
            process.stop()
        exporter.stop()


def test_raw_samples_through_victoriametrics_are_the_fleet(vm):
    source, fleet = vm["source"], vm["fleet"]
    span = source.time_range()
    assert span is not None
    frame = source.read(span[0], span[1] + pd.Timedelta(seconds=1))
    assert frame["gpu_uuid"].nunique() == fleet.latest["gpu_uuid"].nunique()
    latest = frame.sort_values("timestamp").groupby(["gpu_uuid", frame["mig_instance"].astype(object).fillna("-")],
                                                    observed=True).tail(1)
    truth = fleet.latest.set_index(["gpu_uuid", fleet.latest["mig_instance"].astype(object).fillna("-")])
    mine = latest.set_index(["gpu_uuid", latest["mig_instance"].astype(object).fillna("-")])
    for column in ("gpu_util_ratio", "mem_used_bytes", "power_watts"):
        a = mine[column].astype("float64").sort_index().to_numpy()
        b = truth[column].astype("float64").reindex(mine.sort_index().index).to_numpy()
        assert np.allclose(a, b, equal_nan=True), column
    assert set(frame["attribution"].astype(str)) == {"known"}  # the simulated fleet knows its pods


def test_reports_from_vmalert_rollups_match_raw_samples(vm):
    raw = vm["source"]
    rollup = PrometheusSource(vm["url"], step=1, lookback="2s", timeout=15, rule_interval="1s", rollup_interval="5s")
    uuids = set(vm["fleet"].latest["gpu_uuid"])

    # vmalert writes what a rule records back by remote write, so a rule reads an earlier rule of its
    # group (the state code reads plain idle, which reads idle) only a flush later: until every GPU's
    # state code has 5 s of settled inputs behind it, the first rollups can classify from missing
    # inputs (a loaded CI machine stretched that past the first rollup). Compare only rollups whose
    # whole window comes after that.
    def settled_at() -> float | None:
        found = raw.query("gpu:gpuwarden_state:code[2m]")
        firsts = [float(series["values"][0][0]) for series in found]
        return max(firsts) + 5 + 1 if {s["metric"].get("UUID") for s in found} == uuids else None

    settled = wait_for(settled_at, 90, "a state code for every GPU from vmalert")

    def rollup_times():
        found = raw.query("gpu:gpuwarden_state_seconds:5m[2m]")
        per_series = [[float(v[0]) for v in series["values"] if float(v[0]) - 5 - 1 >= settled] for series in found]
        return per_series if {s["metric"].get("UUID") for s in found} == uuids and min(map(len, per_series)) >= 3 else None

    times = wait_for(rollup_times, 90, "three vmalert rollups of every GPU over settled inputs")
    window = rollup_window(times, rollup_seconds=5, lag_seconds=1)
    from_rollup = build_ledger(rollup, *window, params=PARAMS)
    from_raw = build_ledger(raw, *window, params=PARAMS)
    assert from_rollup.quality["source"] == "rollup" and from_raw.quality["source"] == "samples"
    assert set(from_rollup.instances["gpu_uuid"]) == set(from_raw.instances["gpu_uuid"]) == uuids
    assert from_raw.rows["project"].notna().any()  # relabelled from the pod: the rollups must keep it
    assert_reports_agree(from_rollup, from_raw)
    by_state = {name: ledger.rows.groupby(ledger.rows["state"].astype(str))["gpu_hours"].sum() / ledger.gpu_hours
                for name, ledger in (("rollup", from_rollup), ("raw", from_raw))}
    shares = pd.concat(by_state, axis=1).fillna(0.0)
    assert (shares["rollup"] - shares["raw"]).abs().max() < 0.01, shares


def test_cli_report_against_victoriametrics(vm, capsys):
    code = main(["report", "chargeback", "--source", "prometheus", "--prometheus-url", vm["url"],
                 "--prometheus-step", "1s", "--since", "10m", "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    assert report["summary"]["reconciles"] is True and report["summary"]["gpu_hours"] > 0
