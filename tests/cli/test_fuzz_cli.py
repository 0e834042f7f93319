"""Property tests (Hypothesis): random flags and values for every subcommand's parser, random
bytes and random CSV cells for the samples file readers. Each input either parses (a documented
success, numbers finite) or fails with exactly one line and exit 2; nothing else escapes. All
in-process: parsing is the entry point's first step, and reading is load_samples."""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwarden.cli import build_parser
from gpuwarden.fleet import SAMPLE_COLUMNS
from gpuwarden.store import SamplesError, load_samples
from gpuwarden.store.schema import MAX_TEMPERATURE_CELSIUS


def leaf_parsers(parser: argparse.ArgumentParser, path=()):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from leaf_parsers(sub, path + (name,))


PARSER = build_parser()
LEAVES = list(leaf_parsers(PARSER))
NASTY = ["nan", "inf", "-inf", "-1", "0", "1e12", "1e400", "-0", "0x10", " 5 ", "", "1e8", "4294967296", "2300-01-01",
         "http://[::1", "7d", "0d", "-5m", "abc", "1,2", "127.0.0.1:99999", "\x00", "é"]
values = st.one_of(st.sampled_from(NASTY), st.text(max_size=12), st.integers(-10**20, 10**20).map(str),
                   st.floats(allow_nan=True, allow_infinity=True).map(repr))


def options_of(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))]


@st.composite
def command_lines(draw):
    path, parser = draw(st.sampled_from(LEAVES))
    argv = list(path)
    for action in draw(st.lists(st.sampled_from(options_of(parser) or [None]), max_size=4)):
        if action is None:
            continue
        argv.append(action.option_strings[-1])
        if action.nargs != 0:
            argv.append(draw(st.sampled_from(list(action.choices)) if action.choices and draw(st.booleans()) else values))
    positionals = [a for a in parser._actions if not a.option_strings and not isinstance(a, argparse._SubParsersAction)]
    for action in positionals:
        argv.append(draw(st.sampled_from(list(action.choices)) if action.choices else values))
    return argv


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(command_lines())
def test_every_parser_accepts_or_refuses_in_one_line(argv):
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            args = PARSER.parse_args(argv)
        except SystemExit as stop:
            lines = [line for line in stderr.getvalue().splitlines() if line.strip()]
            assert stop.code == 2 and len(lines) == 1, (argv, stderr.getvalue())
            return
    for name, value in vars(args).items():  # a documented success: every number is finite
        if isinstance(value, float):
            assert math.isfinite(value), (argv, name, value)


CELL = st.one_of(st.sampled_from(["", "nan", "inf", "-1", "1e15", "330", "0.5", "2300-01-01T00:00:00Z",
                                  "2026-11-01T00:00:00Z", "2199-05-05", "GPU-1", "x,y", '"', "\\n"]),
                 st.text(max_size=8), st.floats().map(repr))
COLUMNS = [c.name for c in SAMPLE_COLUMNS if not c.nullable] + ["temperature_celsius", "power_watts", "gpu_util_ratio"]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(CELL, min_size=len(COLUMNS), max_size=len(COLUMNS)), max_size=6),
       st.sampled_from([".csv", ".csv.gz", ".parquet"]), st.binary(max_size=64), st.booleans())
def test_file_readers_load_or_refuse_in_one_line(rows, suffix, junk, use_junk):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"samples{suffix}"
        if use_junk:
            path.write_bytes(junk)
        elif suffix == ".parquet":
            pd.DataFrame(rows, columns=COLUMNS, dtype=object).astype(str).to_parquet(path)
        else:
            pd.DataFrame(rows, columns=COLUMNS).to_csv(path, index=False)
        try:
            frame = load_samples(path)
        except SamplesError as error:
            assert "\n" not in str(error) and str(path) in str(error) or "rejected" in str(error)
            return
    # What was kept passed validation: finite, in range, not in the future.
    temperature = frame["temperature_celsius"].to_numpy(dtype=float, na_value=np.nan)
    assert not (temperature > MAX_TEMPERATURE_CELSIUS).any()
    assert not np.isinf(frame["power_watts"].to_numpy(dtype=float, na_value=np.nan)).any()
    assert (frame["timestamp"] <= pd.Timestamp.now(tz="UTC") + pd.Timedelta(minutes=5)).all()


@pytest.mark.parametrize("path, parser", LEAVES, ids=[" ".join(p) for p, _ in LEAVES])
def test_every_flag_has_help_without_markup(path, parser):
    for action in options_of(parser) + [a for a in parser._actions if not a.option_strings and a.help]:
        if action.help == argparse.SUPPRESS:
            continue
        assert action.help, f"{' '.join(path)} {action.option_strings}: no help text"
    text = parser.format_help()
    assert "%%" not in text and "``" not in text and ":class:" not in text, text
