"""Argument parsing that fails the way a user expects: one line naming the problem, exit 2."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (no usage dump, no traceback), exit code 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see '{self.prog} --help')\n")
        raise SystemExit(2)


def _number(text: str, kind: type, minimum: float, inclusive: bool):
    """Parse ``text`` as ``kind`` (int or float) that is >= (or >) ``minimum``, or explain why not."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if value < minimum or (value == minimum and not inclusive):
        bound = f"{'>=' if inclusive else '>'} {minimum:g}"
        what = "an integer" if kind is int else "a number"
        reason = "is negative" if value < 0 else "is not allowed"
        raise argparse.ArgumentTypeError(f"{text!r} {reason}; expected {what} {bound}")
    return value


def non_negative_int(text: str) -> int:
    return _number(text, int, 0, inclusive=True)


def positive_int(text: str) -> int:
    return _number(text, int, 1, inclusive=True)


def positive_float(text: str) -> float:
    return _number(text, float, 0, inclusive=False)


def non_negative_float(text: str) -> float:
    return _number(text, float, 0, inclusive=True)


def host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text
    try:
        number = int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT") from None
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"port {number} is not in 0..65535")
    return host or "127.0.0.1", number
