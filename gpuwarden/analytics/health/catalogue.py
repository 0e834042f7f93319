"""What each known fault signal means and what to do about it: NVIDIA's XID catalogue (the codes
the fleet samples count in their own column), NVML's GPU recovery action, and the mapping from
NVIDIA's recovery wording to an :class:`~gpuwarden.fleet.ActionKind` the actuator understands.

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

# Actions that take a node out of scheduling (what "a cordon" means in the evaluation).
CORDONING_ACTIONS: frozenset[ActionKind] = frozenset({ActionKind.CORDON, ActionKind.DRAIN})

# NVML GPU recovery action value -> (finding kind, NVIDIA recovery wording).
NVML_RECOVERY: dict[int, tuple[FindingKind, str]] = {
    1: (FindingKind.RECOVERY_GPU_RESET, "reset-gpu"),
    2: (FindingKind.RECOVERY_NODE_REBOOT, "reboot"),
    3: (FindingKind.RECOVERY_DRAIN_P2P, "drain-and-reset"),
    4: (FindingKind.RECOVERY_DRAIN_AND_RESET, "drain-and-reset"),
}


@dataclass(frozen=True)
class XidRule:
    code: int
    kind: FindingKind
    title: str
    recovery: str  # NVIDIA recovery wording (a RECOVERY_ACTION_KIND key)
    severity: Severity
    implicates_gpu: bool  # False: the application caused it
    confidence: float

    @property
    def action(self) -> ActionKind | None:
        return RECOVERY_ACTION_KIND[self.recovery]


APPLICATION_XIDS: tuple[int, ...] = (13, 31, 43, 45, 68)

XID_RULES: dict[int, XidRule] = {
    rule.code: rule
    for rule in (
        XidRule(13, FindingKind.APP_XID_13, "graphics engine exception (application)", "restart-app", Severity.INFO, False, 0.9),
        XidRule(31, FindingKind.APP_XID_31, "GPU memory page fault (application)", "restart-app", Severity.INFO, False, 0.9),
        XidRule(43, FindingKind.APP_XID_43, "GPU stopped processing (application)", "restart-app", Severity.INFO, False, 0.9),
        XidRule(45, FindingKind.APP_XID_45, "pre-emptive cleanup after earlier errors (application)", "none", Severity.INFO, False, 0.9),
        XidRule(68, FindingKind.APP_XID_68, "video processor exception (application)", "restart-app", Severity.INFO, False, 0.9),
        XidRule(48, FindingKind.ECC_DBE, "double-bit ECC error", "drain-and-reset", Severity.CRITICAL, True, 0.99),
        XidRule(61, FindingKind.PMU_BREAKPOINT, "internal micro-controller breakpoint", "reset-gpu", Severity.WARNING, True, 0.8),
        XidRule(62, FindingKind.PMU_HALT, "internal micro-controller halt", "reset-gpu", Severity.CRITICAL, True, 0.9),
        XidRule(63, FindingKind.ROW_REMAP_PENDING, "row remapping recorded, waits for a GPU reset", "reset-gpu", Severity.WARNING, True, 0.95),
        XidRule(64, FindingKind.ROW_REMAP_FAILURE, "row remapping failed", "replace", Severity.CRITICAL, True, 0.99),
        XidRule(74, FindingKind.NVLINK_ERROR, "NVLink error", "reset-gpu", Severity.CRITICAL, True, 0.9),
        XidRule(79, FindingKind.OFF_THE_BUS, "GPU has fallen off the bus", "reboot", Severity.CRITICAL, True, 0.99),
        XidRule(92, FindingKind.HIGH_SBE_RATE, "high single-bit ECC error rate", "inspect", Severity.WARNING, True, 0.8),
        XidRule(94, FindingKind.CONTAINED_ECC, "contained ECC error (only the application using the memory dies)", "restart-app",
                Severity.WARNING, True, 0.95),
        XidRule(95, FindingKind.UNCONTAINED_ECC, "uncontained ECC error", "drain-and-reset", Severity.CRITICAL, True, 0.99),
        XidRule(119, FindingKind.GSP_TIMEOUT, "GSP RPC timeout", "reset-gpu", Severity.CRITICAL, True, 0.95),
        XidRule(120, FindingKind.GSP_ERROR, "GSP error", "reset-gpu", Severity.CRITICAL, True, 0.95),
    )
}

# XID codes that kill the workload on the GPU (used for the "zero missed fatal XIDs" target).
FATAL_XIDS: tuple[int, ...] = (48, 62, 64, 74, 79, 94, 95, 119, 120)

# Findings of the early-warning detectors: kind -> (NVIDIA recovery wording once confirmed, severity,
# what to do now). Precursors cordon (no new work lands; the running job can checkpoint) rather
# than drain: the fault has not happened yet.
EARLY_WARNING_KINDS: dict[FindingKind, tuple[str, Severity, ActionKind | None]] = {
    FindingKind.HBM_DEGRADING: ("drain-and-reset", Severity.WARNING, ActionKind.CORDON),  # SBE / correctable remaps climbing
    FindingKind.PCIE_DEGRADING: ("reboot", Severity.WARNING, ActionKind.CORDON),  # PCIe replays climbing: off-the-bus risk
    FindingKind.PCIE_REPLAY_STORM: ("inspect", Severity.WARNING, ActionKind.TAINT),
    FindingKind.THERMAL_THROTTLE: ("inspect", Severity.WARNING, ActionKind.TAINT),
    FindingKind.POWER_BRAKE_THROTTLE: ("inspect", Severity.WARNING, ActionKind.TAINT),
    FindingKind.HW_SLOWDOWN: ("inspect", Severity.WARNING, ActionKind.TAINT),
    FindingKind.NVLINK_DEGRADING: ("reset-gpu", Severity.WARNING, ActionKind.CORDON),  # NVLink errors climbing: XID 74 risk
    FindingKind.COOLING_DEGRADING: ("inspect", Severity.WARNING, ActionKind.TAINT),  # warming alone: thermal shutdown risk
    FindingKind.STRAGGLER: ("replace", Severity.WARNING, ActionKind.CORDON),
    FindingKind.UNCORRECTABLE_ECC: ("drain-and-reset", Severity.CRITICAL, ActionKind.DRAIN),
    # A GPU whose series stopped while its node-mates' went on (presence_rules): fell off the bus, or
    # its exporter lost it. Cordon, not drain: a person checks which before the node is rebooted.
    FindingKind.GPU_SERIES_LOST: ("reboot", Severity.CRITICAL, ActionKind.CORDON),
}


# Node conditions (node_rules): every GPU of a node changed together. No GPU is at fault, so nothing
# recommends a cordon: a power or clock policy is someone's decision (information), inlet air is the
# facility's (a warning for a person, not a repair).
NODE_KINDS: dict[FindingKind, tuple[Severity, str]] = {
    FindingKind.NODE_WIDE_SLOWDOWN: (Severity.INFO, "every busy GPU of the node is slower than its peers together: a "
                                                    "node power cap or clock policy, not a slow GPU"),
    FindingKind.NODE_WIDE_THERMAL: (Severity.WARNING, "every GPU of the node runs hotter (or thermal-throttles) together: "
                                                      "inlet air or rack cooling, not one GPU"),
    FindingKind.NODE_WIDE_COUNTER_RESET: (Severity.INFO, "every counter of the node's GPUs reset at once: a driver reload "
                                                         "or reboot (counts go on from zero)"),
}


def action_for(recovery: str) -> ActionKind | None:
    return RECOVERY_ACTION_KIND[recovery]
