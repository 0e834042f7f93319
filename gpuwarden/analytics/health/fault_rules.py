"""Rules for known faults (``catalogue.XID_RULES``): a new XID event of a tracked code, NVML's
recovery action, a pending or failed row remap, a double-bit ECC error no XID explains.
Application XIDs become INFO findings for the workload owner and never act on the node."""

from __future__ import annotations

import numpy as np

from gpuwarden.fleet import FindingKind, Severity

from .catalogue import APPLICATION_XIDS, EARLY_WARNING_KINDS, FAULT_ACTIONS, NVML_RECOVERY, XID_RULES
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
        b.emit(rule.kind, inc > 0, rule.severity,
               lambda rows, code=code, rule=rule, inc=inc: {
                   "signal": f"xid_{code}_total", "xid": code, "title": rule.title, "events": inc[rows].sum(),
                   "recovery": rule.recovery, "implicates_gpu": rule.implicates_gpu,
                   **({"note": "application fault: the GPU is not implicated; never cordons"} if code in APPLICATION_XIDS else {}),
               },
               lambda rows, rule=rule: rule.confidence)
    inc = s["inc_xid_other_total"]
    if inc.any():
        recovery = FAULT_ACTIONS[FindingKind.XID_OTHER].recovery
        b.emit(FindingKind.XID_OTHER, inc > 0, Severity.WARNING,
               lambda rows: {"signal": "xid_other_total", "events": inc[rows].sum(), "recovery": recovery,
                             "note": "an XID code without its own column; read the kernel log for the code"},
               lambda rows: 0.5)


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
                   "recovery": rule.recovery},
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
