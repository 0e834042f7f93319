"""The PromQL recording rules, generated from the classifier's own parameters: one definition of idle.

``rules/gpuwarden-recording.rules.yml`` (and its copy in the helm chart) is the output of
:func:`render_recording_rules` for the default :class:`~gpuwarden.analytics.params.IdleParams`;
``tests/analytics/test_rules.py`` fails when the file and the generator drift. Regenerate with::

    python -m gpuwarden.analytics.promrules --write      # rules/ and helm/gpuwarden/files/rules/
    python -m gpuwarden.analytics.promrules --check      # exit 1 when a file differs

Thresholds come from ``IdleParams`` (ratios, converted to each metric's unit through the metric
catalogue's scale), the trailing window from ``window_samples`` x the rule interval, the hoarding
grace from ``hoard_grace``, and the state codes from ``STATE_CODES``, so the rules classify each
one-minute evaluation the way :mod:`gpuwarden.analytics.engine` classifies a one-minute sample:

- ``gpu:gpuwarden_state:code`` (every minute, one series per GPU and holder pod): the idle
  taxonomy's state, by the engine's precedence; ``unmeasured`` GPUs (no activity series) get none.
- ``gpu:gpuwarden_state_seconds:5m`` / ``gpu:gpuwarden_used_seconds:5m`` /
  ``gpu:gpuwarden_energy_joules:5m`` / ``gpu:gpuwarden_memory_byte_seconds:5m`` (every 5 minutes,
  label ``state``): the rollups reports read, one point per GPU, namespace and state per 5
  minutes (``ROLLUP_LABELS``: the pod is summed away). A rollup evaluated at ``T`` covers the
  evaluations in ``(T - 5m - 1m, T - 1m]``: one rule interval back, so that it never races the
  usage group it reads (readers shift it back by that interval).

Differences from the engine, by construction small: windows are counted in evaluations, not in
samples of a segment (a gap or a pod change resets the engine's window; a new series does the
same here), and a GPU whose activity is not measured at all has no state series.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from gpuwarden.fleet.catalogue import MetricSpec, load_catalogue
from gpuwarden.store.prometheus.expressions import ROLLUP_LABELS, ROLLUP_LAG_INTERVALS, STATE_ROLLUPS

from .params import STATE_CODES, IdleParams

ROOT = Path(__file__).resolve().parents[2]
RULE_FILE = Path("rules") / "gpuwarden-recording.rules.yml"
HELM_COPY = Path("helm") / "gpuwarden" / "files" / "rules" / "gpuwarden-recording.rules.yml"

STATE_METRIC = "gpu:gpuwarden_state:code"
# The labels a rollup keeps (ROLLUP_LABELS: the GPU or MIG instance and who it served, down to the
# namespace, never the pod, so pod churn starts no rollup series: docs/scale.md counts them), the
# recorded series per figure and the lag are imported from the store's expressions, which its reader reads.
ROLLUP_METRICS = STATE_ROLLUPS  # figure -> recorded series (label ``state``), one point per GPU, namespace and state
# States a rule can record (unmeasured needs an activity series to exist, so it cannot).
RECORDED_STATES = tuple(s for s in STATE_CODES if s != "unmeasured")


def _duration(seconds: float) -> str:
    """A PromQL duration ("4m59s999ms", "1m")."""
    ms = int(round(seconds * 1000))
    out = ""
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        if ms >= size:
            out += f"{ms // size}{unit}"
            ms %= size
    return out or "0s"


def _number(value: float) -> str:
    return f"{value:.10g}"


@dataclass(frozen=True)
class _Metrics:
    sm: str
    util: str
    util_scale: float
    fb_used: str
    fb_free: str
    fb_scale: float  # bytes -> the metric's unit
    power: str
    attribution: str | None


def _metrics(catalogue: tuple[MetricSpec, ...]) -> _Metrics:
    def find(column: str) -> MetricSpec:
        for spec in catalogue:
            if spec.transform == "value" and spec.source_column == column:
                return spec
        raise ValueError(f"the metric catalogue exports no {column} metric; the rules need it")

    used = find("mem_used_bytes")
    states = [s.metric for s in catalogue if s.transform == "state" and s.source_column == "attribution"]
    return _Metrics(find("sm_active_ratio").metric, find("gpu_util_ratio").metric, find("gpu_util_ratio").scale,
                    used.metric, find("mem_free_bytes").metric, used.scale, find("power_watts").metric,
                    states[0] if states else None)


def recording_rules(params: IdleParams | None = None, interval_seconds: float = 60.0, rollup_seconds: float = 300.0,
                    catalogue: tuple[MetricSpec, ...] | None = None) -> dict:
    """The rule groups (a dict ready for YAML) for ``params`` at rule interval ``interval_seconds``."""
    p = params or IdleParams()
    m = _metrics(catalogue or load_catalogue())
    if rollup_seconds % interval_seconds:
        raise ValueError("the rollup interval must be a whole number of rule intervals")
    step = interval_seconds
    per = _number(step)
    # A trailing window of N evaluations: Prometheus range selectors include both ends, so N
    # evaluations spaced ``step`` apart fit in (t - N*step + 1ms, t].
    def last(n: int) -> str:
        return _duration(n * step - 0.001)

    window = last(p.window_samples)
    hoard_n = int(p.hoard_grace.total_seconds() // step) + 1  # idle for longer than the grace
    util_fake = _number(p.fake_busy_util * m.util_scale)
    idle_at = _number(p.idle_activity)
    activity = "gpu:gpuwarden_activity:ratio"
    code = STATE_CODES
    known = (f' and ignoring(state) ({m.attribution}{{state="known"}} == 1)' if m.attribution else " and on() vector(0) == 1")
    state_expr = (
        f"(({activity}{{pod=\"\"}} * 0 + {code['unallocated']}){known})\n"
        f"or ((gpu:gpuwarden_fake_busy:bool * 0 + {code['fake_busy']})"
        f" and (gpu:gpuwarden_fake_busy:bool == 1) and (avg_over_time(gpu:gpuwarden_fake_busy:bool[{window}]) >= 0.5))\n"
        f"or ((gpu:gpuwarden_plain_idle:bool{{pod!=\"\"}} * 0 + {code['hoarded']})"
        f" and (sum_over_time(gpu:gpuwarden_plain_idle:bool{{pod!=\"\"}}[{last(hoard_n)}]) >= {hoard_n})"
        f" and ({m.fb_used} / ({m.fb_used} + {m.fb_free}) >= {_number(p.hoard_mem_ratio)}))\n"
        f"or ((gpu:gpuwarden_plain_idle:bool{{pod!=\"\"}} * 0 + {code['allocated_idle']}) and (gpu:gpuwarden_plain_idle:bool == 1))\n"
        f"or ((gpu:gpuwarden_plain_idle:bool{{pod=\"\"}} * 0 + {code['idle_unattributed']}) and (gpu:gpuwarden_plain_idle:bool == 1))\n"
        f"or ((gpu:gpuwarden_idle:bool{{pod!=\"\"}} * 0 + {code['starved']})"
        f" and (avg_over_time(gpu:gpuwarden_idle:bool[{window}]) >= {_number(p.starved_idle_share)})"
        f" and (max_over_time({activity}[{window}]) >= {_number(p.starved_burst_activity)}))\n"
        f"or (({activity} * 0 + {code['underutilized']})"
        f" and (avg_over_time({activity}[{window}]) < {_number(p.underutilized_below)}))\n"
        f"or ({activity} * 0 + {code['busy']})"
    )
    usage = [
        {"record": activity,
         "expr": f"{m.sm} or {m.util} / {_number(m.util_scale)}",
         "_comment": "Activity 0..1: SM activity where GPM measures it, else NVML utilisation."},
        {"record": "gpu:gpuwarden_fake_busy:bool",
         "expr": f"({m.sm} < bool {idle_at}) * ({m.util} >= bool {util_fake})",
         "_comment": f"Fake-busy: NVML utilisation >= {p.fake_busy_util:g} while SM activity < {p.idle_activity:g} (GPM GPUs only)."},
        {"record": "gpu:gpuwarden_idle:bool",
         "expr": f"({activity} < bool {idle_at}) * (1 - (gpu:gpuwarden_fake_busy:bool or {activity} * 0))",
         "_comment": f"Idle: no kernels running (activity < {p.idle_activity:g}), fake-busy excluded."},
        {"record": "gpu:gpuwarden_allocated_idle:bool",
         "expr": 'gpu:gpuwarden_idle:bool{pod!=""}',
         "_comment": "Allocated to a pod and idle (0/1; only allocated GPUs have the series)."},
        {"record": "gpu:gpuwarden_hoarded_memory:bytes",
         "expr": f'{m.fb_used}{{pod!=""}} * {_number(1 / m.fb_scale)} * gpu:gpuwarden_allocated_idle:bool',
         "_comment": "Memory held by an allocated GPU that is idle, in bytes."},
        {"record": "gpu:gpuwarden_plain_idle:bool",
         "expr": f"gpu:gpuwarden_idle:bool * (avg_over_time(gpu:gpuwarden_idle:bool[{window}]) >= bool "
                 f"{_number(p.idle_window_share - 1e-9)})",
         "_comment": f"Plainly idle: idle now and in at least {p.idle_window_share:g} of the last {p.window_samples} evaluations."},
        {"record": STATE_METRIC, "expr": state_expr,
         "_comment": "The idle taxonomy's state code (gpuwarden.analytics.params.STATE_CODES: "
                     + ", ".join(f"{k}={v}" for k, v in code.items() if k != "unmeasured")
                     + "); the first matching line wins, as in the engine."},
        {"record": "gpu:gpuwarden_idle_seconds:1h",
         "expr": f"sum_over_time(gpu:gpuwarden_idle:bool[{last(int(3600 // step))}]) * {per}",
         "_comment": "Idle GPU-seconds in the last hour, per GPU (and per pod holding it)."},
        {"record": "gpu:gpuwarden_allocated_idle_seconds:1h",
         "expr": f"sum_over_time(gpu:gpuwarden_allocated_idle:bool[{last(int(3600 // step))}]) * {per}"},
    ]
    for name, source in (("idle_gpus", "gpu:gpuwarden_idle:bool"), ("allocated_idle_gpus", "gpu:gpuwarden_allocated_idle:bool"),
                         ("fake_busy_gpus", "gpu:gpuwarden_fake_busy:bool"), ("hoarded_memory", "gpu:gpuwarden_hoarded_memory:bytes"),
                         ("idle_seconds", "gpu:gpuwarden_idle_seconds:1h"),
                         ("allocated_idle_seconds", "gpu:gpuwarden_allocated_idle_seconds:1h")):
        suffix = ":bytes" if name == "hoarded_memory" else (":1h" if name.endswith("seconds") else ":sum")
        usage.append({"record": f"namespace:gpuwarden_{name}{suffix}", "expr": f"sum by (cluster, namespace) ({source})"})

    # The rollup reads the usage group's minutes over a window that ends one rule interval back:
    # the two groups are evaluated independently (at their own phase), so the newest minute may
    # not be recorded yet when a rollup runs. One interval back, every minute is there, and
    # consecutive rollups still tile time exactly (subquery steps are aligned to the interval).
    sub = f"[{_duration(rollup_seconds - 0.001)}:{_duration(step)}] offset {_duration(step * ROLLUP_LAG_INTERVALS)}"
    by = ", ".join(ROLLUP_LABELS)
    rollups = []
    for state in RECORDED_STATES:
        match = f"{STATE_METRIC} == {code[state]}"
        for figure, record in ROLLUP_METRICS.items():
            value = {"seconds": f"count_over_time(({match}){sub})",
                     "used_seconds": f"sum_over_time(({activity} and {match}){sub})",
                     "energy_joules": f"sum_over_time(({m.power} and {match}){sub})",
                     "memory_byte_seconds": f"sum_over_time(({m.fb_used} * {_number(1 / m.fb_scale)} and {match}){sub})",
                     }[figure]
            rollups.append({"record": record, "expr": f"sum by ({by}) ({value}) * {per}", "labels": {"state": state}})
    return {"groups": [
        {"name": "gpuwarden-usage", "interval": _duration(step), "rules": usage},
        {"name": "gpuwarden-rollup", "interval": _duration(rollup_seconds), "rules": rollups},
    ]}


def raw_expressions(params: IdleParams | None = None, catalogue: tuple[MetricSpec, ...] | None = None) -> dict[str, str]:
    """The per-evaluation indicators over raw exporter series (no recorded series): what
    ``PrometheusSource.read_rollup(use_rules=False)`` evaluates as subqueries. The store keeps a
    copy (it may not import analytics); ``tests/analytics/test_rules.py`` keeps the two equal."""
    rules = {rule["record"]: rule["expr"] for rule in recording_rules(params, catalogue=catalogue)["groups"][0]["rules"]}
    activity = f"({rules['gpu:gpuwarden_activity:ratio']})"
    fake = rules["gpu:gpuwarden_fake_busy:bool"]
    idle = rules["gpu:gpuwarden_idle:bool"].replace("gpu:gpuwarden_fake_busy:bool", f"({fake})")
    idle = idle.replace("gpu:gpuwarden_activity:ratio", activity)
    return {"idle": idle, "fake_busy": fake, "hoarded": rules["gpu:gpuwarden_hoarded_memory:bytes"]}


HEADER = """\
# GENERATED by `python -m gpuwarden.analytics.promrules --write` from gpuwarden/analytics/params.py
# (IdleParams defaults) and the metric catalogue: do not edit; change the parameters and regenerate.
# tests/analytics/test_rules.py fails when this file, its helm copy and the generator disagree.
#
# One definition of idle: the "gpuwarden-usage" group classifies every GPU (and holder pod) each
# {interval} into the idle taxonomy of gpuwarden.analytics (gpu:gpuwarden_state:code), with the
# same thresholds; "gpuwarden-rollup" sums it every {rollup} into one point per GPU, namespace and
# state (gpu:gpuwarden_*:5m{{state=...}}; no pod label, so pod churn adds no rollup series), which
# `gpuwarden report ... --source prometheus` reads instead of raw samples. A rollup at T covers the
# evaluations in (T - {rollup} - {interval}, T - {interval}] ("offset {interval}"): groups run at
# their own phase, and one interval back the usage group has always recorded the minute.
# Conventions: level:metric:operation; "gpu:" 1-minute series keep every label of the exporter's
# series; "namespace:" series are summed by cluster and namespace.
# Windows are 1 ms short of N evaluations: Prometheus 2 range selectors include both ends.
"""


def _quote(text: str) -> str:
    """A YAML double-quoted scalar for a PromQL expression (one line)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_recording_rules(params: IdleParams | None = None, interval_seconds: float = 60.0,
                           rollup_seconds: float = 300.0, catalogue: tuple[MetricSpec, ...] | None = None) -> str:
    """The rule file's text: stable, commented YAML (what is committed under ``rules/``)."""
    groups = recording_rules(params, interval_seconds, rollup_seconds, catalogue)["groups"]
    out = [HEADER.format(interval=_duration(interval_seconds), rollup=_duration(rollup_seconds)), "groups:\n"]
    for group in groups:
        out.append(f"  - name: {group['name']}\n    interval: {group['interval']}\n    rules:\n")
        for rule in group["rules"]:
            if rule.get("_comment"):
                out.append(f"      # {rule['_comment']}\n")
            out.append(f"      - record: {rule['record']}\n")
            lines = rule["expr"].split("\n")
            if len(lines) == 1:
                out.append(f"        expr: {_quote(lines[0])}\n")
            else:
                out.append("        expr: |-\n" + "".join(f"          {line}\n" for line in lines))
            if rule.get("labels"):
                out.append("        labels:\n" + "".join(f"          {k}: {v}\n" for k, v in rule["labels"].items()))
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuwarden.analytics.promrules",
                                     description="Generate the recording rules from IdleParams.")
    parser.add_argument("--write", action="store_true", help=f"write {RULE_FILE} and {HELM_COPY}")
    parser.add_argument("--check", action="store_true", help="exit 1 when a committed copy differs")
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root (default: this checkout)")
    args = parser.parse_args(argv)
    text = render_recording_rules()
    if not (args.write or args.check):
        sys.stdout.write(text)
        return 0
    stale = []
    for relative in (RULE_FILE, HELM_COPY):
        path = args.root / relative
        if args.write:
            path.write_text(text)
        elif not path.is_file() or path.read_text() != text:
            stale.append(str(relative))
    if stale:
        print(f"out of date: {', '.join(stale)}; run python -m gpuwarden.analytics.promrules --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
