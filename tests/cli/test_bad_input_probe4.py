"""Issue 35's third bad-input probe (the `p4-` cases): what the corpus format cannot write. A socket as
an input or output path, every output flag of every command, the price book an environment variable
names, a GPU catalogue's CSV, YAML nested past the parser's stack, and a node whose price-tier label
is no tier. The command-line cases are in tests/corpus/cases.yaml."""

from __future__ import annotations

import argparse
import csv
import io
import os
import socket
import threading
from pathlib import Path

import pytest

from gpuwarden.cli import build_parser, main
from gpuwarden.cli.args import OUTPUT_FLAGS
from gpuwarden.fleet.inputs import InputFileError, checked_output, read_yaml_file, write_output_text

SAMPLES_UNTIL = "2026-11-01T01:00:00Z"


def run(argv: list[str], capsys) -> tuple[int, str]:
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse: the parse-time checks
        code = stop.code if isinstance(stop.code, int) else 2
    return code, capsys.readouterr().err


def one_line(code: int, err: str, want: str) -> None:
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "this is a bug" not in err, err
    assert want in err, err


@pytest.fixture
def unix_socket(tmp_path):
    path = tmp_path / "s.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    yield path
    server.close()


@pytest.fixture
def samples_file(tmp_path):
    from builders import make_samples

    path = tmp_path / "s.csv"
    make_samples(steps=3).to_csv(path, index=False, date_format="%Y-%m-%dT%H:%M:%SZ")
    return path


# -- A. a socket, as an input and as an output ----------------------------------------------------
def test_a_socket_as_a_queue_trace_is_refused_naming_flag_and_path(unix_socket, capsys):
    one_line(*run(["simulate", "queue", "--trace", str(unix_socket)], capsys), f"--trace {unix_socket}: is a socket")


def test_a_socket_as_a_pod_list_is_refused(unix_socket, tmp_path, capsys):
    nodes = tmp_path / "d" / "openb" / "openb_node_list_gpu_node.csv"
    nodes.parent.mkdir(parents=True)
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,96000,786432,8,V100M32\n")
    one_line(*run(["simulate", "placement", "--data-dir", str(tmp_path / "d"), "--lists", str(unix_socket),
                   "--seeds", "1", "--workers", "1"], capsys), f"--lists {unix_socket}: is a socket")


def test_a_socket_as_output_is_refused_before_the_report_runs(unix_socket, samples_file, capsys):
    code, err = run(["report", "idle", "--source", "file", "--file", str(samples_file), "--until", SAMPLES_UNTIL,
                     "--output", str(unix_socket)], capsys)
    one_line(code, err, f"--output {unix_socket}: is a socket")


# -- A. every output flag of every command: a FIFO is refused at parse time, never opened ---------
def _output_flags() -> list[tuple[tuple[str, ...], str]]:
    """(command words, flag) for every output flag of every command, walked from the full parser."""
    found = []

    def walk(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, (*words, name))
            for flag in action.option_strings:
                if flag in OUTPUT_FLAGS:
                    found.append((words, flag))

    walk(build_parser(full=True), ())
    return found


OUTPUT_FLAG_CASES = _output_flags()
# What a command needs besides the flag to get past argparse's own checks.
REQUIRED = {("sim", "generate"): ["--store", "s"], ("report",): ["idle"]}


def test_every_command_that_writes_a_file_was_found():
    commands = {words for words, _ in OUTPUT_FLAG_CASES}
    assert {("report",), ("store", "read"), ("sim", "generate"), ("simulate", "queue"), ("simulate", "savings"),
            ("health", "eval"), ("queue",)} <= commands, commands


@pytest.mark.timeout(60)
@pytest.mark.parametrize("words, flag", OUTPUT_FLAG_CASES, ids=[" ".join(w) + " " + f for w, f in OUTPUT_FLAG_CASES])
def test_every_output_flag_refuses_a_fifo_without_blocking(words, flag, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.mkfifo(tmp_path / "out.csv")
    argv = [*words, *REQUIRED.get(words, []), flag, "out.csv"]
    if words == ("sim", "generate") and flag == "--out":
        argv = [*words, flag, "out.csv"]
    one_line(*run(argv, capsys), f"{flag} out.csv: is a FIFO")


def test_every_path_flag_is_an_output_or_read_through_fleet_inputs():
    """A new flag naming a file must be classified: an output (checked by the parser) or an input read
    through gpuwarden.fleet.inputs (checked_input / read_yaml_file), named here after reading its reader."""
    inputs = {"--config", "--data-dir", "--trace", "--price-book", "--inventory", "--kubeconfig", "--audit", "--file",
              "--prometheus-token-file", "--prometheus-ca-file", "--cluster-state", "files"}
    unclassified = set()

    def walk(parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)
            elif action.type is Path:
                names = action.option_strings or [action.dest]
                if not (set(names) & (OUTPUT_FLAGS | inputs)):
                    unclassified.add(names[0])

    walk(build_parser(full=True))
    assert not unclassified, f"path flags neither output nor a known input: {sorted(unclassified)}"


def test_a_fifo_made_after_the_check_fails_at_once_instead_of_blocking(tmp_path):
    """write_output_text opens without blocking: with no reader a FIFO is ENXIO, not a wait for ever."""
    fifo = tmp_path / "late.txt"
    os.mkfifo(fifo)
    done = threading.Event()
    errors: list[Exception] = []

    def attempt() -> None:
        try:
            write_output_text(fifo, "x")
        except InputFileError as error:
            errors.append(error)
        done.set()

    threading.Thread(target=attempt, daemon=True).start()
    assert done.wait(5), "the write blocked on a FIFO"
    assert errors and "is a FIFO" in str(errors[0])


def test_a_regular_output_file_is_replaced_whole(tmp_path):
    target = tmp_path / "o.txt"
    target.write_text("an old and longer text\n")
    write_output_text(target, "new\n")
    assert target.read_text() == "new\n"


# -- A. a user's YAML: aliases, depth, keys given twice -------------------------------------------
def test_yaml_nested_past_the_parsers_stack_is_one_line(tmp_path, samples_file, capsys):
    book = tmp_path / "deep.yaml"
    book.write_text("models: " + "[" * 3000 + "]" * 3000 + "\n")
    code, err = run(["report", "cost", "--source", "file", "--file", str(samples_file), "--until", SAMPLES_UNTIL,
                     "--price-book", str(book)], capsys)
    one_line(code, err, "deep.yaml: not valid YAML (nested too deeply)")


def test_the_price_book_an_environment_variable_names_is_bounded_too(tmp_path, samples_file, capsys, monkeypatch):
    book = tmp_path / "env.yaml"
    levels = ["a0: &a0 [" + ", ".join(["x"] * 10) + "]"]
    levels += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    book.write_text("\n".join(levels) + "\nmodels: {X: {on-demand: 1}}\n")
    monkeypatch.setenv("GPUWARDEN_PRICE_BOOK", str(book))
    code, err = run(["report", "cost", "--source", "file", "--file", str(samples_file), "--until", SAMPLES_UNTIL],
                    capsys)
    one_line(code, err, "env.yaml: YAML aliases expand to more than 1,000,000 nodes")


def test_the_price_book_an_environment_variable_names_refuses_a_fifo(tmp_path, samples_file, capsys, monkeypatch):
    os.mkfifo(tmp_path / "p.yaml")
    monkeypatch.setenv("GPUWARDEN_PRICE_BOOK", str(tmp_path / "p.yaml"))
    code, err = run(["report", "cost", "--source", "file", "--file", str(samples_file), "--until", SAMPLES_UNTIL],
                    capsys)
    one_line(code, err, "p.yaml: is a FIFO")


@pytest.mark.parametrize("text, loaded", [
    ("a: &x {b: 1}\nc: *x\n", {"a": {"b": 1}, "c": {"b": 1}}),
    ("base: &b {p: 1, q: 2}\nm: {<<: *b, q: 3}\n", {"base": {"p": 1, "q": 2}, "m": {"p": 1, "q": 3}}),
    ("", {}),
    ("1: a\n'1': b\n", {1: "a", "1": "b"}),  # an integer key and a string key are two keys
])
def test_ordinary_yaml_reads_as_safe_load_reads_it(tmp_path, text, loaded):
    path = tmp_path / "ok.yaml"
    path.write_text(text)
    assert read_yaml_file(path, "the file") == loaded


def test_a_key_given_twice_is_named_with_its_line(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("a:\n  b: 1\n  c: 2\n  b: 3\n")
    with pytest.raises(InputFileError, match=r"twice\.yaml:4: key 'b' is given twice"):
        read_yaml_file(path, "the file")


def test_a_recursive_alias_is_bounded(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("a: &a [1, *a]\n")
    assert read_yaml_file(path, "the file")["a"][1][1][0] == 1  # PyYAML builds the cycle; nothing expands it


# -- B. the GPU catalogue's CSV: NaN, infinite or absurd figures named by line --------------------
@pytest.mark.parametrize("column, value, want", [
    ("price_on_demand", "nan", "price_on_demand 'nan' is not a finite number"),
    ("tdp_watts", "inf", "tdp_watts 'inf' is not a finite number"),
    ("price_spot", "1e12", "price_spot '1e12' is more than"),
])
def test_a_gpu_catalogue_row_with_a_figure_no_gpu_has_is_named(tmp_path, column, value, want):
    from gpuwarden.fleet.catalogue import CatalogueError
    from gpuwarden.fleet.gpu_catalogue import MIG_PROFILES_PATH, MODELS_PATH, load_gpu_catalogue

    lines = MODELS_PATH.read_text().splitlines(keepends=True)
    header_at = next(i for i, line in enumerate(lines) if line.startswith("model,"))
    header = lines[header_at].rstrip("\n").split(",")

    def fields(i: int) -> list[str]:  # a row's fields, the empty trailing ones included
        cells = next(csv.reader([lines[i]]))
        return cells + [""] * (len(header) - len(cells))

    row = next(i for i in range(header_at + 1, len(lines)) if lines[i].strip() and not lines[i].startswith("#")
               and fields(i)[header.index("price_on_demand")])
    cells = fields(row)
    cells[header.index(column)] = value
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(cells)
    lines[row] = buffer.getvalue()
    (tmp_path / MODELS_PATH.name).write_text("".join(lines))
    with pytest.raises(CatalogueError, match=rf"gpu_models\.csv:{row + 1}: {want}"):
        load_gpu_catalogue(tmp_path / MODELS_PATH.name, MIG_PROFILES_PATH)


# -- B. one bad tier label prices that node by the inventory, not every priced read an error ------
def test_one_node_with_a_bad_tier_label_does_not_fail_the_others():
    from gpuwarden.analytics import Inventory
    from gpuwarden.fleet import PriceTier

    inventory = Inventory.default().with_labels({
        "train-h100-007": {"gpuwarden.io/price-tier": "gold"},
        "train-h100-008": {"gpuwarden.io/price-tier": "spot"},
    }, "kube_node_labels")
    assert inventory.lookup("train-h100-008")[1] is PriceTier.SPOT  # its label
    assert inventory.lookup("train-h100-007")[1] is Inventory.default().lookup("train-h100-007")[1]  # the file's
    note = inventory.tier_note(["train-h100-007", "train-h100-008"])
    assert "train-h100-007" in note and "'gold'" in note, note


@pytest.mark.parametrize("name", ["/dev/null", "/dev/stdout", "/dev/stderr"])
def test_the_standard_streams_by_name_stay_writable_outputs(name, tmp_path):
    """``--output /dev/null`` (discard) and ``/dev/stdout`` are what users mean; a link to a device is not."""
    assert checked_output(name, "--output") == Path(name)
    link = tmp_path / "out.json"
    link.symlink_to("/dev/null")
    with pytest.raises(InputFileError, match="is a device"):
        checked_output(link, "--output")
