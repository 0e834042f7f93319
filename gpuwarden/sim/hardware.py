"""Hardware over time in the simulated fleet: background noise on healthy GPUs, injected faults and
their repair, application XIDs, spot reclaims. ``HardwareSteps`` is mixed into ``Simulation``.
"""

from __future__ import annotations

import numpy as np

from gpuwarden.fleet import XID_COLUMN_NAMES, xid_column

from .faults import APPLICATION_XID_RATE_PER_GPU_DAY, APPLICATION_XIDS, NVLINK_COUNTERS, FaultEvent
from .node_conditions import NodeConditions


class HardwareSteps(NodeConditions):
    """One step of noise, faults, node-wide conditions and reclaims (mixed into ``Simulation``)."""

    def _build_noise(self) -> None:
        """Background noise of healthy GPUs, from its own random stream (jobs and faults do not
        change when it is switched on): per-GPU steady error rates (log-normal: most GPUs quiet,
        a few noisier), per-node temperature offsets, hot-node episodes, driver reloads."""
        cfg = self.config
        n_gpu, n_node = len(self.gpus), len(self.nodes)
        rng = self.noise_rng = np.random.default_rng([cfg.seed, 0x5EED])
        per_step = cfg.step_seconds / 86400.0
        self.noise_sbe = rng.lognormal(np.log(0.3), 1.0, n_gpu) * per_step  # SBE per step
        self.noise_nvlink = rng.lognormal(np.log(5.0), 1.2, n_gpu) * per_step  # NVLink CRC per step
        self.noise_pcie_bursts = np.full(n_gpu, 2.0 * per_step)  # PCIe replay bursts per step
        self.node_temp_offset = rng.normal(0.0, 2.0, n_node)
        self.hot_node_start = np.full(n_node, -np.inf)
        self.hot_node_end = np.full(n_node, -np.inf)
        self.hot_node_celsius = np.zeros(n_node)
        # Attribution: which nodes' samples carry pod labels.
        if cfg.attribution == "off":
            self.node_attributed = np.zeros(n_node, dtype=bool)
        elif cfg.attribution == "mixed":
            self.node_attributed = (np.arange(n_node) % 3) != 1
        else:
            self.node_attributed = np.ones(n_node, dtype=bool)
        self._build_node_conditions()

    def _background(self, now: float) -> None:
        """One step of noise on every GPU, and the confounders: hot-but-healthy nodes, driver
        reloads that reset the volatile counters of a healthy GPU."""
        rng, c, step = self.noise_rng, self.counters, self.config.step_seconds
        c["ecc_sbe_volatile_total"] += rng.poisson(self.noise_sbe)
        crc = rng.poisson(self.noise_nvlink)
        c["nvlink_crc_flit_errors_total"] += crc
        c["nvlink_replay_errors_total"] += rng.binomial(crc, 0.1)
        bursts = rng.random(len(self.gpus)) < self.noise_pcie_bursts
        c["pcie_replay_total"] += bursts * rng.integers(1, 20, len(self.gpus))
        per_step = step / 86400.0
        starting = (rng.random(len(self.nodes)) < 0.05 * per_step) & (self.hot_node_end < now)
        for node in np.flatnonzero(starting):
            self.hot_node_start[node] = now
            self.hot_node_end[node] = now + float(rng.uniform(2, 10)) * 3600.0
            self.hot_node_celsius[node] = float(rng.uniform(8, 15))
            self.node_condition_log.append({"kind": "hot_node", "node": self.nodes[node].name, "start_s": now,
                                            "end_s": float(self.hot_node_end[node])})
        faulty = self.faults.busy_until > now
        reload = np.flatnonzero((rng.random(len(self.gpus)) < 0.01 * per_step) & ~faulty)
        for gpu in reload:
            for name in ("ecc_sbe_volatile_total", "ecc_dbe_volatile_total", "pcie_replay_total", *NVLINK_COUNTERS,
                         *XID_COLUMN_NAMES):
                c[name][gpu] = 0
            self.counts["counter_resets"] += 1


    def _inject_faults(self, now: float) -> None:
        self.faults.draw_until(now)
        step = self.config.step_seconds
        self.active_faults = [e for e in self.faults.events if e.onset_s <= now and e.ends_s > now - step]
        self.gpu_speed[:] = 1.0
        for event in self.active_faults:
            self._apply_fault(event, now, step)
        if self.config.background_noise:
            self._background(now)
        if self.config.node_conditions_per_node_day:
            self._node_conditions(now)
        # Application XIDs (13/31/43/45) on allocated GPUs: the job dies, the GPU is fine.
        allocated = np.unique(self.dev_gpu[self.dev_job >= 0])
        if allocated.size:
            expected = APPLICATION_XID_RATE_PER_GPU_DAY * allocated.size * step / 86400.0
            for _ in range(int(self.rng.poisson(expected))):
                gpu = int(self.rng.choice(allocated))
                code = int(self.rng.choice(APPLICATION_XIDS))
                self.counters[xid_column(code)][gpu] += 1
                self.counts["application_xids"] += 1
                self._fail_jobs_on_gpu(gpu, now, fault=False)

    def _apply_fault(self, event: FaultEvent, now: float, step: float) -> None:
        kind, gpu, c = event.kind.name, event.gpu, self.counters
        at_event = event.event_s <= now < event.event_s + step
        at_end = event.ends_s <= now
        if at_end:
            self._repair(event)
            return
        if now < event.event_s:  # precursors
            progress = (now - event.onset_s) / max(event.event_s - event.onset_s, 1.0)
            if kind == "ecc_dbe":
                c["ecc_sbe_volatile_total"][gpu] += self.rng.poisson(0.05 * np.exp(6.0 * progress))
                if self.rng.random() < 0.01 + 0.05 * progress:
                    c["remapped_rows_correctable_total"][gpu] += 1
            elif kind == "row_remap_failure":
                c["ecc_sbe_volatile_total"][gpu] += self.rng.poisson(0.02 * np.exp(4.0 * progress))
                if self.rng.random() < 0.02 + 0.2 * progress:
                    c["remapped_rows_correctable_total"][gpu] += 1
            elif kind == "xid79_off_bus":
                c["pcie_replay_total"][gpu] += self.rng.poisson(2.0 + 50.0 * progress)
            elif kind == "nvlink_degrading":
                crc = self.rng.poisson(0.1 + 6.0 * progress**2)
                c["nvlink_crc_flit_errors_total"][gpu] += crc
                c["nvlink_crc_data_errors_total"][gpu] += self.rng.poisson(1.0 * progress**2)
                c["nvlink_replay_errors_total"][gpu] += self.rng.binomial(crc, 0.2)
            return
        # At and after the event.
        if at_event and event.kind.xid is not None:
            c[xid_column(event.kind.xid)][gpu] += 1
        if kind == "ecc_dbe" and at_event:
            c["ecc_dbe_volatile_total"][gpu] += 1
            c["remapped_rows_uncorrectable_total"][gpu] += 1
            c["remapped_rows_pending"][gpu] = 1
            c["recovery_action"][gpu] = 4
        elif kind == "row_remap_failure" and at_event:
            c["remapped_rows_failure"][gpu] = 1
            c["recovery_action"][gpu] = 4
        elif kind == "row_remap_pending" and at_event:
            c["remapped_rows_uncorrectable_total"][gpu] += 1
            c["remapped_rows_pending"][gpu] = 1
            c["recovery_action"][gpu] = 1
        elif kind == "xid79_off_bus" and at_event:
            self.gpu_lost[gpu] = True
            c["recovery_action"][gpu] = 2
        elif kind in ("xid95_uncontained_ecc", "xid94_contained_ecc") and at_event:
            c["ecc_dbe_volatile_total"][gpu] += 1
            c["recovery_action"][gpu] = 4 if kind == "xid95_uncontained_ecc" else 0
        elif kind == "xid119_gsp_timeout" and at_event:
            c["recovery_action"][gpu] = 1
        elif kind == "nvlink_degrading" and at_event:
            c["nvlink_recovery_errors_total"][gpu] += 1
            c["recovery_action"][gpu] = 1
        elif kind == "clock_straggler":
            self.gpu_speed[gpu] = 0.78
        elif kind == "cooling_failure":
            self.gpu_speed[gpu] = 0.6
        elif kind == "pcie_replay_storm":
            c["pcie_replay_total"][gpu] += self.rng.poisson(300.0)
        elif kind in ("straggler", "silent_straggler"):
            self.gpu_speed[gpu] = 0.7
        elif kind == "thermal_throttle":
            self.gpu_speed[gpu] = 0.6
        elif kind == "power_brake":
            self.gpu_speed[gpu] = 0.5
        if at_event and event.kind.takes_gpu_down:
            self.gpu_down_until[gpu] = event.ends_s
            self._capacity_changed = True
        if at_event and event.kind.kills_job:
            self._fail_jobs_on_gpu(gpu, now, fault=True)

    def _repair(self, event: FaultEvent) -> None:
        """The GPU was reset, rebooted or replaced: the driver reloads and volatile counters restart."""
        gpu, c = event.gpu, self.counters
        if not (event.kind.takes_gpu_down or event.kind.name == "row_remap_pending"):
            return
        for name in ("ecc_sbe_volatile_total", "ecc_dbe_volatile_total", "remapped_rows_pending",
                     "recovery_action", "pcie_replay_total", *NVLINK_COUNTERS, *XID_COLUMN_NAMES):
            c[name][gpu] = 0
        if event.kind.expected_action == "replace":
            for name in ("remapped_rows_correctable_total", "remapped_rows_uncorrectable_total", "remapped_rows_failure"):
                c[name][gpu] = 0
        self.gpu_lost[gpu] = False
        self.gpu_down_until[gpu] = 0.0
        self._capacity_changed = True

    def _fail_jobs_on_gpu(self, gpu: int, now: float, fault: bool) -> None:
        for job_index in np.unique(self.dev_job[(self.dev_gpu == gpu) & (self.dev_job >= 0)]):
            job = self.jobs[int(job_index)]
            self._stop(job, keep_checkpoint=True, graceful=False)
            job.restarts += 1
            if fault:
                self.counts["failed_by_fault"] += 1

    def _spot_reclaims(self, now: float) -> None:
        rate = self.config.spot_reclaims_per_node_day * self.config.step_seconds / 86400.0
        if rate <= 0:
            return
        back = (self.node_down_until > now - self.config.step_seconds) & (self.node_down_until <= now)
        if back.any():
            self._capacity_changed = True  # a reclaimed node came back
        for node in np.flatnonzero(self.node_spot & (self.node_down_until <= now)):
            if self.rng.random() < rate:
                self.node_down_until[node] = now + float(self.rng.uniform(1, 6)) * 3600.0
                self.counts["spot_reclaims"] += 1
                for job_index in np.unique(self.dev_job[(self.dev_node == node) & (self.dev_job >= 0)]):
                    job = self.jobs[int(job_index)]
                    self._stop(job, keep_checkpoint=True, graceful=True)  # two-minute notice: checkpoint
                    job.preemptions += 1
                    self.counts["preempted"] += 1
                self._capacity_changed = True

