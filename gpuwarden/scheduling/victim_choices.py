"""Victim choices: the registered parts that say which running jobs a blocked job may preempt.

``VICTIM_CHOICES[name]`` is a class a scheduler makes once with its policy (``QueuePolicy.preempt``
names it). Reclaim of lent capacity and the quota guards are the search's own (``victims``), whatever
the choice; a choice adds the victims a job takes for itself:

- ``none``: none.
- ``priority``: running jobs of a lower priority class.
- ``las``: those, and jobs of its own class at least ``las_gap`` service levels above it that ran at
  least ``min_run_seconds``; of another team (with quotas) only capacity that team can give.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from typing import Protocol

from .parts import Registry
from .quotas import Admission
from .state import Job

VictimRule = Callable[[Job], bool]  # whether a running job may be a victim


class ChoiceKnobs(Protocol):
    """What a victim choice reads of its policy (``QueuePolicy`` has it)."""

    @property
    def las_thresholds(self) -> tuple[float, ...]: ...
    @property
    def las_gap(self) -> int: ...
    @property
    def min_run_seconds(self) -> float: ...
    @property
    def quotas(self) -> bool: ...
    @property
    def borrower_las(self) -> bool: ...


class VictimChoice:
    """``none``, and the base of every victim choice."""

    preempts = False  # whether it ever names a victim (else only reclaim looks for victims)
    outranks = False  # whether a higher priority class preempts a lower one
    reads_service = False  # whether it compares attained service (replays then keep it current)

    def __init__(self, policy: ChoiceKnobs) -> None:
        self.edges = tuple(sorted(policy.las_thresholds))
        self.gap, self.min_run = policy.las_gap, policy.min_run_seconds
        self.quotas, self.borrower_las = policy.quotas, policy.borrower_las

    def floor(self, level: int) -> int:
        """The least service level a victim of the job's own class must be at, from the job's ``level``."""
        return 0

    def may_have_victims(self, priority: int, lowest_priority: int, top_level: int, floor: int) -> bool:
        """Whether any running job can be a victim, from bounds over them (``lowest_priority``, ``top_level``):
        False skips the scan. Here: any choice that names victims may have some (a new choice need not
        give a bound to be right, only to be fast)."""
        return self.preempts

    def same_class(self, job: Job, now: float, floor: int, verdict: Admission,
                   keeps_guarantee: VictimRule) -> VictimRule | None:
        """The rule for a running job that ``job`` neither outranks nor reclaims from (None: never a
        victim); ``keeps_guarantee``: whether evicting it leaves its team at or above its guarantee."""
        return None


class PriorityPreemption(VictimChoice):
    """``priority``: a higher priority class preempts a lower one."""

    preempts = outranks = True

    def may_have_victims(self, priority: int, lowest_priority: int, top_level: int, floor: int) -> bool:
        return lowest_priority < priority


class LasPreemption(PriorityPreemption):
    """``las``: priority, and a job at a lower service level preempts one at a higher level (same class)."""

    reads_service = True

    def floor(self, level: int) -> int:
        return level + self.gap  # hysteresis: not a neighbour one level up

    def may_have_victims(self, priority: int, lowest_priority: int, top_level: int, floor: int) -> bool:
        return lowest_priority < priority or top_level >= floor

    def same_class(self, job: Job, now: float, floor: int, verdict: Admission,
                   keeps_guarantee: VictimRule) -> VictimRule | None:
        edges, min_run, priority, team = self.edges, self.min_run, job.priority, job.team
        # LAS takes from another team only what the team can give: never below its guarantee to
        # serve another team's borrowing, and not for a borrowing job unless borrower_las
        guarded, borrowing_blocks = self.quotas, verdict == Admission.BORROW and not self.borrower_las

        def demotes(victim: Job) -> bool:
            # a job that (re)started less than min_run_seconds ago is not demoted (reclaim of a
            # guarantee and higher priority classes still may preempt it)
            if not (victim.priority == priority and bisect_right(edges, victim.attained) >= floor
                    and now - (victim.started if victim.started is not None else now) >= min_run):
                return False
            return not (guarded and victim.team != team and (borrowing_blocks or not keeps_guarantee(victim)))
        return demotes


VICTIM_CHOICES: Registry[type[VictimChoice]] = Registry("victim choice", "preempt")
VICTIM_CHOICES.register("none", VictimChoice)
VICTIM_CHOICES.register("priority", PriorityPreemption)
VICTIM_CHOICES.register("las", LasPreemption)
