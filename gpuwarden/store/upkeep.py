"""The embedded store's upkeep: check, quarantine, repair and clear (a mixin of
:class:`.local.LocalStore`, which gives the folder, the journal, the listing and the reads).

``check`` reads and changes nothing. A part file that cannot be read is moved to
``ROOT/quarantine/`` with one warning naming it; a foreign file (:mod:`.folder`) is never touched.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from .folder import survey
from .parquet_layout import CORRUPT_ERRORS, KEY_SCHEMA, unique_rows, unreadable_files
from .schema import KEY_COLUMNS

if TYPE_CHECKING:
    from .folder import Listing
    from .journal import Journal

log = logging.getLogger("gpuwarden.store")


@dataclass
class CheckResult:
    """What ``check`` found; ``ok`` when nothing needs repair."""

    files: int = 0
    rows: int = 0
    corrupt: list[Path] = field(default_factory=list)
    stale_tmp: list[Path] = field(default_factory=list)
    pending_ops: list[Path] = field(default_factory=list)
    duplicate_rows: int = 0
    quarantined: list[Path] = field(default_factory=list)
    foreign: list[Path] = field(default_factory=list)  # not written by the store: ignored, never touched

    @property
    def ok(self) -> bool:
        """Nothing to repair. Leftovers of an uncommitted write (a full disk, a kill) are never read
        and the next write deletes them, and foreign files are ignored: neither makes it unhealthy."""
        return not (self.corrupt or self.pending_ops or self.duplicate_rows)


class StoreUpkeep:
    """Check, quarantine, repair and clear, over what :class:`.local.LocalStore` provides."""

    root: Path
    journal: Journal
    quarantine_dir: Path
    quarantined: list[Path]

    def _listing(self, first_day: str | None = None, last_day: str | None = None) -> Listing:
        raise NotImplementedError

    def row_count(self) -> int:
        raise NotImplementedError

    def compact(self, min_files: int = 8, dedupe_only: bool = False) -> int:
        raise NotImplementedError

    def clear(self) -> None:
        """Delete every sample: the store's own files, never a foreign one (then empty day folders)."""
        with self.journal.locked():
            listing = self._listing()
            for path in listing.parts + listing.temporary:
                path.unlink(missing_ok=True)
            for folder in {path.parent for path in listing.parts + listing.temporary}:
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only when empty

    # -- damage: check, quarantine, repair --------------------------------------------------------
    def _quarantine(self, path: Path, error: BaseException | str) -> None:
        """Move an unreadable file aside (one warning naming it) so that reads go on."""
        target = self.quarantine_dir / path.parent.name / path.name
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
        except FileNotFoundError:
            return
        self.quarantined.append(target)
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        log.warning("%s: unreadable Parquet file (%s); moved to %s, reads go on without it", path, reason[:200], target)

    def quarantine_corrupt(self) -> list[Path]:
        """Find unreadable files and move them aside. Returns where they went."""
        before = len(self.quarantined)
        with self.journal.locked():
            for path, error in unreadable_files(self._listing().parts):
                self._quarantine(path, error)
        return self.quarantined[before:]

    def _set_aside(self, damaged: list[tuple[Path, str]]) -> None:
        """Quarantine part files a read found damaged (it skipped them), unless a writer holds the
        lock or the store cannot be written: then they stay, and reads go on skipping them."""
        try:
            with self.journal.locked(blocking=False) as held:
                if held:
                    for path, problem in damaged:
                        self._quarantine(path, problem)
        except OSError as error:
            log.debug("%s: cannot quarantine (%s); reads skip the damaged file(s)", self.root, error)

    def check(self) -> CheckResult:
        """Read-only health check: unreadable files, leftovers of an interrupted write, duplicates."""
        with self.journal.reading():  # a compaction's swap is never half seen: its new file beside the old
            return self._check()

    def _check(self) -> CheckResult:
        result = CheckResult()
        found = survey(self.root)
        result.pending_ops, result.stale_tmp, result.foreign = found.journals, found.temporary, found.foreign
        if self.quarantine_dir.exists():
            result.quarantined = sorted(p for p in self.quarantine_dir.rglob("*") if p.is_file())
        bad = unreadable_files(found.parts)
        result.corrupt = [path for path, _ in bad]
        days: dict[str, list[Path]] = {}
        for path in found.parts:
            days.setdefault(path.parent.name[5:], []).append(path)
        for day_files in days.values():
            files = [f for f in day_files if f not in result.corrupt]
            tables = []
            for path in files:
                try:
                    tables.append(pq.read_table(path, columns=list(KEY_COLUMNS), schema=KEY_SCHEMA))
                except FileNotFoundError:
                    continue
                except CORRUPT_ERRORS:
                    result.corrupt.append(path)
            result.files += len(tables)
            if not tables:
                continue
            table = pa.concat_tables(tables)
            result.rows += table.num_rows
            result.duplicate_rows += table.num_rows - unique_rows(table).num_rows
        return result

    def repair(self) -> dict[str, int]:
        """Finish or undo interrupted operations, quarantine unreadable files, drop duplicates."""
        with self.journal.locked(blocking=True):
            pass  # taking the lock replays journals and removes stale temporary files
        quarantined = self.quarantine_corrupt()
        before = self.row_count()
        days = self.compact(min_files=1, dedupe_only=True)
        return {"quarantined": len(quarantined), "days_deduplicated": days, "duplicates_removed": before - self.row_count()}
