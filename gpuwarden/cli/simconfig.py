"""Simulation options shared by ``demo``, ``sim generate`` and ``exporter --backend sim``."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpuwarden.sim import SimConfig

from .args import non_negative_float, non_negative_int, positive_int


def add_sim_options(parser: argparse.ArgumentParser, fault_scale_default: float = 1.0) -> None:
    group = parser.add_argument_group("simulated fleet")
    group.add_argument("--config", type=Path, help="YAML file of simulation settings (keys of SimConfig)")
    group.add_argument("--seed", type=int, help="random seed (an integer); same seed, same fleet and samples")
    group.add_argument("--nodes", type=positive_int, help="number of GPU nodes (default 64)")
    group.add_argument("--gpus-per-node", type=positive_int, help="GPUs per node, 1..8 (default 8)")
    group.add_argument("--step-seconds", type=positive_int, help="simulated seconds per sample (default 60)")
    group.add_argument("--warmup-days", type=non_negative_float, help="days simulated before recording starts (default 1)")
    group.add_argument(
        "--fault-scale", type=non_negative_float,
        help=f"multiplier on published hardware fault rates (default {fault_scale_default:g})",
    )
    parser.set_defaults(fault_scale_default=fault_scale_default)
    group.add_argument("--data-dir", type=Path, help="where the real traces live (default ../shared/data)")
    group.add_argument("--max-training-gpus", type=non_negative_int, help=argparse.SUPPRESS)


def sim_config_from(args: argparse.Namespace) -> SimConfig:
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
