"""The promtool unit test of the generated state rules, with its expectations computed by the engine.

``rules/tests/state.test.yml`` is the output of :func:`render` (``python tests/rules_scenario.py >
rules/tests/state.test.yml``): nine GPUs, one per state of the idle taxonomy, and a tenth whose pod
is replaced by another of the same namespace (pod churn), as per-minute input series, and as
expected values the state that :func:`gpuwarden.analytics.build_ledger` gives the same samples; the
5-minute rollups are expected per GPU, namespace and state (no pod), over the window one minute
back, with no evaluation order imposed between the groups. ``promtool test rules`` therefore checks that the PromQL rules classify like the
Python engine; ``tests/analytics/test_rules.py`` checks the committed file is what this module renders.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpuwarden.analytics import IdleParams, build_ledger  # noqa: E402
from gpuwarden.analytics.params import STATE_CODES  # noqa: E402
from gpuwarden.analytics.promrules import ROLLUP_METRICS, STATE_METRIC  # noqa: E402
from gpuwarden.fleet import SAMPLE_COLUMN_NAMES  # noqa: E402

MINUTES = 45
EVAL_MINUTES = (3, 10, 40)
ROLLUP_AT = 40  # the 5-minute rollup evaluated then covers minutes 35..39 (one rule interval back)
ROLLUP_LAG = 1  # minutes: the rules' "offset 1m"
MIB = 2**20
START = pd.Timestamp("2026-01-01T00:00:00Z")


def _series(n: int, value) -> np.ndarray:
    out = np.empty(n)
    out[:] = value
    return out


def gpus() -> list[dict]:
    """One GPU per state: sm (None: no GPM), util percent, FB used/free MiB, power W, pod, attribution."""
    minute = np.arange(MINUTES)
    bursts = np.where(minute % 3 == 0, 0.5, 0.0)
    return [
        dict(uuid="GPU-a", pod="p1", namespace="ml", sm=0.75, util=95, used=70000, free=11000, watts=600, attr=True),
        dict(uuid="GPU-b", pod="p2", namespace="ml", sm=0.25, util=30, used=20000, free=61000, watts=250, attr=True),
        dict(uuid="GPU-c", pod="p3", namespace="ml", sm=bursts, util=bursts * 100, used=30000, free=51000, watts=300, attr=True),
        dict(uuid="GPU-d", pod="p4", namespace="vision", sm=0.0, util=22, used=30000, free=51000, watts=120, attr=True),
        dict(uuid="GPU-e", pod="p5", namespace="vision", sm=0.0, util=0, used=60000, free=21000, watts=90, attr=True),
        dict(uuid="GPU-f", pod=None, namespace=None, sm=0.0, util=0, used=0, free=81000, watts=70, attr=True),
        dict(uuid="GPU-g", pod=None, namespace=None, sm=0.0, util=0, used=0, free=81000, watts=70, attr=False),
        dict(uuid="GPU-h", pod=None, namespace=None, sm=0.75, util=97, used=70000, free=11000, watts=650, attr=False),
        dict(uuid="GPU-i", pod="p6", namespace="ml", sm=None, util=0, used=500, free=80500, watts=60, attr=True),
        # p7 ends at minute 37 and p8 takes the GPU: the rollup over minutes 35..39 is one series.
        dict(uuid="GPU-j", pod="p7", namespace="ml", sm=0.75, util=95, used=70000, free=11000, watts=600, attr=True,
             next_pod=("p8", 37)),
    ]


def pod_at(gpu: dict, minute: int) -> str | None:
    """The pod holding ``gpu`` at ``minute``."""
    switch = gpu.get("next_pod")
    return switch[0] if switch and minute >= switch[1] else gpu["pod"]


def _labels(gpu: dict, index: int, pod: str | None = None, rollup: bool = False) -> str:
    """The series' labels; ``rollup``: as the rollups keep them (no pod)."""
    parts = [f'UUID="{gpu["uuid"]}"', f'gpu="{index}"', 'Hostname="n1"']
    pod = pod or gpu["pod"]
    if pod:
        parts += [f'namespace="{gpu["namespace"]}"'] + ([] if rollup else [f'pod="{pod}"'])
    return ",".join(parts)


def _values(array: np.ndarray) -> str:
    return " ".join(f"{v:g}" for v in array)


def _held(gpu: dict) -> list[tuple[str | None, np.ndarray]]:
    """(pod, minutes 0/1) for each pod that held the GPU (one entry, pod None, for no pod)."""
    minute = np.arange(MINUTES)
    pods = [pod_at(gpu, m) for m in minute]
    return [(pod, np.array([p == pod for p in pods])) for pod in dict.fromkeys(pods)]


def _values_while(array: np.ndarray, held: np.ndarray) -> str:
    """Values where held, a staleness marker where the series ends, nothing elsewhere (promtool)."""
    out = []
    for m, value in enumerate(array):
        if held[m]:
            out.append(f"{value:g}")
        else:
            out.append("stale" if m and held[m - 1] else "_")
    return " ".join(out)


def samples() -> pd.DataFrame:
    frames = []
    for index, gpu in enumerate(gpus()):
        frame = {name: np.full(MINUTES, np.nan) for name in SAMPLE_COLUMN_NAMES}
        frame.update(
            timestamp=START + pd.to_timedelta(np.arange(MINUTES), unit="m"), cluster="c", node="train-h100-000",
            gpu_uuid=gpu["uuid"], gpu_index=index, model="NVIDIA H100 80GB HBM3", mig_instance=None,
            pod=[pod_at(gpu, m) for m in range(MINUTES)], namespace=gpu["namespace"], team=gpu["namespace"], project=None,
            attribution="known" if gpu["attr"] else None,
            gpu_util_ratio=_series(MINUTES, gpu["util"]) / 100.0,
            sm_active_ratio=_series(MINUTES, np.nan if gpu["sm"] is None else gpu["sm"]),
            mem_used_bytes=_series(MINUTES, gpu["used"] * MIB),
            mem_total_bytes=_series(MINUTES, (gpu["used"] + gpu["free"]) * MIB),
            power_watts=_series(MINUTES, gpu["watts"]),
        )
        frames.append(pd.DataFrame(frame))
    return pd.concat(frames, ignore_index=True)


def expected_states() -> pd.DataFrame:
    """The engine's state of every GPU at every minute (columns gpu_uuid, minute, state)."""
    frame = samples()
    ledger = build_ledger(frame, params=IdleParams(step="60s"), keep_rows=True, price=False)
    rows = ledger.classified.sort_index()
    return pd.DataFrame({"gpu_uuid": frame["gpu_uuid"].to_numpy(),
                         "minute": ((frame["timestamp"] - START).dt.total_seconds() // 60).astype(int).to_numpy(),
                         "state": rows["state"].astype(str).to_numpy()})


def render() -> str:
    states = expected_states()
    table = gpus()
    lines = [
        "# GENERATED by `python tests/rules_scenario.py > rules/tests/state.test.yml`: expectations are the",
        "# states gpuwarden.analytics.build_ledger gives the same samples (one GPU per state; see that module).",
        "rule_files:",
        "  - ../gpuwarden-recording.rules.yml",
        "evaluation_interval: 1m",
        "# no group_eval_order: the rollup reads the usage group's minutes one interval back, so either",
        "# order gives the same values (as Prometheus, which runs the groups independently)",
        "tests:",
        "  - interval: 1m",
        "    input_series:",
    ]
    for index, gpu in enumerate(table):
        minute = np.arange(MINUTES)
        columns = {"DCGM_FI_DEV_GPU_UTIL": _series(MINUTES, gpu["util"]),
                   "DCGM_FI_DEV_FB_USED": _series(MINUTES, gpu["used"]),
                   "DCGM_FI_DEV_FB_FREE": _series(MINUTES, gpu["free"]),
                   "DCGM_FI_DEV_POWER_USAGE": _series(MINUTES, gpu["watts"])}
        if gpu["sm"] is not None:
            columns["DCGM_FI_PROF_SM_ACTIVE"] = _series(MINUTES, gpu["sm"])
        for pod, held in _held(gpu):
            labels = _labels(gpu, index, pod)
            for metric, values in columns.items():
                lines += [f"      - series: '{metric}{{{labels}}}'", f"        values: '{_values_while(values[minute], held)}'"]
        labels = _labels(gpu, index)
        if gpu["attr"] and not gpu["pod"]:
            lines += [f"      - series: 'gpuwarden_pod_attribution_state{{{labels},state=\"known\"}}'",
                      f"        values: '{_values(np.ones(MINUTES))}'"]
    lines.append("    promql_expr_test:")
    for at in EVAL_MINUTES:
        lines += [f"      - expr: {STATE_METRIC}", f"        eval_time: {at}m", "        exp_samples:"]
        for index, gpu in enumerate(table):
            state = states.loc[(states["gpu_uuid"] == gpu["uuid"]) & (states["minute"] == at), "state"].item()
            lines += [f"          # {gpu['uuid']}: {state}",
                      f"          - labels: '{STATE_METRIC}{{{_labels(gpu, index, pod_at(gpu, at))}}}'",
                      f"            value: {STATE_CODES[state]}"]
    window = states[(states["minute"] > ROLLUP_AT - ROLLUP_LAG - 5) & (states["minute"] <= ROLLUP_AT - ROLLUP_LAG)]
    for figure, record in ROLLUP_METRICS.items():
        lines += [f"      - expr: {record}", f"        eval_time: {ROLLUP_AT}m", "        exp_samples:"]
        for index, gpu in enumerate(table):
            mine = window[window["gpu_uuid"] == gpu["uuid"]]
            for state, count in mine["state"].value_counts().sort_index().items():
                minutes = mine.loc[mine["state"] == state, "minute"].to_numpy()
                activity = _series(MINUTES, gpu["util"] / 100.0 if gpu["sm"] is None else gpu["sm"])[minutes]
                value = {"seconds": 60.0 * count,
                         "used_seconds": 60.0 * float(activity.sum()),
                         "energy_joules": 60.0 * gpu["watts"] * count,
                         "memory_byte_seconds": 60.0 * gpu["used"] * MIB * count}[figure]
                lines += [f"          - labels: '{record}{{{_labels(gpu, index, rollup=True)},state=\"{state}\"}}'",
                          f"            value: {value:.10g}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
