"""The immutable snapshot one collection produces and every scrape renders."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwarden.fleet import GpuReading


@dataclass(frozen=True)
class ExporterSnapshot:
    """GPUs read once, plus how that collection went.

    ``timestamp_seconds`` / ``duration_seconds`` / ``success`` describe the latest collection
    attempt; after a failed attempt ``readings`` are still those of the last successful one.
    """

    readings: tuple[GpuReading, ...] = ()
    driver_version: str = ""
    success: bool = False
    timestamp_seconds: float | None = None  # wall-clock end of the latest attempt; None before any
    duration_seconds: float | None = None
    last_success_timestamp_seconds: float | None = None
    error: str | None = None  # the latest attempt's error, when it failed
    node: str = ""  # the node label of the exporter's own series
    stale: bool = False  # the watchdog found a collection hung, or none succeeded lately
    pod_attribution: bool | None = None  # did the kubelet answer; None: pod attribution is off
    # Can the pod labels be trusted: "known" (attribution answered, or the backend labels pods
    # itself), "off" (nobody looked), "failed"; None before any collection (no series served).
    attribution: str | None = None
