"""The exporter's command line, kept light: ``python -m gpuwarden.exporter`` (what the DaemonSet
runs) imports nothing but the exporter, ``fleet``, ``prometheus_client``, ``pynvml`` and, when a
kubelet socket exists, ``grpc``. ``gpuwarden exporter`` uses the same options and adds the
simulated fleet (``--backend sim``), which this module cannot import.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from gpuwarden.fleet.errors import UserError
from gpuwarden.fleet.gpu_catalogue import gpu_catalogue
from gpuwarden.fleet.paths import default_data_dir

from .nvml import NvmlBackend, NvmlUnavailable
from .podresources import DEFAULT_SOCKET, PodAttributor
from .podresources.processes import DEFAULT_KUBELET_ROOT, DEFAULT_PROC_ROOT, PodMemory
from .replay import ReplayBackend, ReplayError
from .service import ExporterService

log = logging.getLogger("gpuwarden.exporter")

BACKENDS = ("nvml", "replay", "sim")
REPLAY_MIG_LIMIT = gpu_catalogue().model("NVIDIA H200").mig_compute_slices  # the recorded GPU is an H200


class ExporterError(UserError):
    """A user-fixable problem: printed as one line, exit 2."""


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (e.g. 0.0.0.0:9400)")
    return host or "0.0.0.0", int(port)


def _positive(kind: type) -> Callable[[str], Any]:
    """A finite number > 0: ``nan`` and ``inf`` would make the collection loop spin or never run."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed; expected a finite number > 0 (seconds)")
        return value
    return parse


def _count(limit: int) -> Callable[[str], int]:
    """An integer 0..limit: a replay of 10**8 GPUs would never finish its first collection."""
    def parse(text: str) -> int:
        if not text.isdigit() or int(text) > limit:
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed; expected an integer 0..{limit}")
        return int(text)
    return parse


def add_arguments(parser: argparse.ArgumentParser, backends: Sequence[str] = BACKENDS, default_backend: str = "nvml") -> None:
    parser.add_argument("--backend", choices=list(backends), default=default_backend,
                        help=f"where GPUs are read from (default {default_backend}): nvml = this node's GPUs, "
                             "replay = a recorded H200 trace, sim = the simulated fleet")
    parser.add_argument("--listen", type=_host_port, default=("0.0.0.0", 9400), help="HOST:PORT (default 0.0.0.0:9400)")
    parser.add_argument("--interval", type=_positive(float), default=15.0, help="seconds between collections (default 15)")
    parser.add_argument("--node-name", default=None,
                        help="Kubernetes node name for the node/Hostname labels (default $NODE_NAME, else the host name); "
                             "with --backend sim: serve only this simulated node")
    parser.add_argument("--kubelet-socket", default=DEFAULT_SOCKET,
                        help=f"kubelet pod-resources socket for pod labels (default {DEFAULT_SOCKET}; 'none' turns pod labels off)")
    parser.add_argument("--proc-root", default=DEFAULT_PROC_ROOT,
                        help=f"the host's /proc (needs hostPID) for per-pod memory on time-sliced GPUs (default {DEFAULT_PROC_ROOT}; "
                             "'none': every pod sharing a GPU carries the GPU's memory)")
    parser.add_argument("--kubelet-root", default=DEFAULT_KUBELET_ROOT,
                        help=f"the kubelet's folder, whose pods/<uid>/ name the pods of PIDs (default {DEFAULT_KUBELET_ROOT})")
    parser.add_argument("--watchdog", type=_positive(float), default=None,
                        help="seconds a collection may run before the snapshot is marked stale (default min(10, 3 intervals))")
    parser.add_argument("--catalogue", default=None, help="metric catalogue CSV deciding what is exported (default: the built-in one)")
    replay = parser.add_argument_group("replay backend")
    replay.add_argument("--replay-trace", default=None, help="phase trace CSV (default <data>/h200/phase_trace.csv)")
    replay.add_argument("--replay-probe", default=None, help="NVML probe JSON (default <data>/h200/nvml_probe.json)")
    replay.add_argument("--replay-gpus", type=_count(1024), default=1, help="GPUs to play from the recorded one (default 1)")
    replay.add_argument("--replay-mig", type=_count(REPLAY_MIG_LIMIT), default=0, help="MIG instances per replayed GPU (default 0: MIG off)")
    replay.add_argument("--replay-mig-profile", default="1g.18gb", help="profile of the replayed MIG instances (default 1g.18gb)")
    replay.add_argument("--replay-latency", action="store_true", help="make each NVML call cost its recorded H200 median")


def node_name(args: argparse.Namespace) -> str:
    return args.node_name or os.environ.get("NODE_NAME") or socket.gethostname()


def build_backend(args: argparse.Namespace) -> NvmlBackend:
    """The nvml or replay backend, opened; :class:`ExporterError` says what to do instead."""
    node = node_name(args)
    if args.backend == "nvml":
        backend = NvmlBackend(node)
        try:
            return backend.open()
        except NvmlUnavailable as error:
            raise ExporterError(
                f"--backend nvml: NVML is not available ({error}); is the NVIDIA driver installed and the GPU visible "
                "to this container? Use --backend replay (a recorded H200) or, with 'gpuwarden exporter', --backend sim "
                "(the simulated fleet) to run without a GPU") from None
    if args.backend == "replay":
        data = default_data_dir() / "h200"
        trace = args.replay_trace or data / "phase_trace.csv"
        probe = args.replay_probe or data / "nvml_probe.json"
        try:
            backend = ReplayBackend(node, trace, probe, gpus=args.replay_gpus,
                                    mig_profiles=[args.replay_mig_profile] * args.replay_mig, latency=args.replay_latency)
        except ReplayError as error:
            raise ExporterError(f"--backend replay: {error}") from None
        return backend.open()
    raise ExporterError(f"--backend {args.backend}: not available from this entry point; use 'gpuwarden exporter'")


def build_service(args: argparse.Namespace, backend: Any, *, node: str) -> ExporterService:
    catalogue = None
    if args.catalogue:
        from gpuwarden.fleet.catalogue import CatalogueError, load_catalogue

        try:
            catalogue = load_catalogue(args.catalogue)
        except (CatalogueError, OSError) as error:
            raise ExporterError(f"--catalogue: {error}") from None
    attributor = None
    if args.kubelet_socket and args.kubelet_socket.lower() != "none" and getattr(backend, "name", "") != "sim":
        proc_root = getattr(args, "proc_root", DEFAULT_PROC_ROOT)
        memory = None
        if proc_root and proc_root.lower() != "none":
            memory = PodMemory(proc_root, getattr(args, "kubelet_root", DEFAULT_KUBELET_ROOT))
        identities = backend.device_identities if isinstance(backend, NvmlBackend) else None  # DRA device names
        attributor = PodAttributor(args.kubelet_socket, memory=memory, identities=identities)
    host, port = args.listen
    return ExporterService(backend, interval_seconds=args.interval, host=host, port=port, catalogue=catalogue,
                           node_name=node, attributor=attributor, watchdog_seconds=args.watchdog)


def serve(service: ExporterService, *, tick: Callable[[], None] | None = None, stop: threading.Event | None = None) -> int:
    """Start, print where, and run until SIGTERM / Ctrl-C (or ``stop``); ``tick`` runs every interval."""
    stop = stop or threading.Event()

    def on_sigterm(*_: object) -> None:
        if stop.is_set():  # a second SIGTERM while shutting down: go now
            os._exit(128 + signal.SIGTERM)
        stop.set()

    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # not the main thread (tests)
        pass
    try:
        service.start()
    except OSError as error:
        raise ExporterError(f"--listen {service.host}:{service.port}: {error.strerror or error}") from None
    print(f"serving {service.url} (backend {getattr(service.backend, 'name', '?')}, node {service.node_name or '-'}, "
          f"interval {service.interval_seconds:g}s); Ctrl-C stops", flush=True)
    try:
        if tick is None:
            stop.wait()  # no periodic wake-up: SIGTERM's handler or Ctrl-C ends the wait
        while tick is not None and not stop.wait(service.interval_seconds):
            tick()
    except KeyboardInterrupt:
        pass
    finally:
        service.stop(timeout=2.0)
        _close_within(service.backend, seconds=2.0)
    return 0


def _close_within(backend: Any, seconds: float) -> None:
    """Close the backend, but never wait on it longer than ``seconds``: a hung NVML call must not
    keep a SIGTERM'd exporter alive (the process exits and the driver frees what it held)."""
    close = getattr(backend, "close", None)
    if close is None:
        return
    closer = threading.Thread(target=close, name="gpuwarden-exporter-close", daemon=True)
    closer.start()
    closer.join(seconds)
    if closer.is_alive():
        log.warning("backend close did not return within %gs; exiting without it", seconds)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see '{self.prog} --help')\n")
        raise SystemExit(2)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="python -m gpuwarden.exporter", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, backends=("nvml", "replay"))
    parser.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        backend = build_backend(args)
        return serve(build_service(args, backend, node=node_name(args)))
    except ExporterError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
