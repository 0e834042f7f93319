"""An independent fault-scenario generator, written apart from ``gpuwarden.sim`` on purpose: a
sanity check that ``gpuwarden health scan`` generalises beyond the simulator it was tuned on.

One H100 fleet (8 GPUs per node, 60 s samples, no pod labels at all), a GPU x time matrix built
with numpy: jobs come and go (busy ~1980 MHz / 550-690 W, idle 345 MHz / ~95 W), temperatures
follow load with a per-slot and per-node offset, and healthy GPUs carry background noise (an
SBE drizzle, PCIe replay bursts, NVLink CRC errors, some GPUs steadily noisier than others).
Confounders on healthy GPUs: application XIDs, driver reloads that reset every counter, a whole
node running hot for hours. Faults: HBM degrading (SBE climbing, then XID 48), row-remap failure
(correctable remaps climbing, then XID 64), cooling failure (+25 C over hours, then thermal
slowdown), PCIe degrading (replays climbing, then XID 79), NVLink degrading (CRC climbing, then
XID 74), a clock-only straggler (0.78x clock at unchanged power), sudden off-the-bus (XID 79) and
uncontained ECC (XID 95).

``generate(seed, nodes, days)`` -> (samples frame, truth frame). ``score(findings, truth, gpus)``
scores by GPU the way an outside judge would: a GPU is called faulty when it has any finding.

Run as a script to write a CSV and its truth:  python tests/scenarios_independent.py OUT.csv --seed 5
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

MODEL = "NVIDIA H100 80GB HBM3"
STEP_S = 60
FAULTS = ("hbm_degrading", "row_remap_failure", "cooling_failure", "pcie_degrading", "nvlink_degrading",
          "clock_straggler", "off_the_bus", "uncontained_ecc")
PRECURSOR_H = {"hbm_degrading": (3, 10), "row_remap_failure": (2, 8), "cooling_failure": (2, 6),
               "pcie_degrading": (1, 4), "nvlink_degrading": (2, 8)}
# The device columns, in the order the frame carries them (a GPU off the bus reports none of them).
ACTIVITY = ("gpu_util_ratio", "sm_active_ratio", "power_watts", "temperature_celsius", "sm_clock_mhz",
            "throttle_reasons_bitmask")
FATAL_XID = {"hbm_degrading": 48, "row_remap_failure": 64, "pcie_degrading": 79, "nvlink_degrading": 74,
             "off_the_bus": 79, "uncontained_ecc": 95, "cooling_failure": None, "clock_straggler": None}


def generate(seed: int = 0, nodes: int = 32, days: float = 3.0, faults_per_kind: int = 3,
             conditions: list[dict] | None = None):
    """``conditions``: where given, the node-wide condition (the hot node) is appended to it."""
    rng = np.random.default_rng(seed)
    gpus = nodes * 8
    steps = int(days * 86400 / STEP_S)
    t0 = pd.Timestamp("2026-03-02T00:00:00Z")

    # Jobs: each GPU alternates busy / idle spells; whole nodes share a job most of the time.
    busy = np.zeros((gpus, steps), dtype=bool)
    intensity = np.ones((gpus, steps))
    for n in range(nodes):
        t = int(rng.uniform(0, 6) * 60)
        while t < steps:
            length = int(rng.uniform(2, 20) * 60)
            if rng.random() < 0.65:
                members = np.arange(8) if rng.random() < 0.7 else rng.choice(8, size=rng.integers(1, 8), replace=False)
                busy[n * 8 + members, t:t + length] = True
                intensity[n * 8 + members, t:t + length] = rng.uniform(0.8, 1.0)
            t += length
    util = np.where(busy, np.clip(rng.normal(0.97, 0.02, (gpus, steps)), 0, 1), 0.0)
    sm = np.where(busy, np.clip(util * rng.uniform(0.75, 0.9), 0, 1), 0.0)
    power = np.where(busy, 690 * intensity + rng.normal(0, 12, (gpus, steps)), rng.normal(95, 3, (gpus, steps)))
    capped = busy & (intensity > 0.97)  # the heaviest jobs hit the power cap and run a little slower
    clock = np.where(busy, 1980.0, 345.0) - np.where(capped, rng.uniform(40, 120, (gpus, steps)), 0.0)
    slot = rng.normal(0, 3, gpus) + np.repeat(rng.normal(0, 2, nodes), 8)
    temp = np.where(busy, 33 + 0.055 * power, 31 + 0.05 * power) + slot[:, None] + rng.normal(0, 0.8, (gpus, steps))
    throttle = np.where(busy, 0, 0x1) | np.where(capped, 0x4, 0)

    counters = {name: np.zeros((gpus, steps)) for name in (
        "ecc_sbe_volatile_total", "ecc_dbe_volatile_total", "remapped_rows_correctable_total",
        "remapped_rows_uncorrectable_total", "pcie_replay_total", "nvlink_crc_flit_errors_total",
        "nvlink_crc_data_errors_total", "nvlink_replay_errors_total", "nvlink_recovery_errors_total")}
    xids = {code: np.zeros((gpus, steps)) for code in (13, 31, 43, 45, 48, 64, 68, 74, 79, 95)}
    gauges = {"remapped_rows_pending": np.zeros((gpus, steps)), "remapped_rows_failure": np.zeros((gpus, steps))}
    # Background noise (per-step increments), some GPUs steadily noisier.
    sbe_rate = rng.lognormal(np.log(0.4), 1.0, gpus) / 1440
    counters["ecc_sbe_volatile_total"] += rng.poisson(sbe_rate[:, None] * np.ones(steps))
    bursts = rng.random((gpus, steps)) < 3 / 1440
    counters["pcie_replay_total"] += bursts * rng.integers(1, 25, (gpus, steps))
    crc_rate = rng.lognormal(np.log(8), 1.2, gpus) / 1440
    counters["nvlink_crc_flit_errors_total"] += rng.poisson(crc_rate[:, None] * np.ones(steps))
    counters["nvlink_replay_errors_total"] += rng.poisson(crc_rate[:, None] * 0.1 * np.ones(steps))

    truth = []
    order = rng.permutation(gpus)
    used = 0
    margin = int(4 * 60)
    for kind in FAULTS:
        for _ in range(faults_per_kind):
            g = int(order[used])
            used += 1
            lo, hi = PRECURSOR_H.get(kind, (0, 0))
            pre = int(rng.uniform(lo, hi) * 60)
            fatal = int(rng.integers(pre + margin, steps - margin))
            onset = fatal - pre
            busy[g, onset:] = True if kind in ("clock_straggler", "cooling_failure") else busy[g, onset:]
            _apply(kind, g, onset, fatal, steps, rng, counters, xids, gauges, util, sm, power, clock, temp, throttle, busy)
            truth.append({"kind": kind, "gpu_uuid": _uuid(seed, g), "node": f"h100-{g // 8:03d}",
                          "onset": t0 + pd.Timedelta(minutes=onset),
                          "fatal_at": t0 + pd.Timedelta(minutes=fatal) if FATAL_XID[kind] or kind == "cooling_failure" else pd.NaT,
                          "fatal": kind != "clock_straggler", "has_precursor": pre > 0})
    # Confounders on healthy GPUs.
    healthy = order[used:]
    for g in rng.choice(healthy, size=max(2, gpus // 25), replace=False):
        code = int(rng.choice([13, 31, 43, 45, 68]))
        xids[code][g, int(rng.integers(0, steps)):] += 1
    reloads = [(int(g), int(rng.integers(steps // 4, steps))) for g in rng.choice(healthy, size=max(2, gpus // 25), replace=False)]
    hot_node = int(healthy[0] // 8)
    start = int(rng.integers(0, steps // 2))
    ramp = np.clip((np.arange(steps) - start) / 60.0, 0, 1) * (np.arange(steps) < start + 10 * 60)
    temp[hot_node * 8:hot_node * 8 + 8] += 14 * ramp
    if conditions is not None:
        conditions.append({"kind": "hot_node", "node": f"h100-{hot_node:03d}", "start": t0 + pd.Timedelta(minutes=start),
                           "end": t0 + pd.Timedelta(minutes=start + 10 * 60)})
    healthy_set = set(int(h) for h in healthy) - set(range(hot_node * 8, hot_node * 8 + 8))

    rows = {}
    g_index, s_index = np.meshgrid(np.arange(gpus), np.arange(steps), indexing="ij")
    rows["timestamp"] = (t0 + pd.to_timedelta(s_index.ravel() * STEP_S, unit="s"))
    rows["cluster"] = "indep"
    rows["node"] = np.array([f"h100-{g // 8:03d}" for g in range(gpus)])[g_index.ravel()]
    rows["gpu_uuid"] = np.array([_uuid(seed, g) for g in range(gpus)])[g_index.ravel()]
    rows["gpu_index"] = (g_index % 8).ravel()
    rows["model"] = MODEL
    rows["mem_total_bytes"] = 85e9
    rows["mem_used_bytes"] = np.where(busy, 7e10, 5e8).ravel()
    rows.update(zip(ACTIVITY, (a.ravel() for a in (util, sm, power, temp, clock, throttle))))
    for name, values in counters.items():
        rows[name] = _cumulative(values, reloads, rng).ravel()
    for name, values in gauges.items():
        rows[name] = values.ravel()
    for code, values in xids.items():
        rows[f"xid_{code}_total"] = np.cumsum(values, axis=1).clip(0).ravel() if code in (48, 64, 74, 79, 95) else values.ravel()
    frame = pd.DataFrame(rows)
    lost = np.zeros((gpus, steps), dtype=bool)
    for row in truth:
        if row["kind"] in ("off_the_bus", "pcie_degrading"):
            g = _gpu_of(row["gpu_uuid"], seed, gpus)
            lost[g, int((row["fatal_at"] - t0) / pd.Timedelta(minutes=1)) + 1:] = True
    frame.loc[lost.ravel(), list(ACTIVITY)] = np.nan  # a GPU off the bus reports nothing
    frame = frame.sort_values(["timestamp", "gpu_uuid"], kind="stable", ignore_index=True)
    return frame, pd.DataFrame(truth), sorted(_uuid(seed, g) for g in healthy_set), [_uuid(seed, g) for g in range(gpus)]


def _cumulative(increments: np.ndarray, reloads, rng) -> np.ndarray:
    """Increments -> counter readings. A reloaded GPU's counters carry a long history before the
    reload (thousands) and restart from 0 at it."""
    readings = np.cumsum(increments, axis=1)
    for g, at in reloads:
        readings[g, :at] += rng.integers(50, 5000)
        readings[g, at:] -= readings[g, at]  # the driver reload: the counter starts again from 0
    return readings


def _uuid(seed: int, g: int) -> str:
    return f"GPU-{seed:04x}{g:04x}-1a2b-4c3d-8e9f-{g * 7919 + seed:012x}"


def _gpu_of(uuid: str, seed: int, gpus: int) -> int:
    return next(g for g in range(gpus) if _uuid(seed, g) == uuid)


# PCIe (base, climb) and NVLink (flit base, flit climb, data, replay) per-minute ramps of the precursors.
RAMPS = {"pcie": (0.2, 30.0), "nvlink": (0.05, 8.0, 2.0, 1.0)}


def _apply(kind, g, onset, fatal, steps, rng, counters, xids, gauges, util, sm, power, clock, temp, throttle, busy,
           scale=1.0, ramps=RAMPS):
    """One fault on GPU ``g``; ``scale`` turns per-minute rates into per-step ones, ``ramps`` sets how
    steeply PCIe and NVLink errors climb."""
    span = max(fatal - onset, 1)
    progress = np.clip((np.arange(steps) - onset) / span, 0, 1) * (np.arange(steps) >= onset)
    pre = (np.arange(steps) >= onset) & (np.arange(steps) < fatal)
    if kind == "hbm_degrading":
        counters["ecc_sbe_volatile_total"][g] += rng.poisson(pre * (0.02 + 0.6 * progress ** 2) * scale)
        counters["ecc_dbe_volatile_total"][g, fatal] += 1
        xids[48][g, fatal] += 1
    elif kind == "row_remap_failure":
        counters["remapped_rows_correctable_total"][g] += rng.random(steps) < pre * (0.005 + 0.05 * progress) * scale
        counters["ecc_sbe_volatile_total"][g] += rng.poisson(pre * 0.1 * progress * scale)
        counters["remapped_rows_uncorrectable_total"][g, fatal] += 1
        gauges["remapped_rows_failure"][g, fatal:] = 1
        xids[64][g, fatal] += 1
    elif kind == "cooling_failure":
        temp[g] += 25 * progress
        after = np.arange(steps) >= fatal
        throttle[g] = np.where(after, throttle[g] | 0x40 | 0x20, throttle[g])
        clock[g] = np.where(after, clock[g] * 0.6, clock[g])
    elif kind == "pcie_degrading":
        base, climb = ramps["pcie"]
        counters["pcie_replay_total"][g] += rng.poisson(pre * (base + climb * progress ** 2) * scale)
        xids[79][g, fatal] += 1
    elif kind == "nvlink_degrading":
        base, climb, data, replay = ramps["nvlink"]
        counters["nvlink_crc_flit_errors_total"][g] += rng.poisson(pre * (base + climb * progress ** 2) * scale)
        counters["nvlink_crc_data_errors_total"][g] += rng.poisson(pre * data * progress ** 2 * scale)
        counters["nvlink_replay_errors_total"][g] += rng.poisson(pre * replay * progress ** 3 * scale)
        counters["nvlink_recovery_errors_total"][g, fatal] += 1
        xids[74][g, fatal] += 1
    elif kind == "clock_straggler":
        util[g, onset:] = np.clip(rng.normal(0.97, 0.02, steps - onset), 0, 1)
        sm[g, onset:] = util[g, onset:] * 0.85
        power[g, onset:] = 650 + rng.normal(0, 12, steps - onset)
        clock[g, onset:] = 1980 * 0.78
        throttle[g, onset:] = 0
    elif kind == "off_the_bus":
        xids[79][g, fatal] += 1
    elif kind == "uncontained_ecc":
        counters["ecc_dbe_volatile_total"][g, fatal] += 1
        xids[95][g, fatal] += 1


def score(findings: list[dict], truth: pd.DataFrame, healthy: list[str], all_gpus: list[str]) -> dict:
    """By GPU: faulty GPUs with any finding are hits; healthy GPUs with any finding false positives.
    Lead: the fatal time minus the first finding's first_seen (precursor faults)."""
    by_gpu: dict[str, list[dict]] = {}
    for f in findings:
        by_gpu.setdefault(f["gpu_uuid"], []).append(f)
    faulty = set(truth["gpu_uuid"])
    tp = sum(1 for g in faulty if g in by_gpu)
    fp = sum(1 for g in healthy if g in by_gpu)
    fp_confounders = sum(1 for g in all_gpus if g not in faulty and g not in healthy and g in by_gpu)
    fn = len(faulty) - tp
    precision = tp / (tp + fp + fp_confounders) if tp + fp + fp_confounders else 1.0
    recall = tp / (tp + fn) if tp + fn else 1.0
    leads, missed_fatal = [], 0
    for row in truth.itertuples():
        found = by_gpu.get(row.gpu_uuid, [])
        if row.fatal and not found:
            missed_fatal += 1
        if row.has_precursor and found and pd.notna(row.fatal_at):
            first = min(pd.Timestamp(f["first_seen"]) for f in found)
            leads.append(max((row.fatal_at - first).total_seconds() / 60.0, 0.0))
    cordons = sum(1 for g, fs in by_gpu.items() if g not in faulty and any(f["recommended_action"] in ("cordon", "drain") for f in fs))
    missed = sorted(set(truth.loc[~truth["gpu_uuid"].isin(by_gpu), "kind"]))
    false_kinds = sorted({f["kind"] for g, fs in by_gpu.items() if g not in faulty for f in fs})
    return {"tp": tp, "fp": fp + fp_confounders, "fn": fn, "precision": precision, "recall": recall,
            "f1": 2 * precision * recall / (precision + recall) if precision + recall else 0.0,
            "missed_fatal": missed_fatal, "median_lead_minutes": float(np.median(leads)) if leads else float("nan"),
            "cordon_on_healthy": cordons, "missed_kinds": missed, "false_kinds": false_kinds}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--days", type=float, default=3.0)
    args = parser.parse_args(argv)
    frame, truth, healthy, all_gpus = generate(args.seed, args.nodes, args.days)
    frame.to_csv(args.out, index=False)
    truth.to_csv(args.out + ".truth.csv", index=False)
    pd.Series(healthy, name="gpu_uuid").to_csv(args.out + ".healthy.csv", index=False)
    print(f"{len(frame):,} rows, {len(truth)} faults -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
