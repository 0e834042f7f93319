"""What the backend reads and how NVML's answers become numbers: the field-value table (one batched
``nvmlDeviceGetFieldValues`` call per GPU), the GPM metric table, and the decoders of field values,
process lists and MIG device names. NVML's "cannot tell" (:data:`~.query.NA`, NaN, NVML's
not-available value) decodes to None, which becomes an absent series.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from typing import Any

from .query import NA

# Field ids read in the one nvmlDeviceGetFieldValues call per GPU: id -> (values key, scale).
FIELDS: dict[int, tuple[str, float]] = {
    3: ("ecc_sbe_volatile_total", 1.0),  # NVML_FI_DEV_ECC_SBE_VOL_TOTAL
    4: ("ecc_dbe_volatile_total", 1.0),  # NVML_FI_DEV_ECC_DBE_VOL_TOTAL
    82: ("memory_temperature_celsius", 1.0),  # NVML_FI_DEV_MEMORY_TEMP
    83: ("energy_joules_total", 1e-3),  # NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ)
    94: ("pcie_replay_total", 1.0),  # NVML_FI_DEV_PCIE_REPLAY_COUNTER
    142: ("remapped_rows_correctable_total", 1.0),  # NVML_FI_DEV_REMAPPED_COR
    143: ("remapped_rows_uncorrectable_total", 1.0),  # NVML_FI_DEV_REMAPPED_UNC
    144: ("remapped_rows_pending", 1.0),  # NVML_FI_DEV_REMAPPED_PENDING
    145: ("remapped_rows_failure", 1.0),  # NVML_FI_DEV_REMAPPED_FAILURE
    230: ("recovery_action", 1.0),  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    # NVLink error counters, each already summed over the GPU's links by the driver; NotSupported on a
    # GPU without NVLink (the recorded H200), which leaves the series absent.
    38: ("nvlink_crc_flit_errors_total", 1.0),  # NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL
    45: ("nvlink_crc_data_errors_total", 1.0),  # NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL
    52: ("nvlink_replay_errors_total", 1.0),  # NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL
    59: ("nvlink_recovery_errors_total", 1.0),  # NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL
}
FIELD_IDS = list(FIELDS)

# GPM metric ids (percent 0-100 in NVML) -> values key (ratio 0-1, as DCGM's PROF fields).
GPM_METRICS: dict[int, str] = {
    1: "graphics_active_ratio",  # NVML_GPM_METRIC_GRAPHICS_UTIL -> DCGM_FI_PROF_GR_ENGINE_ACTIVE
    2: "sm_active_ratio",  # NVML_GPM_METRIC_SM_UTIL -> DCGM_FI_PROF_SM_ACTIVE
    3: "sm_occupancy_ratio",  # NVML_GPM_METRIC_SM_OCCUPANCY -> DCGM_FI_PROF_SM_OCCUPANCY
    5: "tensor_active_ratio",  # NVML_GPM_METRIC_ANY_TENSOR_UTIL -> DCGM_FI_PROF_PIPE_TENSOR_ACTIVE
    10: "dram_active_ratio",  # NVML_GPM_METRIC_DRAM_BW_UTIL -> DCGM_FI_PROF_DRAM_ACTIVE
}

_MIG_PROFILE = re.compile(r"(\d+c\.)?\d+g\.\d+gb(\+\w+)?")


def as_number(value: Any) -> float | None:
    if value is NA or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def field_number(entry: Any) -> float | None:
    kind = int(entry.valueType)
    union = entry.value
    raw = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(kind)
    return None if raw is None else as_number(getattr(union, raw))


def process_memory(procs: Iterable[Any]) -> Iterator[tuple[int, float | None]]:
    """(pid, used bytes or None where NVML cannot tell) of an NVML process list."""
    for proc in procs:
        pid = getattr(proc, "pid", None)
        if not isinstance(pid, int) or pid <= 0:
            continue
        used = as_number(getattr(proc, "usedGpuMemory", None))
        known = used is not None and 0 <= used < 2**63  # 2**64-1 is NVML_VALUE_NOT_AVAILABLE
        yield pid, used if known else None


def mig_profile_from_name(name: str) -> str | None:
    """``NVIDIA H100 80GB HBM3 MIG 1g.10gb`` -> ``1g.10gb``."""
    match = _MIG_PROFILE.search(name.rsplit("MIG", 1)[-1])
    return match.group(0) if match else None
