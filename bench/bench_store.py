"""Embedded store: hold 1,000 GPUs x 7 days at 60 s (~10 M rows) and read it back for the idle report.

Prints append throughput, the 7-day range read (all columns and the idle report's columns), a
one-day read, peak memory, and the ratio against a plain-CSV store holding the same day of rows,
measured in the same run. Samples are synthetic (the store does not care what the numbers are).

    .venv/bin/python bench/bench_store.py [--gpus 1000] [--days 7] [--repeats 3]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from gpuwarden.fleet import SAMPLE_COLUMNS
from gpuwarden.store import LocalStore

IDLE_REPORT_COLUMNS = ["timestamp", "node", "gpu_uuid", "model", "pod", "team", "project", "gpu_util_ratio",
                       "sm_active_ratio", "mem_used_bytes", "mem_total_bytes"]
START = pd.Timestamp("2026-11-01T00:00:00Z")


def day_of_samples(day: int, gpus: int, rng: np.random.Generator) -> pd.DataFrame:
    steps = 1440
    rows = steps * gpus
    stamps = START + pd.to_timedelta(day * 86400 + np.repeat(np.arange(steps) * 60, gpus), unit="s")
    gpu = np.tile(np.arange(gpus), steps)
    frame = {}
    for column in SAMPLE_COLUMNS:
        if column.kind == "float":
            frame[column.name] = rng.random(rows).astype("float64")
        elif column.kind == "int":
            frame[column.name] = pd.array(rng.integers(0, 5, rows), dtype="Int64")
    # Plausible values: the store validates rows on the way in (memory used <= total, ...).
    frame["mem_total_bytes"] = np.full(rows, 80.0 * 2**30)
    frame["mem_used_bytes"] = frame["mem_used_bytes"] * 80.0 * 2**30
    pods = np.where(gpu % 3 == 0, -1, gpu // 8 + day * 1000)
    teams = np.array(["vision", "speech", "llm", "recsys", "research"])
    frame.update(
        timestamp=stamps, cluster=pd.Categorical(["bench"] * rows),
        node=pd.Categorical.from_codes(gpu // 8, [f"node-{n:04d}" for n in range(gpus // 8 + 1)]),
        gpu_uuid=pd.Categorical.from_codes(gpu, [f"GPU-{g:08d}" for g in range(gpus)]),
        gpu_index=gpu % 8, model=pd.Categorical(["NVIDIA H100 80GB HBM3"] * rows),
        mig_instance=pd.Categorical([None] * rows, categories=["1:3g.40gb"]),
        pod=pd.Categorical([f"pod-{p}" if p >= 0 else None for p in pods[:gpus]] * steps),
        namespace=pd.Categorical.from_codes(np.where(pods >= 0, gpu % 5, -1), teams),
        team=pd.Categorical.from_codes(np.where(pods >= 0, gpu % 5, -1), teams),
        project=pd.Categorical.from_codes(np.where(pods >= 0, gpu % 5, -1), teams),
    )
    return pd.DataFrame(frame)


def timed(function, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        store = LocalStore(Path(tmp) / "store")
        append_seconds, rows = 0.0, 0
        first_day = None
        for day in range(args.days):
            frame = day_of_samples(day, args.gpus, rng)
            if first_day is None:
                first_day = frame
            started = time.perf_counter()
            rows += store.append(frame)
            append_seconds += time.perf_counter() - started
        end = START + pd.Timedelta(days=args.days)
        full_s, full = timed(lambda: store.read(START, end), args.repeats)
        idle_s, idle = timed(lambda: store.read(START, end, columns=IDLE_REPORT_COLUMNS), args.repeats)
        day_s, day = timed(lambda: store.read(START, START + pd.Timedelta(days=1)), args.repeats)
        assert len(full) == rows and len(idle) == rows and len(day) == len(first_day)
        # Baseline in the same run: the same first day as one plain CSV file, read with pandas.
        csv_path = Path(tmp) / "day.csv"
        first_day.to_csv(csv_path, index=False)
        csv_s, _ = timed(lambda: pd.read_csv(csv_path, parse_dates=["timestamp"]), args.repeats)
        size_mib = store.size_bytes() / 2**20
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"embedded store: {args.gpus} GPUs x {args.days} days at 60 s = {rows:,} rows, {size_mib:,.0f} MiB on disk "
          f"(medians of {args.repeats})")
    print(f"  append:                       {append_seconds:6.2f} s   {rows / append_seconds:,.0f} rows/s")
    print(f"  {args.days}-day read, all columns:     {full_s:6.2f} s   {rows / full_s:,.0f} rows/s")
    print(f"  {args.days}-day read, idle-report cols: {idle_s:6.2f} s   {rows / idle_s:,.0f} rows/s")
    print(f"  1-day read, all columns:      {day_s:6.2f} s   vs plain CSV {csv_s:.2f} s -> {csv_s / day_s:.1f}x faster")
    print(f"  peak resident memory:         {peak_mib:,.0f} MiB")


if __name__ == "__main__":
    main()
