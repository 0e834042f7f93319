"""Whether a GPU without a pod label is free or merely unseen, for exporters that do not say.

gpuwarden's exporter serves ``gpuwarden_pod_attribution_state``; dcgm-exporter does not. Its pod
mapping (``--kubernetes``) is on or off for the whole exporter, so the rule is per exporter (one
per node, a DaemonSet): when any of its series carried a ``pod`` label within ``lookback`` of the
read, its mapping is on, and its GPUs without a pod label are unallocated ("known"); otherwise
nobody could see who holds them (attribution unknown). The user can override the rule:

- ``auto``: the rule above;
- ``on``: every exporter's mapping is on (a pod-less GPU is unallocated);
- ``off``: attribution is unknown wherever the exporter did not say (a pod-less GPU is unattributed).

Rows whose exporter served a state keep it; a row with a pod label is "known" whatever the rule.
"""

from __future__ import annotations

import pandas as pd

from .client import PrometheusClient, log

RULES: tuple[str, ...] = ("auto", "on", "off")
DEFAULT_LOOKBACK_S = 7 * 86400.0


def check_rule(rule: str) -> str:
    if rule not in RULES:
        raise ValueError(f"pod attribution rule {rule!r} is not one of {', '.join(RULES)}")
    return rule


class PodAttribution:
    """The attribution rule of one source and the nodes whose exporter maps pods (``auto``).

    The nodes are found with Prometheus' series API (label sets only, no samples read) and only
    grow: once an exporter is seen mapping pods, every later read of it agrees."""

    def __init__(self, rule: str = "auto", lookback_s: float = DEFAULT_LOOKBACK_S) -> None:
        self.rule = check_rule(rule)
        self.lookback_s = float(lookback_s)
        self.mapping_nodes: set[str] = set()
        self.silent_nodes: set[str] = set()  # read, but no pod label seen: attribution unknown
        self.state_nodes: set[str] = set()  # their exporter serves gpuwarden_pod_attribution_state
        self.applied = False  # a read asked for the attribution column

    def refresh(self, client: PrometheusClient, anchor: str, end_s: float, state_metrics: list[str]) -> None:
        """Find the nodes whose exporter maps pods (``auto``) and those that say so themselves."""
        def nodes(selector: str) -> set[str]:
            found = (labels.get("node") or labels.get("Hostname") for labels in
                     client.series(selector, end_s - self.lookback_s, end_s))
            return {node for node in found if node}

        for metric in state_metrics:
            self.state_nodes |= nodes(metric)
        if self.rule == "auto":
            self.mapping_nodes |= nodes(anchor[:-1] + ',pod!=""}' if anchor.endswith("}") else anchor + '{pod!=""}')
        log.info("pod attribution: %d node(s) whose exporter maps pods", len(self.mapping_nodes))

    def apply_states(self, frame: pd.DataFrame) -> pd.DataFrame:
        """The recording rules' states (``read_state_rollup``) under the rule: the rules call a
        pod-less GPU unallocated only where the exporter serves its attribution state, so on the
        other nodes whose mapping is on, every pod-less state becomes ``unallocated``."""
        if frame.empty:
            return frame
        self.applied = True
        nodes = frame["node"].astype(object)
        podless = frame["pod"].isna().to_numpy() & ~nodes.isin(self.state_nodes).to_numpy()
        if self.rule == "off":
            return frame
        mapped = podless & (True if self.rule == "on" else nodes.isin(self.mapping_nodes).to_numpy())
        if self.rule == "auto":
            self.silent_nodes.update(set(nodes[podless & ~mapped]))
        states = frame["state"].astype(object).where(~mapped, "unallocated")
        frame = frame.copy()
        frame["state"] = pd.Categorical(states)
        return frame

    def apply(self, frame: pd.DataFrame) -> pd.DataFrame:
        """``frame`` with the rule's ``attribution`` where the exporter served none."""
        if "attribution" not in frame.columns or frame.empty:
            return frame
        self.applied = True
        state = frame["attribution"].astype(object)
        unset = state.isna().to_numpy()
        if not unset.any():
            return frame
        nodes = frame["node"].astype(object)
        if self.rule == "on":
            known = unset
        elif self.rule == "off":
            known = unset & frame["pod"].notna().to_numpy()
        else:
            known = unset & nodes.isin(self.mapping_nodes).to_numpy()
            self.silent_nodes.update(set(nodes[unset & ~known]) - self.mapping_nodes)
        state = state.where(~known, "known")
        frame = frame.copy()
        frame["attribution"] = pd.Categorical(state, categories=sorted(set(state.dropna()) | {"known"}))
        return frame

    def note(self) -> str | None:
        """Which rule this source used (every report that reads attribution says so)."""
        if not self.applied:
            return None
        if self.rule == "on":
            return ("pod attribution: --pod-attribution on: a GPU without a pod label is unallocated on every node "
                    "(the exporter's pod mapping taken as on)")
        if self.rule == "off":
            return ("pod attribution: --pod-attribution off: a GPU without a pod label is unattributed (owner unknown) "
                    "wherever the exporter did not serve gpuwarden_pod_attribution_state")
        silent = sorted(self.silent_nodes)
        return (f"pod attribution: auto: an exporter whose series carried a pod label within "
                f"{self.lookback_s / 86400:g} day(s) maps pods, so its GPUs without one are unallocated "
                f"({len(self.mapping_nodes)} node(s)); on {len(silent)} node(s) no series ever carried one, so their GPUs' "
                f"owner is unknown{': ' + ', '.join(silent[:10]) if silent else ''}"
                f"{' ...' if len(silent) > 10 else ''}; override with --pod-attribution on|off")
