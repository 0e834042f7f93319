"""The work a savings search serves: one window of a trace, as replay jobs (:mod:`.savings`).

Two traces: the bundled Philly jobs (``philly``; teams are its virtual clusters, each team's
guarantee its share of ``philly_vc.csv``'s nodes) or a jobs CSV of one's own (teams share the
guarantees equally). A jobs CSV has one row per job and these columns (any order, others ignored):

- ``submitted``: when the job was submitted, a date-time (ISO 8601; UTC unless it names a zone);
- ``duration_seconds``: how long it runs once started, seconds >= 0 (at most ten years);
- ``gpus``: whole GPUs it asks for, >= 0 (a job of 0 GPUs is left out: it needs no GPU node;
  more than 8 is a gang of 8-GPU pods, rounded up to whole nodes as in the Philly replay);
- ``team``: who submitted it, not empty;
- ``checkpointable`` (optional): true/false, yes/no or 1/0; default true. A checkpointable job
  suspended by a policy keeps its progress; a killed one keeps its last periodic checkpoint.

The window is ``[start, start + days)``: the jobs submitted in it. Its *tail* is the longest
duration of those jobs: a fleet serves the window when every job has finished by the window's end
plus the tail (so the longest job may start as late as the window's end).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from gpuwarden.fleet.inputs import MAX_SAMPLES_FILE_BYTES, checked_input
from gpuwarden.fleet.traces import MAX_DURATION_SECONDS, TraceError, load_philly_jobs

from .errors import SchedulingError
from .replay_queue import build_jobs, guarantees_of, philly_shares
from .state import Job

GPUS_PER_NODE = 8
PHILLY_START = "2017-10-09"  # the Philly queue replay's slice starts here (QueueSlice)
PHILLY_DAYS = 2.0  # 3,794 GPU jobs, about the queue replay's 4,000-job slice (which spans 2.3 days)
JOBS_COLUMNS = ("submitted", "duration_seconds", "gpus", "team")
_TRUE, _FALSE = {"true", "yes", "1", "1.0", "y", "t"}, {"false", "no", "0", "0.0", "n", "f"}


@dataclass(frozen=True)
class Workload:
    """The jobs of one window (submit times in seconds from the window's start) and the facts the
    search reads: each team's share of the guarantees, the tail, the node bounds."""

    trace: str
    start: pd.Timestamp
    window_seconds: float
    jobs: tuple[Job, ...]
    shares: dict[str, float]  # team -> share of the fleet guaranteed to it (sums to <= 1)
    useful_gpu_seconds: float  # what the trace asks for: sum of GPUs x duration

    @property
    def tail_seconds(self) -> float:
        return max(job.duration or 0.0 for job in self.jobs)

    @property
    def deadline_seconds(self) -> float:
        """Every job must have finished by then (seconds from the window's start)."""
        return self.window_seconds + self.tail_seconds

    @property
    def teams(self) -> tuple[str, ...]:
        return tuple(sorted({job.team for job in self.jobs}))

    def guarantees(self, nodes: int) -> dict[str, float]:
        return guarantees_of({team: self.shares.get(team, 0.0) for team in self.teams}, nodes * GPUS_PER_NODE)

    def min_nodes(self) -> int:
        """Fewer nodes cannot serve the window: the widest gang does not fit, or the GPU-seconds the
        jobs hold do not fit before the deadline."""
        widest = max(job.pods for job in self.jobs)
        held = sum(job.pods * job.gpus_per_pod * (job.duration or 0.0) for job in self.jobs)
        return max(1, widest, math.ceil(held / (GPUS_PER_NODE * max(self.deadline_seconds, 1.0)) - 1e-9))

    def max_nodes(self) -> int:
        """A fleet this large starts every job the moment it is submitted (each pod on a node of its
        own, at the peak of pods running at once if nothing ever waits): no policy needs more."""
        events = sorted([(job.submitted, job.pods) for job in self.jobs]
                        + [(job.submitted + (job.duration or 0.0), -job.pods) for job in self.jobs],
                        key=lambda e: (e[0], e[1]))  # an end before a start at the same second
        peak = running = 0
        for _, pods in events:
            running += pods
            peak = max(peak, running)
        return max(peak, self.min_nodes())


def philly_workload(data_dir: Path, start: str | None, days: float | None,
                    max_jobs: int | None = None) -> Workload:
    """The Philly jobs of ``[start, start + days)`` (default: 2017-10-09, two days)."""
    frame = load_philly_jobs(data_dir)
    frame = frame.rename(columns={"submitted_at": "submitted", "virtual_cluster": "team"})
    frame["checkpointable"] = True  # as in the Philly queue replay
    return _workload("philly", frame, start or PHILLY_START, PHILLY_DAYS if days is None else days,
                     philly_shares(data_dir), max_jobs)


def file_workload(path: Path, start: str | None, days: float | None, max_jobs: int | None = None) -> Workload:
    """A jobs CSV's jobs of ``[start, start + days)`` (default: from its first submission, all of it)."""
    frame = read_jobs_csv(path)
    teams = sorted(frame["team"].unique())
    return _workload(str(path), frame, start, days, {t: 1.0 / len(teams) for t in teams}, max_jobs)


def read_jobs_csv(path: Path) -> pd.DataFrame:
    """``path``'s jobs, checked row by row: the first bad row is named by its line in the file."""
    checked_input(path, "--trace", MAX_SAMPLES_FILE_BYTES, raising=TraceError)  # a FIFO or /dev/zero: refused unread
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
        raise TraceError(f"{path}: not a readable jobs CSV ({' '.join(str(error).split())})") from None
    frame.columns = [str(c).strip() for c in frame.columns]
    missing = [c for c in JOBS_COLUMNS if c not in frame.columns]
    if missing:
        raise TraceError(f"{path}: missing column(s) {', '.join(missing)}; a jobs CSV has columns "
                         f"{', '.join(JOBS_COLUMNS)} and optionally checkpointable")
    if frame.empty:
        raise TraceError(f"{path}: no jobs (a header and no rows)")

    def bad(mask: np.ndarray, column: str, why: str) -> None:
        if mask.any():
            row = int(np.flatnonzero(mask)[0])
            raise TraceError(f"{path}:{row + 2}: {column} {frame[column].iloc[row]!r} {why}")

    submitted = pd.to_datetime(frame["submitted"], errors="coerce", utc=True, format="mixed")
    bad(submitted.isna().to_numpy(), "submitted", "is not a date-time (e.g. 2017-10-09 14:00:00)")
    duration = pd.to_numeric(frame["duration_seconds"], errors="coerce")
    bad(~np.isfinite(duration.to_numpy(dtype=float)), "duration_seconds", "is not a number of seconds")
    bad((duration < 0).to_numpy(), "duration_seconds", "is negative")
    bad((duration > MAX_DURATION_SECONDS).to_numpy(), "duration_seconds",
        f"is more than ten years ({MAX_DURATION_SECONDS:,.0f} s); is it in milliseconds?")
    gpus = pd.to_numeric(frame["gpus"], errors="coerce")
    values = gpus.to_numpy(dtype=float)
    bad(~np.isfinite(values) | (np.mod(values, 1) != 0), "gpus", "is not a whole number of GPUs")
    bad((gpus < 0).to_numpy(), "gpus", "is negative")
    bad((gpus > 10**6).to_numpy(), "gpus", "is more than 1,000,000 GPUs")
    team = frame["team"].str.strip()
    bad((team == "").to_numpy(), "team", "is empty; every job names its team")
    checkpointable = np.ones(len(frame), dtype=bool)
    if "checkpointable" in frame.columns:
        words = frame["checkpointable"].str.strip().str.lower()
        bad(~words.isin(_TRUE | _FALSE).to_numpy(), "checkpointable", "is not true/false, yes/no or 1/0")
        checkpointable = words.isin(_TRUE).to_numpy()
    out = pd.DataFrame({"submitted": submitted, "duration_seconds": duration.astype(float),
                        "gpus": gpus.astype("int64"), "team": team, "checkpointable": checkpointable})
    return out.sort_values("submitted", kind="stable", ignore_index=True)


def _workload(trace: str, frame: pd.DataFrame, start: str | None, days: float | None, shares: dict[str, float],
              max_jobs: int | None) -> Workload:
    first, last = frame["submitted"].min(), frame["submitted"].max()
    begin = pd.Timestamp(start, tz="UTC") if start else first
    if begin.tzinfo is None:
        begin = begin.tz_localize("UTC")
    if days is None:
        days = max((last - begin).total_seconds() + 1.0, 1.0) / 86400.0
    if not days > 0:
        raise SchedulingError(f"--days {days:g}: the window must be longer than 0 days")
    end = begin + pd.Timedelta(seconds=days * 86400.0)
    jobs = frame[(frame["submitted"] >= begin) & (frame["submitted"] < end) & (frame["gpus"] > 0)]
    if jobs.empty:
        raise SchedulingError(f"--start {begin:%Y-%m-%d %H:%M} --days {days:g}: no GPU job of {trace} was submitted "
                              f"in that window; the trace holds {first:%Y-%m-%d %H:%M} to {last:%Y-%m-%d %H:%M} UTC")
    if max_jobs:
        jobs = jobs.iloc[:max_jobs]
    jobs = jobs.reset_index(drop=True)
    built = build_jobs(jobs.rename(columns={"submitted": "submitted_at", "team": "virtual_cluster"}),
                       GPUS_PER_NODE, begin)
    checkpointable = jobs["checkpointable"].to_numpy(dtype=bool)
    for job, can in zip(built, checkpointable):
        job.checkpointable = bool(can)
    useful = float((jobs["gpus"] * jobs["duration_seconds"].clip(lower=1.0)).sum())  # build_jobs runs a job >= 1 s
    return Workload(trace=trace, start=begin, window_seconds=days * 86400.0, jobs=tuple(built), shares=shares,
                    useful_gpu_seconds=useful)
