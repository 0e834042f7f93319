"""exporter room: serves Prometheus metrics (DCGM-exporter names and labels) for the GPUs a
``gpuwarden.fleet.GpuBackend`` reads: NVML (``NvmlBackend``), a recorded H200 (``ReplayBackend``), or
the simulated fleet (wired by the CLI). Imports only ``gpuwarden.fleet``, the standard library,
``prometheus_client``, ``pynvml`` and, lazily when a kubelet socket exists, ``grpc``."""

from gpuwarden.fleet.catalogue import MetricSpec, load_catalogue

from .collector import GpuCollector, build_families, render_text
from .nvml import NvmlBackend, NvmlUnavailable
from .podresources import PodAttributor
from .replay import RecordedNvml, ReplayBackend, ReplayError
from .service import ExporterService
from .snapshot import ExporterSnapshot

__all__ = ["ExporterService", "ExporterSnapshot", "GpuCollector", "MetricSpec", "NvmlBackend", "NvmlUnavailable",
           "PodAttributor", "RecordedNvml", "ReplayBackend", "ReplayError", "build_families", "load_catalogue",
           "render_text"]
