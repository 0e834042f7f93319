"""What each known fault signal means and what to do about it: NVIDIA's XID catalogue (the codes
the fleet samples count in their own column), NVML's GPU recovery action, the early-warning and
node-condition kinds, and the mapping from NVIDIA's recovery wording to an
:class:`~gpuwarden.fleet.ActionKind` the actuator understands.

Which node action a fault gets is decided here and nowhere else: :data:`FAULT_ACTIONS` holds one
row per health finding kind (NVIDIA's recovery wording and the action recommended now). The rules
emit a finding with its kind's action (:meth:`.finding_builder.FindingBuilder.emit` looks it up;
a short episode of a sustained rule only taints); the remediation planner
(:mod:`gpuwarden.remediation.plan`) takes the finding's action as it stands and only applies
policy: the strongest per node on the ladder of :mod:`gpuwarden.fleet.node_actions`, the severity
and confidence bars, protected nodes, the drain mode.

Sources (described, not copied): NVIDIA's "XID Errors" catalogue and GPU debug guidelines
(recommended actions per code: restart the application, reset the GPU, drain and reset, reboot
the node, replace / RMA), and NVML's ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` field.

Application faults (13 graphics exception, 31 memory page fault, 43 GPU stopped processing,
45 pre-emptive cleanup, 68 video processor exception) are caused by the program, not the GPU: they
are reported for the workload's owner and never cordon anything.

The XID rows are data: ``xid_catalogue.csv`` pins NVIDIA's mnemonic and resolution buckets
(immediate and investigatory) per code beside gpuwarden's rule for it; ``xid_buckets.csv`` says
what each immediate bucket does to a finding (RESTART_APP: never a node action; CONTACT_SUPPORT:
critical; the others keep the recovery wording's action); ``xid_cancellations.csv`` lists the
events a later XID cancels. :func:`load_xid_catalogue` reads and checks the three, naming the
file, line and column of anything wrong (:class:`~gpuwarden.fleet.catalogue.CatalogueError`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from gpuwarden.fleet import TRACKED_XIDS, ActionKind, FindingKind, Severity
from gpuwarden.fleet.catalogue import CatalogueError, data_rows
from gpuwarden.fleet.node_actions import CORDONING_ACTIONS

__all__ = ["APPLICATION_XIDS", "BUCKET_EFFECTS", "CORDONING_ACTIONS", "Cancellation", "EARLY_WARNING_KINDS", "FATAL_XIDS",
           "FAULT_ACTIONS", "FaultAction", "NODE_KINDS", "NVML_RECOVERY", "RECOVERY_ACTION_KIND", "XID_BUCKETS",
           "XID_CANCELLATIONS", "XID_CATALOGUE", "XID_RULES", "XidCatalogue", "XidEntry", "XidRule", "action_for",
           "bucket_effect", "load_xid_catalogue", "recommended_action"]

# NVIDIA recovery wording -> what the actuator does to the node that holds the GPU.
#  restart-app: the application dies and is restarted; the GPU is fine -> no node action.
#  reset-gpu: the GPU needs a reset when idle -> cordon (no new work), reset once drained.
#  drain-and-reset / reboot / replace: the GPU is unusable or corrupting -> drain the node.
#  inspect: degraded but working -> taint, so new work prefers other nodes while a person looks.
RECOVERY_ACTION_KIND: dict[str, ActionKind | None] = {
    "none": None,
    "restart-app": None,
    "inspect": ActionKind.TAINT,
    "reset-gpu": ActionKind.CORDON,
    "drain-and-reset": ActionKind.DRAIN,
    "reboot": ActionKind.DRAIN,
    "replace": ActionKind.DRAIN,
}


def action_for(recovery: str) -> ActionKind | None:
    """The node action NVIDIA's recovery wording calls for."""
    return RECOVERY_ACTION_KIND[recovery]


@dataclass(frozen=True)
class FaultAction:
    """What a fault kind leads to: NVIDIA's recovery wording for it (what the fault needs once
    confirmed; the findings' ``recovery`` evidence) and the node action recommended now (None: none)."""

    recovery: str  # a RECOVERY_ACTION_KIND key
    action: ActionKind | None


def _as_nvidia(recovery: str) -> FaultAction:
    """The action NVIDIA's wording calls for."""
    return FaultAction(recovery, action_for(recovery))


_NO_ACTION = FaultAction("none", None)

# The XID data files; each CSV's header comments say where every column comes from (NVIDIA's Xid
# catalogue for the buckets and mnemonics; NVSentinel's cancellation design, ADR-038, for the pair).
_HERE = Path(__file__).parent
XID_CATALOGUE_PATH, XID_BUCKETS_PATH, XID_CANCELLATIONS_PATH = (
    _HERE / "xid_catalogue.csv", _HERE / "xid_buckets.csv", _HERE / "xid_cancellations.csv")
# What an immediate resolution bucket does to a finding (xid_buckets.csv says which bucket does which).
BUCKET_EFFECTS: tuple[str, ...] = ("no-node-action", "as-recovery", "critical")
_CATALOGUE_COLUMNS = ("code", "mnemonic", "bucket", "investigatory", "kind", "title", "severity", "implicates_gpu",
                      "confidence", "recovery")
_RULE_COLUMNS = ("severity", "implicates_gpu", "confidence", "recovery")  # with a kind, and only with one


@dataclass(frozen=True)
class XidEntry:
    """One row of ``xid_catalogue.csv``: NVIDIA's data for the code and gpuwarden's rule for it
    (``kind`` None: the code has no column of its own; reference only)."""

    code: int
    mnemonic: str
    bucket: str  # NVIDIA's immediate resolution bucket; "" where NVIDIA's cell is empty
    investigatory: str  # NVIDIA's investigatory resolution bucket, as written
    kind: FindingKind | None
    title: str
    severity: Severity | None
    implicates_gpu: bool
    confidence: float
    recovery: str  # a RECOVERY_ACTION_KIND key ("" without a kind)


@dataclass(frozen=True)
class Cancellation:
    """An XID ``code`` event that a later ``cancelled_by`` on the same GPU cancels, within
    ``window_s`` of the code's last event (None: no limit)."""

    code: int
    cancelled_by: int
    window_s: float | None
    source: str


class XidCatalogue(NamedTuple):
    entries: dict[int, XidEntry]
    buckets: dict[str, str]  # bucket -> effect
    cancellations: tuple[Cancellation, ...]


def _int(text: str, column: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) == 0:
        raise ValueError(f"column {column!r}: {text!r} is not an XID code (a whole number from 1)")
    return int(text)


def _entry(row: dict[str, str], buckets: dict[str, str]) -> XidEntry:
    code = _int(row["code"], "code")
    where = f"XID {code}, column"
    if row["bucket"] and row["bucket"] not in buckets:
        raise ValueError(f"{where} 'bucket': {row['bucket']!r} is not one of {', '.join(buckets)}")
    if not row["kind"]:
        if any(row[c] for c in _RULE_COLUMNS):
            raise ValueError(f"{where}s {', '.join(_RULE_COLUMNS)}: a row without a kind takes none of them")
        return XidEntry(code, row["mnemonic"], row["bucket"], row["investigatory"], None, row["title"], None, True, 0.0, "")
    try:
        kind = FindingKind(row["kind"])
    except ValueError:
        raise ValueError(f"{where} 'kind': {row['kind']!r} is not a finding kind") from None
    if code not in TRACKED_XIDS:
        raise ValueError(f"{where} 'kind': XID {code} has no column in the fleet samples (fleet.TRACKED_XIDS), "
                         "so no rule can see it; leave its kind empty")
    if row["severity"] not in {s.value for s in Severity}:
        raise ValueError(f"{where} 'severity': {row['severity']!r} is not one of info, warning, critical")
    if row["implicates_gpu"] not in ("true", "false"):
        raise ValueError(f"{where} 'implicates_gpu': {row['implicates_gpu']!r} is not true or false")
    try:
        confidence = float(row["confidence"])
    except ValueError:
        confidence = math.nan
    if not 0.0 <= confidence <= 1.0:
        raise ValueError(f"{where} 'confidence': {row['confidence']!r} is not a number from 0 to 1")
    if row["recovery"] not in RECOVERY_ACTION_KIND:
        raise ValueError(f"{where} 'recovery': {row['recovery']!r} is not one of {', '.join(RECOVERY_ACTION_KIND)}")
    if not row["title"]:
        raise ValueError(f"{where} 'title': empty")
    return XidEntry(code, row["mnemonic"], row["bucket"], row["investigatory"], kind, row["title"],
                    Severity(row["severity"]), row["implicates_gpu"] == "true", confidence, row["recovery"])


def _cancellation(row: dict[str, str], entries: dict[int, XidEntry]) -> Cancellation:
    code, by = _int(row["code"], "code"), _int(row["cancelled_by"], "cancelled_by")
    for column, value in (("code", code), ("cancelled_by", by)):
        if value not in entries:
            raise ValueError(f"column {column!r}: XID {value} has no row in xid_catalogue.csv")
    if code == by:
        raise ValueError(f"column 'cancelled_by': XID {code} cannot cancel itself")
    try:
        window = float(row["window_seconds"]) if row["window_seconds"] else None
    except ValueError:
        window = math.nan
    if window is not None and not (0.0 < window < math.inf):
        raise ValueError(f"column 'window_seconds': {row['window_seconds']!r} is not a positive number of seconds "
                         "(or empty: no limit)")
    if not row["source"]:
        raise ValueError("column 'source': empty (say where the pair comes from)")
    return Cancellation(code, by, window, row["source"])


def load_xid_catalogue(catalogue: str | Path = XID_CATALOGUE_PATH, buckets: str | Path = XID_BUCKETS_PATH,
                       cancellations: str | Path = XID_CANCELLATIONS_PATH) -> XidCatalogue:
    """Read and check the three XID data files; :class:`CatalogueError` names the file, line and column."""
    effects: dict[str, str] = {}
    for lineno, row in data_rows(Path(buckets), ("bucket", "effect", "meaning")):
        if not row["bucket"] or row["bucket"] in effects:
            raise CatalogueError(f"{buckets}:{lineno}: column 'bucket': {row['bucket']!r} is empty or repeated")
        if row["effect"] not in BUCKET_EFFECTS:
            raise CatalogueError(f"{buckets}:{lineno}: column 'effect' of {row['bucket']}: {row['effect']!r} is not one "
                                 f"of {', '.join(BUCKET_EFFECTS)}")
        effects[row["bucket"]] = row["effect"]
    entries: dict[int, XidEntry] = {}
    for lineno, row in data_rows(Path(catalogue), _CATALOGUE_COLUMNS):
        try:
            entry = _entry(row, effects)
            if entry.code in entries:
                raise ValueError(f"XID {entry.code}, column 'code': a second row")
            if entry.kind is not None and any(e.kind == entry.kind for e in entries.values()):
                raise ValueError(f"XID {entry.code}, column 'kind': {entry.kind} is another code's already")
        except ValueError as exc:
            raise CatalogueError(f"{catalogue}:{lineno}: {exc}") from None
        entries[entry.code] = entry
    unruled = sorted(set(TRACKED_XIDS) - {code for code, e in entries.items() if e.kind is not None})
    if unruled:
        raise CatalogueError(f"{catalogue}: XID {', '.join(map(str, unruled))} has a column in the fleet samples "
                             "but no row with a kind")
    pairs: list[Cancellation] = []
    for lineno, row in data_rows(Path(cancellations), ("code", "cancelled_by", "window_seconds", "source")):
        try:
            pair = _cancellation(row, entries)
            if any((p.code, p.cancelled_by) == (pair.code, pair.cancelled_by) for p in pairs):
                raise ValueError(f"XID {pair.code} cancelled by {pair.cancelled_by}: a second row")
        except ValueError as exc:
            raise CatalogueError(f"{cancellations}:{lineno}: {exc}") from None
        pairs.append(pair)
    return XidCatalogue(entries, effects, tuple(pairs))


XID_CATALOGUE, XID_BUCKETS, XID_CANCELLATIONS = load_xid_catalogue()


def bucket_effect(bucket: str) -> str:
    """What NVIDIA's immediate bucket does to a finding (an empty bucket: nothing, ``as-recovery``)."""
    return XID_BUCKETS[bucket] if bucket else "as-recovery"


def _xid_fault_actions() -> dict[FindingKind, FaultAction]:
    """The XID kinds' rows of FAULT_ACTIONS: the recovery wording's action, none for an app bucket."""
    return {e.kind: FaultAction(e.recovery, None if bucket_effect(e.bucket) == "no-node-action" else action_for(e.recovery))
            for e in XID_CATALOGUE.values() if e.kind is not None}

# Every health finding kind -> its recovery and action, one row each. Early warnings (precursors)
# cordon (no new work lands; the running job can checkpoint) rather than drain, or only taint: the
# fault has not happened yet, so their action is stated, not NVIDIA's wording's.
FAULT_ACTIONS: dict[FindingKind, FaultAction] = {
    # NVIDIA's XID catalogue (xid_catalogue.csv): the application's faults never act on the node, the
    # GPU's act as the recovery wording says, and a RESTART_APP bucket never acts whatever the wording
    **_xid_fault_actions(),
    FindingKind.XID_STORM: _as_nvidia("restart-app"),  # the workload's owner restarts it; no GPU is implicated
    # many nodes of one domain at once: a person inspects the rack's power, switch or cooling; the
    # nodes' own findings that outlast it act on their own (domain_rules)
    FindingKind.DOMAIN_EVENT: FaultAction("inspect", None),
    # an XID code without its own column: a person reads the kernel log for the code; no node action
    FindingKind.XID_OTHER: FaultAction("inspect", None),
    # NVML's GPU recovery action
    FindingKind.RECOVERY_GPU_RESET: _as_nvidia("reset-gpu"),
    FindingKind.RECOVERY_NODE_REBOOT: _as_nvidia("reboot"),
    FindingKind.RECOVERY_DRAIN_P2P: _as_nvidia("drain-and-reset"),
    FindingKind.RECOVERY_DRAIN_AND_RESET: _as_nvidia("drain-and-reset"),
    # early warnings
    FindingKind.HBM_DEGRADING: FaultAction("drain-and-reset", ActionKind.CORDON),  # SBE / correctable remaps climbing
    FindingKind.PCIE_DEGRADING: FaultAction("reboot", ActionKind.CORDON),  # PCIe replays climbing: off-the-bus risk
    FindingKind.PCIE_REPLAY_STORM: FaultAction("inspect", ActionKind.TAINT),
    FindingKind.THERMAL_THROTTLE: FaultAction("inspect", ActionKind.TAINT),
    FindingKind.POWER_BRAKE_THROTTLE: FaultAction("inspect", ActionKind.TAINT),
    FindingKind.HW_SLOWDOWN: FaultAction("inspect", ActionKind.TAINT),
    FindingKind.NVLINK_DEGRADING: FaultAction("reset-gpu", ActionKind.CORDON),  # NVLink errors climbing: XID 74 risk
    FindingKind.COOLING_DEGRADING: FaultAction("inspect", ActionKind.TAINT),  # warming alone: thermal shutdown risk
    FindingKind.STRAGGLER: FaultAction("replace", ActionKind.CORDON),
    FindingKind.UNCORRECTABLE_ECC: FaultAction("drain-and-reset", ActionKind.DRAIN),
    # A GPU whose series stopped while its node-mates' went on (presence_rules): fell off the bus, or
    # its exporter lost it. Cordon, not drain: a person checks which before the node is rebooted.
    FindingKind.GPU_SERIES_LOST: FaultAction("reboot", ActionKind.CORDON),
    # Observability collapse (collapse_rules): the precursor of a GPU falling off the bus, or a sick
    # exporter; a person watches, nothing acts on it alone.
    FindingKind.OBSERVABILITY_COLLAPSE: _NO_ACTION,
    # Node conditions: no GPU is at fault, so nothing recommends a node action (NODE_KINDS).
    FindingKind.NODE_WIDE_SLOWDOWN: _NO_ACTION,
    FindingKind.NODE_WIDE_THERMAL: _NO_ACTION,
    FindingKind.NODE_WIDE_COUNTER_RESET: _NO_ACTION,
    # A node whose DRA driver stopped publishing its GPUs: kube-scheduler allocates nothing there until
    # it is back; a person looks at the driver (nothing to cordon: no new claim lands there anyway).
    FindingKind.DRA_DEVICES_GONE: _NO_ACTION,
}


def recommended_action(kind: FindingKind) -> ActionKind | None:
    """The node action the catalogue recommends for a finding of ``kind``."""
    return FAULT_ACTIONS[kind].action


# NVML GPU recovery action value -> (finding kind, NVML's name for the value).
NVML_RECOVERY: dict[int, tuple[FindingKind, str]] = {
    1: (FindingKind.RECOVERY_GPU_RESET, "NVML_GPU_RECOVERY_ACTION_GPU_RESET"),
    2: (FindingKind.RECOVERY_NODE_REBOOT, "NVML_GPU_RECOVERY_ACTION_NODE_REBOOT"),
    3: (FindingKind.RECOVERY_DRAIN_P2P, "NVML_GPU_RECOVERY_ACTION_DRAIN_P2P"),
    4: (FindingKind.RECOVERY_DRAIN_AND_RESET, "NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET"),
}


@dataclass(frozen=True)
class XidRule:
    """The rule for an XID code with a column in the fleet samples (a row of ``xid_catalogue.csv``
    with a kind); ``severity`` is the row's, raised to critical by a CONTACT_SUPPORT bucket."""

    code: int
    kind: FindingKind
    title: str
    severity: Severity
    implicates_gpu: bool  # False: the application caused it
    confidence: float
    bucket: str = ""  # NVIDIA's immediate resolution bucket ("" where NVIDIA's cell is empty)
    investigatory: str = ""  # NVIDIA's investigatory resolution bucket

    @property
    def recovery(self) -> str:
        """NVIDIA recovery wording (a RECOVERY_ACTION_KIND key)."""
        return FAULT_ACTIONS[self.kind].recovery

    @property
    def action(self) -> ActionKind | None:
        return FAULT_ACTIONS[self.kind].action


def _rule(entry: XidEntry) -> XidRule | None:
    """The rule of a catalogue row with a kind (None: a reference row)."""
    if entry.kind is None or entry.severity is None:
        return None
    severity = Severity.CRITICAL if bucket_effect(entry.bucket) == "critical" else entry.severity
    return XidRule(entry.code, entry.kind, entry.title, severity, entry.implicates_gpu, entry.confidence, entry.bucket,
                   entry.investigatory)


XID_RULES: dict[int, XidRule] = {code: rule for code, entry in XID_CATALOGUE.items() if (rule := _rule(entry)) is not None}
# The application's own codes (implicates_gpu false): findings for the workload's owner, folded into storms.
APPLICATION_XIDS: tuple[int, ...] = tuple(sorted(code for code, rule in XID_RULES.items() if not rule.implicates_gpu))

# XID codes that kill the workload on the GPU (used for the "zero missed fatal XIDs" target).
FATAL_XIDS: tuple[int, ...] = (48, 62, 64, 74, 79, 94, 95, 119, 120)

# Findings of the early-warning detectors (and the presence and unexplained-ECC rules): kind ->
# severity (their recovery and action: FAULT_ACTIONS).
EARLY_WARNING_KINDS: dict[FindingKind, Severity] = {
    FindingKind.HBM_DEGRADING: Severity.WARNING,
    FindingKind.PCIE_DEGRADING: Severity.WARNING,
    FindingKind.PCIE_REPLAY_STORM: Severity.WARNING,
    FindingKind.THERMAL_THROTTLE: Severity.WARNING,
    FindingKind.POWER_BRAKE_THROTTLE: Severity.WARNING,
    FindingKind.HW_SLOWDOWN: Severity.WARNING,
    FindingKind.NVLINK_DEGRADING: Severity.WARNING,
    FindingKind.COOLING_DEGRADING: Severity.WARNING,
    FindingKind.STRAGGLER: Severity.WARNING,
    FindingKind.UNCORRECTABLE_ECC: Severity.CRITICAL,
    FindingKind.GPU_SERIES_LOST: Severity.CRITICAL,
    FindingKind.OBSERVABILITY_COLLAPSE: Severity.WARNING,
}


# Node conditions (node_rules): every GPU of a node changed together. No GPU is at fault, so nothing
# recommends a node action (FAULT_ACTIONS): a power or clock policy is someone's decision (information), inlet air is the
# facility's (a warning for a person, not a repair).
NODE_KINDS: dict[FindingKind, tuple[Severity, str]] = {
    FindingKind.NODE_WIDE_SLOWDOWN: (Severity.INFO, "every busy GPU of the node is slower than its peers together: a "
                                                    "node power cap or clock policy, not a slow GPU"),
    FindingKind.NODE_WIDE_THERMAL: (Severity.WARNING, "every GPU of the node runs hotter (or thermal-throttles) together: "
                                                      "inlet air or rack cooling, not one GPU"),
    FindingKind.NODE_WIDE_COUNTER_RESET: (Severity.INFO, "every counter of the node's GPUs reset at once: a driver reload "
                                                         "or reboot (counts go on from zero)"),
}
