"""Failure domains: many nodes of one rack or NVLink domain failing together are one event.

A rack's power or a switch takes many nodes at once; judged GPU by GPU, each looks faulty and the
actuator would cordon them all. After the per-GPU rules ran, this pass groups the hardware findings
that such events raise (``DOMAIN_CAUSES``: GPUs falling off the bus or their series vanishing, NVLink
errors, thermal conditions) by failure domain (``domains``: node -> its rack or NVLink domain, from
the node labels; without it, the whole fleet is one domain, so a samples file with no topology still
groups), and chains them by start time (``domain_window_s``). A chain on at least
``domain_min_nodes`` nodes is one ``domain-event`` finding naming the domain, the likely cause (the
most common among its members: power, switch, cooling), the nodes and GPUs, and how many came back.

A member GPU that reports again ``domain_settle_s`` after the event with no fault since was never
faulty: its finding is folded into the event. A member that has not come back, or whose fault
outlasts the event, keeps its own finding (and its action), marked with the domain event: the
remediation's per-domain share (``SafetyLimits.max_unhealthy_ratio_per_domain``) paces those.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta

import pandas as pd

from gpuwarden.fleet import Finding, FindingKind, Severity

from .catalogue import recommended_action
from .scan_config import HealthConfig
from .storm_rules import chains

DOMAIN_CAUSES: dict[FindingKind, str] = {
    FindingKind.OFF_THE_BUS: "power", FindingKind.GPU_SERIES_LOST: "power",
    FindingKind.RECOVERY_NODE_REBOOT: "power", FindingKind.POWER_BRAKE_THROTTLE: "power",
    FindingKind.NVLINK_ERROR: "switch", FindingKind.NVLINK_DEGRADING: "switch",
    FindingKind.NODE_WIDE_THERMAL: "cooling", FindingKind.THERMAL_THROTTLE: "cooling",
    FindingKind.COOLING_DEGRADING: "cooling",
}
MAX_NAMED = 50  # evidence lists at most this many nodes (the count is always whole)
_ORDER = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}


def fold_domain_events(findings: list[Finding], last_sample: Mapping[tuple[str, str | None], datetime],
                       config: HealthConfig, domains: Mapping[str, str] | None = None,
                       onset_after: datetime | None = None) -> list[Finding]:
    """``findings`` with each domain event made one finding (see the module docstring).
    ``last_sample``: :func:`last_samples` of what was scanned. A finding that starts at or before
    ``onset_after`` (the first sample scanned) was already there: its onset is unknown, so it joins
    no event."""
    candidates = [f for f in findings if f.kind in DOMAIN_CAUSES and (onset_after is None or f.first_seen > onset_after)]
    if len({f.node for f in candidates}) < config.domain_min_nodes:
        return findings
    by_domain: dict[str | None, list[Finding]] = defaultdict(list)
    for f in candidates:
        by_domain[domains.get(f.node) if domains else None].append(f)
    folded: set[int] = set()
    marked: dict[int, Finding] = {}
    events: list[Finding] = []
    for domain, members in by_domain.items():
        for chain in chains(members, config.domain_window_s):
            if len({f.node for f in chain}) < config.domain_min_nodes:
                continue
            end = max(f.first_seen for f in chain)
            back = {id(f) for f in chain if _came_back(f, end, last_sample, config.domain_settle_s)}
            folded |= back
            event = _event(domain, chain, back, end, domains is not None)
            events.append(event)
            for f in chain:
                if id(f) not in folded:
                    marked[id(f)] = replace(f, evidence={**f.evidence, "domain_event": event.evidence["domain"],
                                                         "domain_event_first_seen": event.first_seen.isoformat()})
    if not events:
        return findings
    return [marked.get(id(f), f) for f in findings if id(f) not in folded] + events


def last_samples(frame: pd.DataFrame, into: dict[tuple[str, str | None], datetime] | None = None,
                 ) -> dict[tuple[str, str | None], datetime]:
    """The newest sample of each GPU, and of each node (key ``(node, None)``), added to ``into``."""
    out: dict[tuple[str, str | None], datetime] = {} if into is None else into
    if not len(frame):
        return out
    stamps = pd.to_datetime(frame["timestamp"], utc=True)
    per_gpu = stamps.groupby([frame["node"].astype(str), frame["gpu_uuid"].astype(str)]).max()
    for (node, gpu), at in per_gpu.items():
        stamp = pd.Timestamp(at).to_pydatetime()
        for key in ((str(node), str(gpu)), (str(node), None)):
            out[key] = max(out.get(key, stamp), stamp)
    return out


def _came_back(f: Finding, event_end: datetime, last_sample: Mapping[tuple[str, str | None], datetime],
               settle_s: float) -> bool:
    """It reports again ``settle_s`` after the event, and its fault was last seen by the event's end
    (plus the settle time: a sample or two of the same episode)."""
    seen = last_sample.get((f.node, f.gpu_uuid))
    settle = timedelta(seconds=settle_s)
    return seen is not None and seen >= max(event_end, f.last_seen) + settle and f.last_seen <= event_end + settle


def _event(domain: str | None, chain: list[Finding], back: set[int], end: datetime, known: bool) -> Finding:
    nodes = sorted({f.node for f in chain})
    causes = Counter(DOMAIN_CAUSES[f.kind] for f in chain)
    first = min(chain, key=lambda f: (f.first_seen, f.node))
    still = sorted({f.node for f in chain if id(f) not in back})
    return Finding(
        kind=FindingKind.DOMAIN_EVENT, severity=min((f.severity for f in chain), key=_ORDER.__getitem__),
        node=first.node, gpu_uuid=None,
        evidence={
            "domain": domain if known else "(no topology: the fleet)", "cause": causes.most_common(1)[0][0],
            "kinds": sorted({str(f.kind) for f in chain}), "node_count": len(nodes), "nodes": nodes[:MAX_NAMED],
            "gpu_count": len({(f.node, f.gpu_uuid) for f in chain if f.gpu_uuid}),
            "came_back_healthy": len(back), "nodes_still_faulty": still[:MAX_NAMED],
            "window_seconds": round((end - first.first_seen).total_seconds(), 1),
            "note": "many nodes of one domain failed within minutes: inspect its power, switch or cooling; GPUs "
                    "that came back healthy were never faulty",
        },
        recommended_action=recommended_action(FindingKind.DOMAIN_EVENT), confidence=max(f.confidence for f in chain),
        first_seen=first.first_seen, last_seen=max(f.last_seen for f in chain),
        active=any(f.active for f in chain), model=first.model, pool=first.pool,
    )
