"""A pod's required node selection as kube-scheduler reads it: ``spec.nodeSelector`` AND one of the
``requiredDuringSchedulingIgnoredDuringExecution`` node-affinity terms (terms ORed, each term's
``matchExpressions`` ANDed), matched against a node's labels.

The planner keeps a workload off nodes it does not select (as it does for taints it does not
tolerate): a plan that put a pod where its own selector forbids would never bind. ``matchFields``
are not read (gpuwarden's admission writes ``metadata.name`` there itself to pin a pod), nor
preferred affinity (it only steers kube-scheduler).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


@dataclass(frozen=True)
class LabelRequirement:
    """One ``matchExpressions`` entry (a ``nodeSelector`` pair is ``key In [value]``)."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.operator not in OPERATORS:
            raise ValueError(f"node affinity operator {self.operator!r} is not one of: {', '.join(OPERATORS)}")

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.operator == "In":
            return value is not None and value in self.values
        if self.operator == "NotIn":
            return value is None or value not in self.values  # as kube-scheduler: a missing label is not in
        if self.operator == "Exists":
            return value is not None
        if self.operator == "DoesNotExist":
            return value is None
        try:  # Gt / Lt compare integers; a value that is not one selects nothing
            have, bound = int(value or ""), int(self.values[0])
        except (ValueError, IndexError):
            return False
        return have > bound if self.operator == "Gt" else have < bound


NodeSelection = tuple[tuple[LabelRequirement, ...], ...]  # terms ORed, requirements ANDed; (): any node


def selects(selection: NodeSelection, labels: Mapping[str, str]) -> bool:
    """Whether a node with ``labels`` satisfies ``selection``."""
    return not selection or any(all(r.matches(labels) for r in term) for term in selection)


def selection_of(node_selector: Mapping[str, str], affinity_terms: list[list[LabelRequirement]]) -> NodeSelection:
    """``nodeSelector`` ANDed into every required affinity term (or alone, with no terms)."""
    pairs = tuple(LabelRequirement(str(k), "In", (str(v),)) for k, v in sorted(node_selector.items()))
    if not affinity_terms:
        return (pairs,) if pairs else ()
    return tuple(pairs + tuple(term) for term in affinity_terms)
