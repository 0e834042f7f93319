"""Simulation settings: one frozen dataclass, loadable from YAML, with errors that name the key.

Fault rates default to published ones: Llama 3 (Meta, 2024) reports 419 unexpected interruptions
in 54 days on 16,384 H100s; the per-category counts of its table are ``LLAMA3_INTERRUPTIONS``. A
rate per GPU-day for a category is ``count / (54 * 16384)``. ``fault_rate_scale`` multiplies all
hardware fault rates (the demo raises it so that one simulated week shows some faults).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from datetime import datetime, UTC
from pathlib import Path
from typing import Any
from collections.abc import Collection, Mapping

from gpuwarden.fleet.errors import UserError
from gpuwarden.fleet.inputs import read_yaml_file

LLAMA3_GPU_DAYS = 54 * 16384
# Llama 3 paper, Table 5 (GPU-related root causes), interruptions in 54 days.
LLAMA3_INTERRUPTIONS = {
    "faulty_gpu": 148,
    "gpu_hbm3_memory": 72,
    "gpu_sram_memory": 19,
    "gpu_system_processor": 17,
    "silent_data_corruption": 6,
    "gpu_thermal_interface": 6,
}


ATTRIBUTION_MODES = ("on", "off", "mixed")
# The most each setting may be: past these a run only spins or fills memory (a config file is checked
# like the CLI's flags; tests raise fault_rate_scale to 2000 for a few steps).
MOST_INT = {"nodes": 4096, "gpus_per_node": 8, "step_seconds": 3600, "max_training_gpus": 4096 * 8,
            "scheduling_interval_seconds": 86400}
MOST_FLOAT = {"training_load": 100.0, "inference_load": 100.0, "notebooks_per_100_gpus": 100.0,
              "fault_rate_scale": 10_000.0, "spot_reclaims_per_node_day": 1440.0, "warmup_days": 366.0,
              "max_job_days": 366.0, "node_conditions_per_node_day": 1440.0}
MAX_SEED = 2**32 - 1  # as the CLI's --seed


class ConfigError(UserError, ValueError):
    """A setting that does not exist or has a value out of range; the message names key and allowed values."""


@dataclass(frozen=True)
class SimConfig:
    seed: int = 7
    nodes: int = 64
    gpus_per_node: int = 8
    step_seconds: int = 60
    start: datetime = datetime(2026, 11, 23, tzinfo=UTC)
    warmup_days: float = 1.0  # simulated but not recorded, so the first recorded day starts busy
    cluster: str = "sim"
    training_load: float = 0.95  # Philly GPU-time demand relative to training capacity
    inference_load: float = 0.70  # share of inference capacity that services ask for
    notebooks_per_100_gpus: float = 6.0
    fault_rate_scale: float = 1.0
    spot_reclaims_per_node_day: float = 0.0067  # "over 20% a month", the highest band spot advisors list
    max_training_gpus: int = 32
    max_job_days: float = 3.0
    openb_pod_list: str = "default"
    data_dir: Path | None = None
    counts_overrides: Mapping[str, float] = field(default_factory=dict)  # fault kind -> events per GPU-day
    # Background noise and confounders on healthy GPUs (SBE drizzle, PCIe replay bursts, NVLink CRC
    # errors, per-slot and per-node temperature spread, hot-but-healthy nodes, driver reloads that
    # reset counters). Drawn from their own random stream: jobs and faults stay the same either way.
    background_noise: bool = False
    # Node-wide conditions on healthy nodes (sim.node_conditions: a power cap, a clock policy, hot
    # inlet air, a driver reload of the whole node), each kind at this rate per node-day (0: none),
    # from their own random stream; truth apart.
    node_conditions_per_node_day: float = 0.0
    # Pod attribution: "on" (the kubelet answers everywhere), "off" (no pod labels anywhere: pod,
    # namespace, team, project null, attribution 'off'), "mixed" (a third of the nodes without).
    attribution: str = "on"
    # The queue policy the scheduling round runs on the fleet (a name of gpuwarden.scheduling.POLICIES:
    # whoever builds the round checks it, the simulator never imports the scheduler), and how often a
    # round runs when jobs arrived or finished (a cluster action, such as an uncordon or a resume,
    # triggers a round at the next step).
    scheduler_policy: str = "gpuwarden"
    scheduling_interval_seconds: int = 300
    # False: the trace's arrivals never come; only work given to ``Simulation.submit`` arrives (a replay
    # of a recorded slice, e.g. the live-versus-simulator parity check)
    arrivals: bool = True
    # True: a cluster whose GPUs are allocated by Dynamic Resource Allocation (NVIDIA's DRA driver): pods
    # hold GPUs and MIG devices through ResourceClaims (``sim.dra``), a running pod holding what its
    # claims hold (a fractional pod the GPU or MIG device it got: quotas count that, as on such a cluster)
    dra: bool = False

    def __post_init__(self) -> None:
        for name, most in MOST_INT.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= most:
                expected = "1..8 (one HGX board)" if name == "gpus_per_node" else f"a positive integer <= {most}"
                raise ConfigError(f"{name}: {value!r} is not allowed; expected {expected}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"seed: {self.seed!r} is not allowed; expected an integer 0..{MAX_SEED}")
        for name, bound in MOST_FLOAT.items():
            figure = getattr(self, name)
            if (not isinstance(figure, (int, float)) or isinstance(figure, bool) or not math.isfinite(figure)
                    or not 0 <= figure <= bound):
                raise ConfigError(f"{name}: {figure!r} is not allowed; expected a finite number >= 0 and <= {bound:g}")
        for name in ("cluster", "openb_pod_list"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ConfigError(f"{name}: {getattr(self, name)!r} is not allowed; expected a name")
        if not isinstance(self.counts_overrides, Mapping):
            raise ConfigError(f"counts_overrides: {self.counts_overrides!r} is not allowed; expected fault kind: rate")
        for kind, rate in self.counts_overrides.items():
            if (not isinstance(rate, (int, float)) or isinstance(rate, bool) or not math.isfinite(rate)
                    or not 0 <= rate <= MOST_FLOAT["spot_reclaims_per_node_day"]):
                raise ConfigError(f"counts_overrides[{kind!r}]: {rate!r} is not allowed; expected events per GPU-day, "
                                  f"a finite number >= 0 and <= {MOST_FLOAT['spot_reclaims_per_node_day']:g}")
        if self.attribution not in ATTRIBUTION_MODES:
            raise ConfigError(f"attribution: {self.attribution!r} is not allowed; expected one of {', '.join(ATTRIBUTION_MODES)}")
        if not isinstance(self.scheduler_policy, str) or not self.scheduler_policy:
            raise ConfigError(f"scheduler_policy: {self.scheduler_policy!r} is not allowed; expected a policy name")
        for name in ("background_noise", "arrivals", "dra"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}: {getattr(self, name)!r} is not allowed; expected true or false")
        if self.start.tzinfo is None:
            object.__setattr__(self, "start", self.start.replace(tzinfo=UTC))

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], source: str = "config") -> SimConfig:
        unknown = [key for key in values if key not in cls.keys()]
        if unknown:
            raise ConfigError(f"{source}: unknown key {unknown[0]!r}; allowed keys: {', '.join(cls.keys())}")
        converted = dict(values)
        if isinstance(converted.get("start"), str):
            try:
                converted["start"] = datetime.fromisoformat(converted["start"])
            except ValueError:
                raise ConfigError(f"{source}: start: {converted['start']!r} is not an ISO-8601 time") from None
        if converted.get("data_dir") is not None:
            converted["data_dir"] = Path(converted["data_dir"])
        for f in fields(cls):
            if f.name in converted and f.type in ("float",) and isinstance(converted[f.name], int):
                converted[f.name] = float(converted[f.name])
        try:
            return cls(**converted)
        except TypeError as error:
            raise ConfigError(f"{source}: {error}") from None

    @classmethod
    def from_yaml(cls, path: str | Path) -> SimConfig:
        path = Path(path)
        if not path.exists() and not path.is_symlink():
            raise ConfigError(f"{path}: no such config file")
        # a FIFO would block for ever; aliases past a bound and a key given twice are refused
        loaded = read_yaml_file(path, "the sim config", ConfigError)
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping of settings at the top level")
        section = loaded.get("sim", loaded) if set(loaded) <= {"sim"} else loaded
        if not isinstance(section, dict):
            raise ConfigError(f"{path}: sim: expected a mapping of settings")
        return cls.from_mapping(section, source=str(path))

    def check_policy(self, allowed: Collection[str]) -> None:
        """Refuse a ``scheduler_policy`` that is not one of ``allowed`` (the scheduler's names,
        passed in by whoever wires the scheduler to the simulator)."""
        if self.scheduler_policy not in allowed:
            raise ConfigError(f"scheduler_policy: {self.scheduler_policy!r} is not allowed; expected one of "
                              f"{', '.join(allowed)}")

    def replace(self, **changes: Any) -> SimConfig:
        return dataclasses.replace(self, **changes)
