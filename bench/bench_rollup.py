"""Reports over the recording-rule rollups at fleet scale: 1,000 GPUs x 30 days in a real Prometheus TSDB.

    python bench/bench_rollup.py                       # 1,000 GPUs x 30 days, raw slice 100 GPUs x 1 day
    python bench/bench_rollup.py --gpus 200 --days 3   # a quick run

What it does (every figure printed with the command that measured it):

1. Writes the generated rules' 5-minute rollup series (``gpu:gpuwarden_{state_seconds,used_seconds,
   energy_joules,memory_byte_seconds}:5m{state=...}``, one point per GPU, namespace and state per
   5 minutes, labelled as the rules label them: no pod, recorded one rule interval after the
   window they cover) for a synthetic fleet directly as OpenMetrics, one file per 2-hour block,
   and turns them into TSDB blocks with ``promtool tsdb create-blocks-from openmetrics`` (promtool
   2.42 parses a whole file once per 2 h block, so one file per block keeps the backfill linear).
   It counts the rollup series per GPU per month the rules would make for that fleet.
   The fleet: GPUs alternate between pods (runs of ~12 h) and no pod (~3 h); an allocated window is
   busy, underutilized, starved, allocated_idle, hoarded or fake_busy; 5% of nodes have no pod
   attribution (their GPUs are busy or idle_unattributed).
2. Starts Prometheus (Debian ``prometheus``) on those blocks and times ``gpuwarden report idle
   --since 30d --source prometheus`` and ``gpuwarden report chargeback`` as subprocesses, each
   ``--repeats`` times (median wall time and peak RSS of the child; the load average beside them:
   the machine is shared). Target: each < 30 s and < 2 GiB.
3. The raw path beside it, measured on a smaller slice (``--raw-gpus`` x ``--raw-days`` of raw
   DCGM series at 60 s, same fleet model, no rules) and scaled linearly in GPUs x days, saying so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from servers import wait_ready  # noqa: E402

BLOCK_SECONDS = 7200
ROLLUP_SECONDS = 300
RULE_INTERVAL_SECONDS = 60  # the rules' offset: a rollup is recorded one interval after its window
NAMESPACES = 23
NAMESPACES_PER_NODE = 3  # quotas and pools: a node's GPUs serve the pods of a few namespaces
STATES = ("busy", "underutilized", "starved", "allocated_idle", "hoarded", "fake_busy")
STATE_WEIGHTS = (0.60, 0.15, 0.04, 0.10, 0.08, 0.03)
ACTIVITY = {"busy": 0.85, "underutilized": 0.30, "starved": 0.15, "allocated_idle": 0.0, "hoarded": 0.0,
            "fake_busy": 0.0, "unallocated": 0.0, "idle_unattributed": 0.0}
WATTS = {"busy": 620.0, "underutilized": 300.0, "starved": 200.0}
MEM_MIB = {"busy": 70000, "underutilized": 30000, "starved": 30000, "allocated_idle": 500, "hoarded": 60000,
           "fake_busy": 20000, "unallocated": 0, "idle_unattributed": 0}
MODEL = "NVIDIA H100 80GB HBM3"


def fleet_model(gpus: int, windows: int, seed: int = 7):
    """Per GPU and 5-minute window: state names and pod indices (-1: no pod)."""
    rng = np.random.default_rng(seed)
    state = np.empty((gpus, windows), dtype=object)
    pod = np.full((gpus, windows), -1, dtype=np.int64)
    unattributed_node = rng.random(gpus // 8 + 1) < 0.05
    pods = 0
    for g in range(gpus):
        w = 0
        held = rng.random() < 0.8
        while w < windows:
            length = max(1, int(rng.exponential(144 if held else 36)))  # ~12 h with a pod, ~3 h without
            end = min(windows, w + length)
            if held:
                pod[g, w:end] = pods
                pods += 1
                state[g, w:end] = rng.choice(STATES, size=end - w, p=STATE_WEIGHTS)
            elif unattributed_node[g // 8]:
                state[g, w:end] = rng.choice(["busy", "idle_unattributed"], size=end - w, p=[0.5, 0.5])
            else:
                state[g, w:end] = "unallocated"
            held = not held
            w = end
    return state, pod, unattributed_node


def namespace_of(g: int, pod: int) -> int:
    """The namespace of ``pod`` on GPU ``g``: one of its node's ``NAMESPACES_PER_NODE``."""
    return (g // 8 * 7 + pod % NAMESPACES_PER_NODE * 5) % NAMESPACES


def gpu_labels(g: int, pod: int, with_pod: bool = True) -> str:
    """The exporter's labels of GPU ``g`` held by ``pod`` (-1: none); ``with_pod=False``: as the
    rollups keep them (the namespace, not the pod)."""
    node = f"node-{g // 8:04d}"
    labels = f'cluster="bench",node="{node}",Hostname="{node}",UUID="GPU-{g:06d}",gpu="{g % 8}",modelName="{MODEL}"'
    if pod >= 0:
        labels += f',namespace="team-{namespace_of(g, pod):02d}"' + (f',pod="job-{pod:07d}"' if with_pod else "")
    return labels


def rollup_series_per_gpu(state, pod) -> tuple[float, float, float]:
    """Rollup series per GPU over the whole model: (figures x distinct (namespace, state)) as the
    rules record them, the same had they kept the pod, and the distinct namespaces per GPU."""
    rows = np.arange(pod.shape[0])[:, None] // 8 * 7
    namespace = np.where(pod >= 0, (rows + pod % NAMESPACES_PER_NODE * 5) % NAMESPACES, -1)
    figures = 4
    by_namespace = [len(set(zip(namespace[g].tolist(), state[g].tolist()))) for g in range(state.shape[0])]
    by_pod = [len(set(zip(pod[g].tolist(), state[g].tolist()))) for g in range(state.shape[0])]
    namespaces = [len(set(namespace[g].tolist()) - {-1}) for g in range(state.shape[0])]
    return figures * float(np.mean(by_namespace)), figures * float(np.mean(by_pod)), float(np.mean(namespaces))


def write_rollup_block(path: Path, state, pod, first_window: int, start_s: int) -> int:
    """One 2 h block of rollup series as OpenMetrics; returns the sample count. A window's rollup is
    recorded after the window ends, so a block holds the rollups of its windows shifted by one (the
    last window of the block is recorded in the next), and the last block also the last window."""
    per_block = BLOCK_SECONDS // ROLLUP_SECONDS
    lines: dict[str, list[str]] = {m: [] for m in ("state_seconds", "used_seconds", "energy_joules", "memory_byte_seconds")}
    gpus = state.shape[0]
    last = first_window + per_block - 1 if first_window + per_block < state.shape[1] else state.shape[1]
    windows = range(max(0, first_window - 1), last)
    for g in range(gpus):
        series: dict[tuple, list[int]] = {}
        for w in windows:  # one series per namespace and state: pods of a namespace share it
            holder = pod[g, w] % NAMESPACES_PER_NODE if pod[g, w] >= 0 else -1  # a pod of that namespace
            series.setdefault((holder, state[g, w]), []).append(w)
        for (holder, s), ws in series.items():
            labels = gpu_labels(g, holder, with_pod=False) + f',state="{s}"'
            act, watts, mem = ACTIVITY[s], WATTS.get(s, 110.0), MEM_MIB[s] * 2**20
            for w in ws:
                # recorded one rule interval after the window's end (the rules' offset)
                t = start_s + (w + 1) * ROLLUP_SECONDS + RULE_INTERVAL_SECONDS - 1
                lines["state_seconds"].append(f"gpu:gpuwarden_state_seconds:5m{{{labels}}} 300 {t}\n")
                lines["used_seconds"].append(f"gpu:gpuwarden_used_seconds:5m{{{labels}}} {300 * act:g} {t}\n")
                lines["energy_joules"].append(f"gpu:gpuwarden_energy_joules:5m{{{labels}}} {300 * watts:g} {t}\n")
                lines["memory_byte_seconds"].append(f"gpu:gpuwarden_memory_byte_seconds:5m{{{labels}}} {300 * mem:g} {t}\n")
    count = 0
    with path.open("w") as handle:
        for name, body in lines.items():
            handle.write(f"# TYPE gpu:gpuwarden_{name}:5m gauge\n")
            handle.writelines(body)
            count += len(body)
        handle.write("# EOF\n")
    return count


def write_raw_block(path: Path, state, pod, unattributed_node, first_window: int, start_s: int) -> int:
    """One 2 h block of raw DCGM series at 60 s (what the exporter serves) for the same fleet."""
    per_block = BLOCK_SECONDS // ROLLUP_SECONDS
    metrics = ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
               "DCGM_FI_DEV_POWER_USAGE", "gpuwarden_pod_attribution_state")
    lines: dict[str, list[str]] = {m: [] for m in metrics}
    windows = range(first_window, min(first_window + per_block, state.shape[1]))
    for g in range(state.shape[0]):
        attribution = "off" if unattributed_node[g // 8] else "known"
        for w in windows:
            s, p = state[g, w], pod[g, w]
            labels = gpu_labels(g, p)
            sm = ACTIVITY[s]
            util = 22.0 if s == "fake_busy" else 100 * sm
            used = MEM_MIB[s]
            for minute in range(5):
                t = start_s + w * ROLLUP_SECONDS + 60 * minute + 30
                lines["DCGM_FI_PROF_SM_ACTIVE"].append(f"DCGM_FI_PROF_SM_ACTIVE{{{labels}}} {sm:g} {t}\n")
                lines["DCGM_FI_DEV_GPU_UTIL"].append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {util:g} {t}\n")
                lines["DCGM_FI_DEV_FB_USED"].append(f"DCGM_FI_DEV_FB_USED{{{labels}}} {used} {t}\n")
                lines["DCGM_FI_DEV_FB_FREE"].append(f"DCGM_FI_DEV_FB_FREE{{{labels}}} {81559 - used} {t}\n")
                lines["DCGM_FI_DEV_POWER_USAGE"].append(f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} {WATTS.get(s, 110.0):g} {t}\n")
                lines["gpuwarden_pod_attribution_state"].append(
                    f'gpuwarden_pod_attribution_state{{{labels},state="{attribution}"}} 1 {t}\n')
    with path.open("w") as handle:
        for name, body in lines.items():
            handle.write(f"# TYPE {name} gauge\n")
            handle.writelines(sorted(body, key=lambda line: line.split("} ", 1)[0]) if False else body)
        handle.write("# EOF\n")
    return sum(len(b) for b in lines.values())


def backfill(workdir: Path, writer, blocks: int, label: str) -> tuple[int, float, int]:
    """Write each block's OpenMetrics file and promtool it into ``workdir/tsdb``, two at a time."""
    tsdb = workdir / "tsdb"
    tsdb.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    def one(index: int) -> int:
        path = workdir / f"{label}-{index:04d}.om"
        count = writer(path, index)
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(path), str(tsdb)],
                       check=True, capture_output=True, text=True)
        path.unlink()
        return count

    with ThreadPoolExecutor(max_workers=2) as pool:
        samples = sum(pool.map(one, range(blocks)))
    size = sum(p.stat().st_size for p in tsdb.rglob("*") if p.is_file())
    return samples, time.perf_counter() - started, size


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Prometheus:
    def __init__(self, tsdb: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = tsdb.parent / "prometheus.yml"
        config.write_text("global:\n  scrape_interval: 1h\n")
        self.process = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tsdb}", "--storage.tsdb.retention.time=10y",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=error", "--query.timeout=10m"],
            stdout=subprocess.DEVNULL, stderr=(tsdb.parent / "prometheus.log").open("w"))
        wait_ready(f"{self.url}/-/ready", self.process, timeout=300, interval=0.5)

    def rss_gib(self) -> float:
        """Prometheus' own peak RSS (VmHWM) so far."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
        return float("nan")

    def metric(self, name: str) -> float:
        """The sum of Prometheus' own metric ``name`` (its /metrics page)."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as response:
            page = response.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
                   if line.startswith(name) and line[len(name)] in " {")

    def wait_compacted(self, quiet_seconds: float = 90.0, timeout: float = 1800.0) -> str:
        """Let Prometheus compact the backfilled 2 h blocks (as a running server would have long
        ago): wait until its block count has not changed for ``quiet_seconds``."""
        started = time.monotonic()
        blocks, changed = self.metric("prometheus_tsdb_blocks_loaded"), time.monotonic()
        first = blocks
        while time.monotonic() - changed < quiet_seconds and time.monotonic() - started < timeout:
            time.sleep(5)
            now = self.metric("prometheus_tsdb_blocks_loaded")
            if now != blocks:
                blocks, changed = now, time.monotonic()
        return (f"{first:.0f} -> {blocks:.0f} blocks in {time.monotonic() - started:.0f} s "
                f"({self.metric('prometheus_tsdb_compactions_total'):.0f} compactions)")

    def cpu_seconds(self) -> float:
        """Prometheus' CPU time so far (user + system)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


_CHILD = ("import sys, time; import gpuwarden.cli as cli; started = time.perf_counter(); code = cli.main(sys.argv[1:]); "
          "sys.stderr.write(f'REPORT_SECONDS {time.perf_counter() - started}\\n'); sys.exit(code)")


def timed_report_rss(kind: str, url: str, since: str, extra: list[str] = ()) -> tuple[float, float, dict, float]:
    """One ``gpuwarden report`` in a child process: its wall time (interpreter start and imports
    included), peak RSS in GiB, the JSON, and the report's own time (after the imports)."""
    argv = [sys.executable, "-c", _CHILD, "report", kind, "--source", "prometheus", "--prometheus-url", url,
            "--since", since, "--format", "json", "--prometheus-timeout", "600", *extra]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        process = subprocess.Popen(argv, stdout=out, stderr=err, env={**os.environ, "PYTHONPATH": str(ROOT)})
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        errors = err.read()
        if status != 0:
            raise RuntimeError(f"report {kind} failed: {errors[-2000:]}")
        own = [float(line.split()[1]) for line in errors.splitlines() if line.startswith("REPORT_SECONDS")]
        timed_report_rss.cpu_seconds = usage.ru_utime + usage.ru_stime  # type: ignore[attr-defined]
        return wall, usage.ru_maxrss / 2**20, json.loads(out.read()), own[0] if own else wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--raw-gpus", type=int, default=100)
    parser.add_argument("--raw-days", type=int, default=1)
    parser.add_argument("--workdir", type=Path, help="keep the TSDBs here (default: a temp dir, removed)")
    parser.add_argument("--reuse", action="store_true", help="reuse the rollup TSDB already in --workdir")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each report (the median is printed)")
    parser.add_argument("--compact-quiet", type=float, default=90.0,
                        help="wait until Prometheus' block count is unchanged this long before timing (0: do not wait)")
    args = parser.parse_args()
    if shutil.which("promtool") is None or shutil.which("prometheus") is None:
        print("needs Debian package 'prometheus' (prometheus, promtool)", file=sys.stderr)
        return 2
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gpuwarden-bench-rollup-"))
    end_s = (int(time.time()) // BLOCK_SECONDS - 1) * BLOCK_SECONDS  # whole blocks, ending before the head
    windows = args.days * 86400 // ROLLUP_SECONDS
    start_s = end_s - args.days * 86400
    per_block = BLOCK_SECONDS // ROLLUP_SECONDS
    print(f"fleet model: {args.gpus} GPUs x {args.days} days ({windows} five-minute windows)", flush=True)
    state, pod, unattributed = fleet_model(args.gpus, windows)
    by_namespace, by_pod, namespaces = rollup_series_per_gpu(state, pod)
    print(f"rollup series per GPU over {args.days} d: {by_namespace:.0f} (4 figures x (namespace, state) pairs; "
          f"{namespaces:.1f} namespaces per GPU) vs {by_pod:.0f} had the rollups kept the pod "
          f"({by_pod / by_namespace:.1f}x)", flush=True)
    try:
        if args.reuse and (workdir / "rollup" / "tsdb").is_dir():
            samples, seconds = 0, 0.0
            size = sum(p.stat().st_size for p in (workdir / "rollup" / "tsdb").rglob("*") if p.is_file())
        else:
            samples, seconds, size = backfill(
                workdir / "rollup", lambda path, i: write_rollup_block(path, state, pod, i * per_block, start_s),
                args.days * 86400 // BLOCK_SECONDS, "rollup")
        print(f"rollup TSDB: {samples:,} samples, {size / 2**20:,.0f} MiB on disk, backfilled in {seconds:.0f} s "
              f"({samples / args.gpus / args.days:,.0f} samples per GPU-day)", flush=True)
        server = Prometheus(workdir / "rollup" / "tsdb")
        try:
            if args.compact_quiet > 0:
                settled = server.wait_compacted(args.compact_quiet)
                print(f"prometheus compacted the backfilled blocks: {settled}", flush=True)
            else:
                print(f"not waiting for compaction: {server.metric('prometheus_tsdb_blocks_loaded'):.0f} blocks loaded "
                      "(Prometheus compacts them while the reports run)", flush=True)
            results = {}
            for kind in ("idle", "chargeback"):
                runs = []
                for _ in range(max(1, args.repeats)):
                    load, served = os.getloadavg()[0], server.cpu_seconds()
                    wall, rss, report, own = timed_report_rss(kind, server.url, f"{args.days}d")
                    runs.append((own, wall, rss, load, timed_report_rss.cpu_seconds, server.cpu_seconds() - served))
                own, wall, rss, _, cpu, prometheus_cpu = (statistics.median(r[i] for r in runs) for i in range(6))
                results[kind] = (own, rss, cpu + prometheus_cpu)
                gpus = report["summary"].get("gpus", args.gpus)
                print(f"report {kind} --since {args.days}d --source prometheus (rollups): median of {len(runs)}: "
                      f"{own:.1f} s report ({wall:.1f} s with interpreter start and imports; runs "
                      f"{', '.join(f'{r[0]:.1f}' for r in runs)} s), CPU {cpu:.1f} s in the report + {prometheus_cpu:.1f} s "
                      f"in Prometheus, peak RSS {rss:.2f} GiB"
                      f" [{gpus} GPUs; {'rollup' if report['quality'].get('source') == 'rollup' else 'RAW'}; load average "
                      f"{', '.join(f'{r[3]:.1f}' for r in runs)} on {os.cpu_count()} cores]"
                      f" target < 30 s, < 2 GiB: {'ok' if own < 30 and rss < 2 else 'MISSED'}", flush=True)
            print(f"prometheus peak RSS serving them: {server.rss_gib():.2f} GiB", flush=True)
        finally:
            server.stop()
        # The raw path on a slice, scaled.
        raw_windows = args.raw_days * 86400 // ROLLUP_SECONDS
        raw_start = end_s - args.raw_days * 86400
        offset = windows - raw_windows
        raw_state, raw_pod = state[: args.raw_gpus, offset:], pod[: args.raw_gpus, offset:]
        samples, seconds, size = backfill(
            workdir / "raw", lambda path, i: write_raw_block(path, raw_state, raw_pod, unattributed, i * per_block, raw_start),
            args.raw_days * 86400 // BLOCK_SECONDS, "raw")
        print(f"raw slice TSDB: {args.raw_gpus} GPUs x {args.raw_days} d, {samples:,} samples, {size / 2**20:,.0f} MiB", flush=True)
        server = Prometheus(workdir / "raw" / "tsdb")
        try:
            runs = []
            for _ in range(max(1, args.repeats)):
                load, served = os.getloadavg()[0], server.cpu_seconds()
                _, rss, report, own = timed_report_rss("idle", server.url, f"{args.raw_days}d")
                runs.append((own, rss, load, timed_report_rss.cpu_seconds, server.cpu_seconds() - served))
        finally:
            server.stop()
        scale = (args.gpus / args.raw_gpus) * (args.days / args.raw_days)
        raw, rss, cpu, prometheus_cpu = (statistics.median(r[i] for r in runs) for i in (0, 1, 3, 4))
        print(f"report idle --since {args.raw_days}d (raw samples, {args.raw_gpus} GPUs): median of {len(runs)}: {raw:.1f} s "
              f"report (runs {', '.join(f'{r[0]:.1f}' for r in runs)} s), CPU {cpu:.1f} s + {prometheus_cpu:.1f} s in "
              f"Prometheus, peak RSS {rss:.2f} GiB "
              f"[{report['quality'].get('source')}; load average {', '.join(f'{r[2]:.1f}' for r in runs)}]", flush=True)
        print(f"raw path scaled to {args.gpus} GPUs x {args.days} d (x{scale:.0f}, linear in GPU-days, extrapolated, not run): "
              f"~{raw * scale:,.0f} s = {raw * scale / results['idle'][0]:.0f}x the rollup path; CPU "
              f"~{(cpu + prometheus_cpu) * scale:,.0f} s = {(cpu + prometheus_cpu) * scale / results['idle'][2]:.0f}x", flush=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
