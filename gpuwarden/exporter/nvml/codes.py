"""NVML's return codes and the constants the exporter passes to NVML (``nvml.h``; a stable ABI)."""

from __future__ import annotations

# NVML return codes (nvml.h; stable ABI).
NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_NO_INSTANCE = 0xFFFFFFFF  # event data gpuInstanceId / computeInstanceId when no MIG instance is named

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_EVENT_TYPE_XID = 0x8  # nvmlEventTypeXidCriticalError
NVML_GPM_METRICS_GET_VERSION = 1  # c_nvmlGpmMetricsGet_t.version
