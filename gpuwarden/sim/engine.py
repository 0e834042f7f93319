"""The simulated fleet: a deterministic, time-stepped cluster of nodes, GPUs and jobs.

One ``step()`` advances the clock by ``step_seconds``: arrivals join the queue, faults and spot
reclaims strike, running jobs progress (at the speed of their slowest GPU) and finish, and the
scheduling round it was given at construction (a ``fleet.SchedulingHook``: the CLI hands it the
actuator's round, the one a real cluster gets) reads ``SimCluster``'s snapshot, decides what
starts, resumes, suspends or is preempted, and applies it through ``SimCluster``; the simulator
carries decisions out and never makes them: a job (an arrival, or one submitted with
:meth:`Simulation.submit`) waits in the queue, as a gated pod does, until the round binds it. Then one row of fleet samples per device is rendered:

- training / fine-tuning / notebook devices draw a real sample of their current H200 phase
  (``phase_trace.csv``), scaled to the device's model (power by TDP, clocks by max SM clock);
- inference devices follow one of the 143 real GenAI pods' duty cycles and memory;
- free devices draw from the ``idle_no_process`` phase;
- active faults then bend the numbers (clocks, temperature, throttle bits, error counters).

The seams are modules: ``hardware`` (noise, faults, repairs, spot reclaims), ``render`` (samples),
``cluster`` (the ``Cluster`` protocol view the round plans on and acts through).
Everything random comes from one ``numpy`` generator seeded by ``SimConfig.seed``; the same
config gives the same samples, bit for bit.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

from gpuwarden.fleet import Workload, WorkloadKind, WorkloadPhase, XID_COLUMN_NAMES
from gpuwarden.fleet.protocols import SchedulingHookFactory

from .catalog import MODELS
from .cluster import SimCluster
from .jobs import SimJob
from .config import SimConfig
from .faults import GROUND_TRUTH_COLUMNS, NVLINK_COUNTERS, FaultEvent, FaultInjector
from .fleetgen import build_fleet
from gpuwarden.fleet.semantics import mig_share, request_gpu_equivalents
from gpuwarden.fleet.traces import default_data_dir, load_genai, load_h200_phases, load_openb_pods, load_philly_jobs, load_philly_vcs
from .hardware import HardwareSteps
from .render import FREE_MEMORY_BYTES, H200_MAX_SM_MHZ, H200_TDP_WATTS, IDLE_BIT, Renderer  # noqa: F401 (re-exported)
from .workloads import PROFILES, ArrivalStream, JobSpec


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


class Simulation(HardwareSteps, Renderer):
    """A simulated fleet you can step, read and act on."""

    def __init__(self, config: SimConfig | None = None, *, scheduling: SchedulingHookFactory) -> None:
        """``scheduling`` builds the scheduling round on this fleet's ``SimCluster``; the round runs
        every ``scheduling_interval_seconds`` when jobs arrived or finished, and right after a
        cluster action (``gpuwarden.cli.simfleet`` wires the actuator's round)."""
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
        self.queue: list[SimJob] = []  # pending jobs
        self.suspended: set[int] = set()  # indices of suspended jobs
        self.cluster = SimCluster(self)
        self.scheduling = scheduling(self.cluster)
        self.last_round_s = 0.0
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
        self.dev_pod = np.full(n_dev, -1)  # pod code of the job on each device, set at bind (read where dev_job >= 0)
        self.dev_claim = np.full(n_dev, -1)  # on a DRA fleet: code of the claim holding each device, set at bind
        self._claim_codes: dict[str, int] = {}  # "<namespace>/<claim>" -> code
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
        self.job_trains = _Column(np.bool_)  # training / fine-tuning: advances at its slowest GPU's speed
        self.job_mem_ratio = _Column(np.float64)
        self.job_team = _Column(np.int32)
        self.job_project = _Column(np.int32)
        self.gpu_index_of = {g.uuid: i for i, g in enumerate(self.gpus)}

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
        if not self.config.arrivals:
            return
        for spec in self.arrivals.arrivals(now):
            self._add_job(spec)

    def _add_job(self, spec: JobSpec, annotations: dict[str, str] | None = None) -> SimJob:
        """A submitted job joins the queue (pending: only the scheduling round starts it)."""
        request = spec.workload.gpus
        job = SimJob(spec, len(self.jobs), priority=spec.workload.priority_class,
                     gpu_equivalents=request_gpu_equivalents(request.mig_profile, spec.workload.gang_size,
                                                             model=request.gpu_model) if request.mig_profile else
                     request_gpu_equivalents(None, spec.workload.gang_size * max(1, request.count),
                                             request.fraction_milli), annotations=dict(annotations or {}))
        pods = [spec.workload.name] if spec.workload.gang_size == 1 else [
            f"{spec.workload.name}-{k}" for k in range(spec.workload.gang_size)]
        codes = np.arange(len(self._pod_names), len(self._pod_names) + len(pods))
        self._pod_names.extend(pods)
        self._job_pod_codes.append(codes)
        self.job_profile.append(self._profile_names.index(spec.profile))
        self.job_trains.append(spec.workload.kind in (WorkloadKind.TRAINING, WorkloadKind.FINE_TUNING))
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
        return job

    def submit(self, workload: Workload, duration_s: float, profile: str = "train_matmul", mem_ratio: float = 0.5,
               annotations: dict[str, str] | None = None) -> str:
        """Submit ``workload`` now, as a user would (the demo's portal): it waits in the queue like
        any arrival, for the scheduling round to start it. Returns its key; ValueError (naming the
        field) for a name already in use, a team the fleet does not have or an unknown profile."""
        with self.lock:
            if workload.name in self.job_by_name:
                raise ValueError(f"name {workload.name!r}: a workload of that name exists; choose another")
            if workload.team not in self._team_names:
                raise ValueError(f"team {workload.team!r}: not a team of this fleet; allowed: {', '.join(self._team_names)}")
            if profile not in self._profile_names:
                raise ValueError(f"profile {profile!r}: allowed: {', '.join(self._profile_names)}")
            if not duration_s > 0:
                raise ValueError(f"duration_s {duration_s!r}: must be > 0")
            self._add_job(JobSpec(workload, self.now_s, float(duration_s), profile, float(mem_ratio)), annotations)
            return workload.key

    # -- jobs --------------------------------------------------------------------------------------
    def _stop(self, job: SimJob, keep_checkpoint: bool, graceful: bool, to_phase: WorkloadPhase = WorkloadPhase.PENDING) -> None:
        """Take a job off its devices. A graceful stop of a checkpointable job keeps all progress
        (it checkpoints in its grace period); an abrupt one falls back to the last checkpoint."""
        if job.devices is not None:
            self.dev_job[job.devices] = -1
            job.devices = None
            self._capacity_changed = True
            job.attained_before_s = job.attained_gpu_seconds(self.now_s)
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
        if to_phase == WorkloadPhase.SUSPENDED:
            self.suspended.add(job.index)
        else:
            self.suspended.discard(job.index)

    def _progress(self, now: float) -> None:
        step = self.config.step_seconds
        allocated = self.dev_job >= 0
        if not allocated.any():
            return
        running, of_running = np.unique(self.dev_job[allocated], return_inverse=True)
        job_speed = np.full(running.size, np.inf)  # per running job: its slowest GPU's speed
        np.minimum.at(job_speed, of_running, self.gpu_speed[self.dev_gpu[allocated]])
        jobs = self.jobs
        # Services and notebooks live for their lifetime; training advances at its slowest GPU. Python
        # floats: the same IEEE additions as numpy scalars (progress stays bit for bit), 3x cheaper
        for job_index, speed, trains in zip(running.tolist(), job_speed.tolist(), self.job_trains.values[running].tolist()):
            job = jobs[job_index]
            job.progress_s += step * (speed if trains else 1.0)
            if job.progress_s >= job.spec.duration_s:
                self.dev_job[job.devices] = -1
                job.devices = None
                job.phase = WorkloadPhase.SUCCEEDED
                job.finished_s = now
                self.counts["succeeded"] += 1
                self._capacity_changed = True

    def schedulable_nodes(self, now: float) -> np.ndarray:
        """Per node: up, not cordoned and not tainted."""
        node_ok = ~self.node_cordoned & (self.node_down_until <= now)
        for node in self.node_taints:
            node_ok[node] = False  # NoSchedule taints: simulated workloads carry no tolerations
        return node_ok

    def available(self, now: float) -> np.ndarray:
        """Per device: free, on a schedulable node that is up, on a GPU that is neither down nor lost."""
        node_ok = self.schedulable_nodes(now)
        gpu_ok = (self.gpu_down_until <= now) & ~self.gpu_lost
        return (self.dev_job < 0) & node_ok[self.dev_node] & gpu_ok[self.dev_gpu]

    def _schedule(self, now: float) -> None:
        """One scheduling round: at once after a cluster action, else every
        ``scheduling_interval_seconds`` when jobs arrived, finished or were stopped."""
        if not (self.queue or self.suspended):
            return
        due = now - self.last_round_s >= self.config.scheduling_interval_seconds
        if not (self.acted or (due and self._capacity_changed)):
            return
        self.scheduling.run_round()
        self.last_round_s = now
        self._capacity_changed = self.acted = False

    def _bind(self, job: SimJob, devices: np.ndarray, now: float) -> None:
        self.dev_job[devices] = job.index
        # its pods' codes, once per start rather than per rendered step: a gang's pods are slices
        # of gpus.count devices, in the order the devices were given
        workload, codes = job.spec.workload, self._job_pod_codes[job.index]
        self.dev_pod[devices] = codes[0] if workload.gang_size == 1 else \
            codes[np.arange(len(devices)) // max(1, workload.gpus.count)]
        job.devices = devices
        self._bind_claims(job, devices)
        job.phase = WorkloadPhase.RUNNING
        job.last_started_s = now
        self.suspended.discard(job.index)
        if job.started_s is None:
            job.started_s = now
            self.counts["started"] += 1

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
