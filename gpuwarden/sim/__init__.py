"""The simulated fleet: trace-driven nodes, GPUs, jobs, utilisation and faults (with ground truth)."""

from .config import ConfigError, SimConfig
from .engine import Simulation
from gpuwarden.fleet.traces import TraceError, default_data_dir

__all__ = ["ConfigError", "SimConfig", "Simulation", "TraceError", "default_data_dir"]
