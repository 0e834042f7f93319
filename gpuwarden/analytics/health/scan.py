"""Health scan: fleet samples in, de-duplicated findings out.

``scan(frame, now)`` runs two families over a window of fleet samples:

1. **Rules for known faults** (:mod:`.fault_rules`, ``catalogue.XID_RULES``): a new XID event of a tracked code, NVML's
   recovery action, a pending or failed row remap, a double-bit ECC error no XID explains.
   Application XIDs (13, 31, 43, 45, 68) become INFO findings for the workload owner and never
   recommend an action on the node.
2. **Early warning** (:mod:`.warning_rules`) by peer-relative anomaly detection (``detectors``): single-bit ECC errors and
   correctable row remaps bursting over the peer baseline (HBM degrading, before a DBE or a remap
   failure), PCIe replays (climbing before a GPU falls off the bus, or a storm), thermal and
   power-brake throttle share, temperature above peers, and a GPU slower than its peers at the same
   load with no throttle or error (straggler).

3. **Presence** (:mod:`.presence_rules`): a GPU whose series stop while its node-mates report (timed only
   while they report: an ordinary scrape gap is no GPU's fault).
4. **Observability collapse** (:mod:`.collapse_rules`): series thinning, scrapes slowing and losing
   samples, ``up`` flapping on one node while its peers' stay normal: a warning with no action, often
   minutes before a GPU falls off the bus. It reads the optional scrape-health frame (``scrape``:
   :data:`gpuwarden.fleet.scrape_health.SCRAPE_HEALTH_COLUMNS`, from Prometheus); without it, presence only.

Then application XIDs that strike a workload's GPUs, or many nodes, at once are folded into one
job-level ``xid-storm`` finding (:mod:`.storm_rules`), and hardware findings on many nodes of one
failure domain within minutes into one ``domain-event`` (:mod:`.domain_rules`).

Every signal is computed causally (trailing windows), so a finding's ``first_seen`` is when a
live scan would first have reported it. A finding is one episode of one condition on one GPU;
conditions that come back within ``episode_gap_s`` extend the episode. ``FindingLog`` merges the
findings of successive scans (what the actuator and the evaluation harness do).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime

import pandas as pd

from gpuwarden.fleet import Finding, Severity
from gpuwarden.fleet.semantics import to_utc

from .collapse_rules import DEFAULT_COLLAPSE, CollapseConfig, collapse_findings
from .fault_rules import known_fault_findings
from .features import gpu_series
from .finding_builder import FindingBuilder
from .presence_rules import series_lost_findings
from .domain_rules import fold_domain_events, last_samples
from .scan_config import DEFAULT_CONFIG, HealthConfig
from .storm_rules import fold_xid_storms
from .warning_rules import early_warning_findings


def scan(frame: pd.DataFrame, now: datetime | pd.Timestamp | None = None, config: HealthConfig | None = None,
         pools: Mapping[str, str] | None = None, report_from: datetime | pd.Timestamp | None = None,
         domains: Mapping[str, str] | None = None, fold_domains: bool = True, scrape: pd.DataFrame | None = None,
         collapse: CollapseConfig = DEFAULT_COLLAPSE) -> list[Finding]:
    """Findings over the fleet samples in ``frame`` up to ``now`` (default: the newest sample).

    ``pools`` maps node name -> node pool for peer grouping (default: the node name without a
    trailing ``-<number>``). ``domains`` maps node name -> failure domain (rack or NVLink domain) for
    domain events (default: the whole fleet is one domain; ``fold_domains=False``: none, for a caller
    that folds over merged findings itself). ``report_from``: samples before it are context only (a streaming scan
    already judged them with more history); conditions there raise no finding of their own. ``scrape``: the
    scrape health of the GPU exporter targets over the same window, where the source has it
    (``PrometheusSource.read_scrape_health``); ``collapse``: the observability-collapse thresholds.
    Returns findings sorted by severity (critical first), then time.
    """
    config = config or DEFAULT_CONFIG
    if frame is None or len(frame) == 0:
        return []
    if now is not None:
        cutoff = to_utc(now)
        frame = frame[pd.to_datetime(frame["timestamp"], utc=True) <= cutoff]
        if len(frame) == 0:
            return []
        if scrape is not None and len(scrape):
            scrape = scrape[(pd.to_datetime(scrape["timestamp"], utc=True) <= cutoff).to_numpy()]
    series = gpu_series(frame, pools)
    if len(series) == 0:
        return []
    now_ns = int(series["ts"].max()) if now is None else int(cutoff.value)
    builder = FindingBuilder(series, config, now_ns)
    if report_from is not None:
        builder.report_from_ns = int(to_utc(report_from).value)
    known_fault_findings(builder)
    series_lost_findings(builder, scrape)
    early_warning_findings(builder)
    collapse_findings(builder, scrape, collapse)
    findings = fold_xid_storms(builder.findings, frame, config)
    if fold_domains:
        first = report_from if report_from is not None else pd.to_datetime(frame["timestamp"], utc=True).min()
        findings = fold_domain_events(findings, last_samples(frame), config, domains, to_utc(first).to_pydatetime())
    order = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}
    return sorted(findings, key=lambda f: (order[f.severity], f.first_seen, f.node, f.gpu_uuid or "", f.kind))


class FindingLog:
    """Findings merged across scans: one entry per key and episode, first seen kept, last seen and
    evidence taken from the newest scan. ``gap_s`` is the episode gap (as in :class:`HealthConfig`)."""

    def __init__(self, gap_s: float = DEFAULT_CONFIG.episode_gap_s) -> None:
        self.gap = pd.Timedelta(seconds=gap_s)
        self._by_key: dict[tuple, list[Finding]] = {}

    def merge(self, findings: Iterable[Finding]) -> None:
        for finding in findings:
            episodes = self._by_key.setdefault(finding.key, [])
            for i, known in enumerate(episodes):
                if finding.first_seen <= known.last_seen + self.gap and finding.last_seen >= known.first_seen - self.gap:
                    newer = finding if finding.last_seen >= known.last_seen else known
                    episodes[i] = replace(
                        newer, first_seen=min(known.first_seen, finding.first_seen),
                        last_seen=max(known.last_seen, finding.last_seen),
                        confidence=max(known.confidence, finding.confidence))
                    break
            else:
                episodes.append(finding)

    def findings(self) -> list[Finding]:
        return sorted((f for episodes in self._by_key.values() for f in episodes), key=lambda f: (f.first_seen, f.key))

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_key.values())


class StreamingScanner:
    """Scans a stream of sample chunks (in time order) the way a periodic live scan would, keeping
    ``context_s`` of earlier samples so trailing windows are full at each chunk's start."""

    def __init__(self, config: HealthConfig | None = None, context_s: float | None = None,
                 pools: Mapping[str, str] | None = None, domains: Mapping[str, str] | None = None,
                 collapse: CollapseConfig = DEFAULT_COLLAPSE) -> None:
        self.config = config or DEFAULT_CONFIG
        self.domains = domains
        self._last_samples: dict[tuple[str, str | None], datetime] = {}
        self._first_sample: datetime | None = None
        self.collapse = collapse
        longest = max(max(self.config.hbm_windows_s), max(self.config.nvlink_windows_s), self.config.straggler_window_s,
                      self.config.pcie_window_s, (self.config.cooling_history_hours + 1) * 3600.0,
                      collapse.baseline_s + collapse.window_s,
                      max(self.config.trend_windows_s) + self.config.trend_min_history_s,  # a counter's own history
                      self.config.straggler_window_s + self.config.straggler_mild_persist_s)
        self.context = pd.Timedelta(seconds=context_s if context_s is not None else longest + 600)
        self.pools = pools
        self.log = FindingLog(self.config.episode_gap_s)
        self._tail: pd.DataFrame | None = None
        self._scrape_tail: pd.DataFrame | None = None

    def feed(self, chunk: pd.DataFrame, scrape: pd.DataFrame | None = None) -> list[Finding]:
        """Scan ``chunk`` (after the earlier ones); ``scrape``: its scrape health, where the source has it."""
        if chunk.empty:  # nothing new (below, iloc[-0:] would be the whole tail, reported again)
            return []
        frame = chunk if self._tail is None else pd.concat([self._tail, chunk], ignore_index=True)
        if scrape is not None and self._scrape_tail is not None:
            scrape = pd.concat([self._scrape_tail, scrape], ignore_index=True)
        stamps = pd.to_datetime(frame["timestamp"], utc=True)  # once per feed: frame = [tail, chunk]
        report_from = None if self._tail is None or self._tail.empty else stamps.iloc[-len(chunk):].min()
        # domain events are folded over the merged findings (:meth:`findings`): a chunk sees an
        # episode that goes on from the one before as starting at the chunk's first sample
        found = scan(frame, config=self.config, pools=self.pools, report_from=report_from, fold_domains=False,
                     scrape=scrape, collapse=self.collapse)
        last_samples(chunk, into=self._last_samples)
        if self._first_sample is None:
            self._first_sample = to_utc(stamps.min()).to_pydatetime()
        self.log.merge(found)
        self._tail = frame[(stamps > stamps.max() - self.context).to_numpy()]
        if scrape is not None and len(scrape):
            scrape_stamps = pd.to_datetime(scrape["timestamp"], utc=True)
            self._scrape_tail = scrape[(scrape_stamps > stamps.max() - self.context).to_numpy()]
        return found

    def findings(self) -> list[Finding]:
        """Every finding so far, merged across chunks, domain events folded."""
        folded = fold_domain_events(self.log.findings(), self._last_samples, self.config, self.domains, self._first_sample)
        return sorted(folded, key=lambda f: (f.first_seen, f.key))
