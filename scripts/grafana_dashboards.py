"""Generate the Grafana dashboards under dashboards/grafana/ (and their copies in the chart) with
grafana-foundation-sdk: fleet and idle, cost and chargeback, health, actuator, queue.

    python scripts/grafana_dashboards.py          # write dashboards/grafana/*.json and helm/gpuwarden/files/dashboards/
    python scripts/grafana_dashboards.py --check  # exit 1 when a committed file is not what this script writes

The panels are data (:data:`DASHBOARDS`); every query reads what gpuwarden serves: the metrics of
``gpuwarden metrics serve`` (gpuwarden/analytics/metrics_collector.py), the recording rules of
rules/ and the exporter's (or dcgm-exporter's) DCGM_FI_* series. Queries use no Grafana variable
but the data source, so tests/dashboards/test_grafana_dashboards.py runs each one as written against a real
Prometheus.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import NamedTuple
from pathlib import Path

from grafana_foundation_sdk.builders import bargauge, common, dashboard, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import LegendDisplayMode, LegendPlacement
from grafana_foundation_sdk.models.dashboard import DataSourceRef

ROOT = Path(__file__).resolve().parents[1]
OUT_DIRS = (ROOT / "dashboards" / "grafana", ROOT / "helm" / "gpuwarden" / "files" / "dashboards")
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")


class Panel(NamedTuple):
    kind: str  # stat, timeseries, table, bargauge
    title: str
    queries: tuple[tuple[str, str], ...]  # (PromQL, legend)
    unit: str = "none"
    description: str = ""
    width: int = 6
    height: int = 6


def _q(expr: str, legend: str = "") -> tuple[str, str]:
    return (expr, legend)


FRESHNESS = Panel("stat", "Figures computed", (_q("time() - max(gpuwarden_metrics_computed_timestamp_seconds)"),), "s",
                  "Seconds since gpuwarden metrics serve last computed the figures on this board.")

DASHBOARDS: dict[str, tuple[str, str, tuple[Panel, ...]]] = {
    "fleet-idle": ("gpuwarden / Fleet and idle", "Idle GPU time by reason, team and namespace; fleet efficiency.", (
        Panel("stat", "GPUs", (_q("max(gpuwarden_fleet_gpus)"),), description="GPUs seen in the analytics window."),
        Panel("stat", "Fleet efficiency", (_q("max(gpuwarden_fleet_efficiency_ratio)"),), "percentunit",
              "Used GPU-hours over allocated GPU-hours in the analytics window."),
        Panel("stat", "Idle share", (_q("max(gpuwarden_fleet_idle_ratio)"),), "percentunit",
              "Idle GPU-hours over observed GPU-hours in the analytics window."),
        FRESHNESS,
        Panel("timeseries", "Idle GPU-hours by reason", (_q("sum by (reason) (gpuwarden_idle_gpu_hours)", "{{reason}}"),),
              "h", "Over the analytics window, recomputed every interval.", width=12, height=8),
        Panel("timeseries", "Idle GPU-hours by team", (_q("sum by (team) (gpuwarden_idle_gpu_hours)", "{{team}}"),),
              "h", width=12, height=8),
        Panel("timeseries", "Idle GPUs now by namespace (recording rules)",
              (_q("sum by (namespace) (namespace:gpuwarden_idle_gpus:sum)", "{{namespace}}"),), "none",
              "GPUs with no kernels running this minute (rules/gpuwarden-recording.rules.yml).", width=12, height=8),
        Panel("timeseries", "GPU utilisation (exporter)", (_q("avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)", "{{Hostname}}"),),
              "percent", "NVML utilisation per node, as dcgm-exporter and gpuwarden's exporter serve it.", width=12, height=8),
        Panel("table", "Idle GPU-hours by namespace and reason",
              (_q("sort_desc(sum by (namespace, reason) (gpuwarden_idle_gpu_hours))"),), "h", width=24, height=8),
    )),
    "cost": ("gpuwarden / Cost and chargeback", "What the fleet and its idle time cost, by reason and team.", (
        Panel("stat", "Fleet cost", (_q("max(gpuwarden_fleet_cost_usd)"),), "currencyUSD",
              "Every GPU-hour of the analytics window, priced by the price book."),
        Panel("stat", "Idle cost", (_q("max(gpuwarden_fleet_idle_cost_usd)"),), "currencyUSD"),
        Panel("stat", "Price book", (_q("max by (price_book) (gpuwarden_metrics_info)", "{{price_book}}"),),
              description="Which price book priced these figures."),
        FRESHNESS,
        Panel("timeseries", "Idle cost by reason", (_q("sum by (reason) (gpuwarden_idle_cost_usd)", "{{reason}}"),),
              "currencyUSD", width=12, height=8),
        Panel("bargauge", "Idle cost by team", (_q("sort_desc(sum by (team) (gpuwarden_idle_cost_usd))", "{{team}}"),),
              "currencyUSD", width=12, height=8),
        Panel("table", "Idle cost by team, namespace and reason",
              (_q("sort_desc(sum by (team, namespace, reason) (gpuwarden_idle_cost_usd))"),), "currencyUSD",
              width=24, height=8),
    )),
    "health": ("gpuwarden / Health", "Open GPU health findings and the signals behind them.", (
        Panel("stat", "Critical findings", (_q('count(gpuwarden_health_finding{severity="critical"}) or vector(0)'),)),
        Panel("stat", "Warnings", (_q('count(gpuwarden_health_finding{severity="warning"}) or vector(0)'),)),
        Panel("stat", "GPUs with a finding", (_q('count(count by (gpu) (gpuwarden_health_finding{gpu!=""})) or vector(0)'),)),
        FRESHNESS,
        Panel("table", "Open findings", (_q("gpuwarden_health_finding"),),
              description="kind, severity, GPU, node and the recommended action of each open finding.", width=24, height=9),
        Panel("timeseries", "Open findings by kind", (_q("count by (kind) (gpuwarden_health_finding)", "{{kind}}"),),
              width=12, height=8),
        Panel("timeseries", "Hottest GPU per node (exporter)", (_q("max by (Hostname) (DCGM_FI_DEV_GPU_TEMP)", "{{Hostname}}"),),
              "celsius", width=12, height=8),
    )),
    "actuator": ("gpuwarden / Actuator", "The remediation actuator's state, from its audit log.", (
        Panel("stat", "Circuit breaker open", (_q("max(gpuwarden_actuator_breaker_open)"),),
              description="1: a safety limit was reached; nothing is applied until a person resets it."),
        Panel("stat", "Approvals waiting", (_q("max(gpuwarden_actuator_pending_approvals)"),)),
        Panel("stat", "Oldest approval waiting", (_q("max(gpuwarden_actuator_oldest_pending_approval_age_seconds)"),), "s"),
        FRESHNESS,
        Panel("timeseries", "Audit entries by outcome", (_q("sum by (outcome) (gpuwarden_actuator_actions_total)", "{{outcome}}"),),
              width=12, height=8),
        Panel("table", "Audit entries by action and outcome",
              (_q("sum by (kind, outcome) (gpuwarden_actuator_actions_total)"),), width=12, height=8),
    )),
    "queue": ("gpuwarden / Queue", "Workloads waiting in the scheduling queue, per team.", (
        Panel("stat", "Workloads waiting", (_q("sum(gpuwarden_queue_pending_workloads)"),)),
        Panel("stat", "GPUs requested by waiting workloads", (_q("sum(gpuwarden_queue_pending_gpus)"),)),
        Panel("stat", "Longest wait", (_q("max(gpuwarden_queue_oldest_wait_seconds)"),), "s"),
        FRESHNESS,
        Panel("timeseries", "GPUs waiting by team", (_q("sum by (team) (gpuwarden_queue_pending_gpus)", "{{team}}"),),
              width=12, height=8),
        Panel("bargauge", "Longest wait by team", (_q("max by (team) (gpuwarden_queue_oldest_wait_seconds)", "{{team}}"),),
              "s", width=12, height=8),
    )),
}

_BUILDERS = {"stat": stat.Panel, "timeseries": timeseries.Panel, "table": table.Panel, "bargauge": bargauge.Panel}


def _panel(spec: Panel):
    panel = _BUILDERS[spec.kind]().title(spec.title).datasource(DATASOURCE).unit(spec.unit).span(spec.width).height(spec.height)
    if spec.description:
        panel = panel.description(spec.description)
    if spec.kind in ("stat", "bargauge"):  # the newest value of each series
        panel = panel.reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    elif spec.kind == "timeseries":
        panel = panel.legend(common.VizLegendOptions().show_legend(True).display_mode(LegendDisplayMode.LIST)
                             .placement(LegendPlacement.BOTTOM))
    else:
        panel = panel.show_header(True)
    instant = spec.kind in ("table", "bargauge")  # a table of the latest values, not of every point in time
    for ref, (expr, legend) in zip("ABCDEFGH", spec.queries):
        query = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DATASOURCE)
        query = query.instant().format("table") if spec.kind == "table" else (query.instant() if instant else query.range())
        if legend:
            query = query.legend_format(legend)
        panel = panel.with_target(query)
    return panel


def build(name: str) -> dict:
    title, description, panels = DASHBOARDS[name]
    board = (dashboard.Dashboard(title).uid(f"gpuwarden-{name}").description(description).tags(["gpuwarden"])
             .refresh("5m").time("now-24h", "now").timezone("utc").editable()
             .with_variable(dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")))
    for spec in panels:
        board = board.with_panel(_panel(spec))
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))


def render(name: str) -> str:
    return json.dumps(build(name), indent=2, sort_keys=True) + "\n"


def queries(document: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of a dashboard's JSON."""
    return [(panel["title"], target["expr"]) for panel in document.get("panels", []) for target in panel.get("targets", [])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the committed files are current")
    args = parser.parse_args(argv)
    stale = []
    for folder in OUT_DIRS:
        folder.mkdir(parents=True, exist_ok=True)
        wanted = {f"gpuwarden-{name}.json": render(name) for name in DASHBOARDS}
        for path in folder.glob("*.json"):
            if path.name not in wanted:
                stale.append(path) if args.check else path.unlink()
        for file_name, text in wanted.items():
            path = folder / file_name
            if not path.exists() or path.read_text() != text:
                stale.append(path) if args.check else path.write_text(text)
    if args.check and stale:
        print("not current (run: python scripts/grafana_dashboards.py): " + ", ".join(map(str, stale)), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
