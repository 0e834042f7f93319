"""Argument parsing that fails the way a user expects: one line naming the problem, exit 2.

Every number flag goes through :func:`number` (finite, inside a stated range), so ``nan``,
``inf``, ``1e12`` or ``-1`` where they make no sense are refused at parse time instead of
spinning, overflowing or dividing by zero later. Every output path (a flag of
:data:`OUTPUT_FLAGS`, in any command) is checked by :class:`Parser` once parsed: a FIFO, a device,
a socket or a folder is refused before any work starts (a FIFO would block the write for ever).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

# Flags that name a file a command writes, whichever command declares them (``--json``: health eval's
# deprecated spelling of ``--format json --output``). tests/cli/test_bad_input_probe4.py checks that
# every path flag of every command is either one of these or read through fleet.inputs.
OUTPUT_FLAGS = frozenset({"--output", "--out", "--ground-truth", "--json"})


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (no usage dump, no traceback), exit code 2, and
    which refuses an output path that is not a regular file to write (:data:`OUTPUT_FLAGS`)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see '{self.prog} --help')\n")
        raise SystemExit(2)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        for action in self._actions:
            flags = [flag for flag in action.option_strings if flag in OUTPUT_FLAGS]
            value: Any = getattr(parsed, action.dest, None)
            if flags and isinstance(value, (str, Path)) and str(value):
                self._check_output(value, flags[0])
        return parsed, extras

    def _check_output(self, path: str | Path, flag: str) -> None:
        from gpuwarden.fleet.inputs import InputFileError, checked_output  # fleet only once a command parses

        from .storemark import StorePathError, refuse_output_in_store

        try:
            checked_output(path, flag)
            refuse_output_in_store(path, flag)  # a file among a store's parts would be read back as samples
        except (InputFileError, StorePathError) as refused:
            self.error(str(refused))


def number(kind: type, minimum: float | None = None, maximum: float | None = None, *,
           above: bool = False) -> Callable[[str], int | float]:
    """A parser for ``kind`` (int or float) in ``minimum..maximum`` (``above``: strictly greater
    than ``minimum``). Non-finite values are always refused. The message states what is allowed."""
    what = "an integer" if kind is int else "a number"

    def show(bound: float) -> str:
        return f"{int(bound):d}" if kind is int or float(bound).is_integer() and abs(bound) < 1e15 else f"{bound:g}"

    low = "" if minimum is None else (f"> {show(minimum)}" if above else f">= {show(minimum)}")
    allowed = " and ".join(part for part in (low, "" if maximum is None else f"<= {show(maximum)}") if part)
    expected = f"expected {what}" + (f" {allowed}" if allowed else "")

    def parse(text: str) -> int | float:
        try:
            value = kind(text.strip())
        except (ValueError, OverflowError):
            value = None
            if kind is int:
                try:  # 1e3 or 8.0 are integers written as numbers
                    as_float = float(text)
                except ValueError:
                    as_float = math.nan
                if math.isfinite(as_float) and as_float.is_integer():
                    value = int(as_float)
            if value is None:
                raise argparse.ArgumentTypeError(f"{text!r} is not {what}; {expected}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number; {expected}")
        too_low = minimum is not None and (value < minimum or (above and value == minimum))
        if too_low or (maximum is not None and value > maximum):
            reason = "is negative" if value < 0 and (minimum or 0) >= 0 else "is out of range"
            raise argparse.ArgumentTypeError(f"{text!r} {reason}; {expected}")
        return value

    parse.__name__ = f"{kind.__name__} in range"  # argparse names the type in some messages
    return parse


# The common shapes; a flag with its own sensible ceiling calls ``number`` directly.
non_negative_int = number(int, 0, 10**9)
positive_int = number(int, 1, 10**9)
positive_float = number(float, 0, 1e9, above=True)
non_negative_float = number(float, 0, 1e9)
ratio = number(float, 0, 1)
seed = number(int, 0, 2**32 - 1)
port = number(int, 1, 65535)


def host_port(text: str) -> tuple[str, int]:
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = "127.0.0.1", text
    try:
        value = int(port_text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:9400)") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is not in 0..65535")
    return host.strip("[]") or "127.0.0.1", value


def plain(docstring: str | None) -> str:
    """A module docstring as help text: no reStructuredText markup, argparse shows as written."""
    import re

    text = (docstring or "").replace("``", "")
    return re.sub(r":(?:class|func|meth|mod):`~?([^`]+)`", r"\1", text).strip()
