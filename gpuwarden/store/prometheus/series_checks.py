"""Bad input from an exporter's series, met one series at a time: kept or skipped with a note that
names the series, never an exception and never a whole read lost.

=========================  =========================================================================
series                     handling
=========================  =========================================================================
no ``UUID`` label          skipped: a GPU without its identity cannot be followed over time
no ``Hostname``/``node``   skipped: the GPU belongs to no node
``gpu`` not a number       skipped: the index is part of the GPU's identity
unknown ``modelName``      kept: prices and peer groups fall back to the model's name as written
counter going backwards    kept: the drop is read as a reset (driver reload, GPU reset), never as
                           negative events (analytics' reset-safe increments)
=========================  =========================================================================
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from gpuwarden.fleet.gpu_catalogue import gpu_catalogue

# A long read of a broken fleet must not drown the report in notes.
MAX_NOTES = 40


class ReadNotes:
    """Notes of a source's reads: ordered, each said once, at most ``MAX_NOTES`` (then a count)."""

    def __init__(self) -> None:
        self._notes: dict[str, None] = {}
        self.dropped = 0
        self.skipped_series = 0  # series read and skipped: they named no GPU
        self.skipped_points = 0

    def add(self, text: str) -> None:
        if text in self._notes:
            return
        if len(self._notes) >= MAX_NOTES:
            self.dropped += 1
            return
        self._notes[text] = None

    def skip(self, points: int) -> None:
        self.skipped_series += 1
        self.skipped_points += points

    def lines(self) -> list[str]:
        """The count of series skipped (first: it says how much of the read was lost), then each note."""
        skipped = ([f"{self.skipped_series:,} series ({self.skipped_points:,} samples) without a GPU identity (a UUID, "
                    "a Hostname or node, a numeric gpu label) were skipped: they are in no figure of this report"]
                   if self.skipped_series else [])
        more = [f"... and {self.dropped} more note(s) like these"] if self.dropped else []
        return [*skipped, *self._notes, *more]


def series_name(metric: str, labels: Mapping[str, str]) -> str:
    """``metric{Hostname="...",UUID="...",gpu="..."}``: how a note names one series (``metric``
    empty: every series of that device)."""
    keys = ("node", "Hostname", "UUID", "gpu", "GPU_I_ID", "pod")
    shown = ",".join(f'{k}="{labels[k]}"' for k in keys if labels.get(k))
    return f"{metric or 'the series'}{{{shown}}}"


def unusable_identity(labels: Mapping[str, str]) -> str | None:
    """Why a series names no GPU (a note's reason), or None when it does."""
    if not labels.get("UUID"):
        return "no UUID label: skipped"
    if not (labels.get("node") or labels.get("Hostname")):
        return "no Hostname or node label: skipped"
    gpu = labels.get("gpu", "")
    try:
        int(gpu)
    except ValueError:
        return f"gpu label {gpu!r} is not a number: skipped"
    return None


def check_series(metric: str, labels: Mapping[str, str], values: np.ndarray, counter: bool, notes: ReadNotes) -> bool:
    """Whether to keep one series; what is wrong with it goes to ``notes``."""
    reason = unusable_identity(labels)
    if reason is not None:  # one note per device, not per metric: the label is wrong on all of them
        notes.add(f"{series_name('', labels)}: {reason}")
        notes.skip(int(values.size))
        return False
    model = labels.get("modelName", "")
    if gpu_catalogue().resolve(model) is None:
        notes.add(f"GPU {labels['UUID']} on {labels.get('node') or labels['Hostname']}: model {model!r} is not in the GPU "
                  "catalogue (gpuwarden/fleet/gpu_models.csv): kept; its price and MIG profiles are unknown")
    if counter and values.size > 1:
        finite = values[np.isfinite(values)]
        drops = int((np.diff(finite) < 0).sum())
        if drops:
            notes.add(f"{series_name(metric, labels)}: the counter went backwards {drops} time(s): read as a reset "
                      "(driver reload or GPU reset), not as events")
    return True
