"""The samples' ``dra_claim`` column (issue 34 item 4): filled from the ``dra_claim_*`` labels that
dcgm-exporter (``--kubernetes-enable-dra``) and gpuwarden's exporter write, by the scraper and by a real
Prometheus; empty on dcgm-exporter's copies of a MIG parent's series; and read as null from stores and
files written before it existed."""

from __future__ import annotations

from builders import make_samples
from servers import PrometheusServer, wait_for

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from gpuwarden.analytics import COLUMNS as ANALYTICS_COLUMNS
from gpuwarden.exporter.collector import render_text
from gpuwarden.exporter.snapshot import DraClaim, ExporterSnapshot, attributed
from gpuwarden.fleet import SAMPLE_COLUMN_NAMES, GpuReading
from gpuwarden.fleet.catalogue import load_catalogue
from gpuwarden.store import LocalStore, load_samples
from gpuwarden.store.prometheus import PrometheusSource
from gpuwarden.store.parquet_layout import ARROW_SCHEMA
from gpuwarden.store.scraper import parse_exposition
from gpuwarden.store.series import SeriesMapper

AT = pd.Timestamp("2026-05-01T12:00:00Z")
GPU = ('gpu="{gpu}",UUID="{uuid}",pci_bus_id="00000009:0{gpu}:00.0",device="nvidia{gpu}",modelName="NVIDIA A100-SXM4-40GB",'
       'Hostname="dra-01"')
CLAIM = ('container="ctr",dra_claim_name="{claim}",dra_claim_namespace="{ns}",dra_device_name="{device}",'
         'dra_driver_name="gpu.nvidia.com",dra_pool_name="dra-01",namespace="{ns}",pod="{pod}"')
PARENT_COPY = ('container="main",dra_claim_name="infer-0-gpu-x8k2m",dra_claim_namespace="serve",'
               'dra_device_name="gpu-1-mig-1g10gb-19-0",dra_driver_name="gpu.nvidia.com",dra_pool_name="dra-01",'
               'dra_mig_profile="1g.10gb",dra_mig_device_uuid="MIG-aaaa",namespace="serve",pod="infer-0"')


def page() -> str:
    """dcgm-exporter's page of a DRA node: GPU 0 held through claim ml/train-0-gpu-4bq7z; GPU 1 a MIG
    GPU whose 1g.10gb device a pod holds (its series copied onto the parent with dra_mig_device_uuid,
    the instance's own without a pod); GPU 2 free."""
    gpu0, gpu1, gpu2 = (GPU.format(gpu=g, uuid=f"GPU-{g}") for g in range(3))
    held = CLAIM.format(claim="train-0-gpu-4bq7z", ns="ml", device="gpu-0", pod="train-0")
    instance = f'{gpu1},GPU_I_PROFILE="1g.10gb",GPU_I_ID="9"'
    lines = []
    for labels, used in ((f"{gpu0},{held}", 30000), (f"{gpu1},{PARENT_COPY}", 2000), (instance, 2000), (gpu2, 0)):
        lines += [f"DCGM_FI_DEV_FB_USED{{{labels}}} {used}", f"DCGM_FI_DEV_FB_FREE{{{labels}}} {40000 - used}",
                  f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} 50"]
    return "\n".join(lines) + "\n"


def claims_of(frame: pd.DataFrame) -> dict[tuple[str, str | None], tuple[str | None, str | None]]:
    """(gpu_uuid, mig_instance) -> (pod, dra_claim), None for null."""
    def plain(value):
        return None if pd.isna(value) else str(value)

    return {(str(r.gpu_uuid), plain(r.mig_instance)): (plain(r.pod), plain(r.dra_claim))
            for r in frame.drop_duplicates(["gpu_uuid", "mig_instance"]).itertuples()}


EXPECTED = {("GPU-0", None): ("train-0", "ml/train-0-gpu-4bq7z"), ("GPU-1", None): (None, None),
            ("GPU-1", "9:1g.10gb"): (None, None), ("GPU-2", None): (None, None)}


def test_the_scraper_reads_the_claim_and_not_on_a_mig_parents_copy():
    frame = parse_exposition(page(), SeriesMapper(cluster="c"), AT)
    assert claims_of(frame) == EXPECTED
    assert list(frame.columns) == list(SAMPLE_COLUMN_NAMES)


def test_our_exporters_claim_labels_read_back_per_gpu_and_per_mig_instance():
    values = {"mem_used_bytes": 2.0 * 2**30, "mem_total_bytes": 40.0 * 2**30}
    snapshot = ExporterSnapshot(readings=(
        attributed(GpuReading("node-a", "GPU-0", 0, "NVIDIA H200", namespace="ml", pod="train-0", container="t", values=values),
                   claim=DraClaim("ml", "train-0-gpu-4bq7z", "gpu.nvidia.com", "node-a", "gpu-0")),
        attributed(GpuReading("node-a", "GPU-1", 1, "NVIDIA H200", mig_instance_id=8, mig_profile="1g.18gb", mig_uuid="MIG-8",
                              namespace="serve", pod="infer-0", container="s", values=values),
                   claim=DraClaim("serve", "infer-0-gpu-x8k2m", "gpu.nvidia.com", "node-a", "gpu-1-mig-1g18gb-19-1")),
        GpuReading("node-a", "GPU-2", 2, "NVIDIA H200", namespace="ml", pod="legacy-0", container="l", values=values),
    ), success=True, node="node-a", attribution="known")
    frame = parse_exposition(render_text(snapshot, load_catalogue()).decode(), SeriesMapper(cluster="c"), AT)
    assert claims_of(frame) == {("GPU-0", None): ("train-0", "ml/train-0-gpu-4bq7z"),
                                ("GPU-1", "8:1g.18gb"): ("infer-0", "serve/infer-0-gpu-x8k2m"),
                                ("GPU-2", None): ("legacy-0", None)}  # a device-plugin pod: no claim


class _Page(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def test_prometheus_gives_the_claim_of_dcgm_exporters_dra_series(tmp_path):
    """A real Prometheus scraping a dcgm-exporter page of a DRA node: the same rows as the scraper's."""
    handler = type("Page", (_Page,), {"body": page().encode()})
    http = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    server = None
    try:
        server = PrometheusServer(tmp_path, [f"127.0.0.1:{http.server_address[1]}"], [])
        start = pd.Timestamp.now(tz="UTC").floor("s")
        wait_for(server.ready, 30, "prometheus /-/ready")
        source = PrometheusSource(server.url, step=1, lookback="2s", timeout=15, retries=1, backoff=0.05, rollups=False)
        wait_for(lambda: len(source.query("DCGM_FI_DEV_FB_USED")) == 4, 30, "the first scrape in prometheus")
        frame = source.read(start, pd.Timestamp.now(tz="UTC").ceil("s") + pd.Timedelta(seconds=1))
        assert len(frame) and list(frame.columns) == list(SAMPLE_COLUMN_NAMES)
        assert claims_of(frame) == EXPECTED
        assert str(frame["dra_claim"].dtype) == "category"
    finally:
        if server is not None:
            server.stop()
        http.shutdown()


def _old_part(store: LocalStore, frame: pd.DataFrame) -> None:
    """A part file as a store wrote it before ``dra_claim`` existed."""
    old = pa.schema([field for field in ARROW_SCHEMA if field.name != "dra_claim"])
    table = pa.Table.from_pandas(frame.drop(columns=["dra_claim"]), schema=old, preserve_index=False)
    day = store.samples_dir / f"date={frame['timestamp'].iloc[0]:%Y-%m-%d}"
    day.mkdir(parents=True)
    stamps = frame["timestamp"]
    pq.write_table(table, day / f"part-{stamps.min():%Y%m%dT%H%M%S}-{stamps.max():%Y%m%dT%H%M%S}-0123456789abcdef.parquet")


def test_an_old_store_reads_null_claims_beside_new_rows_and_compacts(tmp_path):
    store = LocalStore(tmp_path / "store")
    old = make_samples(steps=10)
    _old_part(store, old)
    back = store.read()
    assert list(back.columns) == list(SAMPLE_COLUMN_NAMES) and len(back) == len(old)
    assert back["dra_claim"].isna().all() and str(back["dra_claim"].dtype) == "category"
    assert back["pod"].astype(object).tolist() == old["pod"].astype(object).tolist()
    new = make_samples(start="2026-11-01T00:10:00Z", steps=10)
    new["dra_claim"] = new["pod"].astype(object).map(lambda pod: None if pd.isna(pod) else f"team-a/{pod}-gpu-abcde")
    store.append(new)
    for compacted in (False, True):
        if compacted:
            assert store.compact(min_files=2) == 1 and store.file_count() == 1
        both = store.read()
        assert len(both) == len(old) + len(new)
        claims = both.set_index("timestamp")["dra_claim"].astype(object)
        assert claims[claims.index < new["timestamp"].min()].isna().all()
        assert set(claims[claims.index >= new["timestamp"].min()].dropna()) == {"team-a/pod-1-gpu-abcde"}
        table = store.read_arrow(columns=list(ANALYTICS_COLUMNS))
        assert table is not None and table.num_rows == len(both)


def test_a_samples_file_without_the_column_reads_null(tmp_path):
    path = tmp_path / "old.csv"
    make_samples().drop(columns=["dra_claim"]).to_csv(path, index=False)
    loaded = load_samples(path)
    assert list(loaded.columns) == list(SAMPLE_COLUMN_NAMES) and loaded["dra_claim"].isna().all()
