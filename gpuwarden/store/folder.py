"""What the embedded store owns in its folder, by its naming scheme, and what it leaves alone.

The store reads, moves and deletes only what its naming scheme names (:mod:`.local`)::

    ROOT/samples/date=YYYY-MM-DD/part-*.parquet       its part files (regular files, links followed)
    ROOT/samples/date=YYYY-MM-DD/.part-*.parquet.tmp  an operation's new files before its commit:
                                                      never read; the next write deletes them
    ROOT/ops/<op-id>.json, ROOT/ops/.<op-id>.json.tmp its journal (:mod:`.journal`)
    ROOT/quarantine/…                                 its files it could not read, moved aside
    ROOT/.lock, ROOT/.readlock                        its locks

Beside them other parts of gpuwarden keep theirs (:data:`NEIGHBOURS`: the demo's marker, the
actuator's audit log, the demo's cluster snapshot, the dashboards' report bundles); the store never
touches them. Anything else in the folder is *foreign*: a CSV, a Parquet file of another name, a
folder, a device or a link to one, a day folder that names no day. A foreign entry is never read,
counted, moved or deleted, and never breaks a read: each is noted once per process in one warning
naming it, and ``gpuwarden store check`` lists them (the store stays healthy). A file with a part
file's name that cannot be read as samples (garbage, cut short, another schema) is the store's
own, damaged: it is moved to ``quarantine/`` with one warning, and reads go on without it.

A folder is a store when it holds any of the store's own entries or its neighbours'
(:func:`not_a_store` says why a path is none); nothing but the store writes inside one
(:func:`store_holding` finds the store a path would land in, so an ``--output`` there is refused).
"""

from __future__ import annotations

import logging
import os
import re
import stat
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

log = logging.getLogger("gpuwarden.store")

SAMPLES, OPS, QUARANTINE, LOCK, READ_LOCK = "samples", "ops", "quarantine", ".lock", ".readlock"
OWN_ENTRIES = (SAMPLES, OPS, QUARANTINE, LOCK, READ_LOCK)
DEMO_MARKER = ".gpuwarden-demo"
# Kept in a store's folder by other parts of gpuwarden; the store never reads or touches them.
NEIGHBOURS = (DEMO_MARKER, "actuator", "cluster", "reports")

DAY_FOLDER = re.compile(r"^date=(\d{4}-\d{2}-\d{2})$")
PART_FILE = re.compile(r"^part-.+\.parquet$")
TEMPORARY_PART = re.compile(r"^\.part-.+\.parquet\.tmp$")
JOURNAL = re.compile(r"^[0-9a-f]+\.json$")
TEMPORARY_JOURNAL = re.compile(r"^\.[0-9a-f]+\.json\.tmp$")


@dataclass
class Listing:
    """What a look at the store's folder found, each list sorted by path."""

    parts: list[Path] = field(default_factory=list)  # its part files: what reads read
    temporary: list[Path] = field(default_factory=list)  # an uncommitted operation's leftovers: never read
    journals: list[Path] = field(default_factory=list)  # committed operations not yet fully applied
    foreign: list[Path] = field(default_factory=list)  # what the store did not write: never read or touched

    def days(self) -> list[str]:
        """The days (YYYY-MM-DD) that have a part file."""
        return sorted({path.parent.name[5:] for path in self.parts})


def day_of(name: str) -> str | None:
    """The day a ``date=YYYY-MM-DD`` folder name names, or None (not a day the store names)."""
    match = DAY_FOLDER.match(name)
    if match is None:
        return None
    try:
        date.fromisoformat(match.group(1))
    except ValueError:
        return None
    return match.group(1)


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as entries:
            return sorted(entries, key=lambda entry: entry.name)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _is_regular(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file()  # links followed: a link to /dev/zero is no file
    except OSError:
        return False


def _is_folder(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def list_samples(samples_dir: Path, first_day: str | None = None, last_day: str | None = None) -> Listing:
    """The store's files under ``samples_dir`` in the days ``first_day..last_day`` (either open),
    and what is foreign there (at the top of ``samples/`` and in those days)."""
    listing = Listing()
    for entry in _entries(samples_dir):
        day = day_of(entry.name)
        if day is None or not _is_folder(entry):
            listing.foreign.append(samples_dir / entry.name)
            continue
        if (first_day is not None and day < first_day) or (last_day is not None and day > last_day):
            continue
        folder = samples_dir / entry.name
        for inner in _entries(folder):
            if PART_FILE.match(inner.name) and _is_regular(inner):
                listing.parts.append(folder / inner.name)
            elif TEMPORARY_PART.match(inner.name) and inner.is_file(follow_symlinks=False):
                listing.temporary.append(folder / inner.name)
            else:
                listing.foreign.append(folder / inner.name)
    return listing


def survey(root: Path) -> Listing:
    """The whole folder: every day's files, the journal, and what is foreign anywhere in it (the
    quarantine is the store's and not looked into)."""
    listing = list_samples(root / SAMPLES)
    for entry in _entries(root / OPS):
        if JOURNAL.match(entry.name) and entry.is_file(follow_symlinks=False):
            listing.journals.append(root / OPS / entry.name)
        elif TEMPORARY_JOURNAL.match(entry.name) and entry.is_file(follow_symlinks=False):
            listing.temporary.append(root / OPS / entry.name)
        else:
            listing.foreign.append(root / OPS / entry.name)
    listing.foreign += [root / entry.name for entry in _entries(root)
                        if entry.name not in OWN_ENTRIES and entry.name not in NEIGHBOURS]
    listing.foreign.sort()
    listing.temporary.sort()
    return listing


_noted: set[str] = set()  # foreign paths already noted by this process
_MAX_NOTED = 100_000


def note_foreign(root: Path, foreign: list[Path]) -> None:
    """One warning naming the foreign entries not noted before in this process (then never again)."""
    fresh = [path for path in foreign if str(path) not in _noted]
    if not fresh:
        return
    if len(_noted) > _MAX_NOTED:
        _noted.clear()
    _noted.update(str(path) for path in fresh)
    names = [os.path.relpath(path, root) for path in fresh]
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    log.warning("%s: %d file(s) or folder(s) the store did not write are ignored (never read, moved or deleted): "
                "%s; move them out of the store's folder", root, len(fresh), shown)


def _kind(path: Path) -> str:
    try:
        mode = path.stat().st_mode
    except OSError:
        return "a broken link"
    kind = ("a folder" if stat.S_ISDIR(mode) else "a file" if stat.S_ISREG(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a folder")
    return kind + (f" (a link to {os.path.realpath(path)})" if path.is_symlink() else "")


def holds_store_parts(folder: Path) -> bool:
    """Whether ``folder`` holds any entry of a store (its own or its neighbours')."""
    return any(os.path.lexists(folder / name) for name in (*OWN_ENTRIES, *NEIGHBOURS))


def not_a_store(root: Path) -> str | None:
    """Why ``root`` holds no store, for a command that only reads one (None when it is one): no
    such folder, not a folder, an empty folder, or a folder of other things."""
    root = Path(root)
    if not os.path.lexists(root):
        return "no store there (no such folder)"
    if not root.is_dir():
        return f"is {_kind(root)}; expected a store directory"
    names = [entry.name for entry in _entries(root)]
    if not names:
        return "an empty folder, not a store"
    if not holds_store_parts(root):
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        return f"is not a gpuwarden store (it holds {shown}, and no samples/)"
    return None


def is_store(folder: Path) -> bool:
    """Whether ``folder`` is a store the store wrote: its samples with a day folder, its lock beside
    its samples or its read lock, or the demo's marker (a folder of other things that happens to
    hold a ``samples/`` or an ``ops/`` is not)."""
    samples = folder / SAMPLES
    if (folder / DEMO_MARKER).is_file():
        return True
    if (folder / LOCK).is_file() and (samples.is_dir() or (folder / READ_LOCK).is_file()):
        return True
    return samples.is_dir() and any(day_of(entry.name) for entry in _entries(samples))


def store_holding(path: str | Path) -> Path | None:
    """The store whose folder ``path`` lies in (at any depth), or None. ``path`` need not exist."""
    target = Path(os.path.abspath(path))
    try:
        target = target.parent.resolve() / target.name  # the folder it lands in, links followed
    except OSError:
        pass
    for folder in target.parents:
        if is_store(folder):
            return folder
    return None
