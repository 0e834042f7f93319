"""``gpuwarden exporter``: serve Prometheus metrics (DCGM-exporter names) for the GPUs of one backend.

Backends: ``nvml`` (this node's GPUs; the default, as in the DaemonSet), ``replay`` (a recorded
H200: ../shared/data/h200/phase_trace.csv and nvml_probe.json, one row per collection) and ``sim``
(the simulated fleet, stepped at --interval). Pod labels come from the kubelet pod-resources
socket when it exists. On a GPU node the DaemonSet runs ``python -m gpuwarden.exporter``, which
takes the same options but imports only the exporter (a smaller process).
"""

from __future__ import annotations

import argparse
import sys

from gpuwarden.exporter.main import (
    REPLAY_MIG_LIMIT,
    ExporterError,
    add_arguments,
    build_backend,
    build_service,
    node_name,
    serve,
)

from .args import number, plain
from .simconfig import add_sim_options, sim_config_from

# Ceilings for the exporter's number flags (its own parser checks only the sign): a NaN or
# infinite interval would spin the collection loop; 1e8 replayed GPUs would never start.
_BOUNDS = {
    "interval": number(float, 0.05, 3600),
    "watchdog": number(float, 0.05, 86400),
    "replay_gpus": number(int, 1, 1024),
    "replay_mig": number(int, 0, REPLAY_MIG_LIMIT),
}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("exporter", help="serve GPU metrics for Prometheus", description=plain(__doc__),
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    for action in parser._actions:
        if action.dest in _BOUNDS:
            action.type = _BOUNDS[action.dest]
    add_sim_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        if args.backend == "sim":
            return _run_sim(args)
        backend = build_backend(args)
        return serve(build_service(args, backend, node=node_name(args)))
    except ExporterError as error:
        print(f"gpuwarden exporter: error: {error}", file=sys.stderr)
        return 2


def _run_sim(args: argparse.Namespace) -> int:
    from gpuwarden.sim.backend import SimGpuBackend

    from .simfleet import simulated_fleet

    simulation = simulated_fleet(sim_config_from(args))
    simulation.step()
    nodes = [args.node_name] if args.node_name else None
    if nodes and args.node_name not in {n.name for n in simulation.nodes}:
        raise ExporterError(f"--node-name {args.node_name!r} is not a simulated node (e.g. {simulation.nodes[0].name})")
    service = build_service(args, SimGpuBackend(simulation, nodes), node=args.node_name or "")
    return serve(service, tick=simulation.step)
