"""Fleet samples through each source: the embedded store vs a real Prometheus, same data.

Simulates ``--gpus`` GPUs (``--gpus / 8`` nodes) for ``--days`` days at one sample per ``--step``
seconds, ending an hour ago, and loads them into
- the embedded store (``LocalStore.append``), and
- Prometheus: rendered as OpenMetrics with the exporter's metric names, scales and labels
  (from the metric catalogue), backfilled with ``promtool tsdb create-blocks-from openmetrics``
  (one input file per 2-hour block, since promtool 2.42 re-reads its input once per block), then
  a real ``prometheus`` started on that TSDB on 127.0.0.1.
Then it reads the same window and columns back through ``LocalStore.read`` and
``PrometheusSource.read`` (``query_range`` at ``--step``), checks both give the same number of rows,
and prints rows per second and the ratio. With ``--rollup`` it also times
``PrometheusSource.read_rollup`` (hourly idle GPU-seconds per GPU, computed inside Prometheus).

    .venv/bin/python bench/bench_sources.py [--gpus 512] [--days 7] [--step 300] [--columns idle|all]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from gpuwarden.fleet import THROTTLE_REASONS
from gpuwarden.fleet.catalogue import load_catalogue
from gpuwarden.sim.config import SimConfig
from gpuwarden.cli.simfleet import simulated_fleet
from gpuwarden.store import LocalStore
from gpuwarden.store.prometheus import PrometheusSource
from gpuwarden.store.series import SeriesMapper

IDLE_COLUMNS = ["timestamp", "cluster", "node", "gpu_uuid", "gpu_index", "model", "mig_instance", "namespace", "pod",
                "team", "project", "gpu_util_ratio", "sm_active_ratio", "mem_used_bytes", "mem_total_bytes", "power_watts"]
BLOCK_SECONDS = 7200


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def epoch_seconds(stamps: pd.Series) -> pd.Series:
    """Whole Unix seconds, whatever the datetime unit (pandas 3 may store microseconds)."""
    return (stamps - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(seconds=1)


def label_strings(frame: pd.DataFrame) -> pd.Series:
    """The exporter's GPU labels (non-empty ones; Prometheus drops empty labels) as '{k="v",...}'."""
    def label(name: str, values: pd.Series) -> pd.Series:
        text = values.astype(object)
        return pd.Series(np.where(text.notna(), f'{name}="' + text.astype(str) + '"', ""), index=frame.index)

    mig = frame["mig_instance"].astype(object)
    mig_id = mig.map(lambda m: m.split(":")[0] if isinstance(m, str) else None)
    mig_profile = mig.map(lambda m: m.split(":")[1] if isinstance(m, str) else None)
    parts = [
        label("cluster", frame["cluster"]), label("Hostname", frame["node"]), label("UUID", frame["gpu_uuid"]),
        label("gpu", frame["gpu_index"].astype(int).astype(str)), label("modelName", frame["model"]),
        label("GPU_I_ID", mig_id), label("GPU_I_PROFILE", mig_profile),
        label("namespace", frame["namespace"]), label("pod", frame["pod"]),
        pd.Series('job="gpuwarden",instance="' + frame["node"].astype(str) + ':9400"', index=frame.index),
    ]
    joined = parts[0]
    for part in parts[1:]:
        joined = joined.str.cat(part, sep=",")
    return "{" + joined.str.replace(r",+", ",", regex=True).str.strip(",") + "}"


def openmetrics(frame: pd.DataFrame, metrics: list[str]) -> str:
    """The exporter's series for these rows, grouped by family then series, in time order."""
    specs = {spec.metric: spec for spec in load_catalogue()}
    labels = label_strings(frame)
    seconds = epoch_seconds(frame["timestamp"]).astype(str)
    lines = []
    for metric in metrics:
        spec = specs[metric]
        if spec.transform == "value":
            if spec.source_column == "gpu_lost":  # as SimGpuBackend decides it
                values = (frame["gpu_util_ratio"].isna() & frame["power_watts"].isna()).astype("float64")
            elif spec.source_column == "mem_free_bytes":
                values = (frame["mem_total_bytes"] - frame["mem_used_bytes"]) * spec.scale
            else:
                values = frame[spec.source_column].astype("float64") * spec.scale
            series = [(labels, values)]
        elif spec.transform == "bits":
            mask = frame["throttle_reasons_bitmask"]
            series = [(labels.str[:-1] + f',{spec.label}="{reason}"' + "}", (mask.astype("float64") // bit % 2))
                      for reason, bit in THROTTLE_REASONS.items()]
        else:  # pattern: xid_*_total
            regex = spec.source_regex()
            series = [(labels.str[:-1] + f',{spec.label}="{regex.match(c).group(1)}"' + "}", frame[c].astype("float64"))
                      for c in frame.columns if regex.match(c)]
        family = [f"# TYPE {metric} gauge"]
        for names, values in series:
            keep = values.notna().to_numpy()
            block = pd.DataFrame({"k": names[keep].to_numpy(), "t": seconds[keep].to_numpy(),
                                  "v": values[keep].map(repr).to_numpy()}).sort_values(["k", "t"], kind="stable")
            family.extend((metric + block["k"] + " " + block["v"] + " " + block["t"]).tolist())
        lines.extend(family)
    return "\n".join(lines) + "\n"


def backfill(chunks: list[pd.DataFrame], metrics: list[str], workdir: Path) -> Path:
    """promtool create-blocks-from openmetrics, one input file per 2-hour block (in parallel)."""
    tsdb = workdir / "tsdb"
    tsdb.mkdir()
    frame = pd.concat(chunks, ignore_index=True)
    block = epoch_seconds(frame["timestamp"]) // BLOCK_SECONDS
    inputs = []
    for number, (_, part) in enumerate(frame.groupby(block.to_numpy(), sort=True)):
        path = workdir / f"block-{number:04d}.om"
        path.write_text(openmetrics(part, metrics) + "# EOF\n")
        inputs.append(path)

    def create(path: Path) -> None:
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(path), str(tsdb)],
                       check=True, capture_output=True, timeout=600)
        path.unlink()

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(pool.map(create, inputs))
    return tsdb


def start_prometheus(tsdb: Path, workdir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    (workdir / "prometheus.yml").write_text("global:\n  scrape_interval: 1m\nscrape_configs: []\n")
    process = subprocess.Popen(
        ["prometheus", f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={tsdb}",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=30d", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=(workdir / "prometheus.log").open("w"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"prometheus exited: {(workdir / 'prometheus.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as response:
                if response.status == 200:
                    return process, url
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("prometheus did not become ready in 120 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=512)
    parser.add_argument("--days", type=float, default=7)
    parser.add_argument("--step", type=int, default=300, help="seconds between samples (default 300)")
    parser.add_argument("--columns", choices=["idle", "all"], default="idle",
                        help="idle: the idle report's columns (6 metric families); all: every column (~21 families)")
    parser.add_argument("--rollup", action="store_true", help="also time read_rollup (hourly, computed in PromQL)")
    parser.add_argument("--data-dir", type=Path, default=None, help="trace data (default ../shared/data)")
    args = parser.parse_args()
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        raise SystemExit("needs prometheus and promtool (Debian package 'prometheus')")
    columns = IDLE_COLUMNS if args.columns == "idle" else None
    metrics = SeriesMapper().metrics_for(None if columns is None else [c for c in columns if c != "timestamp"])

    steps = int(args.days * 86400 // args.step)
    end = pd.Timestamp.now(tz="UTC").floor("h") - pd.Timedelta(hours=1)
    start = end - pd.Timedelta(seconds=steps * args.step)
    warmup = 6 * 3600 / 86400  # a multiple of any step that divides 6 h, so samples sit on the grid
    config = SimConfig(nodes=max(1, args.gpus // 8), gpus_per_node=8, step_seconds=args.step, warmup_days=warmup,
                       start=(start - pd.Timedelta(seconds=args.step)).to_pydatetime(), data_dir=args.data_dir)
    started = time.perf_counter()
    sim = simulated_fleet(config)
    chunks = list(sim.iter_chunks(steps, chunk_steps=max(1, 86400 // args.step)))
    rows = sum(len(c) for c in chunks)
    print(f"simulated {sim.device_count} devices ({args.gpus} GPUs incl. MIG instances) x {steps} steps of {args.step}s "
          f"= {rows:,} rows in {time.perf_counter() - started:.1f}s; window {start} .. {end}")

    with tempfile.TemporaryDirectory(prefix="bench-sources-") as tmp:
        workdir = Path(tmp)
        store = LocalStore(workdir / "store")
        started = time.perf_counter()
        for chunk in chunks:
            store.append(chunk)
        local_load = time.perf_counter() - started
        started = time.perf_counter()
        tsdb = backfill(chunks, metrics, workdir)
        prom_load = time.perf_counter() - started
        del chunks
        process, url = start_prometheus(tsdb, workdir)
        try:
            source = PrometheusSource(url, step=args.step, timeout=300)
            window = (start, end + pd.Timedelta(seconds=1))
            started = time.perf_counter()
            local = store.read(*window, columns=columns)
            local_read = time.perf_counter() - started
            started = time.perf_counter()
            remote = source.read(*window, columns=columns)
            prom_read = time.perf_counter() - started
            if args.rollup:
                started = time.perf_counter()
                rollup = source.read_rollup(start, end, step="1h", by="gpu", use_rules=False)
                rollup_s = time.perf_counter() - started
        finally:
            process.terminate()
            process.wait(30)
    print(f"columns: {args.columns} ({len(metrics)} metric families in Prometheus)")
    print(f"  load   embedded store: {local_load:7.2f} s  {rows / local_load:12,.0f} rows/s")
    print(f"  load   Prometheus (OpenMetrics + promtool backfill): {prom_load:7.2f} s  {rows / prom_load:12,.0f} rows/s")
    print(f"  read   embedded store: {local_read:7.2f} s  {len(local) / local_read:12,.0f} rows/s  ({len(local):,} rows)")
    print(f"  read   Prometheus:     {prom_read:7.2f} s  {len(remote) / prom_read:12,.0f} rows/s  ({len(remote):,} rows)")
    print(f"  ratio  read: embedded store is {prom_read / local_read:.1f}x faster; load: {prom_load / local_load:.1f}x")
    if args.rollup:
        print(f"  rollup Prometheus read_rollup(1h, raw PromQL): {rollup_s:7.2f} s -> {len(rollup):,} rows "
              f"({rows / max(1, len(rollup)):.0f}x fewer than raw)")
    if len(local) != len(remote):
        print(f"  WARNING: row counts differ: embedded {len(local):,} vs Prometheus {len(remote):,}", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
