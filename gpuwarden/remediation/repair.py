"""After a repair outside gpuwarden (GPU reset, reboot, RMA): lift what gpuwarden set, once healthy.

Opt-in (``healthy_for_seconds``). A node that gpuwarden cordoned (cordon or drain) or tainted, by
the audit log, and that has since been Ready with no open health finding for
``healthy_for_seconds``, is uncordoned and its gpuwarden taints removed. The node handlers lift only
what the node's owner annotations say gpuwarden set (:mod:`.kube.ownership`): a cordon someone
else set is refused there, recorded once, and never asked again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from gpuwarden.fleet import Action, ActionKind, ClusterSnapshot, Finding

from .audit import Outcome
from .pacing import ready

_SETS = {ActionKind.CORDON.value: "cordon", ActionKind.DRAIN.value: "cordon"}
_LIFTS = {ActionKind.UNCORDON.value: "cordon"}


def held_by_gpuwarden(records: Iterable[Mapping[str, Any]]) -> dict[str, set[str]]:
    """node -> what gpuwarden's applied actions still hold on it: ``cordon`` and taint strings."""
    held: dict[str, set[str]] = {}
    for record in records:
        outcome, kind, node = record.get("outcome"), record.get("kind"), str(record.get("target", ""))
        params = record.get("params") or {}
        taint = str(params.get("taint") or "")
        if outcome == Outcome.APPLIED.value and kind in _SETS:
            held.setdefault(node, set()).add("cordon")
        elif outcome == Outcome.APPLIED.value and kind == ActionKind.TAINT.value and taint:
            held.setdefault(node, set()).add(taint)
        elif outcome in (Outcome.APPLIED.value, Outcome.UNDONE.value, Outcome.REFUSED.value):
            # lifted, or refused (someone else's): either way not ours to lift again
            if kind in _LIFTS:
                held.get(node, set()).discard("cordon")
            elif kind == ActionKind.UNTAINT.value:
                held.get(node, set()).difference_update({taint} if taint else set(held.get(node, set())) - {"cordon"})
    return {node: what for node, what in held.items() if what}


class Repair:
    """Which of gpuwarden's cordons and taints to lift this round."""

    def __init__(self, healthy_for_seconds: float) -> None:
        if healthy_for_seconds < 0:
            raise ValueError(f"healthy_for_seconds: {healthy_for_seconds} must be >= 0")
        self.healthy_for = timedelta(seconds=healthy_for_seconds)
        self.quiet_since: dict[str, datetime] = {}  # memory only: a restart starts the healthy time again

    def actions(self, records: Iterable[Mapping[str, Any]], snapshot: ClusterSnapshot,
                open_by_node: Mapping[str, Sequence[Finding]], now: datetime) -> list[Action]:
        out = []
        held = held_by_gpuwarden(records)
        for node in sorted(held):
            standing = {"cordon"} & held[node] if node in snapshot.cordoned else set()
            standing |= {t for t in held[node] - {"cordon"} if t in snapshot.taints.get(node, ())}
            if not standing or not ready(snapshot, node) or open_by_node.get(node):
                self.quiet_since.pop(node, None)
                continue
            since = self.quiet_since.setdefault(node, now)
            if now - since < self.healthy_for:
                continue
            why = f"repaired: GPUs healthy and node Ready for {(now - since).total_seconds():.0f} s"
            if "cordon" in standing:
                out.append(Action(ActionKind.UNCORDON, node, why))
            out += [Action(ActionKind.UNTAINT, node, why, {"taint": t}) for t in sorted(standing - {"cordon"})]
        return out
