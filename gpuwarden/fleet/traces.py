"""Loaders for the real traces in ``../shared/data`` (simulator, scheduling replay, health evaluation).

Each loader checks the columns it needs and names the file, the line and the expected value when
a row is bad, so a broken trace never turns into a silent default.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from .paths import default_data_dir  # noqa: F401 (re-exported)
from .errors import UserError


class TraceError(UserError, ValueError):
    """A trace file that is missing, lacks a column, or has a bad row; the message says where."""


def _read_csv(path: Path, required: dict[str, str]) -> pd.DataFrame:
    """Read ``path`` and check ``required`` columns: name -> 'number' | 'time' | 'text'."""
    if not path.exists():
        raise TraceError(f"{path}: trace file not found (set --data-dir or GPUWARDEN_DATA)")
    try:
        # numbers parsed by the reader itself where every one is well formed (text, then to_numeric,
        # took 4x as long on the GenAI traces); a column it cannot parse is read again as text below
        header = pd.read_csv(path, nrows=0).columns
        frame = pd.read_csv(path, dtype={n: str for n in header if required.get(n) != "number"})
        if not all(pd.api.types.is_numeric_dtype(frame[n]) and not pd.api.types.is_bool_dtype(frame[n])
                   for n in required if required[n] == "number" and n in frame.columns):
            frame = pd.read_csv(path, dtype=str)
    except (pd.errors.ParserError, UnicodeDecodeError, EOFError, OSError) as error:
        raise TraceError(f"{path}: not a readable CSV trace ({error})") from None
    missing = [name for name in required if name not in frame.columns]
    if missing:
        raise TraceError(
            f"{path}: missing column(s) {', '.join(missing)}; expected columns: {', '.join(required)}"
        )
    for name, kind in required.items():
        raw = frame[name]
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
    frame = _read_csv(
        data_dir / "philly" / "philly_jobs.csv.gz",
        {"timestamp": "time", "duration": "number", "num_gpus": "number", "cluster": "text"},
    )
    frame = frame.dropna(subset=["timestamp", "duration", "num_gpus"])
    out = pd.DataFrame(
        {
            "submitted_at": frame["timestamp"],
            "duration_seconds": frame["duration"].astype("float64"),
            "gpus": frame["num_gpus"].astype("int64"),
            "virtual_cluster": frame["cluster"].astype(str),
        }
    )
    negative = out[(out["duration_seconds"] < 0) | (out["gpus"] < 0)]
    if not negative.empty:
        raise TraceError(f"philly_jobs.csv.gz:{int(negative.index[0]) + 2}: negative duration or GPU count")
    return out.sort_values("submitted_at", kind="stable", ignore_index=True)


def load_philly_vcs(data_dir: Path) -> pd.DataFrame:
    frame = _read_csv(data_dir / "philly" / "philly_vc.csv", {"vc": "text", "node num": "number"})
    return pd.DataFrame({"virtual_cluster": frame["vc"].astype(str), "nodes": frame["node num"].astype(int)})


def load_openb_pods(data_dir: Path, pod_list: str = "default") -> pd.DataFrame:
    """openb pods: GPUs, milli-GPU per GPU, GPU-model constraint, lifetime in seconds."""
    frame = _read_csv(
        data_dir / "openb" / f"openb_pod_list_{pod_list}.csv",
        {
            "name": "text",
            "cpu_milli": "number",
            "memory_mib": "number",
            "num_gpu": "number",
            "gpu_milli": "number",
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
    duty = _read_csv(
        data_dir / "genai" / "pod_gpu_duty_cycle.csv.gz",
        {"value": "number", "timestamp_anon": "number", "container_ip": "text"},
    )
    memory = _read_csv(
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
    frame = _read_csv(
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
