"""Node-wide conditions on healthy nodes (``SimConfig.node_conditions_per_node_day``): what every GPU of a node
does together with no GPU at fault, so that the health bench can check they are reported once as a
node condition and never as eight GPU faults. Kinds (each at that rate):

- ``power_cap``: a node power cap, every GPU at most ~60% of its TDP and ~0.82x its clock (sw power
  cap reason), 2-8 h;
- ``clock_policy``: clocks locked at ~0.85x, a little less power, no throttle reason, 2-8 h;
- ``hot_inlet``: inlet air ~+12 C over half an hour, busy GPUs hardware-thermal-throttling part of
  the time at ~0.93x clock, 2-8 h;
- ``driver_reload``: every counter of every GPU of the node resets at once.

The background noise's hot-but-healthy nodes (``HardwareSteps._background``) are in the same truth,
as ``hot_node``.

Drawn from their own random stream (jobs, faults and background noise stay the same either way);
the truth (``node_condition_truth``) never enters the samples. ``NodeConditions`` is mixed into
``Simulation`` through ``HardwareSteps``.
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pandas as pd

from gpuwarden.fleet import THROTTLE_REASONS, XID_COLUMN_NAMES

from .faults import NVLINK_COUNTERS
from .render import H200_TDP_WATTS

KINDS = ("power_cap", "clock_policy", "hot_inlet", "driver_reload")
COUNTERS = ("ecc_sbe_volatile_total", "ecc_dbe_volatile_total", "pcie_replay_total", *NVLINK_COUNTERS, *XID_COLUMN_NAMES)
HOT_BITS = THROTTLE_REASONS["hw_thermal_slowdown"] | THROTTLE_REASONS["sw_thermal_slowdown"]
CELSIUS_PER_WATT = 0.06  # less power runs cooler


class NodeConditions:
    """Node-wide conditions: drawn each step, applied to the rendered samples."""

    def _build_node_conditions(self) -> None:
        n_node = len(self.nodes)
        self.node_rng = np.random.default_rng([self.config.seed, 0x90DE])
        self.node_condition = np.full(n_node, "", dtype=object)
        self.node_condition_start = np.zeros(n_node)
        self.node_condition_end = np.full(n_node, -np.inf)
        self.node_condition_log: list[dict] = []

    def _node_conditions(self, now: float) -> None:
        rng, step = self.node_rng, self.config.step_seconds
        faulty_gpu = self.faults.busy_until > now
        faulty_node = np.zeros(len(self.nodes), dtype=bool)
        faulty_node[self.dev_node[faulty_gpu[self.dev_gpu]]] = True
        ended = self.node_condition_end <= now
        self.node_condition[ended] = ""
        for kind in KINDS:
            rate = self.config.node_conditions_per_node_day * step / 86400.0
            starting = (rng.random(len(self.nodes)) < rate) & ended & ~faulty_node
            for node in np.flatnonzero(starting):
                duration = step if kind == "driver_reload" else float(rng.uniform(2, 8)) * 3600.0
                self.node_condition[node] = kind
                self.node_condition_start[node], self.node_condition_end[node] = now, now + duration
                ended[node] = False
                self.node_condition_log.append({"kind": kind, "node": self.nodes[node].name, "start_s": now,
                                                "end_s": now + duration})
                if kind == "driver_reload":
                    gpus = np.unique(self.dev_gpu[self.dev_node == node])
                    for name in COUNTERS:
                        self.counters[name][gpus] = 0

    def _render_node_conditions(self, now: float, util, power, temp, clock, throttle) -> None:
        node = self.dev_node
        kind = self.node_condition[node]
        if not (kind != "").any():
            return
        before = power.copy()
        tdp = self.gpu_power_scale[self.dev_gpu] * H200_TDP_WATTS
        cap = kind == "power_cap"
        power[cap] = np.minimum(power[cap], 0.6 * tdp[cap])
        clock[cap] *= 0.82
        throttle[cap & (util > 0.05)] |= THROTTLE_REASONS["sw_power_cap"]
        policy = kind == "clock_policy"
        clock[policy] *= 0.85
        power[policy] *= 0.9
        hot = kind == "hot_inlet"
        warm = np.clip((now - self.node_condition_start[node]) / 1800.0, 0.0, 1.0)
        temp[hot] += 12.0 * warm[hot]
        throttling = hot & (warm > 0.8) & (util > 0.5) & (self.node_rng.random(node.size) < 0.6)
        throttle[throttling] |= HOT_BITS
        clock[throttling] *= 0.93
        temp += CELSIUS_PER_WATT * (power - before)

    def node_condition_truth(self) -> pd.DataFrame:
        """The node-wide conditions started so far (kind, node, start, end). Never part of the samples."""
        rows = [{"kind": r["kind"], "node": r["node"], "start": self.origin + timedelta(seconds=r["start_s"]),
                 "end": self.origin + timedelta(seconds=r["end_s"])} for r in self.node_condition_log]
        frame = pd.DataFrame(rows, columns=["kind", "node", "start", "end"])
        for name in ("start", "end"):
            frame[name] = pd.to_datetime(frame[name], utc=True)
        return frame
