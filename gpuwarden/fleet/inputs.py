"""Files a user names, checked before they are read or written: a regular file, of bounded size.

A symlink to ``/dev/zero`` (or ``/dev/urandom``) reads forever and fills memory; a FIFO blocks the
read until someone writes (and an open for writing until someone reads); a directory fails deep
inside a parser. Every input and audit path goes through :func:`checked_input` first, every output
path through :func:`checked_output` (and :func:`write_output_text` opens it without blocking); each
refuses these with one line naming the flag and the path. A user's YAML is read by
:func:`read_yaml_file`: its aliases may expand to :data:`MAX_YAML_NODES` nodes at most (a "billion
laughs" document is a few hundred bytes that expand to 10^9), and a mapping may not give a key twice
(PyYAML keeps the last without a word). Sizes: ``GPUWARDEN_MAX_INPUT_BYTES`` overrides the bound of
fleet-samples files.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from .errors import UserError

MIB, GIB = 1 << 20, 1 << 30
MAX_SAMPLES_FILE_BYTES = 32 * GIB  # a month of 1,000 GPUs at 60 s is ~13 GB of CSV
MAX_CONFIG_FILE_BYTES = 16 * MIB  # YAML / JSON settings, price books, inventories
MAX_SECRET_FILE_BYTES = 4 * MIB  # a bearer token, a CA bundle (the public roots are ~0.2 MB)
MAX_AUDIT_FILE_BYTES = 4 * GIB
# Nodes a user's YAML may hold once its aliases are expanded: an inventory of 100,000 nodes is ~400,000.
MAX_YAML_NODES = 1_000_000
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


STANDARD_STREAMS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})  # named as such: the user means them


def checked_output(path: str | Path, what: str, raising: type[Exception] = InputFileError) -> Path:
    """``path`` if it can be written as an output file: absent (in a folder that exists), a regular
    file (after symlinks) or one of :data:`STANDARD_STREAMS` by that name. A FIFO would block the write
    until someone reads, a device swallows it (a link to ``/dev/zero``) and a folder fails late: each is
    ``raising`` naming ``what`` and the path."""
    path = Path(path)
    if str(path) in STANDARD_STREAMS:
        return path
    what = f"{what} " if what else ""
    try:
        info = path.stat()
    except FileNotFoundError:
        folder = path.parent
        if not folder.is_dir():
            raise raising(f"{what}{path}: the folder {folder} does not exist") from None
        return path
    except OSError as error:
        raise raising(f"{what}{path}: cannot write ({error.strerror or error})") from None
    except ValueError:  # the operating system takes no path with a NUL byte in it
        raise raising(f"{what}{str(path)!r}: a path cannot hold a NUL byte") from None
    if not stat.S_ISREG(info.st_mode):
        target = f" (a link to {os.path.realpath(path)})" if path.is_symlink() else ""
        raise raising(f"{what}{path}: is {_kind(info.st_mode)}{target}; expected a regular file to write "
                      f"(leave {what.strip() or 'the flag'} out to write to standard output, where there is one)")
    return path


def write_output_text(path: str | Path, text: str, what: str = "--output") -> None:
    """Write ``text`` to ``path``, checked as :func:`checked_output`; opened without blocking, so a FIFO
    that appeared since the check fails at once (ENXIO) instead of waiting for a reader."""
    path = checked_output(path, what)
    try:
        blocking = 0 if str(path) in STANDARD_STREAMS else os.O_NONBLOCK  # a pipe on stdout must block when full
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | blocking | os.O_CLOEXEC, 0o666)
    except OSError as error:
        raise InputFileError(f"{what} {path}: cannot write ({error.strerror or error})") from None
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise InputFileError(f"{what} {path}: is not a regular file; expected a regular file to write")
        handle.write(text)


def read_yaml_file(path: str | Path, what: str, raising: type[Exception] = InputFileError,
                   max_nodes: int = MAX_YAML_NODES) -> Any:
    """The document of the YAML file ``path`` (checked as :func:`checked_input`; an empty file is
    ``{}``), or ``raising`` naming it: not YAML, nested too deeply, aliases expanding past
    ``max_nodes`` nodes, or a key given twice in one mapping (with the line of the second)."""
    import yaml  # here: the exporter imports fleet and never reads YAML

    checked_input(path, what, MAX_CONFIG_FILE_BYTES, raising=raising)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise raising(f"{path}: not a UTF-8 text file (byte {error.start})") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        if root is None:
            return {}
        _check_yaml_nodes(root, max_nodes, str(path), raising)
        loader = yaml.SafeLoader("")
        try:  # construct the checked tree: the same objects safe_load would give
            document = loader.construct_document(root)
        finally:
            loader.dispose()
    except RecursionError:
        raise raising(f"{path}: not valid YAML (nested too deeply)") from None
    except yaml.YAMLError as problem:
        raise raising(f"{path}: not valid YAML ({problem})") from None
    return {} if document is None else document


def _check_yaml_nodes(root: Any, max_nodes: int, where: str, raising: type[Exception]) -> None:
    """Refuse a composed YAML tree whose aliases expand past ``max_nodes``, or a mapping giving a key twice.
    Sizes are memoised per node, so a tree of shared aliases is measured in the time of its distinct nodes."""
    import yaml

    sizes: dict[int, int] = {}

    def size(node: Any) -> int:
        known = sizes.get(id(node))
        if known is not None:
            return known
        sizes[id(node)] = 1  # a node reached again while measuring it (a recursive alias) counts once
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            _no_key_twice(node, where, raising)
            total += sum(size(key) + size(value) for key, value in node.value)
        if total > max_nodes:
            raise raising(f"{where}: YAML aliases expand to more than {max_nodes:,} nodes (a 'billion laughs' "
                          "document?); write the values out or name fewer aliases")
        sizes[id(node)] = total
        return total

    size(root)


def _no_key_twice(node: Any, where: str, raising: type[Exception]) -> None:
    """A mapping's own keys (not those a ``<<`` merge brings, which it may override) given once each."""
    seen: set[tuple[str, str]] = set()
    for key, _value in node.value:
        if key.tag == "tag:yaml.org,2002:merge" or not hasattr(key, "value") or not isinstance(key.value, str):
            continue
        spelled = (key.tag, key.value)
        if spelled in seen:
            raise raising(f"{where}:{key.start_mark.line + 1}: key {key.value!r} is given twice in one mapping; "
                          "YAML would keep only the last: give each key once")
        seen.add(spelled)
