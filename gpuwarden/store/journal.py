"""Crash safety of the embedded store, at the level of a whole operation (a load, a compaction):
the writer lock, the operation journal, and recovery after a crash (see :mod:`.local`).

An operation first writes its new files under dot-names (never read), then commits a journal
``ops/<op-id>.json`` (written under a temporary name and renamed: whole or absent) listing the
renames and deletions, then applies it and deletes the journal. The next writer (or a reader that
finds the lock free) replays every journal (roll forward) and deletes stale temporary files that
no journal names (roll back). Only files of the store's own naming are replayed or deleted
(:mod:`.folder`): a foreign file in ``ops/`` or a day folder is never touched. A commit that fails
before its journal is in place (a full disk) removes its partial journal and staged files.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import signal
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from .folder import JOURNAL, TEMPORARY_JOURNAL, TEMPORARY_PART, day_of

log = logging.getLogger("gpuwarden.store")

# Test seams: ``GPUWARDEN_STORE_CRASH_AT=<step>`` makes this process SIGKILL itself at that step of
# an operation, so tests can kill -9 a real writer at an exact point (see tests/store/test_store_crash.py);
# ``GPUWARDEN_STORE_STOP_AT=<step>`` SIGSTOPs it there (a writer caught mid-swap, for read races).
_CRASH_ENV = "GPUWARDEN_STORE_CRASH_AT"
_STOP_ENV = "GPUWARDEN_STORE_STOP_AT"


def crash_point(step: str) -> None:
    if os.environ.get(_CRASH_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(_STOP_ENV) == step:
        os.kill(os.getpid(), signal.SIGSTOP)


class Journal:
    """The writer lock and operation journal of the store under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.samples_dir = root / "samples"
        self.ops_dir = root / "ops"
        self.lock_path = root / ".lock"
        self.read_lock_path = root / ".readlock"

    @contextmanager
    def locked(self, blocking: bool = True) -> Iterator[bool]:
        """Hold the store's writer lock (yields False when ``blocking`` is off and it is taken)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except OSError as error:
                if error.errno in (errno.EAGAIN, errno.EACCES):
                    yield False
                    return
                raise
            try:
                self.recover()
                yield True
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Hold the read lock shared while listing and reading files: an operation's swap (its
        renames and deletions, :meth:`apply`) holds it exclusively, so a read sees the store
        before or after an operation, never a compaction's new file beside the files it replaces
        (rows counted twice). Readers never wait for a whole load or compaction, only a swap."""
        try:  # opened, never made: a read creates nothing (no swap ever ran where there is none)
            handle = open(self.read_lock_path)  # noqa: SIM115 - closed below
        except OSError:  # none yet, not a store, or a read-only one: nobody can be swapping files in it
            yield
            return
        with handle:
            fcntl.flock(handle, fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    @contextmanager
    def _swapping(self) -> Iterator[None]:
        with open(self.read_lock_path, "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def recover(self) -> tuple[int, int]:
        """Under the lock: replay committed journals, then delete leftover temporary files.
        Returns (journals replayed, temporary files removed)."""
        replayed = removed = 0
        if self.ops_dir.exists():
            for journal in self.journals():
                try:
                    operation = json.loads(journal.read_text())
                except (OSError, ValueError):
                    journal.unlink(missing_ok=True)  # cannot happen (renamed in whole), but never block
                    continue
                self.apply(operation)
                journal.unlink(missing_ok=True)
                replayed += 1
            for partial in self.ops_dir.glob(".*.json.tmp"):
                if TEMPORARY_JOURNAL.match(partial.name):
                    partial.unlink(missing_ok=True)
        if self.samples_dir.exists():
            for stale in self.samples_dir.glob("date=*/.part-*.parquet.tmp"):
                if day_of(stale.parent.name) and TEMPORARY_PART.match(stale.name) and not stale.is_symlink():
                    stale.unlink(missing_ok=True)
                    removed += 1
        if replayed or removed:
            log.warning("%s: recovered from an interrupted write (%d operation(s) completed, %d temporary file(s) removed)",
                        self.root, replayed, removed)
        return replayed, removed

    def journals(self) -> list[Path]:
        """The committed operations not yet fully applied (journals of the store's naming)."""
        if not self.ops_dir.is_dir():
            return []
        return sorted(path for path in self.ops_dir.glob("*.json") if JOURNAL.match(path.name))

    def recover_if_needed(self) -> None:
        """Readers finish an interrupted operation when no writer holds the lock."""
        if self.journals():
            with self.locked(blocking=False):
                pass

    def apply(self, operation: dict) -> None:
        """The operation's renames and deletions, as one step for readers (:meth:`reading`)."""
        with self._swapping():
            for temporary, final in operation.get("add", []):
                source, target = self.root / temporary, self.root / final
                if source.exists():
                    os.replace(source, target)
                    crash_point(f"{operation['kind']}-renamed")
            for old in operation.get("remove", []):
                (self.root / old).unlink(missing_ok=True)

    def commit(self, kind: str, op_id: str, add: list[tuple[Path, Path]], remove: Sequence[Path] = ()) -> None:
        """Journal, then apply, one operation (see the module doc)."""
        operation = {
            "op": op_id, "kind": kind, "at": pd.Timestamp.now(tz="UTC").isoformat(),
            "add": [[str(t.relative_to(self.root)), str(f.relative_to(self.root))] for t, f in add],
            "remove": [str(p.relative_to(self.root)) for p in remove],
        }
        partial = self.ops_dir / f".{op_id}.json.tmp"
        journal = self.ops_dir / f"{op_id}.json"
        try:
            self.ops_dir.mkdir(parents=True, exist_ok=True)
            with open(partial, "w") as handle:
                json.dump(operation, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(partial, journal)
        except BaseException:  # not committed (a full disk): nothing of it stays behind
            partial.unlink(missing_ok=True)
            for temporary, _ in add:
                temporary.unlink(missing_ok=True)
            raise
        crash_point(f"{kind}-journaled")
        self.apply(operation)
        crash_point(f"{kind}-applied")
        journal.unlink()
