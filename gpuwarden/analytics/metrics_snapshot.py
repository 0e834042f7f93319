"""One computed snapshot of what ``gpuwarden metrics serve`` publishes: plain numbers and labels,
built once per interval from a ledger, health findings, the actuator's audit log and the scheduling
queue, and then only read by :class:`~.metrics_collector.SnapshotCollector` on every scrape.

The rooms meet here without knowing each other: the CLI reads the audit log through the actuator
and the queue through the scheduling planner and hands over :class:`ActuatorFigures` and
:class:`QueueFigure` rows; this module turns a :class:`~.ledger.Ledger` and findings into rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpuwarden.fleet import Finding

from .ledger import Ledger
from .params import IDLE_STATES, AnalyticsError
from .report_sums import _labelled, fleet_totals

METRICS_CURRENCY = "USD"  # the cost metrics are named ..._usd; a book in another currency is refused


@dataclass(frozen=True)
class IdleFigure:
    """Idle GPU-hours and their cost over the window, for one reason, team and namespace."""

    reason: str
    team: str
    namespace: str
    gpu_hours: float
    cost_usd: float


@dataclass(frozen=True)
class FindingFigure:
    """One open health finding, as labels (the value served is 1)."""

    kind: str
    severity: str
    gpu: str
    node: str
    action: str
    confidence: float


@dataclass(frozen=True)
class ActuatorFigures:
    """The actuator's state as its audit log tells it."""

    breaker_open: bool
    pending_approvals: int
    oldest_pending_age_seconds: float  # 0 when nothing waits
    actions_by_outcome: Mapping[tuple[str, str], int]  # (outcome, action kind) -> entries in the log
    newest_entry_timestamp_seconds: float | None = None


@dataclass(frozen=True)
class QueueFigure:
    """Workloads waiting in the scheduling planner's queue, for one team."""

    team: str
    pending_workloads: int
    pending_gpus: float
    oldest_wait_seconds: float


@dataclass(frozen=True)
class FleetFigures:
    window_seconds: float
    gpus: int
    gpu_hours: float
    idle_gpu_hours: float
    cost_usd: float
    idle_cost_usd: float
    efficiency_ratio: float | None  # None: nothing allocated, so no ratio
    idle_ratio: float | None
    newest_sample_timestamp_seconds: float | None = None


@dataclass(frozen=True)
class MetricsSnapshot:
    computed_at_seconds: float
    compute_duration_seconds: float
    price_book: str  # which book priced the cost figures ("bundled" or a path)
    fleet: FleetFigures | None = None
    idle: tuple[IdleFigure, ...] = ()
    findings: tuple[FindingFigure, ...] = ()
    actuator: ActuatorFigures | None = None
    queue: tuple[QueueFigure, ...] | None = None  # None: no cluster snapshot was given
    cluster_snapshot_timestamp_seconds: float | None = None  # when the queue's cluster snapshot was taken
    errors: tuple[str, ...] = field(default=())  # parts that could not be computed this round
    # (version, sha256 of the book's content, the inventory's identity): which copy of the book
    pricing: tuple[str, str, str] | None = None


def _ratio(value: float) -> float | None:
    return None if value != value else float(value)  # NaN -> None


def fleet_figures(ledger: Ledger, newest_sample_timestamp_seconds: float | None = None) -> FleetFigures:
    if ledger.price_book.currency.upper() != METRICS_CURRENCY:
        raise AnalyticsError(f"price book currency {ledger.price_book.currency!r}: the cost metrics are in "
                             f"{METRICS_CURRENCY} (metric names end in _usd); use a price book in {METRICS_CURRENCY}")
    totals = fleet_totals(ledger)
    return FleetFigures(
        window_seconds=(ledger.end - ledger.start).total_seconds(), gpus=int(totals["gpus"]),
        gpu_hours=totals["gpu_hours"], idle_gpu_hours=totals["idle_gpu_hours"], cost_usd=totals["fleet_cost"],
        idle_cost_usd=totals["idle_cost"], efficiency_ratio=_ratio(totals["efficiency_score"]),
        idle_ratio=_ratio(totals["idle_share"]), newest_sample_timestamp_seconds=newest_sample_timestamp_seconds)


def idle_figures(ledger: Ledger) -> tuple[IdleFigure, ...]:
    """Idle GPU-hours and cost by reason, team and namespace (unallocated and unattributed time under
    the reports' own placeholder labels), largest first."""
    rows = _labelled(ledger.rows)
    rows = rows[rows["state"].astype(str).isin(IDLE_STATES)].copy()
    if rows.empty:
        return ()
    rows["reason"] = rows["state"].astype(str)
    sums = rows.groupby(["reason", "team", "namespace"], observed=True)[["gpu_hours", "cost"]].sum().reset_index()
    sums = sums[sums["gpu_hours"] > 0].sort_values(["gpu_hours", "reason", "team", "namespace"],
                                                   ascending=[False, True, True, True])
    return tuple(IdleFigure(str(r.reason), str(r.team), str(r.namespace), float(r.gpu_hours), float(r.cost))
                 for r in sums.itertuples(index=False))


def finding_figures(findings: Iterable[Finding]) -> tuple[FindingFigure, ...]:
    """The open (still active) findings, one row per kind, GPU and node; the most confident wins a tie."""
    seen: dict[tuple[str, str, str], FindingFigure] = {}
    for finding in findings:
        if not finding.active:
            continue
        action = finding.recommended_action.value if finding.recommended_action else "none"
        figure = FindingFigure(str(finding.kind), finding.severity.value, finding.gpu_uuid or "", finding.node, action,
                               float(finding.confidence))
        key = (figure.kind, figure.gpu, figure.node)
        if key not in seen or seen[key].confidence < figure.confidence:
            seen[key] = figure
    return tuple(sorted(seen.values(), key=lambda f: (f.severity, f.kind, f.node, f.gpu)))
