"""The simulated fleet: a deterministic, time-stepped cluster of nodes, GPUs and jobs.

One ``step()`` advances the clock by ``step_seconds``: arrivals join the queue, faults and spot
reclaims strike, running jobs progress (at the speed of their slowest GPU) and finish, the built-in
production scheduler (``gpuwarden.scheduling``, run by ``dispatch.Dispatcher``) decides what starts,
resumes, suspends or is preempted, carried out through ``SimCluster``; and one row of fleet
samples per device is rendered:

- training / fine-tuning / notebook devices draw a real sample of their current H200 phase
  (``phase_trace.csv``), scaled to the device's model (power by TDP, clocks by max SM clock);
- inference devices follow one of the 143 real GenAI pods' duty cycles and memory;
- free devices draw from the ``idle_no_process`` phase;
- active faults then bend the numbers (clocks, temperature, throttle bits, error counters).

Everything random comes from one ``numpy`` generator seeded by ``SimConfig.seed``; the same
config gives the same samples, bit for bit. The ``Cluster`` protocol view is ``SimCluster``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

from gpuwarden.fleet import (
    SAMPLE_COLUMNS,
    SAMPLE_COLUMN_NAMES,
    PriorityClass,
    THROTTLE_REASONS,
    WorkloadKind,
    WorkloadPhase,
    XID_COLUMN_NAMES,
    xid_column,
)

from .catalog import MODELS
from .cluster import SimCluster
from .config import SimConfig
from .dispatch import Dispatcher
from .faults import APPLICATION_XID_RATE_PER_GPU_DAY, NVLINK_COUNTERS, SLOW_KINDS, APPLICATION_XIDS, GROUND_TRUTH_COLUMNS, FaultEvent, FaultInjector
from .fleetgen import build_fleet
from gpuwarden.fleet.semantics import mig_share
from gpuwarden.fleet.traces import default_data_dir, load_genai, load_h200_phases, load_openb_pods, load_philly_jobs, load_philly_vcs
from .workloads import PROFILES, ArrivalStream, JobSpec

FREE_MEMORY_BYTES = 615 * 1024**2  # what NVML reports used with no process (H200 trace)
H200_TDP_WATTS = 700.0
H200_MAX_SM_MHZ = 1980.0
IDLE_BIT = THROTTLE_REASONS["gpu_idle"]


class _Column:
    """A growable numpy array (amortised O(1) append) for per-job attributes used when rendering."""

    def __init__(self, dtype) -> None:
        self._data = np.zeros(64, dtype=dtype)
        self.size = 0

    def append(self, value) -> None:
        if self.size == self._data.size:
            self._data = np.concatenate([self._data, np.zeros_like(self._data)])
        self._data[self.size] = value
        self.size += 1

    @property
    def values(self) -> np.ndarray:
        return self._data[: self.size]


@dataclass
class SimJob:
    spec: JobSpec
    index: int
    phase: WorkloadPhase = WorkloadPhase.PENDING
    priority: PriorityClass = PriorityClass.NORMAL
    progress_s: float = 0.0
    started_s: float | None = None
    finished_s: float | None = None
    devices: np.ndarray | None = None
    preemptions: int = 0
    restarts: int = 0

    @property
    def name(self) -> str:
        return self.spec.workload.name


class Simulation:
    """A simulated fleet you can step, read and act on."""

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config or SimConfig()
        cfg = self.config
        data_dir = Path(cfg.data_dir) if cfg.data_dir else default_data_dir()
        self.rng = np.random.default_rng(cfg.seed)
        self.lock = threading.RLock()  # the demo steps the fleet while the exporter and actuator read it
        self.phases = load_h200_phases(data_dir)
        self.genai = load_genai(data_dir)
        fleet = build_fleet(cfg.cluster, cfg.nodes, cfg.gpus_per_node, load_philly_vcs(data_dir))
        self.nodes, self.gpus, self.teams = fleet.nodes, fleet.gpus, fleet.teams
        self._build_devices()
        training_gpus = sum(n.gpu_count for n in self.nodes if n.pool.startswith("train"))
        inference_gpus = len(self.gpus) - training_gpus
        self.arrivals = ArrivalStream(
            self.rng, load_philly_jobs(data_dir), fleet.team_of_virtual_cluster, load_openb_pods(data_dir, cfg.openb_pod_list),
            self.genai.duty_ratio.shape[0], training_gpus, inference_gpus, len(self.gpus), cfg.gpus_per_node, cfg,
        )
        self.faults = FaultInjector(cfg, len(self.gpus), self.rng)
        self.jobs: list[SimJob] = []
        self.job_by_name: dict[str, SimJob] = {}
        self.queue: list[SimJob] = []  # pending jobs (the scheduler's suspended ones: dispatcher.suspended)
        self.dispatcher = Dispatcher(self, SimCluster(self), cfg.scheduler_policy)
        self.origin = cfg.start - timedelta(days=cfg.warmup_days)
        self.now_s = 0.0
        self.step_index = 0
        self.active_faults: list[FaultEvent] = []
        self.counts = dict.fromkeys(("submitted", "started", "succeeded", "failed_by_fault", "preempted",
                                     "spot_reclaims", "application_xids", "counter_resets"), 0)
        self.latest: pd.DataFrame | None = None
        self._capacity_changed = True
        self.acted = False  # a SimCluster action since the last pass
        warmup_steps = int(round(cfg.warmup_days * 86400 / cfg.step_seconds))
        for _ in range(warmup_steps):
            self._advance(render=False)

    # -- fleet layout ------------------------------------------------------------------------------
    def _build_devices(self) -> None:
        """Devices are what a pod can hold: whole GPUs, or the MIG instances of a MIG-mode GPU."""
        node_index = {node.name: i for i, node in enumerate(self.nodes)}
        self.node_pool = np.array([node.pool for node in self.nodes])
        self.node_spot = np.array([node.price_tier.value == "spot" for node in self.nodes])
        self.model_names = list(dict.fromkeys(gpu.model for gpu in self.gpus))
        rows = []
        for g, gpu in enumerate(self.gpus):
            model = MODELS[gpu.model]
            if gpu.mig_enabled:
                for instance in gpu.mig_instances:
                    profile = model.mig_profile(instance.profile)
                    rows.append((g, node_index[gpu.node], instance.gpu_instance_id, instance.profile,
                                 profile.compute_slices, profile.memory_bytes))
            else:
                rows.append((g, node_index[gpu.node], 0, "", 7, model.memory_bytes))
        self.dev_gpu = np.array([r[0] for r in rows])
        self.dev_node = np.array([r[1] for r in rows])
        self.dev_mig_id = np.array([r[2] for r in rows])
        self.dev_mig_profile = np.array([r[3] for r in rows], dtype=object)
        self.dev_slices = np.array([r[4] for r in rows])
        self.dev_share = np.array([mig_share(r[3] or None, self.gpus[r[0]].model) for r in rows])
        self.dev_is_mig = self.dev_mig_id > 0
        self.dev_mem_total = np.array([r[5] for r in rows], dtype=float)
        self.dev_pool = self.node_pool[self.dev_node]
        gpu_model = [MODELS[g.model] for g in self.gpus]
        self.gpu_power_scale = np.array([m.tdp_watts / H200_TDP_WATTS for m in gpu_model])
        self.gpu_clock_scale = np.array([m.max_sm_clock_mhz / H200_MAX_SM_MHZ for m in gpu_model])
        self.gpu_gpm = np.array([m.gpm_supported for m in gpu_model])
        self.gpu_temp_offset = self.rng.normal(0.0, 2.5, len(self.gpus))
        n_dev, n_gpu = len(rows), len(self.gpus)
        self.dev_job = np.full(n_dev, -1)
        self.node_cordoned = np.zeros(len(self.nodes), dtype=bool)
        self.node_taints: dict[int, tuple[str, ...]] = {}
        self.node_down_until = np.zeros(len(self.nodes))  # spot reclaim
        self.gpu_down_until = np.zeros(n_gpu)
        self.gpu_lost = np.zeros(n_gpu, dtype=bool)
        self.gpu_speed = np.ones(n_gpu)
        self.counters = {name: np.zeros(n_gpu, dtype=np.int64) for name in (
            "ecc_sbe_volatile_total", "ecc_dbe_volatile_total", "remapped_rows_correctable_total",
            "remapped_rows_uncorrectable_total", "remapped_rows_pending", "remapped_rows_failure",
            "pcie_replay_total", *NVLINK_COUNTERS, "recovery_action", *XID_COLUMN_NAMES)}
        self._build_noise()
        # Static label codes for rendering.
        self._node_names = [n.name for n in self.nodes]
        self._gpu_uuids = [g.uuid for g in self.gpus]
        self._mig_labels = [f"{i}:{p}" if i else None for i, p in zip(self.dev_mig_id, self.dev_mig_profile)]
        self._pod_names: list[str] = []
        self._job_pod_codes: list[np.ndarray] = []
        self._team_names = [t.name for t in self.teams]
        self._project_names: list[str] = []
        self._profile_names = list(PROFILES)
        self.job_profile = _Column(np.int16)
        self.job_mem_ratio = _Column(np.float64)
        self.job_team = _Column(np.int32)
        self.job_project = _Column(np.int32)
        self.gpu_index_of = {g.uuid: i for i, g in enumerate(self.gpus)}

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
        faulty = self.faults.busy_until > now
        reload = np.flatnonzero((rng.random(len(self.gpus)) < 0.01 * per_step) & ~faulty)
        for gpu in reload:
            for name in ("ecc_sbe_volatile_total", "ecc_dbe_volatile_total", "pcie_replay_total", *NVLINK_COUNTERS,
                         *XID_COLUMN_NAMES):
                c[name][gpu] = 0
            self.counts["counter_resets"] += 1

    @property
    def now(self) -> datetime:
        return self.origin + timedelta(seconds=self.now_s)

    @property
    def device_count(self) -> int:
        return len(self.dev_gpu)

    # -- stepping --------------------------------------------------------------------------------
    def step(self) -> pd.DataFrame:
        """Advance one step and return its fleet samples (one row per device)."""
        with self.lock:
            return self._advance(render=True)

    def run(self, steps: int) -> pd.DataFrame:
        """Advance ``steps`` steps; return all their samples in one frame."""
        with self.lock:
            return pd.concat([self._advance(render=True) for _ in range(max(1, steps))], ignore_index=True)

    def iter_chunks(self, steps: int, chunk_steps: int = 1440):
        """Advance ``steps`` steps, yielding their samples every ``chunk_steps`` (a day at 60 s)."""
        done = 0
        while done < steps:
            size = min(chunk_steps, steps - done)
            with self.lock:
                columns = [self._advance(render=True, as_frame=False) for _ in range(size)]
                # The exporter backend serves the newest step, also right after a backfill.
                self.latest = self._frame(dict(columns[-1]))
            done += size
            yield self._frame({key: np.concatenate([c[key] for c in columns]) for key in columns[0]})

    def _advance(self, render: bool, as_frame: bool = True):
        cfg = self.config
        self.now_s += cfg.step_seconds
        self.step_index += 1
        now = self.now_s
        self._arrive(now)
        self._inject_faults(now)
        self._spot_reclaims(now)
        self._progress(now)
        self._schedule(now)
        if not render:
            return None
        columns = self._render(now)
        if not as_frame:
            return columns
        frame = self._frame(columns)
        self.latest = frame
        return frame

    def _arrive(self, now: float) -> None:
        for spec in self.arrivals.arrivals(now):
            job = SimJob(spec, len(self.jobs), priority=spec.workload.priority_class)
            pods = [spec.workload.name] if spec.workload.gang_size == 1 else [
                f"{spec.workload.name}-{k}" for k in range(spec.workload.gang_size)]
            codes = np.arange(len(self._pod_names), len(self._pod_names) + len(pods))
            self._pod_names.extend(pods)
            self._job_pod_codes.append(codes)
            self.job_profile.append(self._profile_names.index(spec.profile))
            self.job_mem_ratio.append(spec.mem_ratio)
            self.job_team.append(self._team_names.index(spec.workload.team))
            if spec.workload.project not in self._project_names:
                self._project_names.append(spec.workload.project)
            self.job_project.append(self._project_names.index(spec.workload.project))
            self.jobs.append(job)
            self.job_by_name[job.name] = job
            self.queue.append(job)
            self.counts["submitted"] += 1
            self._capacity_changed = True

    # -- faults ------------------------------------------------------------------------------------
    def _inject_faults(self, now: float) -> None:
        self.faults.draw_until(now)
        step = self.config.step_seconds
        self.active_faults = [e for e in self.faults.events if e.onset_s <= now and e.ends_s > now - step]
        self.gpu_speed[:] = 1.0
        for event in self.active_faults:
            self._apply_fault(event, now, step)
        if self.config.background_noise:
            self._background(now)
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

    # -- jobs --------------------------------------------------------------------------------------
    def _stop(self, job: SimJob, keep_checkpoint: bool, graceful: bool, to_phase: WorkloadPhase = WorkloadPhase.PENDING) -> None:
        """Take a job off its devices. A graceful stop of a checkpointable job keeps all progress
        (it checkpoints in its grace period); an abrupt one falls back to the last checkpoint."""
        if job.devices is not None:
            self.dev_job[job.devices] = -1
            job.devices = None
            self._capacity_changed = True
        workload = job.spec.workload
        if workload.kind in (WorkloadKind.TRAINING, WorkloadKind.FINE_TUNING):
            if not workload.checkpointable or not keep_checkpoint:
                job.progress_s = 0.0
            elif not graceful:
                interval = workload.checkpoint_interval_seconds or 1.0
                job.progress_s = np.floor(job.progress_s / interval) * interval
        job.phase = to_phase
        if to_phase == WorkloadPhase.PENDING and job not in self.queue:
            self.queue.append(job)

    def _progress(self, now: float) -> None:
        step = self.config.step_seconds
        allocated = self.dev_job >= 0
        if not allocated.any():
            return
        job_speed = np.full(len(self.jobs), np.inf)
        np.minimum.at(job_speed, self.dev_job[allocated], self.gpu_speed[self.dev_gpu[allocated]])
        running = np.unique(self.dev_job[allocated])
        for job_index in running:
            job = self.jobs[int(job_index)]
            kind = job.spec.workload.kind
            # Services and notebooks live for their lifetime; training advances at its slowest GPU.
            rate = job_speed[job_index] if kind in (WorkloadKind.TRAINING, WorkloadKind.FINE_TUNING) else 1.0
            job.progress_s += step * rate
            if job.progress_s >= job.spec.duration_s:
                self.dev_job[job.devices] = -1
                job.devices = None
                job.phase = WorkloadPhase.SUCCEEDED
                job.finished_s = now
                self.counts["succeeded"] += 1
                self._capacity_changed = True

    def _available(self, now: float) -> np.ndarray:
        node_ok = ~self.node_cordoned & (self.node_down_until <= now)
        for node in self.node_taints:
            node_ok[node] = False  # NoSchedule taints: simulated workloads carry no tolerations
        gpu_ok = (self.gpu_down_until <= now) & ~self.gpu_lost
        return (self.dev_job < 0) & node_ok[self.dev_node] & gpu_ok[self.dev_gpu]

    def _schedule(self, now: float) -> None:
        """One pass of the production scheduler (``dispatch``): at once after a cluster action,
        else every ``scheduling_interval_seconds`` when jobs arrived, finished or were stopped."""
        if not (self.queue or self.dispatcher.suspended):
            return
        due = now - self.dispatcher.last_now >= self.config.scheduling_interval_seconds
        if not (self.acted or (due and self._capacity_changed)):
            return
        self.dispatcher.schedule(now)
        self._capacity_changed = self.acted = False

    def _bind(self, job: SimJob, devices: np.ndarray, now: float) -> None:
        self.dev_job[devices] = job.index
        job.devices = devices
        job.phase = WorkloadPhase.RUNNING
        if job.started_s is None:
            job.started_s = now
            self.counts["started"] += 1

    # -- rendering -------------------------------------------------------------------------------
    def _render(self, now: float) -> dict[str, np.ndarray]:
        rng, phases = self.rng, self.phases
        n = self.device_count
        gpu = self.dev_gpu
        job = self.dev_job
        allocated = job >= 0
        # Which phase each device is in: jobs draw one phase per step so a gang moves together.
        phase = np.full(n, phases.index("idle_no_process"))
        profiles = np.where(allocated, self.job_profile.values[np.maximum(job, 0)], self._profile_names.index("free"))
        inference = profiles == self._profile_names.index("inference")
        job_phase = np.zeros(len(self.jobs), dtype=np.int64)
        for code in np.unique(profiles[allocated & ~inference]):
            mix = PROFILES[self._profile_names[code]]
            jobs_here = np.unique(job[profiles == code])
            draws = rng.choice(len(mix), size=jobs_here.size, p=np.array(list(mix.values())))
            job_phase[jobs_here] = np.array([phases.index(p) for p in mix])[draws]
        drawn = allocated & ~inference
        phase[drawn] = job_phase[job[drawn]]
        row = phases.offsets[phase] + (rng.random(n) * phases.counts[phase]).astype(int)
        rows = phases.rows
        util = rows["gpu_util"][row] / 100.0
        sm = rows["gpm_sm_util"][row] / 100.0
        tensor = rows["gpm_any_tensor_util"][row] / 100.0
        dram = rows["gpm_dram_bw_util"][row] / 100.0
        power = rows["power_w"][row].copy()
        temp = rows["temp_c"][row].copy()
        clock = rows["sm_clock_mhz"][row].copy()
        throttle = rows["clocks_event_reasons"][row].astype(np.int64)
        mem = np.full(n, float(FREE_MEMORY_BYTES))
        if allocated.any():
            job_mem = self.job_mem_ratio.values[job[allocated]]
            mem[allocated] = np.maximum(job_mem * self.dev_mem_total[allocated], FREE_MEMORY_BYTES)
            hoarding = allocated & (phase == phases.index("idle_memory_hoarded_64g"))
            mem[hoarding] = np.minimum(64 * 1024**3, 0.9 * self.dev_mem_total[hoarding])
        if inference.any():
            self._render_inference(np.flatnonzero(inference), util, sm, tensor, dram, power, clock, throttle, mem)
        # Scale the H200's numbers to each device's model, and MIG instances to their share.
        power = power * self.gpu_power_scale[gpu] * np.where(self.dev_is_mig, self.dev_share, 1.0)
        clock = clock * self.gpu_clock_scale[gpu]
        temp = temp + self.gpu_temp_offset[gpu]
        if self.config.background_noise:
            node = self.dev_node
            warm = np.clip((now - self.hot_node_start) / 1800.0, 0.0, 1.0) * (now < self.hot_node_end)
            temp = temp + self.node_temp_offset[node] + (self.hot_node_celsius * warm)[node]
        mem = np.minimum(mem, self.dev_mem_total)
        self._render_faults(power, temp, clock, throttle)
        for event in self.active_faults:
            if event.kind.name in SLOW_KINDS and event.event_s <= now < event.ends_s:
                event.loaded_steps += int((util[self.dev_gpu == event.gpu] >= 0.5).any())
        no_gpm = ~self.gpu_gpm[gpu]
        sm[no_gpm] = tensor[no_gpm] = dram[no_gpm] = np.nan
        lost = self.gpu_lost[gpu]
        for values in (util, sm, tensor, dram, power, temp, clock, mem):
            values[lost] = np.nan
        throttle = np.where(lost, -1, throttle)
        pods = np.full(n, -1)
        if allocated.any():
            pods[allocated] = self._pod_codes(job[allocated], np.flatnonzero(allocated))
        columns = {
            "timestamp": np.full(n, int(now), dtype=np.int64),
            "device": np.arange(n),
            "job": job.copy(),
            "pod_code": pods,
            "gpu_util_ratio": util,
            "sm_active_ratio": sm,
            "tensor_active_ratio": tensor,
            "dram_active_ratio": dram,
            "mem_used_bytes": mem,
            "power_watts": power,
            "temperature_celsius": temp,
            "sm_clock_mhz": clock,
            "throttle_reasons_bitmask": throttle,
        }
        for name, values in self.counters.items():
            columns[name] = values[gpu]
        return columns

    def _render_inference(self, devices, util, sm, tensor, dram, power, clock, throttle, mem) -> None:
        """Inference follows a real GenAI pod: duty cycle -> NVML util; the rest derived from the
        H200 trace's busy phase scaled by the duty (sub-linear power, as measured)."""
        series_len = self.genai.duty_ratio.shape[1]
        specs = [self.jobs[j].spec for j in self.dev_job[devices]]
        series = np.array([s.genai_series for s in specs])
        offset = np.array([s.genai_offset for s in specs])
        fraction = np.array([min(1.0, s.workload.gpus.fraction_milli / 1000.0) for s in specs])
        t = (self.step_index + offset) % series_len
        duty = self.genai.duty_ratio[series, t]
        on_mig = self.dev_is_mig[devices]
        # A fractional pod that got a whole GPU (no MIG slice left) only uses its fraction of it.
        duty = np.where(on_mig, duty, duty * fraction)
        util[devices] = duty
        sm[devices] = duty * 0.8
        tensor[devices] = duty * 0.45
        dram[devices] = duty * 0.35
        power[devices] = 124.0 + (520.0 - 124.0) * duty**0.8  # idle context 124 W .. busy ~520 W
        clock[devices] = 1980.0
        throttle[devices] = np.where(duty == 0, IDLE_BIT, 0)
        mem_ratio = self.genai.mem_used_bytes[series, t] / (141 * 1024**3)
        mem[devices] = np.maximum(mem_ratio * self.dev_mem_total[devices] * 1.6, FREE_MEMORY_BYTES)

    def _render_faults(self, power, temp, clock, throttle) -> None:
        for event in self.active_faults:
            kind = event.kind.name
            if kind == "cooling_failure" and event.onset_s <= self.now_s < event.event_s:
                progress = (self.now_s - event.onset_s) / max(event.event_s - event.onset_s, 1.0)
                temp[np.flatnonzero(self.dev_gpu == event.gpu)] += 25.0 * progress  # warming at the same load
                continue
            if not (event.event_s <= self.now_s < event.ends_s):
                continue
            devices = np.flatnonzero(self.dev_gpu == event.gpu)
            if kind == "cooling_failure":
                temp[devices] += 25.0
                clock[devices] *= 0.6
                throttle[devices] |= THROTTLE_REASONS["hw_thermal_slowdown"] | THROTTLE_REASONS["sw_thermal_slowdown"]
            elif kind == "clock_straggler":
                clock[devices] *= 0.78  # power unchanged: nothing but the clock gives it away
            elif kind == "thermal_throttle":
                temp[devices] = 88.0 + self.rng.normal(0, 2.0, devices.size)
                clock[devices] *= 0.55
                throttle[devices] |= THROTTLE_REASONS["hw_thermal_slowdown"] | THROTTLE_REASONS["sw_thermal_slowdown"]
            elif kind == "power_brake":
                clock[devices] *= 0.4
                power[devices] *= 0.5
                throttle[devices] |= THROTTLE_REASONS["hw_power_brake_slowdown"] | THROTTLE_REASONS["hw_slowdown"]
            elif kind in ("straggler", "silent_straggler"):
                clock[devices] *= 0.8
                power[devices] *= 0.85

    def _pod_codes(self, jobs: np.ndarray, devices: np.ndarray) -> np.ndarray:
        """Pod of each allocated device: gang pods are 8-GPU slices of the job's devices in order."""
        out = np.empty(jobs.size, dtype=np.int64)
        for k, (j, d) in enumerate(zip(jobs.tolist(), devices.tolist())):
            spec = self.jobs[j].spec.workload
            codes = self._job_pod_codes[j]
            if spec.gang_size == 1:
                out[k] = codes[0]
            else:
                position = int(np.flatnonzero(self.jobs[j].devices == d)[0])
                out[k] = codes[position // max(1, spec.gpus.count)]
        return out

    def _frame(self, columns: dict[str, np.ndarray]) -> pd.DataFrame:
        """Columnar step output -> fleet samples frame (strings as categoricals built from codes)."""
        device = columns.pop("device")
        job = columns.pop("job")
        pod_code = columns.pop("pod_code")
        stamp = self.origin + pd.to_timedelta(columns.pop("timestamp"), unit="s")
        node_code = self.dev_node[device]
        gpu_code = self.dev_gpu[device]
        team_names, project_names = self._team_names, list(self._project_names)
        team_code = np.where(job >= 0, self.job_team.values[np.maximum(job, 0)], -1) if len(self.jobs) else np.full(job.size, -1)
        project_code = np.where(job >= 0, self.job_project.values[np.maximum(job, 0)], -1) if len(self.jobs) else np.full(job.size, -1)
        models = [g.model for g in self.gpus]
        model_names = self.model_names
        model_code = np.array([model_names.index(m) for m in models])[gpu_code]
        mig_names = sorted({m for m in self._mig_labels if m})
        mig_code = np.array([mig_names.index(m) if m else -1 for m in self._mig_labels])[device]
        frame = {
            "timestamp": pd.DatetimeIndex(stamp).tz_convert("UTC") if pd.DatetimeIndex(stamp).tz else pd.DatetimeIndex(stamp).tz_localize("UTC"),
            "cluster": pd.Categorical.from_codes(np.zeros(device.size, dtype=int), [self.config.cluster]),
            "node": pd.Categorical.from_codes(node_code, self._node_names),
            "gpu_uuid": pd.Categorical.from_codes(gpu_code, self._gpu_uuids),
            "gpu_index": np.array([g.index for g in self.gpus])[gpu_code],
            "model": pd.Categorical.from_codes(model_code, model_names),
            "mig_instance": pd.Categorical.from_codes(mig_code, mig_names),
            "namespace": pd.Categorical.from_codes(team_code, team_names),
            "pod": pd.Categorical.from_codes(pod_code, self._pod_names),
            "team": pd.Categorical.from_codes(team_code, team_names),
            "project": pd.Categorical.from_codes(project_code, project_names),
        }
        frame.update(columns)
        if not self.node_attributed.all():
            # Nodes without attribution: nobody could see the pods, so the pod columns are null.
            unattributed = ~self.node_attributed[node_code]
            for name in ("namespace", "pod", "team", "project"):
                codes = frame[name].codes.copy()
                codes[unattributed] = -1
                frame[name] = pd.Categorical.from_codes(codes, frame[name].categories)
        out = pd.DataFrame(frame)
        out["throttle_reasons_bitmask"] = out["throttle_reasons_bitmask"].astype("Int64").mask(out["throttle_reasons_bitmask"] < 0)
        out.insert(list(out.columns).index("power_watts"), "mem_total_bytes", self.dev_mem_total[device])
        # Allocation is known where the node's kubelet answers (SimConfig.attribution), else 'off'.
        out["attribution"] = pd.Categorical.from_codes(np.where(self.node_attributed[node_code], 0, 1), ["known", "off"])
        for column in SAMPLE_COLUMNS:
            if column.name not in out.columns:  # not simulated: not measured (null), never a fake 0
                out[column.name] = pd.Series(np.nan, index=out.index, dtype="Int64" if column.kind == "int" else "float64")
        return out[list(SAMPLE_COLUMN_NAMES)]

    # -- views -------------------------------------------------------------------------------------
    def ground_truth(self) -> pd.DataFrame:
        """Injected faults whose precursors have started by now. Never part of the samples."""
        rows = self.faults.ground_truth(self.origin, self._gpu_uuids, [g.node for g in self.gpus], until_s=self.now_s)
        return pd.DataFrame(rows, columns=list(GROUND_TRUTH_COLUMNS))

    def summary(self) -> dict[str, int]:
        running = sum(1 for j in self.jobs if j.phase == WorkloadPhase.RUNNING)
        pending = sum(1 for j in self.jobs if j.phase == WorkloadPhase.PENDING)
        return {**self.counts, "running": running, "pending": pending, "gpus": len(self.gpus),
                "nodes": len(self.nodes), "devices": self.device_count,
                "faults_injected": int(len(self.ground_truth()))}
