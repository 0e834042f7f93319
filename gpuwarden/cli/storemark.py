"""Which stores the demo made: a marker file, so the demo deletes only data it made.

The demo writes ``ROOT/.gpuwarden-demo`` when it fills a store. Anything else that writes into a
store (``store load``, ``sim generate --store``) removes the marker: from then on the store holds
data the demo did not make, and the demo refuses to delete it without ``--reset``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

DEFAULT_STORE = Path(".gpuwarden/demo-store")
MARKER = ".gpuwarden-demo"
# What a store consists of (the demo deletes these and nothing else in the folder).
STORE_PARTS = ("samples", "ops", "quarantine", "actuator", ".lock", MARKER)


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
