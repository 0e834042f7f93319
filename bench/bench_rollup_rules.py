"""What the generated recording rules and the exporter cost at 1,000 GPUs, measured live.

    python bench/bench_rollup_rules.py [--gpus 1000] [--seconds 90]

A real exporter serves a simulated fleet of ``--gpus`` GPUs (125 nodes x 8, MIG included) from one
endpoint; a real Prometheus scrapes it every 15 s and evaluates the generated rules. To see many
evaluations in a short run the rules are generated at a 5 s interval with 25 s rollups and a
hoarding grace of 150 s: every window then spans the same number of evaluations as the shipped
1 m / 5 m / 30 min rules (5, 31 and 5 points), so one evaluation costs what a production one does.
Printed: exporter series per GPU and bytes per scrape, head series, samples appended per second,
and each rule group's evaluation time (Prometheus' own ``/api/v1/rules``), per GPU.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuwarden.analytics import IdleParams  # noqa: E402
from gpuwarden.analytics.promrules import render_recording_rules  # noqa: E402
from gpuwarden.exporter import ExporterService  # noqa: E402
from gpuwarden.sim.backend import SimGpuBackend  # noqa: E402
from gpuwarden.sim.config import SimConfig  # noqa: E402
from gpuwarden.cli.simfleet import simulated_fleet  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from bench_rollup import free_port  # noqa: E402


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=60) as response:
        return json.loads(response.read())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=90.0)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpuwarden-bench-rules-"))
    sim = simulated_fleet(SimConfig(nodes=args.gpus // 8, gpus_per_node=8, warmup_days=0.2))
    sim.step()
    exporter = ExporterService(SimGpuBackend(sim), interval_seconds=15, host="127.0.0.1", port=0).start()
    process = None
    try:
        exporter.collect_now()  # the first collection may still be running
        with urllib.request.urlopen(exporter.url, timeout=60) as response:
            page = response.read()
        series = sum(1 for line in page.decode().splitlines() if line and not line.startswith("#"))
        print(f"exporter: {series:,} series for {args.gpus} GPUs = {series / args.gpus:.1f} series per GPU; "
              f"{len(page) / 2**20:.1f} MiB per scrape = {len(page) / args.gpus / 1024:.1f} KiB per GPU", flush=True)
        rules = tmp / "rules.yml"
        rules.write_text(render_recording_rules(IdleParams(hoard_grace="150s"), interval_seconds=5, rollup_seconds=25))
        port = free_port()
        target = exporter.url.split("//", 1)[1].rsplit("/metrics", 1)[0]
        (tmp / "prometheus.yml").write_text(
            f"global: {{scrape_interval: 15s, evaluation_interval: 5s, scrape_timeout: 14s}}\nrule_files: [{rules}]\n"
            f"scrape_configs: [{{job_name: gpuwarden, static_configs: [{{targets: ['{target}']}}]}}]\n")
        process = subprocess.Popen([shutil.which("prometheus"), f"--config.file={tmp / 'prometheus.yml'}",
                                    f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
                                    "--log.level=error"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        started = time.monotonic()
        while time.monotonic() - started < args.seconds:
            time.sleep(5)
        groups = get(f"{url}/api/v1/rules")["data"]["groups"]
        status = get(f"{url}/api/v1/status/tsdb")["data"]["headStats"]
        with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
            own = response.read().decode()
        appended = sum(float(line.rsplit(" ", 1)[1]) for line in own.splitlines()
                       if line.startswith("prometheus_tsdb_head_samples_appended_total"))
        elapsed = time.monotonic() - started
        print(f"prometheus head: {status['numSeries']:,} series ({status['numSeries'] / args.gpus:.1f} per GPU) after "
              f"{elapsed:.0f} s; {appended:,.0f} samples appended ({appended / elapsed:,.0f}/s at 15 s scrapes and 5 s rules)")
        for group in groups:
            recorded = sum(1 for _ in group["rules"])
            seconds = group.get("evaluationTime", 0.0)
            production = 60 if group["name"] == "gpuwarden-usage" else 300
            print(f"rule group {group['name']}: {recorded} rules, last evaluation {seconds:.3f} s for {args.gpus} GPUs "
                  f"({1000 * seconds / args.gpus:.3f} ms per GPU); at the shipped interval ({production} s) "
                  f"{100 * seconds / production:.2f}% of one core")
    finally:
        if process is not None:
            process.terminate()
            process.wait(30)
        exporter.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
