"""Check the exporter on a real GPU against nvidia-smi, beside nvitop-exporter (issue 15).

On a machine with an NVIDIA GPU, its driver (``nvidia-smi``) and torch with CUDA, this:

1. starts our exporter (``python -m gpuwarden.exporter --backend nvml --interval 1``) and then, if
   it is installed, ``nvitop-exporter`` (one after the other, never both at once);
2. for each, runs a small torch workload through phases in a child process: idle (no CUDA
   process), matmul (bf16), hoard (a block of memory held, no kernels), tiny kernels (one-block
   kernels back to back), copy (device-to-device memcpy);
3. every second, scrapes the exporter (timing the scrape) and reads ``nvidia-smi --query-gpu``;
4. writes, under ``--out``: ``samples.csv`` (every pair), ``differences.md`` (per phase, exporter
   and field: median nvidia-smi value, median exported value, median and largest difference) and
   ``costs.json`` / ``costs.md`` (scrape p50, CPU % of a core at 1 s and, idle, at 15 s, RSS, and
   for ours the collection ms per GPU), and prints both tables.

Where no GPU, driver or torch is found it says which, and exits 2. The parsing and table code is
pure and tested without a GPU (``tests/exporter/test_exporter_h200_check.py``).

    python bench/h200_check.py [--out h200_check_out] [--phase-seconds 12] [--idle-cpu-seconds 60]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from gpuwarden.fleet.processes import free_port, stop_process

ROOT = Path(__file__).resolve().parents[1]

PHASES = ("idle", "matmul", "hoard", "tiny_kernels", "copy")


@dataclass(frozen=True)
class Field:
    """One nvidia-smi query field and the series that should equal it."""

    smi: str  # nvidia-smi --query-gpu name
    ours: str  # our exported metric (DCGM name), in the same unit as nvidia-smi's nounits value
    peer: str  # nvitop-exporter metric name prefix ('' where it has none)
    scale: float = 1.0  # exported value x scale = nvidia-smi unit


FIELDS = (
    Field("utilization.gpu", "DCGM_FI_DEV_GPU_UTIL", "gpu_utilization"),
    Field("utilization.memory", "DCGM_FI_DEV_MEM_COPY_UTIL", "gpu_memory_utilization"),
    Field("memory.used", "DCGM_FI_DEV_FB_USED", "gpu_memory_used"),
    Field("memory.free", "DCGM_FI_DEV_FB_FREE", "gpu_memory_free"),
    Field("memory.reserved", "DCGM_FI_DEV_FB_RESERVED", ""),
    Field("memory.total", "", "gpu_memory_total"),
    Field("power.draw", "DCGM_FI_DEV_POWER_USAGE", "gpu_power_usage"),
    Field("temperature.gpu", "DCGM_FI_DEV_GPU_TEMP", "gpu_temperature"),
    Field("temperature.memory", "DCGM_FI_DEV_MEMORY_TEMP", ""),
    Field("clocks.sm", "DCGM_FI_DEV_SM_CLOCK", "gpu_clock_sm"),
    Field("clocks.mem", "DCGM_FI_DEV_MEM_CLOCK", "gpu_clock_memory"),
)
SMI_QUERY = ("index",) + tuple(f.smi for f in FIELDS)


# -- pure parts (tested without a GPU) -------------------------------------------------------


def parse_smi_csv(text: str, fields: tuple[str, ...] = SMI_QUERY) -> dict[int, dict[str, float | None]]:
    """``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits`` -> {gpu index: {field: value}}.

    ``[N/A]``, ``[Not Supported]`` and the like become None (not measured, never 0). A line with
    the wrong number of cells raises ValueError naming it."""
    out: dict[int, dict[str, float | None]] = {}
    for number, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(fields):
            raise ValueError(f"nvidia-smi line {number}: {len(row)} cells, expected {len(fields)} ({', '.join(fields)})")
        values: dict[str, float | None] = {}
        for name, cell in zip(fields, row, strict=True):
            cell = cell.strip()
            try:
                number_value = float(cell)
            except ValueError:
                number_value = None
            values[name] = number_value if number_value is None or math.isfinite(number_value) else None
        index = values.pop("index", None)
        if index is None:
            raise ValueError(f"nvidia-smi line {number}: no GPU index in {row!r}")
        out[int(index)] = values
    return out


def parse_exposition(text: str, index_label: str) -> dict[tuple[str, int], float]:
    """{(metric, gpu index): value} of the whole-GPU series in a Prometheus text exposition.

    ``index_label`` names the GPU index label (``gpu`` for DCGM names, ``index`` for nvitop). MIG
    instance series (a non-empty ``GPU_I_ID``) and per-pod copies are skipped: one value per GPU."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[tuple[str, int], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if labels.get("GPU_I_ID") or index_label not in labels:
                continue
            try:
                index = int(labels[index_label])
            except ValueError:
                continue
            out.setdefault((sample.name, index), sample.value)
    return out


def exported_value(parsed: dict[tuple[str, int], float], metric: str, index: int, prefix: bool = False) -> float | None:
    """One GPU's value of ``metric`` (or of the metric whose name starts with it, for nvitop's unit suffixes)."""
    if not metric:
        return None
    if not prefix:
        return parsed.get((metric, index))
    for (name, gpu), value in parsed.items():
        if gpu == index and (name == metric or name.startswith(metric + "_")):
            return value
    return None


@dataclass(frozen=True)
class Pair:
    phase: str
    exporter: str
    field: str
    gpu: int
    smi: float | None
    exported: float | None


def pairs_of(phase: str, exporter: str, smi: dict[int, dict[str, float | None]], parsed: dict[tuple[str, int], float],
             peer: bool) -> list[Pair]:
    """One second's comparisons: every field of every GPU nvidia-smi listed."""
    out = []
    for gpu, values in sorted(smi.items()):
        for field in FIELDS:
            metric = field.peer if peer else field.ours
            if not metric:
                continue
            value = exported_value(parsed, metric, gpu, prefix=peer)
            out.append(Pair(phase, exporter, field.smi, gpu, values.get(field.smi),
                            None if value is None else value * field.scale))
    return out


@dataclass(frozen=True)
class DiffRow:
    phase: str
    exporter: str
    field: str
    n: int  # seconds where both sides had a value
    smi_median: float | None
    exported_median: float | None
    diff_median: float | None  # exported - nvidia-smi
    diff_max_abs: float | None
    missing: int  # seconds where nvidia-smi had a value and the exporter none


def diff_table(pairs: list[Pair]) -> list[DiffRow]:
    """Per (phase, exporter, field), in phase order: how far the exporter was from nvidia-smi."""
    groups: dict[tuple[str, str, str], list[Pair]] = {}
    for pair in pairs:
        groups.setdefault((pair.phase, pair.exporter, pair.field), []).append(pair)
    order = {phase: i for i, phase in enumerate(PHASES)}
    rows = []
    for (phase, exporter, field), group in sorted(groups.items(), key=lambda item: (order.get(item[0][0], 99), item[0][1:])):
        both = [(p.smi, p.exported) for p in group if p.smi is not None and p.exported is not None]
        missing = sum(1 for p in group if p.smi is not None and p.exported is None)
        diffs = [e - s for s, e in both]
        rows.append(DiffRow(
            phase, exporter, field, len(both),
            statistics.median(s for s, _ in both) if both else None,
            statistics.median(e for _, e in both) if both else None,
            statistics.median(diffs) if diffs else None,
            max(abs(d) for d in diffs) if diffs else None,
            missing))
    return rows


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def format_diff_table(rows: list[DiffRow]) -> str:
    lines = ["| phase | exporter | nvidia-smi field | seconds | nvidia-smi median | exported median | "
             "median diff | max abs diff | missing |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.phase} | {r.exporter} | {r.field} | {r.n} | {_cell(r.smi_median)} | {_cell(r.exported_median)} | "
                     f"{_cell(r.diff_median)} | {_cell(r.diff_max_abs)} | {r.missing} |")
    return "\n".join(lines) + "\n"


def format_costs(costs: dict[str, dict[str, float | None]]) -> str:
    keys = (("scrape_p50_ms", "scrape p50 (ms)"), ("cpu_pct_1s", "CPU % of a core, 1 s interval, under the workload"),
            ("cpu_pct_15s_idle", "CPU % of a core, 15 s interval, idle GPU"), ("rss_mib", "RSS (MiB)"),
            ("collection_ms_per_gpu", "collection ms per GPU"), ("series", "series"), ("bytes", "bytes per scrape"))
    names = list(costs)
    lines = ["| figure | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for key, title in keys:
        lines.append(f"| {title} | " + " | ".join(_cell(costs[n].get(key)) for n in names) + " |")
    return "\n".join(lines) + "\n"


# -- the run (needs a GPU) -------------------------------------------------------------------


WORKLOAD = r'''
import sys, time, torch
seconds = float(sys.argv[1]); hoard_gib = float(sys.argv[2])
def phase(name):
    print("PHASE", name, flush=True)
dev = torch.device("cuda")
phase("matmul")
a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16); b = torch.randn_like(a)
end = time.time() + seconds
while time.time() < end:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
del a, b; torch.cuda.empty_cache()
phase("hoard")
block = torch.empty(int(hoard_gib * 2**30), dtype=torch.uint8, device=dev)
time.sleep(seconds)
del block; torch.cuda.empty_cache()
phase("tiny_kernels")
x = torch.zeros(32, device=dev)
end = time.time() + seconds
while time.time() < end:
    for _ in range(1000):
        x.add_(1.0)
    torch.cuda.synchronize()
phase("copy")
src = torch.empty(2 * 2**30, dtype=torch.uint8, device=dev); dst = torch.empty_like(src)
end = time.time() + seconds
while time.time() < end:
    dst.copy_(src)
    torch.cuda.synchronize()
phase("done")
'''


def environment_problem() -> str | None:
    """Why this machine cannot run the check, or None."""
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi is not on PATH (no NVIDIA driver here)"
    try:
        probe = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"nvidia-smi failed ({error})"
    if probe.returncode != 0 or not probe.stdout.strip():
        return f"nvidia-smi lists no GPU ({(probe.stderr or probe.stdout).strip()[:200]})"
    check = subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available(), 'CUDA unavailable'"],
                           capture_output=True, text=True, timeout=120)
    if check.returncode != 0:
        last = (check.stderr.strip().splitlines() or ["?"])[-1]
        return f"torch with CUDA is not usable from {sys.executable} ({last})"
    return None


def cpu_seconds(pid: int) -> float:
    """CPU the whole process used, exited threads included (``/proc/PID/stat``, 10 ms ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def smi_now() -> dict[int, dict[str, float | None]]:
    result = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(SMI_QUERY)}", "--format=csv,noheader,nounits"],
                            capture_output=True, text=True, timeout=30, check=True)
    return parse_smi_csv(result.stdout)


def scrape(url: str) -> tuple[str, float]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as response:
        body = response.read().decode()
    return body, time.perf_counter() - started


def wait_up(url: str, process: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"exporter exited with {process.returncode}")
        try:
            scrape(url)
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {seconds:g} s")


def exporter_command(name: str, port: int, interval: float) -> list[str]:
    if name == "gpuwarden":
        return [sys.executable, "-m", "gpuwarden.exporter", "--backend", "nvml", "--listen", f"127.0.0.1:{port}",
                "--kubelet-socket", "none", "--interval", f"{interval:g}"]
    return [shutil.which("nvitop-exporter") or "nvitop-exporter", "--bind-address", "127.0.0.1", "--port", str(port),
            "--interval", f"{interval:g}"]


def run_one(name: str, args: argparse.Namespace) -> tuple[list[Pair], dict[str, float | None]]:
    """Start one exporter, run the workload beside it, compare every second; then its idle cost at 15 s."""
    peer = name != "gpuwarden"
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    exporter = subprocess.Popen(exporter_command(name, port, 1.0), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, env=env, cwd=ROOT)
    pairs: list[Pair] = []
    scrapes: list[float] = []
    collection: list[float] = []
    last_body = ""
    try:
        wait_up(url, exporter)
        time.sleep(2.0)  # two collections: GPM windows filled
        cpu0, t0 = cpu_seconds(exporter.pid), time.monotonic()
        phase = ["idle"]
        worker: subprocess.Popen | None = None

        def sample_for(seconds: float) -> None:
            nonlocal last_body
            end = time.monotonic() + seconds
            while time.monotonic() < end and (worker is None or phase[0] != "done"):
                tick = time.monotonic()
                body, took = scrape(url)
                scrapes.append(took)
                last_body = body
                parsed = parse_exposition(body, "index" if peer else "gpu")
                if not peer:
                    per_gpu = [v for (m, _), v in parsed.items() if m == "gpuwarden_exporter_gpu_collection_seconds"]
                    collection.extend(per_gpu)
                pairs.extend(pairs_of(phase[0], name, smi_now(), parsed, peer))
                time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))

        sample_for(args.phase_seconds)  # idle: no CUDA process
        worker = subprocess.Popen([sys.executable, "-c", WORKLOAD, str(args.phase_seconds), str(args.hoard_gib)],
                                  stdout=subprocess.PIPE, text=True)

        def follow() -> None:
            for line in worker.stdout:
                if line.startswith("PHASE "):
                    phase[0] = line.split()[1]

        threading.Thread(target=follow, daemon=True).start()
        sample_for(len(PHASES) * args.phase_seconds + 120)
        worker.wait(timeout=120)
        cpu_1s = 100 * (cpu_seconds(exporter.pid) - cpu0) / (time.monotonic() - t0)
        rss = rss_mib(exporter.pid)
    finally:
        stop_process(exporter)
    cpu_15s = idle_cpu(name, args.idle_cpu_seconds, env) if args.idle_cpu_seconds > 0 else None
    series = sum(1 for line in last_body.splitlines() if line and not line.startswith("#"))
    costs = {"scrape_p50_ms": statistics.median(scrapes) * 1e3 if scrapes else None, "cpu_pct_1s": cpu_1s,
             "cpu_pct_15s_idle": cpu_15s, "rss_mib": rss,
             "collection_ms_per_gpu": statistics.median(collection) * 1e3 if collection else None,
             "series": float(series), "bytes": float(len(last_body.encode()))}
    return pairs, costs


def idle_cpu(name: str, seconds: float, env: dict[str, str]) -> float:
    """CPU % of a core at the 15 s interval on an idle GPU, scraped every 15 s like Prometheus."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    process = subprocess.Popen(exporter_command(name, port, 15.0), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
    try:
        wait_up(url, process)
        cpu0, t0 = cpu_seconds(process.pid), time.monotonic()
        while time.monotonic() - t0 < seconds:
            scrape(url)
            time.sleep(min(15.0, max(0.0, seconds - (time.monotonic() - t0))))
        return 100 * (cpu_seconds(process.pid) - cpu0) / (time.monotonic() - t0)
    finally:
        stop_process(process)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("h200_check_out"))
    parser.add_argument("--phase-seconds", type=float, default=12.0, help="seconds per workload phase (default 12)")
    parser.add_argument("--hoard-gib", type=float, default=64.0, help="GiB held in the hoard phase (default 64)")
    parser.add_argument("--idle-cpu-seconds", type=float, default=60.0,
                        help="window for the idle CPU figure at a 15 s interval (default 60; 0 skips it)")
    parser.add_argument("--no-peer", action="store_true", help="do not run nvitop-exporter even if installed")
    args = parser.parse_args(argv)
    problem = environment_problem()
    if problem is not None:
        print(f"h200_check: cannot run here: {problem}. Run it on a machine with an NVIDIA GPU, its driver "
              "and torch with CUDA (the replay benches, bench/bench_exporter*.py, need none).", file=sys.stderr)
        return 2
    exporters = ["gpuwarden"]
    if not args.no_peer and shutil.which("nvitop-exporter"):
        exporters.append("nvitop-exporter")
    elif not args.no_peer:
        print("h200_check: nvitop-exporter is not installed (pip install nvitop): checking ours alone")
    all_pairs: list[Pair] = []
    costs: dict[str, dict[str, float | None]] = {}
    for name in exporters:
        print(f"h200_check: {name}: {len(PHASES)} phases of {args.phase_seconds:g} s ...", flush=True)
        pairs, cost = run_one(name, args)
        all_pairs.extend(pairs)
        costs[name] = cost
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "samples.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["phase", "exporter", "field", "gpu", "nvidia_smi", "exported"])
        for p in all_pairs:
            writer.writerow([p.phase, p.exporter, p.field, p.gpu, p.smi, p.exported])
    table = format_diff_table(diff_table(all_pairs))
    (args.out / "differences.md").write_text(table)
    (args.out / "costs.json").write_text(json.dumps(costs, indent=1))
    (args.out / "costs.md").write_text(format_costs(costs))
    print(table)
    print(format_costs(costs))
    print(f"h200_check: written to {args.out}/ (samples.csv, differences.md, costs.json, costs.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
