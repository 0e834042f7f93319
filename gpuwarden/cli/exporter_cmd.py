"""``gpuwarden exporter``: serve Prometheus metrics for the GPUs of one backend.

Backends today: ``sim`` (the simulated fleet, stepped at --interval). The NVML and replay backends
are the exporter issue's work.
"""

from __future__ import annotations

import argparse
import threading

from gpuwarden.exporter import ExporterService
from gpuwarden.sim import Simulation
from gpuwarden.sim.backend import SimGpuBackend

from .args import host_port, positive_float
from .simconfig import add_sim_options, sim_config_from


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("exporter", help="serve GPU metrics for Prometheus", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sim"], default="sim", help="where GPUs are read from (default sim)")
    parser.add_argument("--listen", type=host_port, default=("0.0.0.0", 9400), help="HOST:PORT (default 0.0.0.0:9400)")
    parser.add_argument("--interval", type=positive_float, default=15.0, help="seconds between collections (default 15)")
    parser.add_argument("--node-name", help="serve only this node's GPUs (default: every node the backend has)")
    add_sim_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    simulation = Simulation(sim_config_from(args))
    simulation.step()
    nodes = [args.node_name] if args.node_name else None
    if nodes and args.node_name not in {n.name for n in simulation.nodes}:
        raise SystemExit(f"gpuwarden exporter: error: --node-name {args.node_name!r} is not a simulated node "
                         f"(e.g. {simulation.nodes[0].name})")
    host, port = args.listen
    service = ExporterService(SimGpuBackend(simulation, nodes), interval_seconds=args.interval, host=host, port=port)
    service.start()
    print(f"serving {service.url} (backend {args.backend}); Ctrl-C stops", flush=True)
    stop = threading.Event()
    try:
        while not stop.wait(args.interval):
            simulation.step()
    except KeyboardInterrupt:
        pass
    finally:
        service.stop()
    return 0
