"""The pure parts of ``bench/h200_check.py`` (no GPU needed): nvidia-smi CSV parsing, reading
exported values of both exporters, and the table of differences. The exposition compared is the
real one our exporter renders over the recorded H200 (replay backend)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import h200_check  # noqa: E402

from gpuwarden.exporter import ExporterService  # noqa: E402
from gpuwarden.exporter.replay import ReplayBackend  # noqa: E402

SMI = "0, 3, 0, 0, 143156, 616, 143771, 80.07, 37, 36, 345, 3201\n1, 97, 41, 66253, 76902, 616, 143771, 512.33, 55, [N/A], 1980, 3201\n"


def test_parse_smi_csv_reads_values_and_not_available_as_none():
    parsed = h200_check.parse_smi_csv(SMI)
    assert set(parsed) == {0, 1}
    assert parsed[0]["memory.reserved"] == 616 and parsed[0]["power.draw"] == pytest.approx(80.07)
    assert parsed[1]["utilization.gpu"] == 97 and parsed[1]["memory.used"] == 66253
    assert parsed[1]["temperature.memory"] is None  # [N/A]: not measured, never 0
    assert h200_check.parse_smi_csv("0, [Not Supported]" + ", 1" * 10 + "\n")[0]["utilization.gpu"] is None
    with pytest.raises(ValueError, match="line 2: 3 cells"):
        h200_check.parse_smi_csv(SMI.splitlines()[0] + "\n1, 2, 3\n")


def test_our_exposition_is_compared_field_by_field(data_dir):
    backend = ReplayBackend("node-a", data_dir / "h200" / "phase_trace.csv", data_dir / "h200" / "nvml_probe.json",
                            gpus=1, xid_wait_ms=20)
    try:
        service = ExporterService(backend, interval_seconds=60, node_name="node-a")
        service.collect_now()
        parsed = h200_check.parse_exposition(service.render_metrics().decode(), "gpu")
    finally:
        backend.close()
    smi = h200_check.parse_smi_csv(SMI.splitlines()[0] + "\n")
    pairs = h200_check.pairs_of("idle", "gpuwarden", smi, parsed, peer=False)
    by_field = {p.field: p for p in pairs}
    assert "memory.total" not in by_field  # we export no total series: not compared
    assert by_field["memory.used"].exported == pytest.approx(0, abs=1)  # v2: no reserved in used
    assert by_field["memory.reserved"].exported == pytest.approx(616, abs=1)
    rows = {r.field: r for r in h200_check.diff_table(pairs)}
    assert rows["memory.reserved"].n == 1 and abs(rows["memory.reserved"].diff_median) <= 1
    assert rows["memory.free"].diff_max_abs <= 1
    table = h200_check.format_diff_table(list(rows.values()))
    assert table.splitlines()[0].startswith("| phase | exporter |") and "| idle | gpuwarden | memory.used |" in table


def test_peer_names_with_unit_suffixes_and_the_diff_statistics():
    peer = ('# TYPE gpu_memory_used_MiB gauge\n'
            'gpu_memory_used_MiB{hostname="h",index="1",devicename="NVIDIA H200",uuid="GPU-x"} 66868\n'
            'gpu_utilization_Percentage{hostname="h",index="1",devicename="NVIDIA H200",uuid="GPU-x"} 95\n')
    parsed = h200_check.parse_exposition(peer, "index")
    smi = h200_check.parse_smi_csv(SMI)
    pairs = h200_check.pairs_of("hoard", "nvitop-exporter", {1: smi[1]}, parsed, peer=True)
    pairs += h200_check.pairs_of("hoard", "nvitop-exporter", {1: {**smi[1], "memory.used": 66251.0}}, parsed, peer=True)
    rows = {r.field: r for r in h200_check.diff_table(pairs)}
    used = rows["memory.used"]
    assert used.n == 2 and used.diff_median == pytest.approx((615 + 617) / 2) and used.diff_max_abs == 617
    assert rows["utilization.gpu"].diff_median == -2
    assert rows["power.draw"].n == 0 and rows["power.draw"].missing == 2  # the peer gave none: counted, not hidden
    costs = h200_check.format_costs({"gpuwarden": {"scrape_p50_ms": 0.5}, "nvitop-exporter": {"scrape_p50_ms": 2.6}})
    assert "| scrape p50 (ms) | 0.5 | 2.6 |" in costs


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="an NVIDIA driver is here: the check would run")
def test_without_a_gpu_it_says_so_in_one_line_and_exits_2(capsys):
    assert h200_check.main(["--out", "/nonexistent/never-written"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot run here" in err[0] and "nvidia-smi" in err[0]
