"""Exporter cost: /metrics latency against a naive exporter, and the process's memory and CPU.

1. ``/metrics`` over HTTP on loopback, p50 / p99, for 8 GPUs and for 8 GPUs x 7 MIG instances, with
   pod labels from a real gRPC kubelet pod-resources server on a unix socket, on the replay backend
   (a recorded H200 through the real NVML backend code). The exporter serves a snapshot taken by
   its collection thread; the naive exporter, measured in the same run, reads NVML (and asks the
   kubelet) on every scrape, as an exporter without a snapshot does. By default every NVML call
   costs its median as recorded on the H200 (``nvml_probe.json``: field values 3.2 ms per GPU);
   ``--no-latency`` shows the pure-Python figures too.
2. Resident memory and CPU of a real exporter process (``python -m gpuwarden.exporter --backend
   replay --replay-gpus 8``) at the default 15 s interval, scraped every 15 s like Prometheus, plus
   what its imports cost (what dominates the RSS).

Targets (issue 3): p50 < 2 ms and >= 10x faster than naive; RSS < 60 MiB; CPU < 1% of one core.

    .venv/bin/python bench/bench_exporter.py [--scrapes 200] [--cpu-seconds 45]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent import futures
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuwarden.exporter import ExporterService  # noqa: E402
from gpuwarden.exporter.main import default_data_dir  # noqa: E402
from gpuwarden.exporter.podresources import PodAttributor, api_pb2  # noqa: E402
from gpuwarden.exporter.replay import ReplayBackend  # noqa: E402


def kubelet(socket_path: str, pods: list[tuple[str, str, str, list[str]]]):
    """A real gRPC pod-resources server (the kubelet's protobuf service) on a unix socket."""
    import grpc

    response = api_pb2.ListPodResourcesResponse()
    for namespace, pod, resource, devices in pods:
        entry = response.pod_resources.add(name=pod, namespace=namespace)
        entry.containers.add(name="main").devices.add(resource_name=resource, device_ids=devices)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
        "List": grpc.unary_unary_rpc_method_handler(
            lambda request, context: response,
            request_deserializer=api_pb2.ListPodResourcesRequest.FromString,
            response_serializer=api_pb2.ListPodResourcesResponse.SerializeToString),
    }),))
    server.add_insecure_port(f"unix:{socket_path}")
    server.start()
    return server


class NaiveExporter(ExporterService):
    """Reads the backend (and the kubelet) on every scrape, then renders (with the same fast
    renderer, so the ratio is only the cost of reading on the scrape path): no snapshot."""

    def metrics_response(self, accepts_gzip: bool) -> tuple[bytes, bool]:
        self.collect_now()
        return self.collector.render(), False


def scrape_times(url: str, count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=10) as response:
            response.read()
        times.append(time.perf_counter() - started)
    return times


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_render(data: Path, mig: int, scrapes: int, latency: bool, socket_dir: str) -> dict:
    trace, probe = data / "h200" / "phase_trace.csv", data / "h200" / "nvml_probe.json"
    profiles = ["1g.18gb"] * mig

    def backend() -> ReplayBackend:
        return ReplayBackend("bench-node", trace, probe, gpus=8, mig_profiles=profiles, latency=latency, xid_wait_ms=200)

    probe_backend = backend()
    readings = probe_backend.read()
    probe_backend.close()
    pods = []
    for i, reading in enumerate(readings):
        if mig and reading.mig_uuid:
            pods.append(("team-a", f"job-{i}", "nvidia.com/mig-1g.18gb", [reading.mig_uuid]))
        elif not mig:
            pods.append(("team-a", f"job-{i}", "nvidia.com/gpu", [reading.gpu_uuid]))
    socket_path = os.path.join(socket_dir, f"kubelet-{mig}-{int(latency)}.sock")
    server = kubelet(socket_path, pods)
    results = {}
    try:
        for name, cls in (("snapshot", ExporterService), ("naive", NaiveExporter)):
            service = cls(backend(), interval_seconds=15.0 if cls is ExporterService else 3600.0, port=0,
                          node_name="bench-node", attributor=PodAttributor(socket_path))
            service.start()
            try:
                deadline = time.monotonic() + 10
                while service.snapshot.readings == () and time.monotonic() < deadline:
                    time.sleep(0.01)
                service.collect_now()  # second collection: GPM series present
                body = urllib.request.urlopen(service.url, timeout=10).read()
                assert b'pod="job-' in body, "pod labels missing"
                times = scrape_times(service.url, scrapes if name == "snapshot" else max(20, scrapes // 4))
                results[name] = {"p50": statistics.median(times), "p99": percentile(times, 0.99),
                                 "series": sum(1 for line in body.splitlines() if line and not line.startswith(b"#")),
                                 "bytes": len(body)}
                if name == "snapshot":
                    from prometheus_client import generate_latest

                    for key, render in (("render_once", service.collector.render),
                                        ("render_client", lambda: generate_latest(service.registry))):
                        renders = []
                        for _ in range(30):
                            started = time.perf_counter()
                            render()
                            renders.append(time.perf_counter() - started)
                        results[name][key] = statistics.median(renders)
                    results[name]["collection"] = service.snapshot.duration_seconds
            finally:
                service.stop()
                service.backend.close()
                service.attributor.close()
    finally:
        server.stop(0)
    return results


def proc_stat(pid: int) -> tuple[float, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks, time.monotonic()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def bench_process(data: Path, seconds: float, kubelet_socket: str, latency: bool) -> dict:
    command = [sys.executable, "-m", "gpuwarden.exporter", "--backend", "replay", "--replay-gpus", "8",
               "--listen", "127.0.0.1:0", "--kubelet-socket", kubelet_socket]
    if latency:
        command.append("--replay-latency")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
                               env={**os.environ, "GPUWARDEN_DATA": str(data), "PYTHONUNBUFFERED": "1"})
    try:
        line = process.stdout.readline()
        if not line.startswith("serving "):
            raise RuntimeError(f"exporter did not start: {line!r}")
        url = line.split()[1]
        time.sleep(1.0)
        urllib.request.urlopen(url, timeout=10).read()  # warm: first scrape renders
        cpu0, t0 = proc_stat(process.pid)
        end = t0 + seconds
        while time.monotonic() < end:
            urllib.request.urlopen(url, timeout=10).read()  # a Prometheus scrape every 15 s
            time.sleep(min(15.0, max(0.0, end - time.monotonic())))
        cpu1, t1 = proc_stat(process.pid)
        return {"rss": rss_mib(process.pid), "cpu_pct": 100 * (cpu1 - cpu0) / (t1 - t0), "window": t1 - t0}
    finally:
        process.terminate()
        process.wait(timeout=10)


def import_cost() -> list[tuple[str, float]]:
    """RSS (MiB) of a fresh interpreter after each cumulative import: what dominates."""
    steps = [("python", ""), ("+ prometheus_client", "import prometheus_client"),
             ("+ pynvml", "import pynvml"), ("+ gpuwarden.exporter (all)", "import gpuwarden.exporter.main"),
             ("+ grpc (only with a kubelet socket)", "import grpc; import gpuwarden.exporter.podresources.api_pb2")]
    out, code = [], ""
    for name, statement in steps:
        code += statement + "\n"
        probe = code + "print(int(open('/proc/self/status').read().split('VmRSS:')[1].split()[0]))\n"
        result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True)
        out.append((name, int(result.stdout.strip()) / 1024))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--cpu-seconds", type=float, default=45.0, help="CPU/RSS window at the 15 s interval")
    parser.add_argument("--no-latency", action="store_true", help="also measure with free (unrecorded-cost) NVML calls")
    args = parser.parse_args()
    data = default_data_dir()
    if not (data / "h200" / "phase_trace.csv").is_file():
        print(f"bench_exporter: the recorded H200 is not at {data}/h200 (set GPUWARDEN_DATA)", file=sys.stderr)
        return 2
    ok = True
    with tempfile.TemporaryDirectory(prefix="gw-bench-") as socket_dir:
        print("/metrics over HTTP, replay backend, pod labels from a gRPC kubelet; "
              "NVML calls cost their recorded H200 medians" + ("" if not args.no_latency else " (and free)"))
        for latency in ([True, False] if args.no_latency else [True]):
            for mig in (0, 7):
                r = bench_render(data, mig, args.scrapes, latency, socket_dir)
                s, n = r["snapshot"], r["naive"]
                ratio = n["p50"] / s["p50"]
                shape = "8 GPUs" if not mig else "8 GPUs x 7 MIG"
                cost = "recorded NVML cost" if latency else "free NVML calls"
                print(f"  {shape:15s} [{cost}] {s['series']} series, {s['bytes'] / 1024:.0f} KiB: "
                      f"exporter p50 {s['p50'] * 1e3:.2f} ms (p99 {s['p99'] * 1e3:.2f}), "
                      f"naive p50 {n['p50'] * 1e3:.2f} ms (p99 {n['p99'] * 1e3:.2f}), ratio {ratio:.1f}x; "
                      f"text rendered once per snapshot in {s['render_once'] * 1e3:.2f} ms "
                      f"(prometheus_client generate_latest: {s['render_client'] * 1e3:.2f} ms), "
                      f"collection {s['collection'] * 1e3:.1f} ms")
                if latency:
                    good = s["p50"] < 0.002 and ratio >= 10
                    ok &= good
                    print(f"    target p50 < 2 ms and >= 10x: {'PASS' if good else 'FAIL'}")
        print(f"exporter process, 8 replayed GPUs, default 15 s interval, scraped every 15 s, {args.cpu_seconds:g} s window:")
        p = bench_process(data, args.cpu_seconds, "none", latency=True)
        good = p["rss"] < 60 and p["cpu_pct"] < 1
        ok &= good
        print(f"  no kubelet socket: RSS {p['rss']:.1f} MiB, CPU {p['cpu_pct']:.3f}% of one core "
              f"({'PASS' if good else 'FAIL'} against < 60 MiB and < 1%)")
        socket_path = os.path.join(socket_dir, "kubelet-process.sock")
        server = kubelet(socket_path, [])
        try:
            q = bench_process(data, min(20.0, args.cpu_seconds), socket_path, latency=True)
        finally:
            server.stop(0)
        print(f"  with a kubelet socket (grpc loaded): RSS {q['rss']:.1f} MiB, CPU {q['cpu_pct']:.3f}%")
    print("what the RSS is made of (fresh interpreter, cumulative imports):")
    previous = 0.0
    for name, mib in import_cost():
        print(f"  {name:40s} {mib:6.1f} MiB  (+{mib - previous:.1f})")
        previous = mib
    print("all targets met" if ok else "some targets missed (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
