"""The scheduling engine, one import away: state, quotas, placement, policies and the scheduler.

The engine lives in small modules, one job each: ``state`` (the working copy and its statement),
``quotas`` (guarantees, lending and reclaim), ``placement`` (where a job fits), ``policy`` (named
queue policies) and ``scheduler`` (one pass that returns decisions). This module keeps the old
import path working.
"""

from __future__ import annotations

from .placement import FractionMode, PlacementOptions, find_placement
from .policy import POLICIES, PreemptMode, QueueOrder, QueuePolicy, policy_named
from .quotas import ANY_FLAVOUR, Admission, Quotas, QuotaSpec
from .scheduler import STARTS, Decision, DecisionKind, QueueEntry, Scheduler, queue_positions
from .state import MILLI, WAITING, Job, JobState, NodeState, Slot, State, Statement

__all__ = [
    "ANY_FLAVOUR", "MILLI", "POLICIES", "STARTS", "WAITING", "Admission", "Decision", "DecisionKind",
    "FractionMode", "Job", "JobState", "NodeState", "PlacementOptions", "PreemptMode", "QueueEntry", "QueueOrder",
    "QueuePolicy", "Quotas", "QuotaSpec", "Scheduler", "Slot", "State", "Statement", "find_placement",
    "policy_named", "queue_positions",
]
