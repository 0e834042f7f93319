"""The checked-in bad-input corpus (tests/corpus/cases.yaml): every case gives its exit code and
one line naming the problem, or its documented success; never a traceback, never a hang.

Cases run in-process through ``gpuwarden.cli.main`` (the console script's entry point), each in
its own temporary working directory; one subprocess case checks the same through the real
console entry (``python -m gpuwarden.cli``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from builders import make_samples

from gpuwarden.cli import main
from gpuwarden.store import LocalStore, write_samples

ROOT = Path(__file__).resolve().parents[2]
CASES = yaml.safe_load((ROOT / "tests" / "corpus" / "cases.yaml").read_text())


def make_file(path: Path, spec) -> None:
    if isinstance(spec, str):
        path.write_text(spec)
    elif "hex" in spec:
        path.write_bytes(bytes.fromhex(spec["hex"].replace(" ", "")))
    elif spec.get("dir"):
        path.mkdir()
    elif "symlink" in spec:  # e.g. /dev/zero: an input that never ends
        path.symlink_to(spec["symlink"])
    elif spec.get("fifo"):  # a named pipe: a read that never starts
        os.mkfifo(path)
    elif "store" in spec:
        LocalStore(path).append(make_samples("2026-11-01T00:00:00Z", steps=spec["store"]))
    elif "samples" in spec:
        frame = make_samples(steps=max(1, spec["samples"])).astype(object)
        if spec["samples"] == 0:
            frame = frame.iloc[0:0]
        for row in spec.get("rows", [0]):
            for column, value in spec.get("set", {}).items():
                frame.loc[row, column] = value
        if path.suffix == ".parquet":
            write_samples(frame.astype({"timestamp": "datetime64[ns, UTC]"}), path)
        else:
            frame.to_csv(path, index=False, date_format="%Y-%m-%dT%H:%M:%SZ")
    else:
        raise ValueError(f"unknown file spec {spec!r}")


def run_case(case: dict, tmp_path: Path, capsys) -> tuple[int, str, str]:
    for name, spec in (case.get("files") or {}).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        make_file(tmp_path / name, spec)
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in case["argv"]]
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse: --help, --version, parse errors
        code = stop.code if isinstance(stop.code, int) else 2
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_corpus_case(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_case(case, tmp_path, capsys)
    expected = case["exit"] if isinstance(case["exit"], list) else [case["exit"]]
    assert code in expected, f"exit {code}; stderr: {err!r}; stdout: {out[-500:]!r}"
    assert "Traceback" not in err and "Traceback" not in out
    lines = [line for line in err.splitlines() if line.strip()]
    if 0 not in expected:
        assert len(lines) <= 1, err
    if "stderr" in case:
        assert case["stderr"] in err, err
        if 0 not in expected:
            assert len(lines) == 1
    if "stdout" in case:
        assert case["stdout"] in out, out


def test_corpus_covers_every_subcommand():
    from gpuwarden.cli import COMMANDS

    named = {c["argv"][0] for c in CASES if c["argv"]}
    assert set(COMMANDS) <= named, set(COMMANDS) - named
    assert len(CASES) >= 100 and len({c["id"] for c in CASES}) == len(CASES)


def test_console_entry_gives_one_line_and_quiet_broken_pipe(tmp_path):
    """Through a real process: a bad flag is one line, exit 2; a reader that goes away is quiet."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "gpuwarden.cli", "sim", "generate", "--out", "x.csv", "--fault-scale", "inf"],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    # `gpuwarden store schema | head -1`: the pipe closes early; no BrokenPipeError traceback.
    pipeline = subprocess.run(f"{sys.executable} -m gpuwarden.cli store schema | head -c 10 >/dev/null",
                              shell=True, capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert pipeline.stderr == ""
    assert pd.Timestamp.now(tz="UTC") > pd.Timestamp("2026-11-01T00:00:00Z")  # the corpus's store data is in the past
