"""Report bundles: what one dashboard page shows over one window, computed once and kept beside the
store, so the first view of a page reads a few small files instead of scanning a week of samples.

A bundle is a flat mapping of names to small DataFrames (kept as Parquet) or JSON values, with the
window it covers and the *store version* it was computed from (the newest modification time of
the store's day folders: a write makes a new version). It lives in
``<store>/reports/<kind>/<window key>`` (a link to the newest copy); writing one replaces the
previous bundle of that kind and window key as a whole, so a reader never sees half of one.

``gpuwarden demo`` writes the default window's bundles right after its backfill; the dashboard
reads them, and writes what it computes itself where it may. Nothing here is the source of truth:
a missing, old or unreadable bundle is computed again from the samples.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

REPORTS_DIR = "reports"
META_FILE = "meta.json"
FORMAT_VERSION = 1


def store_version(root: str | Path) -> float:
    """Newest modification time of the store's day folders (a new or merged file changes it); 0
    when the store has none."""
    samples = Path(root) / "samples"
    try:
        stamps = [samples.stat().st_mtime, *(p.stat().st_mtime for p in samples.glob("date=*"))]
    except OSError:
        return 0.0
    return max(stamps)


@dataclass(frozen=True)
class Bundle:
    values: Mapping[str, Any]
    start: pd.Timestamp
    end: pd.Timestamp
    version: float
    computed_at: pd.Timestamp = field(default_factory=lambda: pd.Timestamp.now(tz="UTC"))

    def __getitem__(self, name: str) -> Any:
        return self.values[name]


def _folder(root: str | Path, kind: str, key: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
    return Path(root) / REPORTS_DIR / kind / safe


KEEP_OLD_SECONDS = 600.0  # an older copy stays this long for a page still reading it


def save(root: str | Path, kind: str, key: str, bundle: Bundle) -> Path:
    """Write ``bundle`` as the one ``kind`` bundle of window ``key``. Each copy is a folder of its
    own, and ``<key>`` a link switched to the new one atomically, so a reader never sees half a
    bundle and one that is reading an older copy finishes it (older copies go after a while)."""
    target = _folder(root, kind, key)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=target.parent))
    try:
        scalars: dict[str, Any] = {}
        frames: list[str] = []
        for name, value in bundle.values.items():
            if isinstance(value, pd.DataFrame):
                value.to_parquet(staging / f"{name}.parquet")
                frames.append(name)
            else:
                scalars[name] = value
        meta = {"format": FORMAT_VERSION, "kind": kind, "key": key, "start": bundle.start.isoformat(),
                "end": bundle.end.isoformat(), "version": bundle.version,
                "computed_at": bundle.computed_at.isoformat(), "frames": frames, "values": scalars}
        (staging / META_FILE).write_text(json.dumps(meta, default=str))
        link = target.parent / f".link-{uuid.uuid4().hex}"
        os.symlink(staging.name, link)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(link, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _forget_old_copies(target, staging)
    return staging


def _forget_old_copies(target: Path, current: Path) -> None:
    now = time.time()
    for copy in target.parent.glob(f"{target.name}.*"):
        try:
            if copy != current and copy.is_dir() and now - copy.stat().st_mtime > KEEP_OLD_SECONDS:
                shutil.rmtree(copy, ignore_errors=True)
        except OSError:
            continue


def load(root: str | Path, kind: str, key: str) -> Bundle | None:
    """The stored ``kind`` bundle of window ``key``, or None when there is none or it cannot be
    read (it is then simply computed again)."""
    try:
        folder = _folder(root, kind, key).resolve(strict=True)  # this copy, even if a newer one lands
        meta = json.loads((folder / META_FILE).read_text())
        if meta.get("format") != FORMAT_VERSION:
            return None
        frames = [str(name) for name in meta["frames"]]
        if not all((folder / f"{name}.parquet").is_file() for name in frames):
            return None
        values = _StoredValues(folder, dict(meta["values"]), frames)
        return Bundle(values, pd.Timestamp(meta["start"]), pd.Timestamp(meta["end"]), float(meta["version"]),
                      pd.Timestamp(meta["computed_at"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


class _StoredValues(Mapping[str, Any]):
    """A stored bundle's values; each frame is read when a page first asks for it (the Fleet page
    needs one figure of the ledger bundle, not its sixteen tables)."""

    def __init__(self, folder: Path, scalars: dict[str, Any], frames: list[str]) -> None:
        self._folder = folder
        self._values: dict[str, Any] = dict(scalars)
        self._frames = set(frames)
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> Any:
        if name in self._frames and name not in self._values:
            with self._lock:
                if name not in self._values:
                    self._values[name] = pd.read_parquet(self._folder / f"{name}.parquet")
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter([*(k for k in self._values if k not in self._frames), *sorted(self._frames)])

    def __len__(self) -> int:
        return len(set(self._values) | self._frames)


def remove_all(root: str | Path) -> None:
    """Forget every stored bundle of the store (they are only ever a cache of the samples)."""
    shutil.rmtree(Path(root) / REPORTS_DIR, ignore_errors=True)
