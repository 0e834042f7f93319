"""What every report and scan says about its source: the rows it rejected (by reason), the
pod-attribution rule it used (with the ``--pod-attribution`` override) and what its reads met (series skipped or kept, XID events read
from dcgm-exporter's last-XID gauge). Sources without such notes say nothing here."""

from __future__ import annotations

import argparse

POD_ATTRIBUTION_RULES = ("auto", "on", "off")  # gpuwarden.store.prometheus.attribution.RULES (a test keeps them equal)


def add_attribution_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pod-attribution", choices=POD_ATTRIBUTION_RULES, default="auto",
        help="Prometheus source: is a GPU without a pod label unallocated? auto (default): yes where the same "
             "exporter labels any GPU with a pod (its pod mapping is on), else its owner is unknown; on: always; "
             "off: never (owner unknown) unless the exporter serves gpuwarden_pod_attribution_state")


def apply_attribution(source: object, rule: str) -> None:
    """Give the source the rule; a source that reads its attribution from the samples ignores it."""
    if hasattr(source, "pod_attribution"):
        source.pod_attribution = rule  # type: ignore[attr-defined]


def rejected_rows_note(source: object) -> list[str]:
    """``N of M row(s) rejected - why`` for a source whose reads rejected rows (a file, Prometheus,
    dcgm-exporter through it), and the columns a file carried that are not samples columns: never
    dropped without a word."""
    report = getattr(source, "validation", None)
    return report.notes() if report is not None else []


def source_notes(source: object, rule: str = "auto", reads_attribution: bool = True) -> list[str]:
    """The rows the source rejected and its own notes; for a source without a rule (the local
    store, a file), which one its samples carry, and that an override has no effect there."""
    rejected = rejected_rows_note(source)
    if hasattr(source, "pod_attribution"):
        return [*rejected, *(getattr(source, "notes", []) or [])]
    if not reads_attribution:
        return rejected
    ignored = f" (--pod-attribution {rule} applies to the Prometheus source only)" if rule != "auto" else ""
    return [*rejected, "pod attribution: as recorded in the samples' attribution column; a row without a pod label and "
            f"without 'known' there is unattributed (owner unknown){ignored}"]
