"""Which stores the demo made: a marker file, so the demo deletes only data it made.

The demo writes ``ROOT/.gpuwarden-demo`` when it fills a store. Anything else that writes into a
store (``store load``, ``sim generate --store``) removes the marker: from then on the store holds
data the demo did not make, and the demo refuses to delete it without ``--reset``.

The store owns its folder (:mod:`gpuwarden.store.folder`): a command that only reads a store
refuses a path that holds none (:func:`checked_store` with ``existing``), and no command writes a
file inside a store's folder (:func:`refuse_output_in_store`) or makes a store inside another.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from gpuwarden.fleet.errors import UserError

DEFAULT_STORE = Path(".gpuwarden/demo-store")
MARKER = ".gpuwarden-demo"
# What a store consists of (the demo deletes these and nothing else in the folder).
STORE_PARTS = ("samples", "ops", "quarantine", "actuator", ".lock", ".readlock", MARKER)


class StorePathError(UserError, ValueError):
    """A --store path that is not a store (a file, a folder of other things, none at all for a
    command that reads one), or an output path inside a store's folder."""


def store_path(text: str) -> Path:
    """The ``--store`` argument: a folder name, never empty (``Path("")`` is the working folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not a store folder; name one (default {DEFAULT_STORE})")
    return Path(text)


def checked_store(root: Path, flag: str = "--store", existing: bool = False) -> Path:
    """``root`` if it can be a store: absent (a new one), an empty folder, or a folder holding any
    of a store's parts. A file, or a folder of other things (a home folder, a checkout), is refused
    with the reason: a store there would mix its parts with them, and the demo deletes its parts.
    So is a folder inside another store's folder. With ``existing`` (a command that only reads a
    store: info, check, read, repair) it must be a store already: absent or empty is refused too."""
    from gpuwarden.store.folder import not_a_store  # the store's rule; pandas only once a command runs

    root = Path(root)
    if existing:
        why = not_a_store(root)
        if why:
            raise StorePathError(f"{flag} {root}: {why}; name a store that 'gpuwarden demo' or 'gpuwarden store "
                                 f"load' filled (default {DEFAULT_STORE})")
    if root.exists() and not root.is_dir():
        raise StorePathError(f"{flag} {root}: is a file; expected a store directory")
    if not root.is_dir():
        _outside_stores(root, flag)
        return root
    entries = sorted(entry.name for entry in root.iterdir())
    if entries and not any(name in STORE_PARTS for name in entries):
        shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
        raise StorePathError(f"{flag} {root}: is not a gpuwarden store (it holds {shown}, and no samples/); name an "
                             "existing store, an empty folder or a new one")
    _outside_stores(root, flag)
    return root


def _outside_stores(root: Path, flag: str) -> None:
    """A store inside another store's folder would be the other's foreign files (never read)."""
    from gpuwarden.store.folder import store_holding

    holder = store_holding(root)
    if holder is not None:
        raise StorePathError(f"{flag} {root}: is inside the store {holder}; only that store writes there, name a "
                             "folder outside it")


def refuse_output_in_store(path: Path | str | None, flag: str) -> None:
    """StorePathError when the file ``path`` would land inside a store's folder (at any depth):
    only the store writes there, and a file of its naming would be read as samples."""
    from gpuwarden.fleet.inputs import STANDARD_STREAMS
    from gpuwarden.store.folder import store_holding

    if path is None or str(path) in STANDARD_STREAMS:
        return
    holder = store_holding(path)
    if holder is not None:
        raise StorePathError(f"{flag} {path}: is inside the store {holder}; only the store writes there, write it "
                             "elsewhere")


def store_has_data(root: Path) -> bool:
    samples = Path(root) / "samples"
    return samples.is_dir() and any(samples.glob("date=*/part-*.parquet"))


def is_demo_store(root: Path) -> bool:
    return (Path(root) / MARKER).is_file()


def mark_demo_store(root: Path) -> None:
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / MARKER).write_text(json.dumps({"made_by": "gpuwarden demo", "pid": os.getpid(), "at": time.time()}) + "\n")


def demo_running_on(root: Path) -> int | None:
    """The pid of a live demo that marked ``root`` (another process), if any."""
    try:
        pid = int(json.loads((Path(root) / MARKER).read_text()).get("pid", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    if pid <= 0 or pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid  # alive, someone else's
    return pid


def adopt_store(root: Path) -> None:
    """Someone other than the demo writes here: the demo must no longer delete it."""
    (Path(root) / MARKER).unlink(missing_ok=True)
