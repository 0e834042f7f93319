"""Loaders for the real traces in ``../shared/data`` (simulator, scheduling replay, health evaluation).

Each loader checks the columns it needs and names the file, the line and the expected value when
a row is bad, so a broken trace never turns into a silent default. Columns that count things or
time (GPUs, nodes, milli-CPUs, durations) go through :func:`checked_column`: a value that is empty,
not finite, negative, fractional where it counts, or past a bound no trace reaches is refused
naming its line, never read as another number (``1.5`` GPUs as 1) or summed as NaN.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from .paths import default_data_dir  # noqa: F401 (re-exported)
from .errors import UserError
from .inputs import MAX_SAMPLES_FILE_BYTES, checked_input

MAX_JOB_GPUS = 10**6  # GPUs one job or pod asks for
MAX_COUNT = 10**9  # milli-CPUs, MiB, nodes: the largest real trace values are ~10^6
MAX_DURATION_SECONDS = 3660 * 86400.0  # ten years: Philly's longest job ran 54 days
# kind -> (whole numbers only, the most allowed, how the most is said)
BOUNDED_KINDS: dict[str, tuple[bool, float, str]] = {
    "gpus": (True, MAX_JOB_GPUS, "1,000,000 GPUs"),
    "count": (True, MAX_COUNT, "1,000,000,000"),
    "seconds": (False, MAX_DURATION_SECONDS, "ten years of seconds"),
}


class TraceError(UserError, ValueError):
    """A trace file that is missing, lacks a column, or has a bad row; the message says where."""


def checked_column(path: Path | str, raw: pd.Series, name: str, kind: str) -> pd.Series:
    """``raw`` (text or numbers, one trace column) as float64, or TraceError naming ``path``, the line
    (the header is line 1) and the value: empty, not a number, not finite, negative, or for a
    :data:`BOUNDED_KINDS` kind fractional where it must be whole or above its bound."""
    whole, most, said = BOUNDED_KINDS[kind]
    values = pd.to_numeric(raw, errors="coerce").astype("float64")
    array = values.to_numpy()
    finite = np.isfinite(array)
    checks = (
        (pd.isna(raw).to_numpy() | (raw.astype(str).str.strip() == "").to_numpy(), "is empty"),
        (np.isnan(array), "is not a number"),
        (~finite, "is not a finite number"),
        (finite & (array < 0), "is negative"),
        (finite & (np.mod(np.where(finite, array, 0.0), 1.0) != 0) if whole else np.zeros(len(array), bool),
         "is not a whole number"),
        (finite & (array > most), f"is more than {said}"),
    )
    for mask, why in checks:
        if mask.any():
            row = int(np.flatnonzero(mask)[0])
            raise TraceError(f"{path}:{row + 2}: column {name!r}: {raw.iloc[row]!r} {why}")
    return values


def read_trace_csv(path: Path, required: dict[str, str], what: str = "") -> pd.DataFrame:
    """Read ``path`` and check ``required`` columns: name -> 'number' | 'time' | 'text' or a kind of
    :data:`BOUNDED_KINDS` (checked by :func:`checked_column`). ``what``: the flag that named the file."""
    if not path.exists() and not path.is_symlink():
        raise TraceError(f"{path}: trace file not found (set --data-dir or GPUWARDEN_DATA)")
    checked_input(path, what, MAX_SAMPLES_FILE_BYTES, raising=TraceError)  # a FIFO or /dev/zero: refused unread
    numeric = {n for n, kind in required.items() if kind == "number"}  # bounded kinds read as written: errors quote them
    try:
        # numbers parsed by the reader itself where every one is well formed (text, then to_numeric,
        # took 4x as long on the GenAI traces); a column it cannot parse is read again as text below
        header = pd.read_csv(path, nrows=0).columns
        frame = pd.read_csv(path, dtype={n: str for n in header if n not in numeric})
        if not all(pd.api.types.is_numeric_dtype(frame[n]) and not pd.api.types.is_bool_dtype(frame[n])
                   for n in numeric if n in frame.columns):
            frame = pd.read_csv(path, dtype=str)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, EOFError, OSError) as error:
        raise TraceError(f"{path}: not a readable CSV trace ({' '.join(str(error).split())})") from None
    missing = [name for name in required if name not in frame.columns]
    if missing:
        raise TraceError(
            f"{path}: missing column(s) {', '.join(missing)}; expected columns: {', '.join(required)}"
        )
    for name, kind in required.items():
        raw = frame[name]
        if kind in BOUNDED_KINDS:
            frame[name] = checked_column(path, raw, name, kind)
            continue
        if kind == "number":
            values = pd.to_numeric(raw, errors="coerce")
        elif kind == "time":
            values = pd.to_datetime(raw, errors="coerce", utc=True, format="mixed")
        else:
            continue
        bad = values.isna() & raw.notna()
        if bad.any():
            position = int(np.flatnonzero(bad.to_numpy())[0])
            raise TraceError(f"{path}:{position + 2}: column {name!r}: {raw.iloc[position]!r} is not a {kind}")
        frame[name] = values
    return frame


def load_philly_jobs(data_dir: Path) -> pd.DataFrame:
    """Philly jobs: submit time (UTC), duration_seconds, gpus, virtual cluster (team)."""
    path = data_dir / "philly" / "philly_jobs.csv.gz"
    frame = read_trace_csv(path, {"timestamp": "time", "duration": "seconds", "num_gpus": "gpus", "cluster": "text"})
    undated = frame["timestamp"].isna().to_numpy()
    if undated.any():  # dropped without a word before
        raise TraceError(f"{path}:{int(np.flatnonzero(undated)[0]) + 2}: column 'timestamp' is empty")
    out = pd.DataFrame(
        {
            "submitted_at": frame["timestamp"],
            "duration_seconds": frame["duration"].astype("float64"),
            "gpus": frame["num_gpus"].astype("int64"),
            "virtual_cluster": frame["cluster"].astype(str),
        }
    )
    return out.sort_values("submitted_at", kind="stable", ignore_index=True)


def load_philly_vcs(data_dir: Path) -> pd.DataFrame:
    frame = read_trace_csv(data_dir / "philly" / "philly_vc.csv", {"vc": "text", "node num": "count"})
    return pd.DataFrame({"virtual_cluster": frame["vc"].astype(str), "nodes": frame["node num"].astype(int)})


def load_openb_pods(data_dir: Path, pod_list: str = "default") -> pd.DataFrame:
    """openb pods: GPUs, milli-GPU per GPU, GPU-model constraint, lifetime in seconds."""
    frame = read_trace_csv(
        data_dir / "openb" / f"openb_pod_list_{pod_list}.csv",
        {
            "name": "text",
            "cpu_milli": "count",
            "memory_mib": "count",
            "num_gpu": "gpus",
            "gpu_milli": "count",
            "creation_time": "number",
            "deletion_time": "number",
        },
    )
    return pd.DataFrame(
        {
            "name": frame["name"].astype(str),
            "cpu_milli": frame["cpu_milli"].astype("int64"),
            "memory_mib": frame["memory_mib"].astype("int64"),
            "gpus": frame["num_gpu"].astype("int64"),
            "gpu_milli": frame["gpu_milli"].astype("int64"),
            "gpu_spec": frame.get("gpu_spec", pd.Series([""] * len(frame))).fillna("").astype(str),
            "lifetime_seconds": (frame["deletion_time"] - frame["creation_time"]).astype("float64"),
        }
    )


@dataclass(frozen=True)
class GenAiSeries:
    """Per-pod inference duty cycle (0..1) and memory (bytes), one sample per ``step_seconds``."""

    duty_ratio: np.ndarray  # (pods, steps), NaN-free
    mem_used_bytes: np.ndarray  # (pods, steps)
    step_seconds: float
    pod_keys: tuple[str, ...]


def load_genai(data_dir: Path) -> GenAiSeries:
    duty = read_trace_csv(
        data_dir / "genai" / "pod_gpu_duty_cycle.csv.gz",
        {"value": "number", "timestamp_anon": "number", "container_ip": "text"},
    )
    memory = read_trace_csv(
        data_dir / "genai" / "pod_gpu_memory_used_bytes.csv.gz",
        {"value": "number", "timestamp_anon": "number", "container_ip": "text"},
    )
    duty_wide = duty.pivot_table(index="container_ip", columns="timestamp_anon", values="value", aggfunc="mean")
    mem_wide = memory.pivot_table(index="container_ip", columns="timestamp_anon", values="value", aggfunc="mean")
    mem_wide = mem_wide.reindex(index=duty_wide.index, columns=duty_wide.columns)
    # A pod's series has gaps where it did not exist yet or any more: fill along time, then by the pod's median.
    duty_filled = duty_wide.ffill(axis=1).bfill(axis=1).fillna(0.0)
    mem_filled = mem_wide.ffill(axis=1).bfill(axis=1)
    mem_filled = mem_filled.fillna(float(np.nanmedian(mem_wide.to_numpy())))
    stamps = duty_wide.columns.to_numpy(dtype=float)
    step = float(np.median(np.diff(stamps))) if len(stamps) > 1 else 60.0
    return GenAiSeries(
        duty_ratio=np.clip(duty_filled.to_numpy(dtype=float) / 100.0, 0.0, 1.0),
        mem_used_bytes=np.clip(mem_filled.to_numpy(dtype=float), 0.0, None),
        step_seconds=step,
        pod_keys=tuple(duty_wide.index.astype(str)),
    )


PHASE_COLUMNS = (
    "gpu_util",
    "power_w",
    "temp_c",
    "sm_clock_mhz",
    "clocks_event_reasons",
    "gpm_sm_util",
    "gpm_any_tensor_util",
    "gpm_dram_bw_util",
)


@dataclass(frozen=True)
class PhaseSamples:
    """The labelled H200 phases: rows of real samples per phase, to draw from."""

    names: tuple[str, ...]
    offsets: np.ndarray  # start row of each phase in ``rows``
    counts: np.ndarray  # rows per phase
    rows: dict[str, np.ndarray]  # column -> values, phases concatenated

    def index(self, name: str) -> int:
        return self.names.index(name)


def load_h200_phases(data_dir: Path) -> PhaseSamples:
    frame = read_trace_csv(
        data_dir / "h200" / "phase_trace.csv",
        {"phase": "text", **{column: "number" for column in PHASE_COLUMNS if not column.startswith("gpm_")}},
    )
    for column in PHASE_COLUMNS:
        if column.startswith("gpm_"):
            frame[column] = pd.to_numeric(frame[column], errors="coerce")
    frame = frame[frame["phase"] != "start"]
    names = tuple(dict.fromkeys(frame["phase"]))
    parts = [frame[frame["phase"] == name] for name in names]
    rows = {}
    for column in PHASE_COLUMNS:
        values = np.concatenate([part[column].to_numpy(dtype=float) for part in parts])
        if column.startswith("gpm_"):
            # GPM is a rate over the previous sample; the first sample of a phase can be NaN.
            values = np.where(np.isnan(values), 0.0, values)
        rows[column] = values
    counts = np.array([len(part) for part in parts])
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return PhaseSamples(names=names, offsets=offsets, counts=counts, rows=rows)
