"""Whether a GPU without a pod label is free or merely unseen, for exporters that do not say.

gpuwarden's exporter serves ``gpuwarden_pod_attribution_state``; dcgm-exporter does not. Its pod
mapping (``--kubernetes``) is on or off for the whole exporter process, so the rule is per exporter
``instance`` (the scrape target; a node may have two exporters, one mapping pods and one not): when
any series of an instance carried a ``pod`` label within ``lookback`` of the read, its mapping is on,
and the GPUs it serves without a pod label are unallocated ("known"); otherwise nobody could see who
holds them (attribution unknown). A GPU served by a mapping instance is decided by it. Series
without an ``instance`` label (federated or remote-written without it) fall back to their node.
The user can override the rule:

- ``auto``: the rule above;
- ``on``: every exporter's mapping is on (a pod-less GPU is unallocated);
- ``off``: attribution is unknown wherever the exporter did not say (a pod-less GPU is unattributed).

Rows whose exporter served a state keep it; a row with a pod label is "known" whatever the rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
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
        self.mapped_gpus: set[tuple[str, str]] = set()  # (node, UUID) served by an instance that maps pods
        self.mapping_instances: set[str] = set()
        self.silent_instances: dict[str, str] = {}  # instance -> its node: read, no pod label seen
        self.state_nodes: set[str] = set()  # their exporter serves gpuwarden_pod_attribution_state
        self.applied = False  # a read asked for the attribution column

    def refresh(self, client: PrometheusClient, anchor: str, end_s: float, state_metrics: list[str]) -> None:
        """Find the instances that map pods and the GPUs they serve (``auto``), and the nodes whose
        exporter says so itself."""
        def series(selector: str) -> list[dict[str, str]]:
            return client.series(selector, end_s - self.lookback_s, end_s)

        for metric in state_metrics:
            self.state_nodes |= {node for node in map(_node, series(metric)) if node}
        if self.rule == "auto":
            with_pod = anchor[:-1] + ',pod!=""}' if anchor.endswith("}") else anchor + '{pod!=""}'
            self.learn(series(anchor), {_instance(labels) for labels in series(with_pod)})
        log.info("pod attribution: %d exporter instance(s) map pods, serving %d GPU(s)", len(self.mapping_instances),
                 len(self.mapped_gpus))

    def learn(self, series: Iterable[Mapping[str, str]], mapping: set[str]) -> None:
        """Label sets of the anchor's series, and the instances (:func:`_instance`) seen mapping pods."""
        for labels in series:
            instance, gpu = _instance(labels), (_node(labels), labels.get("UUID", ""))
            if instance in mapping:
                self.mapping_instances.add(instance)
                self.mapped_gpus.add(gpu)
            else:
                self.silent_instances[instance] = gpu[0]

    def _mapped(self, frame: pd.DataFrame) -> np.ndarray:
        """Per row: is its GPU served by an instance that maps pods."""
        if not self.mapped_gpus or "gpu_uuid" not in frame.columns:
            return np.zeros(len(frame), dtype=bool)
        keys = pd.MultiIndex.from_arrays([frame["node"].astype(object), frame["gpu_uuid"].astype(object)])
        return np.asarray(keys.isin(list(self.mapped_gpus)), dtype=bool)

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
        mapped = podless & (True if self.rule == "on" else self._mapped(frame))
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
        if self.rule == "on":
            known = unset
        elif self.rule == "off":
            known = unset & frame["pod"].notna().to_numpy()
        else:
            known = unset & self._mapped(frame)
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
        silent = sorted(f"{instance} ({node})" if node and node not in instance else instance
                        for instance, node in self.silent_instances.items() if instance not in self.mapping_instances)
        return (f"pod attribution: auto: an exporter instance whose series carried a pod label within "
                f"{self.lookback_s / 86400:g} day(s) maps pods, so the GPUs it serves without one are unallocated "
                f"({len(self.mapping_instances)} instance(s), {len(self.mapped_gpus)} GPU(s)); on {len(silent)} instance(s) "
                f"no series ever carried one, so their GPUs' owner is unknown{': ' + ', '.join(silent[:10]) if silent else ''}"
                f"{' ...' if len(silent) > 10 else ''}; override with --pod-attribution on|off")


def _node(labels: Mapping[str, str]) -> str:
    return labels.get("node") or labels.get("Hostname", "")


def _instance(labels: Mapping[str, str]) -> str:
    """The exporter that served a series: its scrape target, else (no ``instance`` label) its node."""
    return labels.get("instance") or f"node {_node(labels)}"
