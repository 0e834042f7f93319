"""Workload arrivals for the simulated fleet, drawn from real traces.

- Training and fine-tuning: Philly jobs (sizes, durations, teams, arrival times) replayed from a
  seed-chosen offset into the trace, thinned so their GPU-time demand is ``training_load`` of the
  training pools' capacity. Multi-node jobs become gangs of 8-GPU pods.
- Inference: openb GPU pods (whole-GPU counts and milli-GPU fractions); fractions ask for the MIG
  slice closest to their share. openb's lifetimes describe a mixed batch trace (median 9 minutes),
  far shorter than serving replicas, so service lifetimes are log-normal (median 12 h) instead.
- Notebooks: one interactive GPU each, log-normal lifetime (median 8 h), mostly holding memory idle.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpuwarden.fleet import GpuRequest, PriorityClass, Workload, WorkloadKind

from .fleetgen import INFERENCE_POOLS, TEAM_NAMES, TRAINING_POOLS

DAY = 86400.0
PROJECTS = ("core", "exp", "prod")

# Behaviour profiles: each is a mix over the labelled H200 phases (see traces.PhaseSamples).
PROFILES: dict[str, dict[str, float]] = {
    "free": {"idle_no_process": 1.0},
    "train_matmul": {"compute_bf16_matmul": 0.93, "idle_context_only": 0.07},
    "train_memory_bound": {"memory_bound_copy": 0.93, "idle_context_only": 0.07},
    "train_duty_cycled": {"duty_cycle_30pct_matmul": 0.93, "idle_context_only": 0.07},
    "train_starved": {"dataloader_starved_10pct": 0.95, "idle_context_only": 0.05},
    "train_tiny_kernels": {"tiny_kernels_one_block": 0.95, "idle_context_only": 0.05},
    "train_stuck": {"idle_context_only": 1.0},  # holds GPUs, runs nothing (hung collective, debugger)
    "notebook": {"idle_memory_hoarded_64g": 0.72, "compute_bf16_matmul": 0.08, "idle_context_only": 0.12,
                 "tiny_kernels_one_block": 0.08},
    "inference": {},  # driven by the GenAI duty-cycle series instead of the phase table
}
TRAINING_MIX = {"train_matmul": 0.55, "train_memory_bound": 0.12, "train_duty_cycled": 0.13,
                "train_starved": 0.10, "train_tiny_kernels": 0.05, "train_stuck": 0.05}
FINE_TUNING_MIX = {"train_matmul": 0.45, "train_memory_bound": 0.10, "train_duty_cycled": 0.15,
                   "train_starved": 0.15, "train_tiny_kernels": 0.08, "train_stuck": 0.07}


@dataclass
class JobSpec:
    """A workload as it arrives, plus what only the simulator knows (its true length, behaviour)."""

    workload: Workload
    submit_s: float
    duration_s: float
    profile: str
    mem_ratio: float  # share of each GPU's memory the job holds
    genai_series: int = -1
    genai_offset: int = 0


def _choice(rng: np.random.Generator, mix: dict[str, float]) -> str:
    names = list(mix)
    return names[int(rng.choice(len(names), p=np.array(list(mix.values())) / sum(mix.values())))]


class ArrivalStream:
    """Lazily yields ``JobSpec``s in submit order for any horizon (the live demo never ends)."""

    def __init__(self, rng, philly, team_of_vc, openb, genai_pods, training_gpus, inference_gpus,
                 fleet_gpus, gpus_per_node, config) -> None:
        self.rng = rng
        self.config = config
        self.gpus_per_node = gpus_per_node
        self.team_of_vc = team_of_vc
        self.genai_pods = genai_pods
        self.counter = 0
        self._philly_setup(philly, training_gpus)
        self._openb_setup(openb, inference_gpus)
        self.notebook_rate_per_s = config.notebooks_per_100_gpus * fleet_gpus / 100.0 / self._notebook_mean_life_s()
        self.pending: list[JobSpec] = []
        self.generated_until_s = 0.0
        self.initial_done = False

    # -- Philly --------------------------------------------------------------------------------
    def _philly_setup(self, philly: pd.DataFrame, training_gpus: int) -> None:
        cap = self.config.max_job_days * DAY
        jobs = philly[(philly["gpus"] > 0) & (philly["duration_seconds"] > 0)].copy()
        jobs["gpus"] = jobs["gpus"].clip(upper=self.config.max_training_gpus)
        jobs["duration_seconds"] = jobs["duration_seconds"].clip(upper=cap)
        times = (jobs["submitted_at"] - jobs["submitted_at"].min()).dt.total_seconds().to_numpy()
        span = max(times[-1], DAY)
        # GPU-seconds submitted per day, and per following week. The trace's first weeks are
        # nearly empty, so the replay starts on a day whose next week is at least half as busy as
        # a typical week; the thinning then matches that week's demand to the training capacity.
        demand = (jobs["gpus"] * jobs["duration_seconds"]).to_numpy()
        daily = np.bincount((times // DAY).astype(int), weights=demand)
        week = np.convolve(daily, np.ones(7), mode="valid")  # week[d] = days d..d+6
        busy_days = np.flatnonzero(week >= 0.5 * np.median(week))
        start_day = int(self.rng.choice(busy_days))
        offset = start_day * DAY + float(self.rng.uniform(0, DAY))
        capacity = self.config.training_load * training_gpus * 7 * DAY
        keep_probability = min(1.0, capacity / max(float(week[start_day]), 1e-9))
        self.philly_times = times
        self.philly = jobs.reset_index(drop=True)
        # the columns a job reads, as lists: a row read through the frame (iloc) cost more than the job
        self.philly_rows = list(zip(self.philly["gpus"].tolist(), self.philly["duration_seconds"].tolist(),
                                    self.philly["virtual_cluster"].tolist()))
        self.philly_span = span
        self.philly_offset = offset
        self.philly_keep = keep_probability
        self.philly_cursor = int(np.searchsorted(times, offset))
        self.philly_lap = 0

    def _next_philly(self, until_s: float) -> list[JobSpec]:
        out = []
        while True:
            if self.philly_cursor >= len(self.philly_times):
                self.philly_cursor, self.philly_lap = 0, self.philly_lap + 1
            at = self.philly_times[self.philly_cursor] - self.philly_offset + self.philly_lap * self.philly_span
            if at > until_s:
                return out
            gpus, duration, vc = self.philly_rows[self.philly_cursor]
            self.philly_cursor += 1
            if self.rng.random() >= self.philly_keep or at < 0:
                continue
            out.append(self._training_job(at, int(gpus), float(duration), str(vc)))

    def _training_job(self, at: float, gpus: int, duration: float, vc: str) -> JobSpec:
        rng = self.rng
        per_node = self.gpus_per_node
        if gpus > per_node:
            gang, per_pod = int(np.ceil(gpus / per_node)), per_node
        else:
            gang, per_pod = 1, gpus
        fine_tuning = gang == 1 and duration < DAY and rng.random() < 0.4
        kind = WorkloadKind.FINE_TUNING if fine_tuning else WorkloadKind.TRAINING
        priority = _choice(rng, {PriorityClass.NORMAL: 0.65, PriorityClass.HIGH: 0.2, PriorityClass.LOW: 0.15})
        checkpointable = rng.random() < (0.6 if fine_tuning else 0.85)
        team = self.team_of_vc.get(vc, TEAM_NAMES[-1])
        self.counter += 1
        name = f"{'ft' if fine_tuning else 'train'}-{self.counter:06d}"
        workload = Workload(
            name=name, namespace=team, kind=kind, team=team,
            project=f"{team}-{PROJECTS[self.counter % len(PROJECTS)]}", priority_class=priority,
            gpus=GpuRequest(count=per_pod), gang_size=gang, checkpointable=checkpointable,
            checkpoint_interval_seconds=(900.0 if fine_tuning else 1800.0) if checkpointable else None,
            pools=TRAINING_POOLS,
        )
        profile = _choice(rng, FINE_TUNING_MIX if fine_tuning else TRAINING_MIX)
        return JobSpec(workload, at, duration, profile, float(rng.uniform(0.55, 0.95)))

    # -- openb inference -------------------------------------------------------------------------
    def _openb_setup(self, openb: pd.DataFrame, inference_gpus: int) -> None:
        pods = openb[openb["gpus"] > 0].reset_index(drop=True)
        self.openb = pods
        self.openb_rows = list(zip(pods["gpus"].tolist(), pods["gpu_milli"].tolist()))  # as philly_rows
        mean_equivalents = float((pods["gpus"] * pods["gpu_milli"] / 1000.0).mean())
        self.service_target = self.config.inference_load * inference_gpus / max(mean_equivalents, 1e-9)
        self.service_rate_per_s = self.service_target / self._service_mean_life_s()

    @staticmethod
    def _service_mean_life_s() -> float:
        return 12 * 3600.0 * float(np.exp(1.0**2 / 2))  # log-normal mean with sigma 1.0

    @staticmethod
    def _notebook_mean_life_s() -> float:
        return 8 * 3600.0 * float(np.exp(0.8**2 / 2))

    def _service(self, at: float, residual: bool = False) -> JobSpec:
        rng = self.rng
        gpus, milli = self.openb_rows[int(rng.integers(len(self.openb_rows)))]
        gpus, milli = int(gpus), int(milli)
        request = GpuRequest(count=gpus) if milli >= 1000 else GpuRequest(count=1, fraction_milli=max(1, milli))
        team = TEAM_NAMES[int(rng.integers(len(TEAM_NAMES)))]
        self.counter += 1
        priority = _choice(rng, {PriorityClass.CRITICAL: 0.2, PriorityClass.HIGH: 0.6, PriorityClass.NORMAL: 0.2})
        workload = Workload(
            name=f"svc-{self.counter:06d}", namespace=team, kind=WorkloadKind.INFERENCE, team=team,
            project=f"{team}-{PROJECTS[self.counter % len(PROJECTS)]}", priority_class=priority, gpus=request,
            pools=INFERENCE_POOLS,
        )
        life = float(np.clip(rng.lognormal(np.log(12 * 3600.0), 1.0), 3600.0, 14 * DAY))
        if residual:
            life *= float(rng.uniform(0.05, 1.0))
        series = int(rng.integers(self.genai_pods))
        return JobSpec(workload, at, life, "inference", 0.0, series, int(rng.integers(1440)))

    def _notebook(self, at: float, residual: bool = False) -> JobSpec:
        rng = self.rng
        team = TEAM_NAMES[int(rng.integers(len(TEAM_NAMES)))]
        self.counter += 1
        workload = Workload(
            name=f"nb-{self.counter:06d}", namespace=team, kind=WorkloadKind.NOTEBOOK, team=team,
            project=f"{team}-exp", priority_class=_choice(rng, {PriorityClass.NORMAL: 0.7, PriorityClass.LOW: 0.3}),
            gpus=GpuRequest(count=1), pools=INFERENCE_POOLS,
        )
        life = float(np.clip(rng.lognormal(np.log(8 * 3600.0), 0.8), 3600.0, 3 * DAY))
        if residual:
            life *= float(rng.uniform(0.05, 1.0))
        return JobSpec(workload, at, life, "notebook", 0.0)

    def _poisson_times(self, rate_per_s: float, start_s: float, end_s: float) -> np.ndarray:
        count = int(self.rng.poisson(rate_per_s * (end_s - start_s)))
        return np.sort(self.rng.uniform(start_s, end_s, count))

    # -- public --------------------------------------------------------------------------------
    def arrivals(self, until_s: float) -> list[JobSpec]:
        """Jobs submitted in ``(previous until, until_s]``, in submit order."""
        start = self.generated_until_s
        new: list[JobSpec] = []
        if not self.initial_done:
            # Services and notebooks already running when the clock starts.
            new += [self._service(0.0, residual=True) for _ in range(int(round(self.service_target)))]
            new += [self._notebook(0.0, residual=True) for _ in range(int(round(self.notebook_rate_per_s * self._notebook_mean_life_s())))]
            self.initial_done = True
        # Generate a day at a time so the stream does not depend on how often it is asked.
        chunk_end = max(until_s, start)
        chunk_end = np.ceil(chunk_end / DAY) * DAY
        if chunk_end > start:
            new += self._next_philly(chunk_end)
            new += [self._service(t) for t in self._poisson_times(self.service_rate_per_s, start, chunk_end)]
            new += [self._notebook(t) for t in self._poisson_times(self.notebook_rate_per_s, start, chunk_end)]
            self.generated_until_s = chunk_end
        if new:
            self.pending.extend(new)
            self.pending.sort(key=lambda job: job.submit_s)
        cut = 0
        while cut < len(self.pending) and self.pending[cut].submit_s <= until_s:
            cut += 1
        due, self.pending = self.pending[:cut], self.pending[cut:]
        return due
