"""Exporter server under load (issue 16, item 5): many scrapers at once, and slowloris.

Both servers run as real processes (``python -m gpuwarden.exporter --backend replay --replay-gpus 8
--replay-latency``) on loopback: this tree's, and the previous design's (``--baseline-rev``, the
http.server front with a listen backlog of 5 and a thread per connection, extracted with ``git
archive``), one after the other under the same load:

1. ``--clients`` concurrent clients (default 50, spread over 5 client processes so the client's
   GIL is not the bottleneck) for ``--seconds`` (default 20), each opening a connection per scrape
   of ``/metrics`` as a scraper without keep-alive does: p50 / p99 / max, requests, errors. Twice:
   paced (each client scrapes every ``--period`` seconds, phases spread; the target applies here)
   and as a closed loop (back to back: the server saturated, so latency is queueing, 50 clients /
   throughput; printed with the ratio, no target).
2. ``--slowloris`` sockets (default 100) that send half a request head and hold it: the server's
   thread count before and while they are held (``/proc/PID/status``), and one real scrape's
   latency meanwhile.

Targets: paced p99 < 50 ms for 8 GPUs; threads bounded under slowloris (no thread per connection).

    .venv/bin/python bench/bench_exporter_load.py [--clients 50] [--seconds 20] [--slowloris 100]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_exporter import PREVIOUS_DESIGN_REV, previous_design, start_exporter  # noqa: E402

from gpuwarden.fleet.paths import default_data_dir  # noqa: E402
from gpuwarden.fleet.processes import stop_process  # noqa: E402


def scrape_once(port: int, timeout: float = 30.0) -> float:
    """One /metrics scrape on a fresh connection; seconds until the whole body arrived."""
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        received = 0
        while chunk := sock.recv(262144):
            received += len(chunk)
    if received < 1000:
        raise RuntimeError(f"short answer ({received} bytes)")
    return time.perf_counter() - started


def client_process(port: int, threads: int, seconds: float, period: float, queue: multiprocessing.Queue) -> None:
    """``threads`` clients scraping until the deadline, each starting a scrape every ``period``
    seconds (0: back to back, a closed loop); puts (latencies, errors)."""
    deadline = time.monotonic() + seconds
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()

    def loop() -> None:
        mine, failed = [], 0
        next_start = time.monotonic() + random.uniform(0, period)  # spread the clients' phases
        while next_start < deadline:
            if period:
                time.sleep(max(0.0, next_start - time.monotonic()))
            try:
                mine.append(scrape_once(port))
            except (OSError, RuntimeError):
                failed += 1
            next_start = max(next_start + period, time.monotonic()) if period else time.monotonic()
        with lock:
            latencies.extend(mine)
            errors[0] += failed

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    queue.put((latencies, errors[0]))


def load(port: int, clients: int, seconds: float, period: float, processes: int = 5) -> dict:
    queue: multiprocessing.Queue = multiprocessing.Queue()
    per = [clients // processes + (1 if i < clients % processes else 0) for i in range(processes)]
    procs = [multiprocessing.Process(target=client_process, args=(port, n, seconds, period, queue)) for n in per if n]
    for proc in procs:
        proc.start()
    latencies: list[float] = []
    errors = 0
    for _ in procs:
        got, failed = queue.get(timeout=seconds + 120)
        latencies.extend(got)
        errors += failed
    for proc in procs:
        proc.join()
    latencies.sort()
    if not latencies:
        return {"requests": 0, "errors": errors}
    return {"requests": len(latencies), "errors": errors, "p50": statistics.median(latencies),
            "p99": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], "max": latencies[-1],
            "rate": len(latencies) / seconds}


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return -1


def slowloris(pid: int, port: int, count: int, hold: float) -> dict:
    before = threads_of(pid)
    held = []
    try:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n")  # the head never ends
            held.append(sock)
        time.sleep(hold)
        during = threads_of(pid)
        try:
            scrape = scrape_once(port, timeout=10)
        except OSError:
            scrape = float("nan")
    finally:
        for sock in held:
            sock.close()
    return {"before": before, "during": during, "scrape": scrape}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--period", type=float, default=0.2,
                        help="seconds between one client's scrapes in the paced run (default 0.2: 250 scrapes/s from 50)")
    parser.add_argument("--slowloris", type=int, default=100)
    parser.add_argument("--hold", type=float, default=3.0, help="seconds the slowloris sockets are held")
    parser.add_argument("--baseline-rev", default=PREVIOUS_DESIGN_REV,
                        help=f"git revision of the previous server to compare with (default {PREVIOUS_DESIGN_REV}; '' to skip)")
    args = parser.parse_args()
    data = default_data_dir()
    if not (data / "h200" / "phase_trace.csv").is_file():
        print(f"bench_exporter_load: the recorded H200 is not at {data}/h200 (set GPUWARDEN_DATA)", file=sys.stderr)
        return 2
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="gw-load-") as tmp:
        roots = {"this": ROOT}
        if args.baseline_rev:
            old = previous_design(args.baseline_rev, Path(tmp) / "previous")
            if old is not None:
                roots["previous"] = old
            else:
                print(f"(previous design {args.baseline_rev} not available from git: no ratio)")
        for name, root in roots.items():
            process, url = start_exporter(data, 8, "none", latency=True, code_root=root)
            port = int(url.rsplit(":", 1)[1].split("/")[0])
            try:
                time.sleep(1.0)
                scrape_once(port)
                result = {"paced": load(port, args.clients, args.seconds, args.period),
                          "closed": load(port, args.clients, args.seconds, 0.0)}
                result["slowloris"] = slowloris(process.pid, port, args.slowloris, args.hold)
                results[name] = result
            finally:
                stop_process(process)
    ok = True
    for mode, title in (("paced", f"each scraping every {args.period * 1e3:g} ms ({args.clients / args.period:.0f}/s offered)"),
                        ("closed", "each scraping back to back (a closed loop: the server saturated)")):
        print(f"{args.clients} concurrent clients {title}, {args.seconds:g} s, a new connection per scrape, "
              f"8 replayed GPUs (recorded NVML costs), loopback, {os.cpu_count()} CPUs (load average "
              f"{os.getloadavg()[0]:.1f}):")
        for name, r in results.items():
            r = r[mode]
            label = "this server" if name == "this" else f"previous ({args.baseline_rev})"
            if not r["requests"]:
                print(f"  {label:24s} no request succeeded ({r['errors']} errors)")
                continue
            print(f"  {label:24s} {r['requests']} scrapes ({r['rate']:.0f}/s), {r['errors']} errors: p50 {r['p50'] * 1e3:.1f} ms, "
                  f"p99 {r['p99'] * 1e3:.1f} ms, max {r['max'] * 1e3:.0f} ms")
        this = results["this"][mode]
        ratio = ""
        if "previous" in results and results["previous"][mode].get("requests") and this["requests"]:
            ratio = f"; p99 ratio to the previous server {this['p99'] / results['previous'][mode]['p99']:.3f}x"
        if mode == "paced":
            good = this["requests"] > 0 and this["p99"] < 0.050 and this["errors"] == 0
            ok &= good
            print(f"  target p99 < 50 ms, no errors: {'PASS' if good else 'FAIL'}{ratio}")
        else:
            print(f"  (saturation figure, no target){ratio}")
    print(f"{args.slowloris} slowloris sockets held {args.hold:g} s (half a request head each):")
    for name, r in results.items():
        s = r["slowloris"]
        label = "this server" if name == "this" else f"previous ({args.baseline_rev})"
        print(f"  {label:24s} threads {s['before']} -> {s['during']}, a real scrape meanwhile {s['scrape'] * 1e3:.1f} ms")
    s = results["this"]["slowloris"]
    good = s["during"] <= s["before"] + 2 and s["scrape"] == s["scrape"]
    ok &= good
    print(f"  target threads bounded (at most the 2 pool workers more) and scrapes still answered: {'PASS' if good else 'FAIL'}")
    print("all targets met" if ok else "some targets missed (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
