"""Simulation options shared by ``demo``, ``sim generate`` and ``exporter --backend sim``."""

from __future__ import annotations

import argparse
from pathlib import Path

from .args import non_negative_int, number, seed

MAX_NODES = 4096  # a simulated fleet larger than this does not fit a laptop's memory
MAX_FAULT_SCALE = 1000.0  # beyond this every GPU fails every step; the simulation only spins


def add_sim_options(parser: argparse.ArgumentParser, fault_scale_default: float = 1.0) -> None:
    group = parser.add_argument_group("simulated fleet")
    group.add_argument("--config", type=Path, help="YAML file of simulation settings (keys of SimConfig)")
    group.add_argument("--seed", type=seed, help="random seed, 0..4294967295; same seed, same fleet and samples")
    group.add_argument("--nodes", type=number(int, 1, MAX_NODES), help=f"number of GPU nodes, 1..{MAX_NODES} (default 64)")
    group.add_argument("--gpus-per-node", type=number(int, 1, 1000), help="GPUs per node, 1..8 (default 8)")
    group.add_argument("--step-seconds", type=number(int, 1, 3600), help="simulated seconds per sample, 1..3600 (default 60)")
    group.add_argument("--warmup-days", type=number(float, 0, 30),
                       help="days simulated before recording starts, 0..30 (default 1)")
    group.add_argument(
        "--fault-scale", type=number(float, 0, MAX_FAULT_SCALE),
        help=f"multiplier on published hardware fault rates, 0..{MAX_FAULT_SCALE:g} (default {fault_scale_default:g})",
    )
    parser.set_defaults(fault_scale_default=fault_scale_default)
    group.add_argument("--data-dir", type=Path, help="where the real traces live (default ../shared/data)")
    group.add_argument("--max-training-gpus", type=non_negative_int, help=argparse.SUPPRESS)


def sim_config_from(args: argparse.Namespace):
    """The SimConfig the options describe (imports the simulator only now: ``--help`` stays fast)."""
    from gpuwarden.sim import SimConfig

    config = SimConfig.from_yaml(args.config) if args.config else SimConfig()
    overrides = {
        "seed": args.seed,
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "step_seconds": args.step_seconds,
        "warmup_days": args.warmup_days,
        "data_dir": args.data_dir,
        "max_training_gpus": args.max_training_gpus,
    }
    changes = {key: value for key, value in overrides.items() if value is not None}
    if args.fault_scale is not None:
        changes["fault_rate_scale"] = args.fault_scale
    elif not args.config:
        changes["fault_rate_scale"] = args.fault_scale_default
    return config.replace(**changes) if changes else config


def recording_ends_at(config, end, days: float):
    """``config`` started so that its ``days`` of recorded samples end at ``end`` (a UTC time), the
    start on the step grid: the demo's and ``sim generate``'s fleets end at (or just before) now."""
    import pandas as pd

    start = pd.Timestamp(end) - pd.Timedelta(days=days)
    return config.replace(start=start.floor(f"{config.step_seconds}s").to_pydatetime())
