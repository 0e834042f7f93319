"""The query gate: every NVML call of the exporter goes through :class:`NvmlQuery`.

It initialises NVML lazily, turns an unsupported call or field into the :data:`NA` sentinel (an
absent series, never a fake 0), logs each unknown function or unexpected error once, counts errors
per GPU, and raises :class:`GpuLost` for ``NVML_ERROR_GPU_IS_LOST`` so that one GPU is marked lost
while the others carry on. It refuses the calls in :data:`FORBIDDEN_CALLS`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from .codes import (
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
)

log = logging.getLogger("gpuwarden.exporter.nvml")

# Calls the exporter must never make on the collection path.
FORBIDDEN_CALLS = frozenset({"nvmlDeviceGetPcieThroughput", "nvmlDeviceGetTotalEnergyConsumption"})


class _NotAvailable:
    """The one sentinel for "NVML cannot tell": it becomes an absent series."""

    _instance: _NotAvailable | None = None

    def __new__(cls) -> _NotAvailable:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "NA"


NA: Any = _NotAvailable()


class NvmlUnavailable(RuntimeError):
    """NVML could not be initialised: no driver, no library, or no permission."""


class _Missing:
    """What :class:`NvmlQuery` returns for ``missing=`` callers when this NVML lacks the function."""


MISSING: Any = _Missing()


class GpuLost(Exception):
    """NVML_ERROR_GPU_IS_LOST from a call on one GPU."""


def _error_code(error: BaseException) -> int | None:
    value = getattr(error, "value", None)
    return value if isinstance(value, int) else None


def as_text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlQuery:
    """The single gate to NVML. ``query(name, *args, device=key)`` calls ``nvml.<name>(*args)``.

    Returns :data:`NA` (or ``default``) when the call is unsupported, unknown to this driver, or
    fails; raises :class:`GpuLost` when the GPU is lost and :class:`NvmlUnavailable` when NVML
    cannot be initialised. Each unknown function, and each (function, error) pair, is logged once.
    """

    QUIET = frozenset({NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NOT_FOUND})

    def __init__(self, nvml: Any = None):
        self._nvml = nvml
        self._init_lock = threading.Lock()
        self._initialised = False
        self._logged: set[tuple[str, object]] = set()
        self.errors: dict[str, int] = {}  # device key -> NVML errors (not NotSupported) so far
        self.calls: dict[str, int] = {}  # function name -> calls, for tests and the bench

    @property
    def nvml(self) -> Any:
        if self._nvml is None:
            try:
                import pynvml  # type: ignore[import-untyped]  # nvidia-ml-py: importing does not load libnvidia-ml
            except ImportError as error:  # pragma: no cover - a declared dependency
                raise NvmlUnavailable(f"the nvidia-ml-py package is not installed ({error})") from None
            self._nvml = pynvml
        return self._nvml

    @property
    def initialised(self) -> bool:
        return self._initialised

    def init(self) -> None:
        """Initialise NVML once; raise :class:`NvmlUnavailable` with NVML's own reason."""
        if self._initialised:
            return
        with self._init_lock:
            if self._initialised:
                return
            nvml = self.nvml
            try:
                nvml.nvmlInit()
            except Exception as error:  # noqa: BLE001 (NVMLError, OSError from ctypes...)
                raise NvmlUnavailable(f"{type(error).__name__}: {error}") from None
            self._initialised = True
            log.info("nvml initialised")

    def shutdown(self) -> None:
        with self._init_lock:
            if self._initialised:
                try:
                    self.nvml.nvmlShutdown()
                except Exception as error:  # noqa: BLE001
                    log.debug("nvmlShutdown failed: %s", error)
                self._initialised = False

    def _once(self, key: tuple[str, object], level: int, message: str, *args: object) -> None:
        if key in self._logged:
            return
        self._logged.add(key)
        log.log(level, message, *args)

    def count_error(self, device: str | None) -> None:
        if device is not None:
            self.errors[device] = self.errors.get(device, 0) + 1

    def __call__(self, name: str, *args: Any, device: str | None = None, default: Any = NA,
                 expected: Iterable[int] = (), missing: Any = None) -> Any:
        """``missing``: returned instead of ``default`` (and not logged) when this library or driver
        lacks the function, so that a caller can fall back to an older call."""
        if name in FORBIDDEN_CALLS:
            raise ValueError(f"{name} must not be called on the collection path")
        self.init()
        nvml = self.nvml
        function = getattr(nvml, name, None)
        if function is None:
            if missing is not None:
                return missing
            self._once((name, "missing"), logging.WARNING, "nvml: %s is unknown to this nvidia-ml-py; treated as unsupported", name)
            return default
        self.calls[name] = self.calls.get(name, 0) + 1
        try:
            return function(*args)
        except nvml.NVMLError as error:
            code = _error_code(error)
            if code == NVML_ERROR_GPU_IS_LOST:
                self.count_error(device)
                raise GpuLost(f"{name}: {error}") from None
            if code is not None and (code in self.QUIET or code in expected):
                self._once((name, code), logging.DEBUG, "nvml: %s -> %s (absent)", name, error)
                return default
            if missing is not None and code in (NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_ARGUMENT_VERSION_MISMATCH):
                return missing
            if code == NVML_ERROR_FUNCTION_NOT_FOUND:
                self._once((name, code), logging.WARNING, "nvml: %s is not in this driver's NVML; treated as unsupported", name)
                return default
            self.count_error(device)
            self._once((name, code), logging.WARNING, "nvml: %s failed on %s: %s (absent; logged once)", name, device, error)
            return default
