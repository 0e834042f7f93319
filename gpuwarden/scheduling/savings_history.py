"""GPU-hours saved on your own history: the savings search (:mod:`.savings`) over the workloads of a
window of fleet samples, rebuilt as the what-if rebuilds them (:mod:`.whatif_history`).

The Fleet page of the dashboard shows its headline (:func:`savings_bundle`, computed in the
background like the page's other slow tiles) and ``gpuwarden simulate savings --since 7d`` prints
the whole report. How a rebuilt workload becomes a job of the search:

- submitted at its first sample (the samples hold no submission time), running as long as it ran
  (pauses left out), as checkpointable training (the what-if's assumption);
- whole GPUs on 8-GPU nodes, as the search's fleet has: a workload of ``k`` GPUs is one pod of
  ``k`` (more than 8: a gang of 8-GPU pods); a MIG slice or a time-sliced share is rounded up to
  whole GPUs (``ceil`` of its GPU equivalents) and counted in a note;
- each team's share of the guarantees is its share of the window's GPU-hours (the what-if's rule);
- the window starts at its first sample (a store younger than the window does not count empty
  hours as provisioned), and its samples must cover at least :data:`MIN_HISTORY_SECONDS`.

The search starts from the fleet's own size (the GPUs seen in the window), where the answer
usually is, so it takes few replays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from .engine import POLICIES
from .savings import SavingsReport, find_savings
from .savings_jobs import GPUS_PER_NODE, Workload, _workload
from .whatif_history import DEFAULT_MAX_GAP_SECONDS, NEEDED_COLUMNS, History, rebuild

if TYPE_CHECKING:
    from gpuwarden.analytics.report_bundle import Bundle
    from gpuwarden.analytics.windows import Window

HISTORY_TRACE = "history"
MIN_HISTORY_SECONDS = 3600.0  # a shorter window says too little about what a fleet must hold
DEFAULT_SLO_SECONDS = 3600.0  # as `gpuwarden simulate savings --slo-wait 1h`
BASELINES = ("kube-default", "kueue")  # the headline's baseline: the first the engine has
DASHBOARD_POLICIES = tuple(p for p in ("kube-default", "kueue", "gpuwarden") if p in POLICIES)
BUNDLE_KIND = "savings"


def history_workload(history: History) -> tuple[Workload, list[str]]:
    """The search's :class:`.savings_jobs.Workload` of ``history`` (rules in the module doc), and notes."""
    workloads = history.workloads
    if not workloads:
        raise ValueError("no workload in the history")
    rounded = sum(1 for w in workloads if w.mig_profile or w.gpu_fraction < 1.0)
    frame = pd.DataFrame({
        "submitted": [history.start + pd.Timedelta(seconds=w.submitted_seconds) for w in workloads],
        "duration_seconds": [w.duration_seconds for w in workloads],
        "gpus": [max(1, math.ceil(w.gpu_equivalents - 1e-9)) for w in workloads],
        "team": [w.team for w in workloads],
        "checkpointable": True,
    })
    used: dict[str, float] = {}
    for w in workloads:
        used[w.team] = used.get(w.team, 0.0) + w.duration_seconds * w.gpu_equivalents
    total = sum(used.values())
    shares = {team: (amount / total if total > 0 else 1.0 / len(used)) for team, amount in sorted(used.items())}
    start = history.start.tz_convert("UTC").tz_localize(None).isoformat()  # _workload reads it as UTC
    workload = _workload(HISTORY_TRACE, frame, start, history.window_seconds / 86400.0, shares, None)
    notes = [f"{rounded} MIG or time-sliced workload(s) counted as whole GPUs (the search places whole GPUs)"
             ] if rounded else []
    return workload, notes


@dataclass(frozen=True)
class HistorySavings:
    """The savings search over one window of history, or why it cannot say."""

    start: pd.Timestamp
    end: pd.Timestamp
    fleet_gpus: int  # GPUs seen in the window
    report: SavingsReport | None
    why: str = ""  # why there is no figure ("" when there is one)
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def baseline(self) -> str | None:
        """The policy gpuwarden is compared with: kube-default when run, else kueue."""
        if self.report is None:
            return None
        return next((b for b in BASELINES if b in self.report.outcomes), None)

    def figure(self) -> dict[str, Any]:
        """JSON-ready: the headline, each policy's nodes and GPU-hours provisioned, or why not."""
        base = {"start": self.start.isoformat(), "end": self.end.isoformat(), "fleet_gpus": self.fleet_gpus,
                "notes": list(self.notes)}
        report, baseline = self.report, self.baseline
        why = self.why
        if not why and (report is None or baseline is None or "gpuwarden" not in report.outcomes):
            why = "gpuwarden and kube-default (or kueue) must both be searched"
        if not why and report is not None and baseline is not None:
            why = "; ".join(f"{p} served it on no fleet up to {report.outcomes[p].nodes} nodes ({report.outcomes[p].why})"
                            for p in ("gpuwarden", baseline) if not report.outcomes[p].served)
        if why or report is None or baseline is None:
            return {**base, "ok": False, "why": why, "headline": f"No savings figure for this window: {why}."}
        ours, theirs = report.policy_figures("gpuwarden"), report.policy_figures(baseline)
        saved = report.saved_pct(baseline)
        pct = 0.0 if saved is None else saved
        return {
            **base, "ok": True, "why": "", "baseline": baseline, "nodes": ours["nodes"], "baseline_nodes": theirs["nodes"],
            "gpu_hours": ours["gpu_hours_provisioned"], "baseline_gpu_hours": theirs["gpu_hours_provisioned"],
            "saved_pct": pct, "jobs": len(report.workload.jobs), "replays": sum(report.replays.values()),
            "slo_wait_seconds": report.slo_seconds,
            "policies": {p: report.policy_figures(p)["nodes"] for p in report.outcomes},
            "headline": (f"gpuwarden would have served this window's work on {ours['nodes']} nodes against {baseline}'s "
                         f"{theirs['nodes']}: {abs(pct):.0f}% {'fewer' if pct >= 0 else 'more'} GPU-hours"),
        }


def history_savings(source: Any, start: pd.Timestamp, end: pd.Timestamp,
                    policies: tuple[str, ...] = DASHBOARD_POLICIES, slo_seconds: float = DEFAULT_SLO_SECONDS,
                    start_gpus: int | None = None, max_gap_seconds: float = DEFAULT_MAX_GAP_SECONDS) -> HistorySavings:
    """Read ``[start, end)`` from a samples source (or take a frame), rebuild it and search each of
    ``policies``' smallest serving fleet, from ``start_gpus`` (default: the fleet's own GPUs)."""
    start, end = pd.Timestamp(start), pd.Timestamp(end)
    frame = source if isinstance(source, pd.DataFrame) else source.read(start, end, list(NEEDED_COLUMNS))
    frame = frame[(frame["timestamp"] >= start) & (frame["timestamp"] < end)]
    if frame.empty:
        return HistorySavings(start, end, 0, None, "no samples in the window")
    first = max(start, pd.Timestamp(frame["timestamp"].min()).floor("s"))  # a younger store: from its first sample
    history = rebuild(frame, first, end, max_gap_seconds)
    covered = (frame["timestamp"].max() - first).total_seconds() + history.step_seconds
    del frame
    if covered < MIN_HISTORY_SECONDS:
        return HistorySavings(first, end, history.gpus, None,
                              f"too little history: the samples cover {covered / 60:.0f} min, the figure "
                              f"needs at least {MIN_HISTORY_SECONDS / 60:.0f} min", history.notes)
    if not history.workloads:
        return HistorySavings(first, end, history.gpus, None,
                              "no pod held a GPU in this window, so there is no work to size a fleet for", history.notes)
    workload, notes = history_workload(history)
    start_from = start_gpus if start_gpus is not None else max(history.gpus, GPUS_PER_NODE)
    report = find_savings(workload, policies, start_from, slo_seconds)
    return HistorySavings(first, end, history.gpus, report, "", (*history.notes, *notes))


def savings_bundle(source: Any, window: Window, version: float) -> Bundle:
    """The dashboard's bundle of ``window`` (kind :data:`BUNDLE_KIND`): ``figure`` is
    :meth:`HistorySavings.figure` of the dashboard's policies."""
    from gpuwarden.analytics.report_bundle import Bundle

    found = history_savings(source, window.start, window.end)
    return Bundle({"figure": found.figure()}, window.start, window.end, version)
