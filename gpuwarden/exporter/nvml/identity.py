"""What NVML says of each device that the NVIDIA DRA driver names it by.

The driver (``gpu.nvidia.com``, kubernetes-sigs/dra-driver-nvidia-gpu) names a whole GPU after its
minor number (``/dev/nvidia<minor>``, ``nvmlDeviceGetMinorNumber``), which need not be its NVML
index, and a MIG device after its parent's minor, its GPU-instance profile id and its placement
(``nvmlGpuInstanceGetInfo``). :class:`IdentityReader` reads these once per GPU (the minor) and
once per MIG device (the placement: static while the instance lives) through the query gate, and
hands the pod attribution step one collection's :class:`DeviceIdentity` tuple.

NVML gives a GPU instance's placement to a privileged user only (``nvmlDeviceGetGpuInstanceById``);
where it refuses, the identity carries the MIG profile alone, and a DRA name is then matched by
parent and profile only when that leaves one device (:mod:`..podresources.dra`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .codes import NVML_ERROR_NO_PERMISSION
from .query import NA, NvmlQuery

log = logging.getLogger("gpuwarden.exporter.nvml")


@dataclass(frozen=True)
class DeviceIdentity:
    """One GPU or MIG device as the DRA driver's names need it.

    ``minor`` is the GPU's, or the parent GPU's for a MIG device; ``parent_uuid`` is None for a
    whole GPU. The placement fields are None where NVML did not give them."""

    uuid: str  # GPU-... or MIG-...
    minor: int
    parent_uuid: str | None = None
    profile: str | None = None  # MIG profile, e.g. "1g.18gb"
    gi_profile_id: int | None = None  # GPU-instance profile id (nvidia-smi mig -lgip), e.g. 19
    placement_start: int | None = None
    placement_size: int | None = None


class IdentityReader:
    """Collects one collection's identities: :meth:`begin`, :meth:`gpu` / :meth:`mig` per device,
    :meth:`end`; ``identities`` is then the tuple of the latest complete collection."""

    def __init__(self, query: NvmlQuery):
        self.query = query
        self.identities: tuple[DeviceIdentity, ...] = ()
        self._current: list[DeviceIdentity] = []
        # MIG UUID -> (profile id, start, size), or None where NVML would not tell (asked once per instance)
        self._placements: dict[str, tuple[int, int, int] | None] = {}
        self._said_refused = False

    def minor(self, handle: Any, uuid: str) -> int | None:
        """The GPU's minor number, or None (unsupported: its DRA names cannot be matched)."""
        minor = self.query("nvmlDeviceGetMinorNumber", handle, device=uuid)
        return None if minor is NA else int(minor)

    def begin(self) -> None:
        self._current = []

    def gpu(self, uuid: str, minor: int | None) -> None:
        if minor is not None:
            self._current.append(DeviceIdentity(uuid, minor))

    def mig(self, parent_handle: Any, parent_uuid: str, minor: int | None, instance_id: int | None,
            mig_uuid: str | None, profile: str | None) -> None:
        if minor is None or not mig_uuid:
            return
        if mig_uuid not in self._placements:
            self._placements[mig_uuid] = self._placement(parent_handle, parent_uuid, instance_id)
        placement = self._placements[mig_uuid]
        profile_id, start, size = placement if placement is not None else (None, None, None)
        self._current.append(DeviceIdentity(mig_uuid, minor, parent_uuid, profile, profile_id, start, size))

    def end(self) -> None:
        self.identities = tuple(self._current)
        live = {i.uuid for i in self.identities}
        for gone in [u for u in self._placements if u not in live]:  # destroyed instances
            del self._placements[gone]

    def _placement(self, parent_handle: Any, parent_uuid: str, instance_id: int | None) -> tuple[int, int, int] | None:
        if instance_id is None:
            return None
        q = self.query
        instance = q("nvmlDeviceGetGpuInstanceById", parent_handle, instance_id, device=parent_uuid,
                     expected=(NVML_ERROR_NO_PERMISSION,))
        info = NA if instance is NA else q("nvmlGpuInstanceGetInfo", instance, device=parent_uuid,
                                           expected=(NVML_ERROR_NO_PERMISSION,))
        if info is NA:
            if not self._said_refused:
                self._said_refused = True
                log.info("nvml gives no GPU-instance placement here (it needs a privileged user): DRA MIG device "
                         "names are matched by parent GPU and profile, and said where that leaves several")
            return None
        placement = getattr(info, "placement", None)
        try:
            return int(info.profileId), int(placement.start), int(placement.size)  # type: ignore[union-attr]
        except (AttributeError, TypeError, ValueError):
            return None
