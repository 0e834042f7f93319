"""The NVML GPU backend, in six parts along its seams:

- :mod:`.codes`: NVML's return codes and call constants;
- :mod:`.query`: the query gate, the only place that calls NVML (:class:`NvmlQuery`, :data:`NA`);
- :mod:`.fields`: the field-value and GPM tables, and the decoders of NVML's answers;
- :mod:`.xid`: the XID event thread and its per-GPU counters;
- :mod:`.identity`: minor numbers and MIG placements, by which the NVIDIA DRA driver names devices;
- :mod:`.backend`: :class:`NvmlBackend`, which reads every GPU and MIG instance once per collection.

The names below are the package's public API (``gpuwarden.exporter.nvml.X`` as before the split).
"""

from __future__ import annotations

from .backend import NvmlBackend
from .codes import (
    NVML_CLOCK_MEM,
    NVML_CLOCK_SM,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
    NVML_EVENT_TYPE_XID,
    NVML_GPM_METRICS_GET_VERSION,
    NVML_NO_INSTANCE,
    NVML_SUCCESS,
    NVML_TEMPERATURE_GPU,
)
from .fields import FIELD_IDS, FIELDS, GPM_METRICS, mig_profile_from_name
from .identity import DeviceIdentity, IdentityReader
from .query import FORBIDDEN_CALLS, MISSING, NA, GpuLost, NvmlQuery, NvmlUnavailable
from .xid import XidTracker, XidWatcher

__all__ = [
    "FIELDS", "FIELD_IDS", "FORBIDDEN_CALLS", "GPM_METRICS", "MISSING", "NA",
    "NVML_CLOCK_MEM", "NVML_CLOCK_SM", "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_INVALID_ARGUMENT",
    "NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_NOT_FOUND", "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_TIMEOUT",
    "NVML_EVENT_TYPE_XID", "NVML_GPM_METRICS_GET_VERSION", "NVML_NO_INSTANCE", "NVML_SUCCESS",
    "NVML_TEMPERATURE_GPU", "DeviceIdentity", "GpuLost", "IdentityReader", "NvmlBackend", "NvmlQuery", "NvmlUnavailable", "XidTracker", "XidWatcher",
    "mig_profile_from_name",
]
