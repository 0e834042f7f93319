"""The command line as a user meets it: --help everywhere, one-line errors with exit 2, and the
headless demo end to end (simulated fleet -> store -> exporter over real HTTP)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwarden.cli import build_parser, main
from gpuwarden.store import LocalStore, load_samples

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str, timeout: float = 240, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpuwarden.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def all_commands(parser, prefix=()):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + (name,)
                yield from all_commands(sub, prefix + (name,))


def test_every_subcommand_has_help(capsys):
    commands = list(all_commands(build_parser()))
    assert ("demo",) in commands and ("sim", "generate") in commands and ("store", "read") in commands
    for command in commands:
        with pytest.raises(SystemExit) as exit_info:
            main([*command, "--help"])
        assert exit_info.value.code == 0
        assert "usage: gpuwarden " + " ".join(command) in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, expected",
    [
        (["demo", "--bogus"], r"unrecognized arguments: --bogus"),
        (["demo", "--seed", "abc"], r"argument --seed: 'abc' is not an integer"),
        (["demo", "--nodes", "-4"], r"argument --nodes: '-4' is negative; expected an integer >= 1"),
        (["demo", "--gpus-per-node", "12"], r"gpus_per_node: 12 is not allowed; expected 1..8"),
        (["sim", "generate", "--out", "x.csv", "--days", "0"], r"argument --days: '0' is out of range; expected a number > 0"),
        (["exporter", "--backend", "gpu"], r"argument --backend: invalid choice: 'gpu' \(choose from '?nvml'?, '?replay'?, '?sim'?\)"),
    ],
)
def test_bad_input_is_one_line_exit_2_no_traceback(args, expected):
    result = run_cli(*args, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert re.search(expected, lines[0]), lines[0]


def test_unknown_config_key_names_key_and_allowed(tmp_path):
    config = tmp_path / "fleet.yaml"
    config.write_text("nodes: 4\ngpu_count: 8\n")
    result = run_cli("sim", "generate", "--config", str(config), "--out", str(tmp_path / "x.csv"), timeout=60)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "unknown key 'gpu_count'" in result.stderr and "allowed keys: seed, nodes, gpus_per_node" in result.stderr


def test_broken_trace_names_file_and_column(tmp_path, data_dir):
    broken = tmp_path / "data"
    for sub in ("genai", "openb", "philly", "h200"):
        (broken / sub).mkdir(parents=True)
        for item in (data_dir / sub).iterdir():
            (broken / sub / item.name).symlink_to(item)
    (broken / "h200" / "phase_trace.csv").unlink()
    text = (data_dir / "h200" / "phase_trace.csv").read_text().replace("power_w", "watts", 1)
    (broken / "h200" / "phase_trace.csv").write_text(text)
    result = run_cli("sim", "generate", "--data-dir", str(broken), "--out", str(tmp_path / "x.csv"), timeout=60)
    assert result.returncode == 2
    assert "phase_trace.csv: missing column(s) power_w" in result.stderr
    assert "Traceback" not in result.stderr


def test_sim_generate_writes_samples_and_ground_truth(tmp_path, data_dir):
    out, truth = tmp_path / "samples.parquet", tmp_path / "truth.csv"
    result = run_cli("sim", "generate", "--nodes", "4", "--days", "0.05", "--warmup-days", "0",
                     "--fault-scale", "0", "--data-dir", str(data_dir), "--out", str(out), "--ground-truth", str(truth))
    assert result.returncode == 0, result.stderr
    samples = load_samples(out)
    steps = round(0.05 * 86400 / 60)
    assert samples["timestamp"].nunique() == steps
    assert len(samples) % steps == 0 and samples["node"].nunique() == 4
    assert truth.read_text().startswith("fault_id,kind,node,gpu_uuid")


def test_store_load_validates_before_writing(tmp_path, data_dir):
    good = tmp_path / "good.csv"
    run_cli("sim", "generate", "--nodes", "4", "--days", "0.02", "--warmup-days", "0", "--data-dir", str(data_dir),
            "--out", str(good))
    bad = tmp_path / "bad.csv"
    bad.write_text(good.read_text().replace(",", ";", 1))  # breaks the header
    store = tmp_path / "store"
    result = run_cli("store", "load", str(good), str(bad), "--store", str(store))
    assert result.returncode == 2 and "bad.csv: missing column(s)" in result.stderr
    assert LocalStore(store).row_count() == 0  # the good file was not half-loaded either
    result = run_cli("store", "load", str(good), "--store", str(store))
    assert result.returncode == 0
    assert LocalStore(store).row_count() == len(load_samples(good))
    info = run_cli("store", "info", "--store", str(store))
    first = load_samples(good)["timestamp"].min()
    assert "rows:" in info.stdout and f"range:  {first.isoformat()}" in info.stdout


def test_sim_generate_ends_at_now_so_a_default_report_sees_it(tmp_path, data_dir):
    """Without --start the recorded days end at now: ``report idle`` with its default window (the
    last 7 days) reads them on any date. A fixed default start went out of every window a week
    after it (this broke CI on 2026-12-01)."""
    import pandas as pd

    store = tmp_path / "store"
    before = pd.Timestamp.now(tz="UTC")
    result = run_cli("sim", "generate", "--nodes", "2", "--days", "0.125", "--warmup-days", "0", "--step-seconds", "300",
                     "--fault-scale", "0", "--data-dir", str(data_dir), "--store", str(store))
    assert result.returncode == 0, result.stderr
    first, last = LocalStore(store).time_range()
    assert before - pd.Timedelta(minutes=10) <= last <= pd.Timestamp.now(tz="UTC")
    assert last - first == pd.Timedelta(hours=3) - pd.Timedelta(seconds=300)  # 36 steps of 5 min
    report = run_cli("report", "idle", "--store", str(store), "--format", "json")
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["report"] == "idle"


def test_sim_generate_start_pins_the_samples(tmp_path, data_dir):
    """``--start`` dates the recording: same seed and start, same samples, run after run."""
    common = ("sim", "generate", "--nodes", "2", "--days", "0.05", "--warmup-days", "0", "--seed", "7",
              "--start", "2025-03-01T06:00:00Z", "--data-dir", str(data_dir))
    first, second = tmp_path / "a.csv", tmp_path / "b.csv"
    assert run_cli(*common, "--out", str(first)).returncode == 0
    assert run_cli(*common, "--out", str(second)).returncode == 0
    assert first.read_bytes() == second.read_bytes()
    assert str(load_samples(first)["timestamp"].min()) == "2025-03-01 06:01:00+00:00"  # one step after --start


def test_headless_demo_runs_the_pipeline_and_prints_a_summary(tmp_path, data_dir):
    store = tmp_path / "store"
    result = run_cli(
        "demo", "--headless", "--duration", "4", "--nodes", "8", "--days", "0.25", "--warmup-days", "0.1",
        "--store", str(store), "--exporter-listen", "127.0.0.1:0", "--step-interval", "0.5",
        "--data-dir", str(data_dir),
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "backfill: 100%" in out
    assert re.search(r"fleet:\s+8 nodes, 64 GPUs", out)
    match = re.search(r"samples stored:\s+([\d,]+) rows", out)
    stored = int(match.group(1).replace(",", ""))
    assert stored == LocalStore(store).row_count()
    backfilled_steps = round(0.25 * 86400 / 60)
    devices = int(re.search(r"\((\d+) devices", out).group(1))
    assert stored >= (backfilled_steps + 2) * devices  # the live phase kept feeding the store
    assert re.search(r"exporter:\s+http://127\.0\.0\.1:\d+/metrics \((\d+) series", out)
    series = int(re.search(r"\((\d+) series at the last scrape", out).group(1))
    assert series > devices * 10
    scrapes, scraped_rows = map(lambda v: int(v.replace(",", "")), re.search(
        r"embedded scraper:\s+(\d+) scrapes of /metrics, ([\d,]+) rows", out).groups())
    assert scrapes >= 2 and scraped_rows == scrapes * devices  # the live phase is fed through /metrics
    assert re.search(r"injected faults:\s+\d+", out)
    assert re.search(r"jobs:\s+\d+ submitted, \d+ started", out)
    # Analytics, health and the actuator (observe mode) are wired in.
    assert re.search(r"fleet cost:\s+[\d,.]+ USD; idle [\d,.]+ GPU-h", out)
    assert re.search(r"health findings:\s+\d+ in the last 6 h", out)
    assert re.search(r"planned actions:\s+\d+ \(observe mode: none applied", out)
    assert (store / "actuator" / "audit.jsonl").exists() or "planned actions:  0" in out


def _filled_store(path: Path) -> None:
    from builders import make_samples

    LocalStore(path).append(make_samples(steps=5))


def test_demo_refuses_a_store_it_did_not_make_and_checks_ports_first(tmp_path):
    import socket

    store = tmp_path / "mine"
    _filled_store(store)
    rows = LocalStore(store).row_count()
    result = run_cli("demo", "--headless", "--store", str(store), "--exporter-listen", "127.0.0.1:0", timeout=60)
    assert result.returncode == 2 and "holds samples the demo did not make" in result.stderr
    assert "--reset" in result.stderr and "Traceback" not in result.stderr
    with socket.socket() as busy:  # a port in use: refused before the store is touched, even with --reset
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        result = run_cli("demo", "--headless", "--reset", "--store", str(store),
                         "--exporter-listen", f"127.0.0.1:{taken}", timeout=60)
    assert result.returncode == 2 and "the port is in use" in result.stderr
    assert LocalStore(store).row_count() == rows  # nothing was deleted


def test_a_sigterm_while_a_thread_starts_leaves_the_started_thread_intact(monkeypatch):
    """The demo's SIGTERM handler raises Stopped wherever the main thread is. CI once caught it just
    after ``Thread.start`` had launched the reconciler's thread: Stopped, then an Exception, made
    ``Thread.start`` undo its bookkeeping of a thread already running, which died with KeyError.
    This replays that interleaving: the signal lands right after the thread is launched."""
    import threading

    from gpuwarden.cli.demo import Stopped

    launch = "_start_joinable_thread" if hasattr(threading, "_start_joinable_thread") else "_start_new_thread"
    real_launch = getattr(threading, launch)

    def launch_then_signal(*args, **kwargs):
        real_launch(*args, **kwargs)
        raise Stopped("SIGTERM")  # what the handler raises at the next bytecode

    crashes = []
    monkeypatch.setattr(threading, "excepthook", lambda hook_args: crashes.append(hook_args.exc_value))
    monkeypatch.setattr(threading, launch, launch_then_signal)
    ran = threading.Event()
    thread = threading.Thread(target=ran.set, name="started-as-the-signal-lands", daemon=True)
    with pytest.raises(Stopped):
        thread.start()
    monkeypatch.setattr(threading, launch, real_launch)
    assert ran.wait(5) and not crashes, crashes
    thread.join(5)


def test_demo_stops_on_sigterm_and_still_prints_its_summary(tmp_path, data_dir):
    import signal

    store = tmp_path / "store"
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden.cli", "demo", "--headless", "--duration", "600", "--nodes", "4",
         "--days", "0.05", "--warmup-days", "0", "--store", str(store), "--exporter-listen", "127.0.0.1:0",
         "--step-interval", "0.2", "--data-dir", str(data_dir)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = []
    for line in process.stdout:  # wait until it is live
        lines.append(line)
        if line.startswith("live:"):
            break
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    out = "".join(lines) + out
    assert process.returncode == 143, err
    assert "stopping (SIGTERM)" in out and "== gpuwarden demo summary ==" in out
    assert re.search(r"fleet cost:\s+[\d,.]+ USD", out)
    assert (store / ".gpuwarden-demo").exists()  # the demo marked the store it made
    # A store the demo made is its own to start afresh; once loaded into, it is not.
    assert "Traceback" not in err


def test_cli_keeps_copies_of_names_in_step_with_their_rooms():
    """The CLI names these without importing their rooms (for a fast --help); they must agree."""
    from gpuwarden.analytics.report_schema import REPORT_KINDS
    from gpuwarden.cli import report_cmd, simulate_cmd
    from gpuwarden.scheduling.replay_openb import POLICIES
    from gpuwarden.scheduling.replay_queue import QUEUE_POLICIES

    assert report_cmd.REPORT_KINDS == REPORT_KINDS
    assert simulate_cmd.PLACEMENT_POLICIES == POLICIES and simulate_cmd.QUEUE_POLICIES == QUEUE_POLICIES


def test_report_window_ends_at_now_and_trims_to_the_data_held(tmp_path):
    """One far-future row cannot move the window (it is rejected at load), and a window longer
    than the data is trimmed with a note."""
    import pandas as pd
    from builders import make_samples

    from gpuwarden.cli.args import Parser
    from gpuwarden.cli.sources import add_source_options, open_window

    store = LocalStore(tmp_path / "s")
    now = pd.Timestamp.now(tz="UTC").floor("min")
    frame = make_samples(start=(now - pd.Timedelta(hours=2)).isoformat(), steps=120)
    future = make_samples(start=now.isoformat(), steps=1)
    future["timestamp"] += pd.Timedelta(days=365)  # one row a year ahead (make_samples itself validates)
    store.append(pd.concat([frame, future], ignore_index=True))
    assert store.last_append.report.rejected == {"timestamp in the future (after now + 5 min)": 4}
    parser = Parser()
    add_source_options(parser)
    window = open_window(parser.parse_args(["--store", str(tmp_path / "s"), "--since", "7d"]), now=now)
    assert window.end == now and window.start == now - pd.Timedelta(hours=2)
    assert window.note.startswith("note: the window was trimmed to the data held")
    window = open_window(parser.parse_args(["--store", str(tmp_path / "s"), "--since", "30m"]), now=now)
    assert window.start == now - pd.Timedelta(minutes=30) and not window.note


def test_the_console_script_imports_a_room_only_when_its_command_runs():
    """`gpuwarden --help` and the exporter's parser load no pandas, simulator or dashboards."""
    probe = (
        "import sys\n"
        "from gpuwarden.cli import build_parser\n"
        "build_parser(['--help'], full=False).format_help()\n"
        "build_parser(['exporter'], full=False).parse_args(['exporter', '--backend', 'replay'])\n"
        "heavy = [m for m in ('pandas', 'pyarrow', 'streamlit', 'sklearn', 'gpuwarden.sim', 'gpuwarden.analytics') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_cli_tables_fit_120_columns_unless_wide_and_show_ratios_as_percent():
    from gpuwarden.cli.output import render_rows

    rows = [{"gpu_uuid": f"GPU-{'a' * 36}-{i}", "policy": "p" * 80, "util_ratio": 0.4567, "note": "n" * 60} for i in range(3)]
    table = render_rows(rows, "table")
    assert max(len(line) for line in table.splitlines()) <= 120
    assert rows[0]["gpu_uuid"] in table and "45.7%" in table and "..." in table  # UUIDs whole, long text cut
    wide = render_rows(rows, "table", wide=True)
    assert "p" * 80 in wide and max(len(line) for line in wide.splitlines()) > 120
    assert "0.4567" in render_rows(rows, "csv") and '"util_ratio": 0.4567' in render_rows(rows, "json")
    assert render_rows(rows, "markdown").startswith("| gpu_uuid | policy |")
