"""The evaluation harness: score health findings against injected-fault ground truth.

Inputs are plain frames, so any source of samples + truth can be scored (the CLI and the bench
generate them with the simulated fleet): ``findings`` (a list of :class:`~gpuwarden.fleet.Finding`)
and ``truth`` with the columns ``kind, gpu_uuid, onset, event_at, ends_at, xid, fatal,
has_precursor, expected_action`` (the simulator's ``ground_truth()``).

How a finding meets a fault: same GPU, and the finding's [first seen, last seen] overlaps the
fault's [onset, ends at] widened by ``grace_s`` on both sides.

- **Recall** of a fault kind: faults with a finding whose kind names that fault kind
  (:data:`FINDING_FAULTS`; a straggler finding names both straggler kinds, which look the same in
  the samples). A fault counts if its onset lies in the scored window and its event at
  least ``min_observable_s`` before the window's end.
- **Precision**: a finding that meets no fault at all is a false positive of the fault kind it
  names first; a finding that meets some fault on its GPU is explained (a pending-remap finding
  during a double-bit error is a consequence, not a false alarm). Application-XID findings are
  information for the workload owner, not fault claims, and are left out; so are node conditions
  (``node_rules``: a node's GPUs changing together names no GPU), counted in a note instead.
- **Lead time** (faults with precursors whose fatal event falls in the window): the fatal event's
  time minus the first sighting of a finding that names the fault; 0 when only the event was seen.
- **False cordons**: findings recommending cordon or drain on a GPU with no fault that needs the
  GPU out of service (expected action reset-gpu, drain-and-reset, reboot or replace) at the time;
  overlapping ones on one GPU count once. Per 1,000 GPU-days of the scored window.
- **Missed fatal XIDs**: faults that log a fatal XID without a finding of that XID's rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from collections.abc import Iterable

import numpy as np
import pandas as pd

from gpuwarden.fleet import Finding, FindingKind
from gpuwarden.fleet.semantics import to_utc

from .catalogue import APPLICATION_XIDS, CORDONING_ACTIONS, FATAL_XIDS, NODE_KINDS, XID_RULES

# Simulator seeds the thresholds were tuned on; reported figures must use other seeds.
TUNING_SEEDS: tuple[int, ...] = (1, 2, 3)
REPORTING_SEEDS: tuple[int, ...] = (301, 302, 303, 304)

# finding kind -> fault kinds it names (first: the one a false positive is charged to)
FINDING_FAULTS: dict[FindingKind, tuple[str, ...]] = {
    FindingKind.ECC_DBE: ("ecc_dbe",),
    FindingKind.UNCORRECTABLE_ECC: ("ecc_dbe", "xid95_uncontained_ecc"),
    FindingKind.HBM_DEGRADING: ("ecc_dbe", "row_remap_failure"),
    FindingKind.ROW_REMAP_FAILURE: ("row_remap_failure",),
    FindingKind.ROW_REMAP_PENDING: ("row_remap_pending",),
    FindingKind.OFF_THE_BUS: ("xid79_off_bus",),
    FindingKind.PCIE_DEGRADING: ("xid79_off_bus",),
    FindingKind.RECOVERY_NODE_REBOOT: ("xid79_off_bus",),
    FindingKind.UNCONTAINED_ECC: ("xid95_uncontained_ecc",),
    FindingKind.RECOVERY_DRAIN_AND_RESET: ("ecc_dbe", "row_remap_failure", "xid95_uncontained_ecc"),
    FindingKind.RECOVERY_DRAIN_P2P: ("ecc_dbe", "row_remap_failure", "xid95_uncontained_ecc"),
    FindingKind.PCIE_REPLAY_STORM: ("pcie_replay_storm",),
    FindingKind.STRAGGLER: ("straggler", "silent_straggler", "clock_straggler"),
    FindingKind.CONTAINED_ECC: ("xid94_contained_ecc",),
    FindingKind.GSP_TIMEOUT: ("xid119_gsp_timeout",),
    FindingKind.GSP_ERROR: ("xid119_gsp_timeout",),
    FindingKind.THERMAL_THROTTLE: ("thermal_throttle", "cooling_failure"),
    FindingKind.COOLING_DEGRADING: ("cooling_failure", "thermal_throttle"),
    FindingKind.NVLINK_DEGRADING: ("nvlink_degrading",),
    FindingKind.NVLINK_ERROR: ("nvlink_degrading",),
    FindingKind.RECOVERY_GPU_RESET: ("row_remap_pending", "xid119_gsp_timeout", "nvlink_degrading"),
    FindingKind.POWER_BRAKE_THROTTLE: ("power_brake",),
    FindingKind.HW_SLOWDOWN: ("power_brake",),
}
OUT_OF_SERVICE = ("reset-gpu", "drain-and-reset", "reboot", "replace")
APP_KINDS = frozenset(XID_RULES[code].kind for code in APPLICATION_XIDS)
NODE_CONDITION_KINDS = frozenset(NODE_KINDS)  # name no GPU: counted apart, never a GPU fault claim

TARGETS = {"f1": 0.93, "median_lead_minutes": 30.0, "false_cordons_per_10k_gpu_days": 1.0, "missed_fatal_xids": 0}


@dataclass
class EvalReport:
    table: pd.DataFrame  # one row per fault kind, plus "all"
    faults: pd.DataFrame  # the scored faults: detected, lead_minutes
    false_positives: pd.DataFrame
    false_cordons: pd.DataFrame
    gpu_days: float
    missed_fatal_xids: int
    fatal_xid_faults: int
    notes: list[str] = field(default_factory=list)

    @property
    def overall(self) -> pd.Series:
        return self.table.loc["all"]

    @property
    def false_cordons_per_1000_gpu_days(self) -> float:
        return 1000.0 * len(self.false_cordons) / self.gpu_days if self.gpu_days else float("nan")

    @property
    def faults_injected(self) -> int:
        return int(self.overall["faults"])

    def targets(self) -> list[tuple[str, str, str, bool | None]]:
        """(target, goal, measured, met) per target of the health issue; ``met`` is None where
        nothing was injected that the target could be judged on."""
        overall = self.overall
        per_10k = 10 * self.false_cordons_per_1000_gpu_days
        lead = overall["median_lead_minutes"]
        return [
            ("missed fatal XIDs", "0", f"{self.missed_fatal_xids} of {self.fatal_xid_faults}", self.missed_fatal_xids == 0)
            if self.fatal_xid_faults else ("missed fatal XIDs", "0", "no fatal XID was injected", None),
            ("F1, all fault kinds", f">= {TARGETS['f1']}", f"{overall['f1']:.3f}", bool(overall["f1"] >= TARGETS["f1"]))
            if self.faults_injected else ("F1, all fault kinds", f">= {TARGETS['f1']}", "no fault was injected", None),
            ("median lead time, precursor faults", ">= 30 min", f"{lead:.0f} min", bool(lead >= TARGETS["median_lead_minutes"]))
            if not pd.isna(lead) else ("median lead time, precursor faults", ">= 30 min", "no precursor fault caught", None),
            ("false cordons per 10,000 GPU-days", "<= 1", f"{per_10k:.2f} ({len(self.false_cordons)} in {self.gpu_days:,.0f} GPU-days)",
             per_10k <= TARGETS["false_cordons_per_10k_gpu_days"]),
        ]

    def format(self) -> str:
        show = self.table.copy()
        lines = [f"{'fault kind':24} {'faults':>6} {'caught':>6} {'FP':>4} {'precision':>9} {'recall':>6} {'F1':>6} {'lead (median min)':>17}"]
        for kind, row in show.iterrows():
            lead = "" if pd.isna(row["median_lead_minutes"]) else f"{row['median_lead_minutes']:.0f} (n={int(row['lead_n'])})"
            lines.append(f"{kind:24} {int(row['faults']):6d} {int(row['detected']):6d} {int(row['false_positives']):4d} "
                         f"{_pct(row['precision']):>9} {_pct(row['recall']):>6} {_pct(row['f1']):>6} {lead:>17}")
        lines.append("")
        if not self.faults_injected:
            lines.append("no fault was injected in this window, so there is nothing to score detection on "
                         "(raise --rate, --days or --nodes); false cordons below still count")
        else:
            lines.append(f"macro F1 over fault kinds: {self.table.drop(index='all')['f1'].mean():.3f}")
        lines.append(f"false cordon recommendations: {len(self.false_cordons)} in {self.gpu_days:,.0f} GPU-days "
                     f"= {self.false_cordons_per_1000_gpu_days:.3f} per 1,000 GPU-days")
        lines.append("")
        lines.append("targets:")
        for name, goal, measured, met in self.targets():
            lines.append(f"  {verdict(met)} {name}: {measured} (target {goal})")
        lines.extend(self.notes)
        return "\n".join(lines)


def verdict(met: bool | None) -> str:
    """MET, MISS, or n/a where nothing was injected to judge the target on."""
    return "n/a " if met is None else ("MET " if met else "MISS")


def _pct(value: float) -> str:
    return "-" if pd.isna(value) else f"{value:.3f}"


def findings_frame(findings: Iterable[Finding]) -> pd.DataFrame:
    rows = [{"kind": f.kind.value, "gpu_uuid": f.gpu_uuid, "node": f.node, "first_seen": pd.Timestamp(f.first_seen),
             "last_seen": pd.Timestamp(f.last_seen), "action": f.recommended_action.value if f.recommended_action else None,
             "severity": f.severity.value, "confidence": f.confidence} for f in findings]
    columns = ["kind", "gpu_uuid", "node", "first_seen", "last_seen", "action", "severity", "confidence"]
    frame = pd.DataFrame(rows, columns=columns)
    for name in ("first_seen", "last_seen"):
        frame[name] = pd.to_datetime(frame[name], utc=True)
    return frame




def evaluate(findings: Iterable[Finding] | pd.DataFrame, truth: pd.DataFrame, start: datetime, end: datetime,
             gpu_count: int, grace_s: float = 900.0, min_observable_s: float = 1800.0) -> EvalReport:
    """Score ``findings`` against ``truth`` over the samples window [start, end) of ``gpu_count`` GPUs."""
    start, end = to_utc(start), to_utc(end)
    grace = pd.Timedelta(seconds=grace_s)
    found = findings if isinstance(findings, pd.DataFrame) else findings_frame(findings)
    found = found.reset_index(drop=True).assign(fid=lambda f: np.arange(len(f)))
    truth = truth.copy().reset_index(drop=True)
    for name in ("onset", "event_at", "ends_at"):
        truth[name] = pd.to_datetime(truth[name], utc=True)
    truth["tid"] = np.arange(len(truth))
    # Scored: precursors (or the event) start in the window, and the event itself happens at least
    # ``min_observable_s`` before the window ends (a precursor still building up at the end is neither
    # a hit nor a miss yet).
    truth["scored"] = (truth["onset"] >= start) & (truth["event_at"] <= end - pd.Timedelta(seconds=min_observable_s))
    if "observable" in truth:  # e.g. a straggler on a GPU that never ran anything cannot be seen
        truth["scored"] &= truth["observable"].fillna(True).astype(bool)
    pairs = found.merge(truth, on="gpu_uuid", suffixes=("", "_fault"))
    pairs = pairs[(pairs["first_seen"] <= pairs["ends_at"] + grace) & (pairs["last_seen"] >= pairs["onset"] - grace)]
    pairs = pairs.assign(compatible=[k in FINDING_FAULTS.get(f, ()) for f, k in zip(pairs["kind"], pairs["kind_fault"])])
    # astype(bool): an empty list makes an object column, which pandas would read as column labels.
    good = pairs[pairs["compatible"].astype(bool)]

    # Faults: detected, lead time.
    scored = truth[truth["scored"]].copy()
    scored["detected"] = scored["tid"].isin(good["tid"])
    earliest = good[good["first_seen"] >= good["onset"] - grace].groupby("tid")["first_seen"].min()
    scored["first_seen"] = pd.to_datetime(scored["tid"].map(earliest.to_dict()), utc=True)  # NaT where undetected
    lead_ok = scored["has_precursor"].astype(bool) & scored["detected"] & (scored["event_at"] < end)
    lead = (scored["event_at"] - scored["first_seen"]).dt.total_seconds() / 60.0
    scored["lead_minutes"] = np.where(lead_ok, np.clip(lead.fillna(0.0), 0.0, None), np.nan)

    # Findings that meet no fault: false positives of the kind they name first.
    fault_claims = found[~found["kind"].isin(APP_KINDS | NODE_CONDITION_KINDS)]
    explained = fault_claims["fid"].isin(pairs["fid"])
    in_window = (fault_claims["last_seen"] >= start) & (fault_claims["first_seen"] < end)
    false_pos = fault_claims[~explained & in_window].copy()
    false_pos["charged_to"] = [FINDING_FAULTS.get(k, ("unattributed",))[0] for k in false_pos["kind"]]

    # False cordons.
    cordon_values = {a.value for a in CORDONING_ACTIONS}
    cordons = found[found["action"].isin(cordon_values) & (found["last_seen"] >= start) & (found["first_seen"] < end)]
    justified = pairs[pairs["expected_action"].isin(OUT_OF_SERVICE) & pairs["action"].isin(cordon_values)]["fid"]
    false_cordons = _merge_overlaps(cordons[~cordons["fid"].isin(justified)])

    # Fatal XIDs: the rule of the logged XID must have fired.
    fatal = scored[scored["xid"].notna() & scored["xid"].isin(FATAL_XIDS) & scored["fatal"].astype(bool) & (scored["event_at"] < end)]
    rule_kind = {code: XID_RULES[code].kind for code in FATAL_XIDS}
    rule_fired = np.array([rule_kind.get(int(x)) == k if pd.notna(x) else False for x, k in zip(pairs["xid"], pairs["kind"])],
                          dtype=bool)
    hit = pairs.loc[rule_fired, "tid"]
    missed_fatal = int((~fatal["tid"].isin(hit)).sum())

    kinds = sorted(set(truth["kind"]) | set(false_pos["charged_to"]) - {"unattributed"}) + (
        ["unattributed"] if (false_pos["charged_to"] == "unattributed").any() else [])
    rows = {}
    for kind in kinds:
        of_kind = scored[scored["kind"] == kind]
        rows[kind] = _scores(len(of_kind), int(of_kind["detected"].sum()), int((false_pos["charged_to"] == kind).sum()),
                             of_kind["lead_minutes"].dropna())
    rows["all"] = _scores(len(scored), int(scored["detected"].sum()), len(false_pos), scored["lead_minutes"].dropna())
    table = pd.DataFrame.from_dict(rows, orient="index")
    gpu_days = gpu_count * (end - start).total_seconds() / 86400.0
    notes = []
    node_findings = int((found["kind"].isin(NODE_CONDITION_KINDS) & (found["last_seen"] >= start) & (found["first_seen"] < end)).sum())
    if node_findings:
        notes.append(f"({node_findings} node condition finding(s): a whole node's GPUs changed together; "
                     "they name no GPU and are not scored as GPU faults)")
    unscored = int((~truth["scored"]).sum())
    if unscored:
        notes.append(f"({unscored} injected faults started before the window, had their event after "
                     f"{min_observable_s / 60:.0f} minutes before its end, or (stragglers) never ran under load "
                     f"for an hour: not scored; findings on them are not false positives)")
    return EvalReport(table, scored, false_pos, false_cordons, gpu_days, missed_fatal, len(fatal), notes)


def _scores(faults: int, detected: int, false_positives: int, leads: pd.Series) -> dict:
    precision = detected / (detected + false_positives) if detected + false_positives else np.nan
    recall = detected / faults if faults else np.nan
    f1 = 2 * precision * recall / (precision + recall) if faults and (precision + recall) else np.nan
    return {"faults": faults, "detected": detected, "false_positives": false_positives, "precision": precision,
            "recall": recall, "f1": f1, "median_lead_minutes": float(leads.median()) if len(leads) else np.nan,
            "lead_n": len(leads)}


def _merge_overlaps(frame: pd.DataFrame) -> pd.DataFrame:
    """Overlapping cordon recommendations on one GPU are one false cordon."""
    if frame.empty:
        return frame
    frame = frame.sort_values(["gpu_uuid", "first_seen"])
    keep, last_gpu, last_end = [], None, None
    for index, row in frame.iterrows():
        if row["gpu_uuid"] == last_gpu and row["first_seen"] <= last_end:
            last_end = max(last_end, row["last_seen"])
            continue
        keep.append(index)
        last_gpu, last_end = row["gpu_uuid"], row["last_seen"]
    return frame.loc[keep]


def combine(reports: list[EvalReport]) -> EvalReport:
    """Pool several runs (seeds) into one report."""
    faults = pd.concat([r.faults for r in reports], ignore_index=True)
    false_pos = pd.concat([r.false_positives for r in reports], ignore_index=True)
    kinds = sorted(set().union(*(set(r.table.index) for r in reports)) - {"all"})
    rows = {}
    for kind in kinds:
        of_kind = faults[faults["kind"] == kind]
        charged = int((false_pos["charged_to"] == kind).sum()) if "charged_to" in false_pos else 0
        rows[kind] = _scores(len(of_kind), int(of_kind["detected"].sum()), charged, of_kind["lead_minutes"].dropna())
    rows["all"] = _scores(len(faults), int(faults["detected"].sum()), len(false_pos), faults["lead_minutes"].dropna())
    return EvalReport(
        pd.DataFrame.from_dict(rows, orient="index"), faults, false_pos,
        pd.concat([r.false_cordons for r in reports], ignore_index=True), sum(r.gpu_days for r in reports),
        sum(r.missed_fatal_xids for r in reports), sum(r.fatal_xid_faults for r in reports),
        sorted(set(n for r in reports for n in r.notes)),
    )
