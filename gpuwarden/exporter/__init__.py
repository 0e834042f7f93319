"""exporter room: serves Prometheus metrics (DCGM-exporter names and labels) for the GPUs a
``gpuwarden.fleet.GpuBackend`` reads. Imports only ``gpuwarden.fleet``, the standard library and
``prometheus_client``."""

from gpuwarden.fleet.catalogue import MetricSpec, load_catalogue
from .collector import GpuCollector, build_families
from .service import ExporterService
from .snapshot import ExporterSnapshot

__all__ = ["ExporterService", "ExporterSnapshot", "GpuCollector", "MetricSpec", "build_families", "load_catalogue"]
