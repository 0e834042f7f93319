"""Files a user names, checked before they are read: a regular file, of bounded size.

A symlink to ``/dev/zero`` (or ``/dev/urandom``) reads forever and fills memory; a FIFO blocks the
read until someone writes; a directory fails deep inside a parser. Every input and audit path goes
through :func:`checked_input` first, which refuses each of these with one line naming the path.
Sizes: ``GPUWARDEN_MAX_INPUT_BYTES`` overrides the bound of fleet-samples files.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import UserError

MIB, GIB = 1 << 20, 1 << 30
MAX_SAMPLES_FILE_BYTES = 32 * GIB  # a month of 1,000 GPUs at 60 s is ~13 GB of CSV
MAX_CONFIG_FILE_BYTES = 16 * MIB  # YAML / JSON settings, price books, inventories
MAX_SECRET_FILE_BYTES = 4 * MIB  # a bearer token, a CA bundle (the public roots are ~0.2 MB)
MAX_AUDIT_FILE_BYTES = 4 * GIB
_ENV_SAMPLES_BOUND = "GPUWARDEN_MAX_INPUT_BYTES"


class InputFileError(UserError, ValueError):
    """A named file that cannot be read as input: missing, not a regular file, or too large."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def samples_bound_bytes() -> int:
    text = os.environ.get(_ENV_SAMPLES_BOUND, "")
    try:
        return int(text) if text else MAX_SAMPLES_FILE_BYTES
    except ValueError:
        raise InputFileError(f"{_ENV_SAMPLES_BOUND}={text!r} is not a whole number of bytes") from None


def checked_input(path: str | Path, what: str, max_bytes: int, missing_ok: bool = False,
                  raising: type[Exception] = InputFileError) -> Path | None:
    """``path`` if it is a regular file (after symlinks) of at most ``max_bytes``; None when it does
    not exist and ``missing_ok``. Otherwise ``raising`` (a room's own :class:`UserError`; default
    :class:`InputFileError`), naming ``what`` (a flag or the kind of file) and the path, and
    saying what is allowed."""
    path = Path(path)
    what = f"{what} " if what else ""
    try:
        info = path.stat()  # follows symlinks: a link to /dev/zero is a device
    except FileNotFoundError:
        if missing_ok:
            return None
        raise raising(f"{what}{path}: no such file") from None
    except OSError as error:
        raise raising(f"{what}{path}: cannot read ({error.strerror or error})") from None
    if not stat.S_ISREG(info.st_mode):
        target = f" (a link to {os.path.realpath(path)})" if path.is_symlink() else ""
        raise raising(f"{what}{path}: is {_kind(info.st_mode)}{target}; expected a regular file")
    if info.st_size > max_bytes:
        raise raising(f"{what}{path}: is {info.st_size:,} bytes, more than the {max_bytes:,} allowed; "
                             "split it or name a smaller file")
    return path
