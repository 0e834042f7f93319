"""Report bundles: what one dashboard page shows over one window, computed once and kept beside the
store, so the first view of a page reads a few small files instead of scanning a week of samples.

A bundle is a flat mapping of names to small DataFrames (kept as Parquet) or JSON values, with the
window it covers and the *store version* it was computed from (the newest modification time of
the store's day folders: a write makes a new version). It lives in
``<store>/reports/<kind>/<window key>/``; writing one replaces the previous bundle of that kind and
window key as a whole (a rename), so a reader never sees half of one.

``gpuwarden demo`` writes the default window's bundles right after its backfill; the dashboard
reads them, and writes what it computes itself where it may. Nothing here is the source of truth:
a missing, old or unreadable bundle is computed again from the samples.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Mapping
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


def save(root: str | Path, kind: str, key: str, bundle: Bundle) -> Path:
    """Write ``bundle`` as the one ``kind`` bundle of window ``key`` (atomically replaces the old)."""
    target = _folder(root, kind, key)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
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
        old = target.parent / f".old-{uuid.uuid4().hex}"
        if target.exists():
            os.replace(target, old)
        os.replace(staging, target)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def load(root: str | Path, kind: str, key: str) -> Bundle | None:
    """The stored ``kind`` bundle of window ``key``, or None when there is none or it cannot be
    read (it is then simply computed again)."""
    folder = _folder(root, kind, key)
    try:
        meta = json.loads((folder / META_FILE).read_text())
        if meta.get("format") != FORMAT_VERSION:
            return None
        values: dict[str, Any] = dict(meta["values"])
        for name in meta["frames"]:
            values[name] = pd.read_parquet(folder / f"{name}.parquet")
        return Bundle(values, pd.Timestamp(meta["start"]), pd.Timestamp(meta["end"]), float(meta["version"]),
                      pd.Timestamp(meta["computed_at"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remove_all(root: str | Path) -> None:
    """Forget every stored bundle of the store (they are only ever a cache of the samples)."""
    shutil.rmtree(Path(root) / REPORTS_DIR, ignore_errors=True)
