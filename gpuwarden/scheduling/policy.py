"""Queue policies: named combinations of registered parts (``parts``) and the knobs they read.

A policy names a queue order (``order``: ``queue_orders.QUEUE_ORDERS``), a victim choice
(``preempt``: ``victim_choices.VICTIM_CHOICES``), an admission check (``admission``:
``admission_checks.ADMISSION_CHECKS``) and a placement scorer (``placement.scorer``:
``scorers.SCORERS``). ``gpuwarden`` is the production policy; ``fifo``, ``kueue`` and ``tiresias``
are the baselines the replays compare against, and ``kube-default`` is what users have without
gpuwarden: kube-scheduler's default behaviour (PrioritySort, NodeResourcesFit with LeastAllocated
spreading, priority preemption, no quotas and no gang).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum

from .admission_checks import ADMISSION_CHECKS
from .errors import SchedulingError
from .placement import PlacementOptions
from .queue_orders import QUEUE_ORDERS
from .victim_choices import VICTIM_CHOICES


# The built-in parts' names, as enums (what policies were written with before parts had names;
# a policy may name any registered part, an enum member or a plain string).
class QueueOrder(StrEnum):
    FIFO = "fifo"  # priority, then submit time
    LAS = "las"  # priority, then attained-service level (least attained service first)


class PreemptMode(StrEnum):
    NONE = "none"
    PRIORITY = "priority"  # a higher priority class preempts a lower one
    LAS = "las"  # a job at a lower service level preempts one at a higher level (same class)


@dataclass(frozen=True)
class QueuePolicy:
    """A named combination of parts.

    order: a queue order's name (``QueueOrder`` for the built-in ones); quotas: enforce guarantees /
    burst limits; reclaim: take lent capacity back; preempt: a victim choice's name (``PreemptMode``);
    admission: an admission check's name (empty: ``quotas`` when ``quotas`` is on, else ``open``)
    checkpoint: victims that are checkpointable are suspended (progress kept) instead of killed
    defragment: move checkpointable jobs to gather a blocked job's GPUs on one node (``Scheduler``)
    """

    name: str
    order: QueueOrder | str = QueueOrder.FIFO
    quotas: bool = False
    reclaim: bool = False
    preempt: PreemptMode | str = PreemptMode.NONE
    checkpoint: bool = False
    aging_seconds: float = 0.0  # every this long in the queue raises a job one level (0: off)
    las_thresholds: tuple[float, ...] = (3600.0 * 1, 3600.0 * 10)  # GPU-seconds per level
    protect_after: int = 2  # preempted this many times within protect_window ...
    protect_window: float = 6 * 3600.0
    protect_for: float = 6 * 3600.0  # ... is protected from preemption this long
    min_run_seconds: float = 0.0  # a job (re)started less than this ago is not LAS-preempted (reclaim still may)
    backfill: bool = True  # later jobs may start when the head does not fit
    # Whole-GPU jobs blocked only by scattered free GPUs start after checkpointable single-node jobs
    # of no higher priority move out of their way (SUSPEND, then RESUME elsewhere in the same pass).
    defragment: bool = False
    guarantee_first: bool = False  # within a level, jobs of teams still under their guarantee go first
    borrower_las: bool = False  # a borrowing job may LAS-preempt another team's borrowed capacity
    las_gap: int = 1  # LAS preemption needs the victim this many levels above the job (hysteresis)
    las_keep_guarantee: bool = False  # LAS takes from another team only GPUs it borrows beyond its guarantee
    placement: PlacementOptions = PlacementOptions()
    admission: str = ""

    @property
    def admission_check(self) -> str:
        """The admission check's name: ``admission``, else what ``quotas`` says."""
        return self.admission or ("quotas" if self.quotas else "open")

    @property
    def gang(self) -> bool:
        """Whether a job's pods are placed as one (False: ``kube-default``, each pod where the scorer puts
        it; a replay then schedules them one by one, while the live loop still admits a workload
        whole: ``PlacementOptions.gang``)."""
        return self.placement.gang

    @property
    def reranks_with_service(self) -> bool:
        """Whether the queue order changes as running jobs attain service (a replay re-ranks on ticks)."""
        return QUEUE_ORDERS[self.order].reads_service

    @property
    def reads_service(self) -> bool:
        """Whether a pass reads the attained service of jobs (to order by it or to preempt by it)."""
        return self.reranks_with_service or VICTIM_CHOICES[self.preempt].reads_service

    def __post_init__(self) -> None:
        # strings are accepted where people write policies by hand (YAML, tests); a built-in part's
        # name is stored as its enum member (as before parts had names), another registered part's as given
        for name, enum, registry in (("order", QueueOrder, QUEUE_ORDERS), ("preempt", PreemptMode, VICTIM_CHOICES)):
            value = getattr(self, name)
            _check_named(self.name, name, value, registry)
            if value in {member.value for member in enum}:
                object.__setattr__(self, name, enum(value))
        if self.preempt == PreemptMode.LAS and self.order != QueueOrder.LAS:
            # the job's level (what LAS preemption compares) is the queue order's: under fifo every job
            # is level 0, and LAS preemption would never find a victim
            raise SchedulingError(f"policy {self.name!r}: preempt 'las' needs order 'las' (it has {self.order!r})")
        if self.admission:
            _check_named(self.name, "admission", self.admission, ADMISSION_CHECKS)
            # ``quotas`` also tells the verifier, the victim guards and guarantee-first ordering that
            # guarantees and bursts hold: a built-in check that says otherwise would be refused live
            if (self.admission, self.quotas) in (("open", True), ("quotas", False)):
                raise SchedulingError(f"policy {self.name!r}: admission {self.admission!r} contradicts quotas="
                                      f"{self.quotas}; leave admission empty, or set quotas={not self.quotas}")


def _check_named(policy: str, key: str, value: object, registry: Collection[str]) -> None:
    if value not in registry:
        raise SchedulingError(f"policy {policy!r}: {key} {value!r} is not one of: {', '.join(registry)}")


# FGD with two extensions, measured on the openb trace (docs/scheduling.md): a penalty, in FGD score
# steps per unit, for growing a node's CPU/memory starvation (GPU share free beyond the CPU or memory
# share free: CPU-starved GPUs are stranded GPUs); and equal scores go to the node the pod leaves with
# the least CPU share free, then node order, instead of a random one (chosen from seven tie rules on
# seeds 42-51, confirmed on seeds 1-10, which the choice never saw); keep_clear: see docs/scheduling.md.
GPUWARDEN_PLACEMENT = PlacementOptions(scorer="fgd", cpu_weight=200.0, ties="tightest_cpu", keep_clear=True)

POLICIES: dict[str, QueuePolicy] = {
    "fifo": QueuePolicy("fifo", placement=PlacementOptions(topology=False, scorer="firstfit")),
    "kueue": QueuePolicy("kueue", quotas=True, reclaim=True, checkpoint=False,
                         placement=PlacementOptions(topology=False, scorer="firstfit")),
    "tiresias": QueuePolicy("tiresias", order=QueueOrder.LAS, preempt=PreemptMode.LAS, checkpoint=True,
                            placement=PlacementOptions(topology=False, scorer="firstfit")),
    "gpuwarden": QueuePolicy("gpuwarden", order=QueueOrder.LAS, quotas=True, reclaim=True, preempt=PreemptMode.LAS, checkpoint=True,
                             aging_seconds=24 * 3600.0, min_run_seconds=0.0, guarantee_first=True,
                             borrower_las=True, las_keep_guarantee=True,
                             # level edges 1 GPU-h and 10 GPU-h (Tiresias's): once suspended time counts
                             # as wait, they beat the Gittins-index edges (300 GPU-s, 1 GPU-h, 10 GPU-h)
                             # on the Philly slice in mean JCT, p99 wait and the worst team's guarantee
                             # alike (docs/scheduling.md, bench/bench_queue_pareto.py)
                             las_thresholds=(3600.0, 36000.0), placement=GPUWARDEN_PLACEMENT),
}


# kube-scheduler's default profile, as far as GPU jobs go: PrioritySort (priority, then creation order:
# the fifo order), NodeResourcesFit with its default LeastAllocated scoring over CPU, memory and GPUs,
# DefaultPreemption (a higher priority evicts a lower one; evicted pods restart, nothing is
# checkpointed nor protected from being preempted again), no quotas, and no gang: pods placed one by
# one (in replays a job may hold part of its GPUs while the rest of its pods wait; live, the scheduler
# admits a workload whole).
KUBE_DEFAULT = QueuePolicy("kube-default", preempt=PreemptMode.PRIORITY, protect_after=2**31,
                           placement=PlacementOptions(topology=False, scorer="leastallocated", spot_first=False,
                                                      gang=False))
POLICIES["kube-default"] = KUBE_DEFAULT


def policy_named(name: str) -> QueuePolicy:
    if name not in POLICIES:
        raise SchedulingError(f"unknown queue policy {name!r}; choose from {', '.join(POLICIES)}")
    return POLICIES[name]
