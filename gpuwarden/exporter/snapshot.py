"""The immutable snapshot one collection produces and every scrape renders."""

from __future__ import annotations

from dataclasses import dataclass, fields

from gpuwarden.fleet import GpuReading


@dataclass(frozen=True)
class DraClaim:
    """The DRA allocation through which a pod holds a device (kubelet pod-resources
    ``DynamicResource`` / ``ClaimResource``); rendered as dcgm-exporter's ``dra_*`` labels."""

    claim_namespace: str
    claim_name: str
    driver: str
    pool: str
    device: str

    def labels(self) -> dict[str, str]:
        return {"dra_claim_name": self.claim_name, "dra_claim_namespace": self.claim_namespace,
                "dra_driver_name": self.driver, "dra_pool_name": self.pool, "dra_device_name": self.device}


@dataclass(frozen=True)
class AttributedReading(GpuReading):
    """A reading the pod attribution step decided more of than fleet's reading holds: the DRA
    ``claim`` its pod holds it through, or ``owner_unknown`` for a GPU without a pod label that a
    DRA device nobody could map may be (its attribution state is then "failed", never "known")."""

    claim: DraClaim | None = None
    owner_unknown: bool = False


def attributed(reading: GpuReading, *, claim: DraClaim | None = None, owner_unknown: bool = False) -> AttributedReading:
    return AttributedReading(**{f.name: getattr(reading, f.name) for f in fields(GpuReading)},
                             claim=claim, owner_unknown=owner_unknown)


@dataclass(frozen=True)
class DraStatus:
    """How the latest kubelet answer's DRA GPU devices (driver ``gpu.nvidia.com``) mapped to GPUs."""

    devices: int = 0  # held by pods and mapped to a GPU or MIG device
    unresolved: int = 0  # held by pods, but named as no GPU or MIG device here (said, never guessed)
    unresolved_total: int = 0  # allocations (pod, container, claim, device) first seen unresolved, since start


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
    dra: DraStatus | None = None  # None: pod attribution is off
