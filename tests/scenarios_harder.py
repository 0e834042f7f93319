"""The independent generator's harder fleets (``generate_harder``), written apart from
``gpuwarden.sim`` like :mod:`scenarios_independent` (whose helpers it shares): what real fleets
look like and the simulator's default fleet does not.

- **Mixed GPU models in one fleet**, one model per node (H100, A100 80GB, H200, L40S: different
  idle / busy clocks, TDPs and temperatures; the L40S has no NVLink, so no NVLink counters);
  nodes are named ``<model>-<n>`` so each model is its own node pool.
- **15 s or 30 s steps** (``step_s``), with idle dips inside jobs (a data-loading pause drops the
  clock to the idle clock for a step or two) besides the idle spells between jobs.
- **Scrape gaps**: whole-fleet gaps and per-node gaps of 5 to 60 minutes (rows simply absent).
- **Lifetime counters**: every counter starts at a large value of its own (its history).
- **Node-wide conditions on healthy nodes** (every GPU of the node changes together, no fault):
  ``power_cap`` (a node power cap: all 8 GPUs at ~60% of TDP and ~0.82x clock, sw power cap bit),
  ``hot_inlet`` (all 8 +12 C, with hardware thermal slowdown flags and a slightly lower clock),
  ``driver_reload`` (every counter of all 8 resets at once), ``clock_policy`` (clocks locked at
  ~0.85x with no throttle reason at all: exactly what 8 stragglers would look like).
- **Gentler NVLink and PCIe degradation**: ramps over 4-12 h (NVLink) and 3-10 h (PCIe) at a
  fraction of today's rates, so the precursor, not only the fatal XID, must be found.

``generate_harder(seed, nodes, days, step_s, faults_per_kind)`` -> (samples, truth, healthy GPU
uuids, all GPU uuids, node conditions); ``score_harder(findings, ...)`` adds the node-level
figures to :func:`scenarios_independent.score`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from scenarios_independent import ACTIVITY, FATAL_XID, FAULTS, _apply, _cumulative, _uuid, score

# model -> (node prefix, busy clock MHz, idle clock MHz, TDP W, idle W, temperature at 0 W C,
#           C per W, has NVLink)
MODELS: dict[str, tuple[str, float, float, float, float, float, float, bool]] = {
    "NVIDIA H100 80GB HBM3": ("h100", 1980.0, 345.0, 700.0, 95.0, 33.0, 0.055, True),
    "NVIDIA A100-SXM4-80GB": ("a100", 1410.0, 210.0, 400.0, 60.0, 30.0, 0.090, True),
    "NVIDIA H200": ("h200", 1980.0, 345.0, 700.0, 110.0, 31.0, 0.050, True),
    "NVIDIA L40S": ("l40s", 2520.0, 210.0, 350.0, 35.0, 28.0, 0.120, False),
}
NODE_PATTERN = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA H200",
                "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA L40S", "NVIDIA A100-SXM4-80GB")
NODE_CONDITIONS = ("power_cap", "hot_inlet", "driver_reload", "clock_policy")  # needs 2 H100 and 2 A100 nodes
PRECURSOR_H = {"hbm_degrading": (3, 10), "row_remap_failure": (2, 8), "cooling_failure": (2, 6),
               "pcie_degrading": (3, 10), "nvlink_degrading": (4, 12)}
COUNTER_NAMES = ("ecc_sbe_volatile_total", "ecc_dbe_volatile_total", "remapped_rows_correctable_total",
                 "remapped_rows_uncorrectable_total", "pcie_replay_total", "nvlink_crc_flit_errors_total",
                 "nvlink_crc_data_errors_total", "nvlink_replay_errors_total", "nvlink_recovery_errors_total")
FATAL_CODES = (48, 64, 74, 79, 95)
# Gentle precursors: PCIe replays at a seventh of today's climb, NVLink errors at a fifth (scenarios_independent.RAMPS).
GENTLE_RAMPS = {"pcie": (0.05, 4.0), "nvlink": (0.02, 1.5, 0.3, 0.2)}


def generate_harder(seed: int = 0, nodes: int = 16, days: float = 2.0, step_s: int = 30, faults_per_kind: int = 2):
    if 60 % step_s:
        raise ValueError(f"step_s={step_s}: use a divisor of 60 (15, 20, 30 or 60)")
    rng = np.random.default_rng(seed + 10_000)  # its own stream: not today's scenario of the same seed
    per_min = 60 // step_s
    gpus = nodes * 8
    steps = int(days * 86400 / step_s)
    t0 = pd.Timestamp("2026-03-02T00:00:00Z")
    node_model = [NODE_PATTERN[n % len(NODE_PATTERN)] for n in range(nodes)]
    counts: dict[str, int] = {}
    node_names = []
    for model in node_model:
        counts[model] = counts.get(model, -1) + 1
        node_names.append(f"{MODELS[model][0]}-{counts[model]:03d}")
    spec = np.array([MODELS[node_model[g // 8]][1:7] for g in range(gpus)])  # busy, idle, tdp, idle_w, t0, c/w
    busy_clk, idle_clk, tdp, idle_w, temp0, per_w = (spec[:, i:i + 1] for i in range(6))
    nvlink = np.array([MODELS[node_model[g // 8]][7] for g in range(gpus)])

    busy = np.zeros((gpus, steps), dtype=bool)
    intensity = np.ones((gpus, steps))
    for n in range(nodes):
        t = int(rng.uniform(0, 6) * 60 * per_min)
        while t < steps:
            length = int(rng.uniform(2, 20) * 60 * per_min)
            if rng.random() < 0.65:
                members = np.arange(8) if rng.random() < 0.7 else rng.choice(8, size=rng.integers(1, 8), replace=False)
                busy[n * 8 + members, t:t + length] = True
                intensity[n * 8 + members, t:t + length] = rng.uniform(0.8, 1.0)
            t += length
    # Node-wide conditions go to healthy H100 / A100 nodes (the pools with the most peers); a whole-node
    # job runs through a power cap or clock policy (on an idle node neither shows).
    if nodes < 5:
        raise ValueError(f"nodes={nodes}: the node-wide conditions need at least 5 nodes (2 H100, 2 A100)")
    # The two that slow a node go to different pools (a pool slowed as a whole has no peers left).
    h100 = [int(n) for n in rng.permutation([n for n in range(nodes) if node_names[n].startswith("h100")])]
    a100 = [int(n) for n in rng.permutation([n for n in range(nodes) if node_names[n].startswith("a100")])]
    chosen = [h100[0], a100[0], h100[1], a100[1]]  # power_cap, hot_inlet, driver_reload, clock_policy
    conditions, reloads, spells = [], [], []
    for kind, n in zip(NODE_CONDITIONS, chosen):
        start = int(rng.uniform(0.25, 0.55) * steps)
        end = min(steps, start + int(rng.uniform(3, 8) * 3600 / step_s)) if kind != "driver_reload" else start + 1
        if kind in ("power_cap", "clock_policy"):
            busy[n * 8:n * 8 + 8, start:end] = True
            intensity[n * 8:n * 8 + 8, start:end] = rng.uniform(0.8, 0.95)
        if kind == "driver_reload":
            reloads += [(g, start) for g in range(n * 8, n * 8 + 8)]
        spells.append((kind, n, start, end))
        conditions.append({"kind": kind, "node": node_names[n], "start": t0 + pd.Timedelta(seconds=start * step_s),
                           "end": t0 + pd.Timedelta(seconds=end * step_s)})
    busy &= ~(rng.random((gpus, steps)) < 0.03)  # data-loading pauses: a step or so at idle clocks
    util = np.where(busy, np.clip(rng.normal(0.97, 0.02, (gpus, steps)), 0, 1), 0.0)
    sm = np.where(busy, np.clip(util * rng.uniform(0.75, 0.9), 0, 1), 0.0)
    power = np.where(busy, tdp * 0.98 * intensity + rng.normal(0, 0.017, (gpus, steps)) * tdp,
                     idle_w + rng.normal(0, 3, (gpus, steps)))
    capped = busy & (intensity > 0.97)
    clock = np.where(busy, busy_clk, idle_clk) - np.where(capped, rng.uniform(0.02, 0.06, (gpus, steps)) * busy_clk, 0.0)
    slot = rng.normal(0, 3, gpus) + np.repeat(rng.normal(0, 2, nodes), 8)
    temp = temp0 + per_w * power + slot[:, None] + rng.normal(0, 0.8, (gpus, steps))
    throttle = np.where(busy, 0, 0x1) | np.where(capped, 0x4, 0)

    scale = step_s / 60.0  # per-minute rates -> per step
    counters = {name: np.zeros((gpus, steps)) for name in COUNTER_NAMES}
    xids = {code: np.zeros((gpus, steps)) for code in (13, 31, 43, 45, 48, 64, 68, 74, 79, 95)}
    gauges = {"remapped_rows_pending": np.zeros((gpus, steps)), "remapped_rows_failure": np.zeros((gpus, steps))}
    sbe_rate = rng.lognormal(np.log(0.4), 1.0, gpus) / 1440 * scale
    counters["ecc_sbe_volatile_total"] += rng.poisson(sbe_rate[:, None] * np.ones(steps))
    bursts = rng.random((gpus, steps)) < 3 / 1440 * scale
    counters["pcie_replay_total"] += bursts * rng.integers(1, 25, (gpus, steps))
    crc_rate = rng.lognormal(np.log(8), 1.2, gpus) / 1440 * scale
    counters["nvlink_crc_flit_errors_total"] += rng.poisson(crc_rate[:, None] * np.ones(steps))
    counters["nvlink_replay_errors_total"] += rng.poisson(crc_rate[:, None] * 0.1 * np.ones(steps))

    for kind, n, start, end in spells:
        _node_condition(kind, slice(n * 8, n * 8 + 8), start, end, rng, busy, util, power, clock, temp, throttle, tdp,
                        busy_clk, per_w)

    truth, used = [], set(g for n in chosen for g in range(n * 8, n * 8 + 8))
    order = [int(g) for g in rng.permutation(gpus) if int(g) not in used]
    margin = 4 * 3600 // step_s
    faults_on = np.zeros(nodes, dtype=int)
    for kind in FAULTS:
        for _ in range(faults_per_kind):
            # spread over nodes: the GPU of the node with the fewest faults so far
            # (a straggler only where its model has another node: with its node-mates idle, a GPU of a
            # one-node pool has no peer at its operating point and nobody could call it slow)
            candidates = [g for g in order if g not in used and (nvlink[g] or kind != "nvlink_degrading")
                          and (node_model.count(node_model[g // 8]) > 1 or kind != "clock_straggler")]
            g = min(candidates, key=lambda g: faults_on[g // 8])
            faults_on[g // 8] += 1
            used.add(g)
            lo, hi = PRECURSOR_H.get(kind, (0, 0))
            pre = int(rng.uniform(lo, hi) * 3600 / step_s)
            fatal = int(rng.integers(pre + margin, steps - margin))
            onset = fatal - pre
            if kind in ("clock_straggler", "cooling_failure"):
                busy[g, onset:] = True
            _fault(kind, g, onset, fatal, steps, rng, scale, counters, xids, gauges, util, sm, power, clock, temp,
                   throttle, tdp[g, 0], busy_clk[g, 0], per_w[g, 0])
            truth.append({"kind": kind, "gpu_uuid": _uuid(seed, g), "node": node_names[g // 8],
                          "onset": t0 + pd.Timedelta(seconds=onset * step_s),
                          "fatal_at": (t0 + pd.Timedelta(seconds=fatal * step_s)
                                       if FATAL_XID[kind] or kind == "cooling_failure" else pd.NaT),
                          "fatal": kind != "clock_straggler", "has_precursor": pre > 0})
    healthy_gpus = [g for g in range(gpus) if g not in used or g // 8 in chosen]
    for g in rng.choice([g for g in healthy_gpus if g // 8 not in chosen], size=max(2, gpus // 25), replace=False):
        xids[int(rng.choice([13, 31, 43, 45, 68]))][g, int(rng.integers(0, steps)):] += 1

    lifetime = {name: rng.integers(10_000, 50_000_000, gpus).astype(float) for name in COUNTER_NAMES}
    rows: dict[str, object] = {}
    g_index, s_index = np.meshgrid(np.arange(gpus), np.arange(steps), indexing="ij")
    rows["timestamp"] = t0 + pd.to_timedelta(s_index.ravel() * step_s, unit="s")
    rows["cluster"] = "harder"
    rows["node"] = np.array(node_names)[g_index.ravel() // 8]
    rows["gpu_uuid"] = np.array([_uuid(seed, g) for g in range(gpus)])[g_index.ravel()]
    rows["gpu_index"] = (g_index % 8).ravel()
    rows["model"] = np.array(node_model)[g_index.ravel() // 8]
    rows.update(zip(ACTIVITY, (a.ravel() for a in (util, sm, power, temp, clock, throttle))))
    for name, values in counters.items():
        readings = _cumulative(values, [], rng) + lifetime[name][:, None]
        for g, at in reloads:  # the driver reload: every counter of the node starts again from 0
            readings[g, at:] -= readings[g, at] - values[g, at]
        if name.startswith("nvlink_"):
            readings[~nvlink] = np.nan  # no NVLink: never measured
        rows[name] = readings.ravel()
    for name, values in gauges.items():
        rows[name] = values.ravel()
    for code, values in xids.items():
        rows[f"xid_{code}_total"] = np.cumsum(values, axis=1).ravel() if code in FATAL_CODES else values.ravel()
    frame = pd.DataFrame(rows)
    keep = _gaps(rng, nodes, steps, step_s)
    lost = np.zeros((gpus, steps), dtype=bool)
    for row in truth:
        if row["kind"] in ("off_the_bus", "pcie_degrading"):
            g = next(g for g in range(gpus) if _uuid(seed, g) == row["gpu_uuid"])
            lost[g, int((row["fatal_at"] - t0).total_seconds() // step_s) + 1:] = True
    frame.loc[lost.ravel(), list(ACTIVITY)] = np.nan
    frame = frame[keep.ravel()].sort_values(["timestamp", "gpu_uuid"], kind="stable", ignore_index=True)
    return (frame, pd.DataFrame(truth), sorted(_uuid(seed, g) for g in healthy_gpus),
            [_uuid(seed, g) for g in range(gpus)], pd.DataFrame(conditions))


def _node_condition(kind, gpus, start, end, rng, busy, util, power, clock, temp, throttle, tdp, busy_clk, per_w) -> None:
    """A condition every GPU of one node shares (no GPU is faulty). Less power runs cooler."""
    span = slice(start, end)
    on = busy[gpus, span]
    before = power[gpus, span].copy()
    if kind == "power_cap":
        cap = 0.6 * tdp[gpus]
        power[gpus, span] = np.where(on, np.minimum(power[gpus, span], cap), power[gpus, span])
        clock[gpus, span] = np.where(on, busy_clk[gpus] * rng.uniform(0.8, 0.84, on.shape), clock[gpus, span])
        throttle[gpus, span] = np.where(on, throttle[gpus, span] | 0x4, throttle[gpus, span])
    elif kind == "clock_policy":
        clock[gpus, span] = np.where(on, busy_clk[gpus] * 0.85, clock[gpus, span])
        power[gpus, span] = np.where(on, power[gpus, span] * 0.9, power[gpus, span])
        throttle[gpus, span] = np.where(on, 0, throttle[gpus, span])
    elif kind == "hot_inlet":
        ramp = np.clip(np.arange(end - start) / max((end - start) / 6, 1), 0, 1)
        temp[gpus, span] += 12 * ramp
        hot = on & (ramp > 0.8) & (rng.random(on.shape) < 0.7)
        throttle[gpus, span] = np.where(hot, throttle[gpus, span] | 0x40 | 0x20, throttle[gpus, span])
        clock[gpus, span] = np.where(hot, clock[gpus, span] * 0.93, clock[gpus, span])
    temp[gpus, span] += per_w[gpus] * (power[gpus, span] - before)
    # driver_reload: counters only (applied when they are made cumulative)


def _fault(kind, g, onset, fatal, steps, rng, scale, counters, xids, gauges, util, sm, power, clock, temp,
           throttle, tdp, busy_clk, per_w) -> None:
    if kind != "clock_straggler":  # as today's, per step, with the gentle ramps
        _apply(kind, g, onset, fatal, steps, rng, counters, xids, gauges, util, sm, power, clock, temp, throttle, None,
               scale=scale, ramps=GENTLE_RAMPS)
        return
    n = steps - onset  # a straggler at its own model's clock and power
    util[g, onset:] = np.clip(rng.normal(0.97, 0.02, n), 0, 1)
    sm[g, onset:] = util[g, onset:] * 0.85
    before = power[g, onset:].copy()
    power[g, onset:] = tdp * 0.93 + rng.normal(0, 0.017 * tdp, n)
    temp[g, onset:] += per_w * (power[g, onset:] - before)  # busy from the onset: as warm as its load
    clock[g, onset:] = busy_clk * 0.78
    throttle[g, onset:] = 0


def _gaps(rng, nodes: int, steps: int, step_s: int) -> np.ndarray:
    """Rows kept: two whole-fleet scrape gaps and a per-node gap on a quarter of the nodes, each 5-60 min."""
    keep = np.ones((nodes * 8, steps), dtype=bool)
    for _ in range(2):
        start, length = int(rng.integers(0, steps)), int(rng.uniform(5, 60) * 60 / step_s)
        keep[:, start:start + length] = False
    for n in rng.choice(nodes, size=max(1, nodes // 4), replace=False):
        start, length = int(rng.integers(0, steps)), int(rng.uniform(5, 60) * 60 / step_s)
        keep[n * 8:n * 8 + 8, start:start + length] = False
    return keep


def score_harder(findings: list[dict], truth: pd.DataFrame, healthy: list[str], all_gpus: list[str],
                 conditions: pd.DataFrame) -> dict:
    """:func:`scenarios_independent.score` over the GPU findings, plus the node level: node-wide
    conditions reported as node findings (``node_conditions_found``, of ``node_conditions``), node
    findings on nodes with no condition (``false_node_findings``), and per-GPU findings on the GPUs of
    a node-wide condition that is not faulty itself (``per_gpu_on_node_conditions``: must be 0; they
    count as false positives in the GPU score too)."""
    per_gpu = [f for f in findings if f.get("gpu_uuid")]
    on_node = [f for f in findings if not f.get("gpu_uuid")]
    result = score(per_gpu, truth, healthy, all_gpus)
    condition_nodes = set(conditions["node"])
    reported = {f["node"] for f in on_node}
    result.update(
        node_conditions=len(condition_nodes), node_conditions_found=len(condition_nodes & reported),
        false_node_findings=len(reported - condition_nodes),
        per_gpu_on_node_conditions=sum(1 for f in per_gpu if f["node"] in condition_nodes
                                       and f["gpu_uuid"] not in set(truth["gpu_uuid"])),
    )
    return result


# -- gentle precursors (issue 35 item 4): slower, sparser ramps and milder stragglers ----------------

GENTLE_KINDS = ("nvlink_gentle", "pcie_gentle", "mild_straggler")
_DEVICE = ("gpu_util_ratio", "sm_active_ratio", "power_watts", "temperature_celsius", "sm_clock_mhz",
           "throttle_reasons_bitmask")


def add_gentle_precursors(frame: pd.DataFrame, seed: int, step_s: int, per_kind: int = 3, avoid=()):
    """Gentle faults over a healthy harder fleet (``generate_harder(..., faults_per_kind=0)``), one per
    node, never on the nodes in ``avoid`` (its node conditions): NVLink CRC (flit or data) errors rising
    to 0.03-0.4 a minute over 4-12 h, PCIe replays to 0.05-0.6 a minute over 3-10 h (as progress to the
    power 1-3; increments clumped threefold in 30% of them; the GPU reset mid-ramp, every counter from
    0, in 40%), then XID 74 / XID 79 (the GPU off the bus after); a mild straggler at 0.85-0.95x clock
    while busy (power unchanged or 0-5% lower). Returns (samples, truth)."""
    rng = np.random.default_rng(seed + 777)
    frame = frame.copy()
    t0 = frame["timestamp"].min()
    steps = int((frame["timestamp"].max() - t0).total_seconds() // step_s) + 1
    gpus = frame.drop_duplicates("gpu_uuid")[["gpu_uuid", "node", "model"]].reset_index(drop=True)
    pools = gpus.drop_duplicates("node").groupby("model").size()
    uuid = frame["gpu_uuid"].to_numpy()
    step_of = ((frame["timestamp"] - t0).dt.total_seconds() // step_s).astype(int).to_numpy()
    order, used, truth = rng.permutation(len(gpus)), set(avoid), []
    for kind in GENTLE_KINDS:
        for _ in range(per_kind):
            i = next(int(i) for i in order if gpus.node[i] not in used
                     and (kind != "nvlink_gentle" or "L40S" not in gpus.model[i])
                     and (kind != "mild_straggler" or pools[gpus.model[i]] > 1))
            used.add(gpus.node[i])
            rows = np.flatnonzero(uuid == gpus.gpu_uuid[i])
            at = step_of[rows]
            lo, hi = {"nvlink_gentle": (4, 12), "pcie_gentle": (3, 10), "mild_straggler": (0, 0)}[kind]
            pre, margin = int(rng.uniform(lo, hi) * 3600 / step_s), 4 * 3600 // step_s
            fatal = int(rng.integers(pre + margin, steps - margin))
            onset = fatal - pre if pre else int(rng.integers(steps // 6, steps // 2))
            info: dict = {}
            if kind == "mild_straggler":
                factor = rng.uniform(0.85, 0.95)
                on = rows[(at >= onset) & (frame["gpu_util_ratio"].to_numpy()[rows] > 0.5)]
                frame.loc[on, "sm_clock_mhz"] *= factor
                if rng.random() < 0.5:
                    frame.loc[on, "power_watts"] *= rng.uniform(0.95, 1.0)
                info = {"factor": factor}
            else:
                grid = np.arange(steps)
                progress = np.clip((grid - onset) / (fatal - onset), 0, 1) * (grid >= onset) * (grid < fatal)
                end = rng.uniform(0.03, 0.4) if kind == "nvlink_gentle" else rng.uniform(0.05, 0.6)
                inc = rng.poisson(end * progress ** rng.choice([1.0, 2.0, 3.0]) * step_s / 60)
                if rng.random() < 0.3:
                    inc = inc * rng.choice([1, 1, 1, 3], size=steps)
                column = ("pcie_replay_total" if kind == "pcie_gentle" else
                          str(rng.choice(["nvlink_crc_flit_errors_total", "nvlink_crc_data_errors_total"])))
                frame.loc[rows, column] += np.cumsum(inc)[at]
                if rng.random() < 0.4:  # a GPU reset mid-ramp: every counter starts again from 0
                    after = rows[at >= int(onset + rng.uniform(0.3, 0.7) * (fatal - onset))]
                    for name in COUNTER_NAMES:
                        if after.size and np.isfinite(frame.at[after[0], name]):
                            frame.loc[after, name] -= frame.at[after[0], name]
                xid = 74 if kind == "nvlink_gentle" else 79
                frame.loc[rows[at >= fatal], f"xid_{xid}_total"] += 1
                if xid == 79:
                    frame.loc[rows[at > fatal], list(_DEVICE)] = np.nan
                info = {"end_per_minute": end, "events": int(np.cumsum(inc)[fatal - 1])}
            truth.append({"kind": kind, "gpu_uuid": gpus.gpu_uuid[i], "node": gpus.node[i], "model": gpus.model[i],
                          "onset": t0 + pd.Timedelta(seconds=onset * step_s),
                          "fatal_at": t0 + pd.Timedelta(seconds=fatal * step_s) if pre else pd.NaT, **info})
    return frame, pd.DataFrame(truth)


def gentle_report(seeds, steps=(30, 15), per_kind: int = 3) -> dict:
    """Per gentle kind over ``seeds`` x ``steps`` (16 nodes x 2 days): faults, found, found before the
    fatal event, median lead (min); and healthy GPUs with a finding, and with a cordon or drain."""
    from gpuwarden.analytics.health import scan
    from gpuwarden.fleet import ActionKind

    kinds: dict[str, list[tuple[bool, float]]] = {kind: [] for kind in GENTLE_KINDS}
    false, cordons = 0, 0
    for seed in seeds:
        for step in steps:
            base, _, _, _, conditions = generate_harder(seed, nodes=16, days=2.0, step_s=step, faults_per_kind=0)
            frame, truth = add_gentle_precursors(base, seed, step, per_kind, avoid=set(conditions["node"]))
            found: dict[str, list] = {}
            for f in scan(frame):
                if f.gpu_uuid and not f.kind.startswith("app-xid"):
                    found.setdefault(f.gpu_uuid, []).append(f)
            for row in truth.itertuples():
                first = min((pd.Timestamp(f.first_seen) for f in found.get(row.gpu_uuid, [])), default=None)
                lead = (row.fatal_at - first).total_seconds() / 60 if first is not None and pd.notna(row.fatal_at) else np.nan
                kinds[row.kind].append((first is not None, lead))
            healthy = [fs for g, fs in found.items() if g not in set(truth["gpu_uuid"])]
            false += len(healthy)
            cordons += sum(any(f.recommended_action in (ActionKind.CORDON, ActionKind.DRAIN) for f in fs) for fs in healthy)
    out = {}
    for kind, rows in kinds.items():
        leads = [lead for hit, lead in rows if hit and np.isfinite(lead)]
        out[kind] = {"faults": len(rows), "found": sum(hit for hit, _ in rows),
                     "before_fatal": sum(1 for hit, lead in rows if hit and not lead <= 0),
                     "median_lead_minutes": float(np.median(leads)) if leads else float("nan")}
    out["healthy"] = {"with_findings": false, "cordons": cordons}
    return out
