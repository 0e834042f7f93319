"""Node labels from kube-state-metrics' ``kube_node_labels`` (one series per node, each node label
as ``label_<name>``), read from the series index: no samples. kube-state-metrics exports only the
labels its ``--metric-labels-allowlist`` names (``nodes=[karpenter.sh/capacity-type,...]``); where it
exports none, or is not scraped, nodes have no labels here and their price tier comes from the
inventory."""

from __future__ import annotations

from typing import Protocol

NODE_LABELS_METRIC = "kube_node_labels"


class SeriesIndex(Protocol):
    def series(self, match: str, start: float, end: float) -> list[dict[str, str]]: ...


def read_node_labels(client: SeriesIndex, start: float, end: float) -> dict[str, dict[str, str]]:
    """node -> its ``label_*`` labels over [start, end] (a node relabelled in the window: the union,
    the last series read winning)."""
    out: dict[str, dict[str, str]] = {}
    for labels in client.series(NODE_LABELS_METRIC, start, end):
        node = labels.get("node")
        if node:
            out.setdefault(node, {}).update({k: v for k, v in labels.items() if k.startswith("label_")})
    return out
