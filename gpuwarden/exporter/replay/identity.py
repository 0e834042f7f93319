"""The recorded NVML's device identities: minor numbers and MIG GPU-instance placements.

The probe was recorded on a node with one H200 and MIG off, so these answers are made up the way
an H200 gives them: a GPU's minor number is its index unless ``minors`` says otherwise (on a real
node they can differ), and the MIG instances of :class:`~.recorded.RecordedNvml` sit one after
another at the first placement their profile allows, with Hopper's GPU-instance profile ids
(``nvidia-smi mig -lgip``). ``gpu_instances_refused`` answers NVML_ERROR_NO_PERMISSION for the
GPU-instance calls, as NVML does for an unprivileged process.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pynvml  # type: ignore[import-untyped]

# Hopper (H100 / H200) GPU-instance profiles: name -> (profile id, memory slices its placement spans)
HOPPER_GI_PROFILES: dict[str, tuple[int, int]] = {
    "1g.18gb": (19, 1), "1g.18gb+me": (20, 1), "1g.35gb": (15, 2), "2g.35gb": (14, 2),
    "3g.71gb": (9, 4), "4g.71gb": (5, 4), "7g.141gb": (0, 8),
    "1g.10gb": (19, 1), "1g.20gb": (15, 2), "2g.20gb": (14, 2), "3g.40gb": (9, 4), "4g.40gb": (5, 4), "7g.80gb": (0, 8),
}
FIRST_GPU_INSTANCE_ID = 7  # the recorded NVML numbers its instances from 7 upwards, as H100/H200 number 1g instances


def placements(profiles: Sequence[str]) -> list[tuple[int, int, int] | None]:
    """(profile id, placement start, size) of each instance, packed in order; None for a profile
    this table does not know."""
    out: list[tuple[int, int, int] | None] = []
    start = 0
    for profile in profiles:
        known = HOPPER_GI_PROFILES.get(profile)
        if known is None:
            out.append(None)
            continue
        profile_id, size = known
        start = -(-start // size) * size  # a placement starts at a multiple of its size
        out.append((profile_id, start, size))
        start += size
    return out


@dataclass(frozen=True)
class RecordedGpuInstance:
    index: int
    slot: int


class RecordedIdentity:
    """Mixed into :class:`~.recorded.RecordedNvml`: minor numbers, per-GPU MIG mode, GPU instances."""

    mig_profiles: tuple[str, ...]
    mig_gpus: frozenset[int] | None = None  # GPUs with MIG on (None: every GPU, when profiles are given)
    minors: dict[int, int]
    gpu_instances_refused: bool = False

    def _init_identity(self, mig_gpus: Collection[int] | None) -> None:
        self.mig_gpus = None if mig_gpus is None else frozenset(mig_gpus)
        self.minors = {}

    def _enter(self, name: str, handle: Any = None) -> None:  # RecordedNvml's
        raise NotImplementedError

    def mig_on(self, index: int) -> bool:
        return bool(self.mig_profiles) and (self.mig_gpus is None or index in self.mig_gpus)

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetMinorNumber", handle)
        if handle.mig_slot is not None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(self.minors.get(handle.index, handle.index))

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, instance_id: int) -> RecordedGpuInstance:
        self._enter("nvmlDeviceGetGpuInstanceById", handle)
        if self.gpu_instances_refused:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        slot = instance_id - FIRST_GPU_INSTANCE_ID
        if handle.mig_slot is not None or not self.mig_on(handle.index) or not 0 <= slot < len(self.mig_profiles):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return RecordedGpuInstance(handle.index, slot)

    def nvmlGpuInstanceGetInfo(self, instance: RecordedGpuInstance) -> SimpleNamespace:
        self._enter("nvmlGpuInstanceGetInfo", None)
        placement = placements(self.mig_profiles)[instance.slot]
        if placement is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        profile_id, start, size = placement
        return SimpleNamespace(id=instance.slot + FIRST_GPU_INSTANCE_ID, profileId=profile_id,
                               placement=SimpleNamespace(start=start, size=size))
