"""The findings analytics emits over fleet samples: what the CLI hands the actuator's reconciler
each round (analytics finds, never acts; the actuator plans from findings it is given).

Health findings come from the health scan; hoarding findings (``kind='hoarded'``) from the idle
ledger's hoarded pods, with the namespace and pod in the evidence so planning can find the
workload, and ``first_seen`` set back by the hours the pod's GPUs have been hoarded.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

import pandas as pd

from gpuwarden.fleet import Finding, FindingKind, Node, Severity

from .health import scan
from .reader import build_ledger
from .reports import hoarding_pods

log = logging.getLogger("gpuwarden.analytics")


def hoarding_findings(frame: pd.DataFrame, now: datetime) -> list[Finding]:
    if frame is None or frame.empty:
        return []
    ledger = build_ledger(frame, price=False)
    out = []
    for row in hoarding_pods(ledger).itertuples(index=False):
        if not row.pod:
            continue
        hours = float(row.hoarded_gpu_hours) / max(1, int(row.gpus))
        out.append(Finding(
            FindingKind.HOARDED, Severity.WARNING, "", None,
            {"namespace": row.namespace, "pod": row.pod, "hoarded_gpu_hours": round(float(row.hoarded_gpu_hours), 3),
             "hoarded_share": round(float(row.hoarded_share), 3), "gpus": int(row.gpus),
             "mean_hoarded_mem_gib": round(float(row.mean_hoarded_mem_gib), 2)},
            None, 1.0, now - timedelta(hours=hours), now))
    return out


def failure_domains(nodes: Iterable[Node]) -> dict[str, str]:
    """Node name -> its failure domain for the health scan's domain events: its rack, else its NVLink
    domain (a domain that is only the node's own name is none); nodes with neither are left out."""
    out = {}
    for node in nodes:
        if node.topology.rack:
            out[node.name] = f"rack:{node.topology.rack}"
        elif node.topology.nvlink_domain and node.topology.nvlink_domain != node.name:
            out[node.name] = f"nvlink:{node.topology.nvlink_domain}"
    return out


def findings_from_frame(frame: pd.DataFrame | None, now: datetime, hoarding: bool = True,
                        domains: Mapping[str, str] | None = None) -> list[Finding]:
    """Active health findings and (optionally) hoarding findings over ``frame`` up to ``now``;
    ``domains``: :func:`failure_domains` of the cluster's nodes (None: no topology known)."""
    if frame is None or len(frame) == 0:
        log.info("findings: no samples in the window")
        return []
    findings = [f for f in scan(frame, now=pd.Timestamp(now), domains=domains or None) if f.active]
    if hoarding:
        findings += hoarding_findings(frame, now)
    return findings
