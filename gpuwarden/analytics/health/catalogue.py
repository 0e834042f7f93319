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
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuwarden.fleet import ActionKind, FindingKind, Severity
from gpuwarden.fleet.node_actions import CORDONING_ACTIONS

__all__ = ["APPLICATION_XIDS", "CORDONING_ACTIONS", "EARLY_WARNING_KINDS", "FATAL_XIDS", "FAULT_ACTIONS", "FaultAction",
           "NODE_KINDS", "NVML_RECOVERY", "RECOVERY_ACTION_KIND", "XID_RULES", "XidRule", "action_for",
           "recommended_action"]

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

# Every health finding kind -> its recovery and action, one row each. Early warnings (precursors)
# cordon (no new work lands; the running job can checkpoint) rather than drain, or only taint: the
# fault has not happened yet, so their action is stated, not NVIDIA's wording's.
FAULT_ACTIONS: dict[FindingKind, FaultAction] = {
    # NVIDIA's XID catalogue: the application's faults never act on the node...
    FindingKind.APP_XID_13: _as_nvidia("restart-app"),
    FindingKind.APP_XID_31: _as_nvidia("restart-app"),
    FindingKind.APP_XID_43: _as_nvidia("restart-app"),
    FindingKind.APP_XID_45: _as_nvidia("none"),
    FindingKind.APP_XID_68: _as_nvidia("restart-app"),
    FindingKind.XID_STORM: _as_nvidia("restart-app"),  # the workload's owner restarts it; no GPU is implicated
    # many nodes of one domain at once: a person inspects the rack's power, switch or cooling; the
    # nodes' own findings that outlast it act on their own (domain_rules)
    FindingKind.DOMAIN_EVENT: FaultAction("inspect", None),
    # ...the GPU's act as NVIDIA's recovery says
    FindingKind.ECC_DBE: _as_nvidia("drain-and-reset"),
    FindingKind.PMU_BREAKPOINT: _as_nvidia("reset-gpu"),
    FindingKind.PMU_HALT: _as_nvidia("reset-gpu"),
    FindingKind.ROW_REMAP_PENDING: _as_nvidia("reset-gpu"),
    FindingKind.ROW_REMAP_FAILURE: _as_nvidia("replace"),
    FindingKind.NVLINK_ERROR: _as_nvidia("reset-gpu"),
    FindingKind.OFF_THE_BUS: _as_nvidia("reboot"),
    FindingKind.HIGH_SBE_RATE: _as_nvidia("inspect"),
    FindingKind.CONTAINED_ECC: _as_nvidia("restart-app"),  # only the application using the memory dies
    FindingKind.UNCONTAINED_ECC: _as_nvidia("drain-and-reset"),
    FindingKind.GSP_TIMEOUT: _as_nvidia("reset-gpu"),
    FindingKind.GSP_ERROR: _as_nvidia("reset-gpu"),
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
    # Node conditions: no GPU is at fault, so nothing recommends a node action (NODE_KINDS).
    FindingKind.NODE_WIDE_SLOWDOWN: _NO_ACTION,
    FindingKind.NODE_WIDE_THERMAL: _NO_ACTION,
    FindingKind.NODE_WIDE_COUNTER_RESET: _NO_ACTION,
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
    code: int
    kind: FindingKind
    title: str
    severity: Severity
    implicates_gpu: bool  # False: the application caused it
    confidence: float

    @property
    def recovery(self) -> str:
        """NVIDIA recovery wording (a RECOVERY_ACTION_KIND key)."""
        return FAULT_ACTIONS[self.kind].recovery

    @property
    def action(self) -> ActionKind | None:
        return FAULT_ACTIONS[self.kind].action


APPLICATION_XIDS: tuple[int, ...] = (13, 31, 43, 45, 68)

XID_RULES: dict[int, XidRule] = {
    rule.code: rule
    for rule in (
        XidRule(13, FindingKind.APP_XID_13, "graphics engine exception (application)", Severity.INFO, False, 0.9),
        XidRule(31, FindingKind.APP_XID_31, "GPU memory page fault (application)", Severity.INFO, False, 0.9),
        XidRule(43, FindingKind.APP_XID_43, "GPU stopped processing (application)", Severity.INFO, False, 0.9),
        XidRule(45, FindingKind.APP_XID_45, "pre-emptive cleanup after earlier errors (application)", Severity.INFO, False, 0.9),
        XidRule(68, FindingKind.APP_XID_68, "video processor exception (application)", Severity.INFO, False, 0.9),
        XidRule(48, FindingKind.ECC_DBE, "double-bit ECC error", Severity.CRITICAL, True, 0.99),
        XidRule(61, FindingKind.PMU_BREAKPOINT, "internal micro-controller breakpoint", Severity.WARNING, True, 0.8),
        XidRule(62, FindingKind.PMU_HALT, "internal micro-controller halt", Severity.CRITICAL, True, 0.9),
        XidRule(63, FindingKind.ROW_REMAP_PENDING, "row remapping recorded, waits for a GPU reset", Severity.WARNING, True, 0.95),
        XidRule(64, FindingKind.ROW_REMAP_FAILURE, "row remapping failed", Severity.CRITICAL, True, 0.99),
        XidRule(74, FindingKind.NVLINK_ERROR, "NVLink error", Severity.CRITICAL, True, 0.9),
        XidRule(79, FindingKind.OFF_THE_BUS, "GPU has fallen off the bus", Severity.CRITICAL, True, 0.99),
        XidRule(92, FindingKind.HIGH_SBE_RATE, "high single-bit ECC error rate", Severity.WARNING, True, 0.8),
        XidRule(94, FindingKind.CONTAINED_ECC, "contained ECC error (only the application using the memory dies)",
                Severity.WARNING, True, 0.95),
        XidRule(95, FindingKind.UNCONTAINED_ECC, "uncontained ECC error", Severity.CRITICAL, True, 0.99),
        XidRule(119, FindingKind.GSP_TIMEOUT, "GSP RPC timeout", Severity.CRITICAL, True, 0.95),
        XidRule(120, FindingKind.GSP_ERROR, "GSP error", Severity.CRITICAL, True, 0.95),
    )
}

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
