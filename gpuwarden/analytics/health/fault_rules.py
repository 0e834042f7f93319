"""Rules for known faults (``catalogue.XID_RULES``): a new XID event of a tracked code, NVML's
recovery action, a pending or failed row remap, a double-bit ECC error no XID explains.
Application XIDs become INFO findings for the workload owner and never act on the node.

An XID finding carries NVIDIA's resolution buckets (its action and severity follow the immediate
one: ``catalogue.bucket_effect``). An XID event that a later one cancels (``catalogue.XID_CANCELLATIONS``,
both codes with a column) becomes a closed finding: no node action, not active, the cancelling
event as evidence. A streaming scan whose chunk holds the cancelling event but not the cancelled
one re-emits the earlier finding closed, so the merged log (``scan.FindingLog``) keeps that one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pandas as pd

from gpuwarden.fleet import Finding, FindingKind, Severity

from .catalogue import (APPLICATION_XIDS, EARLY_WARNING_KINDS, FAULT_ACTIONS, NVML_RECOVERY, XID_CANCELLATIONS, XID_RULES,
                        Cancellation, XidRule)
from .finding_builder import FindingBuilder, nanmax


def known_fault_findings(b: FindingBuilder) -> None:
    """Every known-fault rule over ``b``'s series; findings go to ``b.findings``."""
    _xid_rules(b)
    _state_rules(b)


def _xid_rules(b: FindingBuilder) -> None:
    s = b.s
    for code, rule in XID_RULES.items():
        inc = s[f"inc_xid_{code}_total"]
        if not inc.any():
            continue
        if code in (63, 64):
            continue  # folded into the row-remap state rules below (XID or NVML state, one finding)

        def emit(code: int = code, rule: XidRule = rule, inc: np.ndarray = inc) -> None:
            b.emit(rule.kind, inc > 0, rule.severity,
                   lambda rows: {
                       "signal": f"xid_{code}_total", "xid": code, "title": rule.title, "events": inc[rows].sum(),
                       "recovery": rule.recovery, "implicates_gpu": rule.implicates_gpu,
                       "nvidia_bucket": rule.bucket or None, "nvidia_investigatory": rule.investigatory or None,
                       **({"note": "application fault: the GPU is not implicated; never cordons"} if code in APPLICATION_XIDS else {}),
                   },
                   lambda rows: rule.confidence)
        _cancellable(b, code, emit)
    inc = s["inc_xid_other_total"]
    if inc.any():
        recovery = FAULT_ACTIONS[FindingKind.XID_OTHER].recovery
        b.emit(FindingKind.XID_OTHER, inc > 0, Severity.WARNING,
               lambda rows: {"signal": "xid_other_total", "events": inc[rows].sum(), "recovery": recovery,
                             "note": "an XID code without its own column; read the kernel log for the code"},
               lambda rows: 0.5)


def _cancellable(b: FindingBuilder, code: int, emit: Callable[[], None]) -> None:
    """Run ``emit`` (the rule of XID ``code``), then close its findings that a later XID cancels."""
    pairs = [p for p in XID_CANCELLATIONS if p.code == code and f"inc_xid_{p.cancelled_by}_total" in b.s.cols]
    start = len(b.findings)
    emit()
    if not pairs:
        return
    b.findings[start:] = [_closed(b, f, pairs) or f for f in b.findings[start:]]
    chunk = b.report_from_ns
    if chunk is None:
        return
    # Episodes wholly before this chunk (an earlier chunk reported them open) that an event in
    # this chunk cancels: their closed version, for the merged log to keep.
    kept, b.findings, b.report_from_ns = b.findings, [], None
    try:
        emit()
        earlier = [c for f in b.findings if pd.Timestamp(f.last_seen).value < chunk
                   and (c := _closed(b, f, pairs, after_ns=chunk)) is not None]
    finally:
        b.findings, b.report_from_ns = kept, chunk
    b.findings.extend(earlier)


def _closed(b: FindingBuilder, finding: Finding, pairs: list[Cancellation], after_ns: int | None = None) -> Finding | None:
    """``finding`` closed by the first cancelling event strictly after its last event on its GPU
    (within the pair's window), or None if none came (or, with ``after_ns``, it came before)."""
    s = b.s
    gpu = np.flatnonzero(s.gpus == finding.gpu_uuid)
    if gpu.size == 0:
        return None
    ts, last = s["ts"], pd.Timestamp(finding.last_seen).value
    mine = (s["gpu"] == gpu[0]) & (ts > last)
    for pair in pairs:
        hit = mine & (s[f"inc_xid_{pair.cancelled_by}_total"] > 0)
        if pair.window_s is not None:
            hit &= ts <= last + int(pair.window_s * 1e9)
        if hit.any():
            first = int(ts[hit].min())
            if after_ns is not None and first < after_ns:
                return None  # an earlier chunk saw it and closed the finding then
            at = pd.Timestamp(first, tz="UTC")
            return replace(finding, recommended_action=None, active=False, evidence={
                **finding.evidence, "cancelled_by": pair.cancelled_by, "cancelled_at": at.isoformat(),
                "cancellation_source": pair.source,
                "note": f"cancelled by XID {pair.cancelled_by} on the same GPU: closed, no node action"})
    return None


def _state_rules(b: FindingBuilder) -> None:
    s = b.s
    # Row remapping: XID 63 / pending flag; XID 64 / failure flag.
    for kind, code, gauge in ((FindingKind.ROW_REMAP_PENDING, 63, "remapped_rows_pending"), (FindingKind.ROW_REMAP_FAILURE, 64, "remapped_rows_failure")):
        rule = XID_RULES[code]
        inc = s[f"inc_xid_{code}_total"]
        state = np.nan_to_num(s[gauge]) > 0
        flag = (inc > 0) | state
        b.emit(kind, flag, rule.severity,
               lambda rows, code=code, gauge=gauge, inc=inc, state=state, rule=rule: {
                   "signal": f"xid_{code}_total / {gauge}", "xid": code, "title": rule.title,
                   "xid_events": inc[rows].sum(), f"{gauge}": bool(state[rows].any()),
                   "remapped_rows_uncorrectable_total": nanmax(s["remapped_rows_uncorrectable_total"][rows]),
                   "recovery": rule.recovery, "nvidia_bucket": rule.bucket or None,
                   "nvidia_investigatory": rule.investigatory or None},
               lambda rows, rule=rule: rule.confidence)
    # NVML's recovery action.
    action_value = np.nan_to_num(s["recovery_action"]).astype(int)
    for value, (kind, _) in NVML_RECOVERY.items():
        flag = action_value == value
        b.emit(kind, flag, Severity.CRITICAL,
               lambda rows, value=value, recovery=FAULT_ACTIONS[kind].recovery: {
                   "signal": "recovery_action", "value": value, "recovery": recovery,
                   "note": "NVML GPU recovery action"},
               lambda rows: 0.95)
    # A double-bit ECC error that no XID 48/94/95 explains (drivers that do not log the XID).
    dbe = s["inc_ecc_dbe_volatile_total"]
    if dbe.any():
        window = b.config.dbe_explained_within_s
        explained = sum(b.s.window_sum(s[f"inc_xid_{c}_total"], window) for c in (48, 94, 95)) > 0
        severity, recovery = EARLY_WARNING_KINDS[FindingKind.UNCORRECTABLE_ECC], FAULT_ACTIONS[FindingKind.UNCORRECTABLE_ECC].recovery
        b.emit(FindingKind.UNCORRECTABLE_ECC, (dbe > 0) & ~explained, severity,
               lambda rows: {"signal": "ecc_dbe_volatile_total", "events": dbe[rows].sum(), "recovery": recovery,
                             "note": "double-bit ECC errors with no XID 48/94/95 logged"},
               lambda rows: 0.9)
