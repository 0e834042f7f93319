"""The replay files: ``phase_trace.csv`` (one row of dynamic GPU values per collection) and
``nvml_probe.json`` (a real H200's static NVML answers and errors). A malformed file raises
:class:`ReplayError` naming the file and line.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwarden.fleet.errors import UserError
from gpuwarden.fleet.inputs import MAX_CONFIG_FILE_BYTES, MAX_SAMPLES_FILE_BYTES, checked_input

# Columns of phase_trace.csv the recorded NVML answers from; every other column but `phase` must
# be numeric too. NaN is allowed only in GPM columns (the first GPM window has no value).
TRACE_COLUMNS = (
    "gpu_util", "mem_util", "mem_used_mib", "power_w", "temp_c", "sm_clock_mhz", "mem_clock_mhz",
    "clocks_event_reasons", "energy_mj", "n_procs",
    "gpm_graphics_util", "gpm_sm_util", "gpm_sm_occupancy", "gpm_any_tensor_util", "gpm_dram_bw_util",
)
_TEXT_COLUMNS = frozenset({"phase"})


class ReplayError(UserError, ValueError):
    """A replay file is missing or malformed; the message names the file and line."""


@dataclass(frozen=True)
class TraceRow:
    line: int
    phase: str
    values: Mapping[str, float]


def load_trace(path: str | Path) -> tuple[TraceRow, ...]:
    """Read and check a phase trace; a bad row raises :class:`ReplayError` with its line number."""
    path = Path(path)
    checked_input(path, "the replay trace", MAX_SAMPLES_FILE_BYTES, raising=ReplayError)
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as error:
        raise ReplayError(f"{path}: cannot read the replay trace ({error.strerror or error})") from None
    rows: list[TraceRow] = []
    with handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if not header:
            raise ReplayError(f"{path}:1: empty file; expected a header with {', '.join(TRACE_COLUMNS)}")
        header = [h.strip() for h in header]
        missing = [c for c in TRACE_COLUMNS if c not in header]
        if missing:
            raise ReplayError(f"{path}:1: missing column(s) {', '.join(missing)}")
        for line, cells in enumerate(reader, start=2):
            if not cells or all(not c.strip() for c in cells):
                continue
            if len(cells) != len(header):
                raise ReplayError(f"{path}:{line}: {len(cells)} fields, expected {len(header)}")
            values: dict[str, float] = {}
            phase = ""
            for name, cell in zip(header, cells):
                if name in _TEXT_COLUMNS:
                    phase = cell
                    continue
                try:
                    number = float(cell)
                except ValueError:
                    raise ReplayError(f"{path}:{line}: column {name!r}: {cell!r} is not a number") from None
                if math.isinf(number) or (math.isnan(number) and not name.startswith("gpm_")):
                    raise ReplayError(f"{path}:{line}: column {name!r}: {cell!r} is not a finite number")
                if not math.isnan(number) and number < 0 and name != "t":
                    raise ReplayError(f"{path}:{line}: column {name!r}: {cell!r} is negative")
                values[name] = number
            rows.append(TraceRow(line, phase, values))
    if not rows:
        raise ReplayError(f"{path}: no data rows")
    return tuple(rows)


def load_probe(path: str | Path) -> dict[str, Any]:
    """Read ``nvml_probe.json``: ``driver`` and ``device0`` answers are required."""
    path = Path(path)
    checked_input(path, "the NVML probe", MAX_CONFIG_FILE_BYTES, raising=ReplayError)
    try:
        probe = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ReplayError(f"{path}: cannot read the NVML probe ({error.strerror or error})") from None
    except json.JSONDecodeError as error:
        raise ReplayError(f"{path}:{error.lineno}: not valid JSON ({error.msg})") from None
    if not isinstance(probe, dict):
        raise ReplayError(f"{path}: not a JSON object; expected an nvml_probe.json recording")
    for key in ("driver", "device0"):
        if key not in probe:
            raise ReplayError(f"{path}: missing {key!r}; expected an nvml_probe.json recording")
    for key in ("name", "uuid", "memory"):
        if not probe["device0"].get(key, {}).get("ok"):
            raise ReplayError(f"{path}: device0.{key} must be a recorded value")
    return probe
