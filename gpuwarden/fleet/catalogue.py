"""The metric catalogue: a data file deciding what the exporter serves.

``metric_catalogue.csv`` (beside this module; its header comments document the columns) maps
fleet-samples columns to exported metric families, as dcgm-exporter's ``default-counters.csv``
does. :func:`load_catalogue` parses and validates it; nothing here reads a GPU.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from .errors import UserError
from .inputs import MAX_CONFIG_FILE_BYTES, checked_input
from .samples import METRIC_COLUMN_NAMES

DEFAULT_CATALOGUE_PATH = Path(__file__).with_name("metric_catalogue.csv")

# Sources the collector computes from a reading rather than reading from ``values``
# (``mem_free_bytes`` is read from ``values`` when present: a pod's series of a shared GPU).
DERIVED_SOURCES: frozenset[str] = frozenset({"mem_free_bytes", "gpu_lost"})

# Keys an exporter backend may put in ``GpuReading.values`` beyond the fleet-samples columns:
# what DCGM dashboards show but the samples table does not keep, and the exporter's own per-GPU
# figures. Units in the names, as in the samples table.
EXPORTER_SOURCES: dict[str, str] = {
    "mem_copy_util_ratio": "NVML utilisation.memory / 100: share of time device memory was read or written",
    "mem_clock_mhz": "memory clock",
    "memory_temperature_celsius": "HBM temperature (NVML_FI_DEV_MEMORY_TEMP)",
    "energy_joules_total": "energy since the driver loaded (NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION / 1000)",
    "sm_occupancy_ratio": "GPM SM occupancy 0..1 (absent where GPM is unsupported)",
    "graphics_active_ratio": "GPM graphics/compute engine activity 0..1 (absent where GPM is unsupported)",
    "xid_last_code": "the last XID code seen on the GPU, 0 for none (DCGM_FI_DEV_XID_ERRORS semantics)",
    "nvml_errors_total": "NVML errors (not NotSupported) the exporter met on this GPU",
    "collection_seconds": "time the exporter took to read this GPU in the latest collection",
    "pod_memory_attributed": ("on a GPU shared by several pods: 1 when mem_used_bytes is the pod's own (its "
                              "processes' sum), 0 when it is the whole GPU's"),
}

# Pattern sources (one "*") over exporter-only keys; the match becomes the row's label value.
EXPORTER_PATTERNS: frozenset[str] = frozenset({"xid_*_last_seen_timestamp_seconds"})

# Labels every GPU series carries (dcgm-exporter's names); a catalogue label may not reuse one.
GPU_LABELS: tuple[str, ...] = (
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "Hostname",
    "GPU_I_PROFILE",
    "GPU_I_ID",
    "pod",
    "namespace",
    "container",
    "DCGM_FI_DRIVER_VERSION",
    "node",  # the Kubernetes node name (dcgm-exporter's Hostname is often the exporter pod's name)
)

TYPES = ("gauge", "counter")
TRANSFORMS = ("value", "pattern", "bits", "state")
# A state row: one series per GPU labelled `label`=<current state>, value 1 (kube-state-metrics style);
# only the ``attribution`` column (known | off | failed) is such a state.
STATE_SOURCES: frozenset[str] = frozenset({"attribution"})
_COLUMNS = ("metric", "type", "source_column", "transform", "label", "scale", "help")
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class CatalogueError(UserError, ValueError):
    """The catalogue file is malformed; the message names the file and line."""


@dataclass(frozen=True)
class MetricSpec:
    """One catalogue row."""

    metric: str
    type: str  # gauge | counter
    source_column: str
    transform: str = "value"  # value | pattern | bits | state
    label: str = ""  # the extra label a pattern or bits row fills
    scale: float = 1.0
    help: str = ""

    def source_regex(self) -> re.Pattern[str]:
        """For a pattern row: a regex whose group 1 is the label value."""
        head, _, tail = self.source_column.partition("*")
        return re.compile(f"^{re.escape(head)}(.+?){re.escape(tail)}$")


def _parse_scale(text: str) -> float:
    text = text.strip() or "1"
    try:
        scale = float(Fraction(text))
    except (ValueError, ZeroDivisionError, OverflowError):  # Fraction("1e400") parses; float() overflows
        scale = math.nan
    if not math.isfinite(scale) or scale == 0:
        raise ValueError(f"invalid scale {text!r}: a finite, non-zero number or a fraction such as 1/1048576")
    return scale


def _check(spec: MetricSpec) -> None:
    if not _NAME.match(spec.metric):
        raise ValueError(f"invalid metric name {spec.metric!r}")
    if spec.type not in TYPES:
        raise ValueError(f"type must be one of {TYPES}, not {spec.type!r}")
    if spec.transform not in TRANSFORMS:
        raise ValueError(f"transform must be one of {TRANSFORMS}, not {spec.transform!r}")
    if spec.transform == "value":
        if spec.label:
            raise ValueError("a value row takes no label")
        if (spec.source_column not in METRIC_COLUMN_NAMES and spec.source_column not in DERIVED_SOURCES
                and spec.source_column not in EXPORTER_SOURCES):
            raise ValueError(f"unknown source column {spec.source_column!r}")
        return
    if not _LABEL.match(spec.label) or spec.label in GPU_LABELS:
        raise ValueError(f"a {spec.transform} row needs a new label name, not {spec.label!r}")
    if spec.transform == "state" and spec.source_column not in STATE_SOURCES:
        raise ValueError(f"state rows read one of {sorted(STATE_SOURCES)}, not {spec.source_column!r}")
    if spec.transform == "bits" and spec.source_column != "throttle_reasons_bitmask":
        raise ValueError("bits rows read throttle_reasons_bitmask (the only bitmask column)")
    if spec.transform == "pattern":
        if spec.source_column.count("*") != 1:
            raise ValueError("a pattern source needs exactly one '*'")
        if spec.source_column not in EXPORTER_PATTERNS and not any(spec.source_regex().match(c) for c in METRIC_COLUMN_NAMES):
            raise ValueError(f"pattern {spec.source_column!r} matches no fleet-samples column")


def data_rows(path: Path, columns: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    """(line number, row) of a CSV data file whose lines starting with '#' are comments and whose
    header must be ``columns``; values are stripped, missing trailing fields read as empty."""
    checked_input(path, "", MAX_CONFIG_FILE_BYTES, raising=CatalogueError)  # a FIFO or /dev/zero would never end
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            lines = [(n, line) for n, line in enumerate(handle, 1) if line.strip() and not line.lstrip().startswith("#")]
    except UnicodeDecodeError as error:
        raise CatalogueError(f"{path}: not a UTF-8 text CSV file (byte {error.start})") from None
    if not lines:
        raise CatalogueError(f"{path}: empty file")
    reader = csv.DictReader(line for _, line in lines)
    if tuple(reader.fieldnames or ()) != columns:
        raise CatalogueError(f"{path}:{lines[0][0]}: header must be {','.join(columns)}")
    rows = []
    for (lineno, _), row in zip(lines[1:], reader):
        if None in row:
            raise CatalogueError(f"{path}:{lineno}: more than the {len(columns)} fields {','.join(columns)}")
        rows.append((lineno, {k: (v or "").strip() for k, v in row.items()}))
    return rows


def load_catalogue(path: str | Path = DEFAULT_CATALOGUE_PATH) -> tuple[MetricSpec, ...]:
    """Read and validate a catalogue CSV. Lines starting with '#' are comments."""
    path = Path(path)
    specs: list[MetricSpec] = []
    seen: set[str] = set()
    for lineno, row in data_rows(path, _COLUMNS):
        try:
            spec = MetricSpec(metric=row["metric"], type=row["type"], source_column=row["source_column"],
                              transform=row["transform"] or "value", label=row["label"],
                              scale=_parse_scale(row["scale"]), help=row["help"])
            _check(spec)
            if spec.metric in seen:
                raise ValueError(f"duplicate metric {spec.metric!r}")
        except ValueError as exc:
            raise CatalogueError(f"{path}:{lineno}: {exc}") from None
        seen.add(spec.metric)
        specs.append(spec)
    return tuple(specs)
