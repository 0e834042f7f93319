"""scheduling room: pure decisions on an immutable snapshot, and the replays that measure them.

Live (the actuator): ``plan(snapshot) -> Schedule`` (actions + queue with positions and wait
reasons). Engine (``state``, ``quotas``, ``placement``, ``policy``, ``scheduler`` modules; ``engine``
re-exports them): ``State``, ``Job`` (``JobState``), ``NodeState``, ``Quotas`` / ``QuotaSpec``,
``Scheduler`` with named ``POLICIES`` (fifo, kueue, tiresias, gpuwarden) returning ``Decision``s
(``DecisionKind``), ``Statement`` (checkpoint / rollback), ``find_placement``. MIG: ``advise_layouts``, ``MIG_TABLES``. Replays: ``replay_openb``,
``replay_queue``, ``replay_mixed`` modules.
"""

from .engine import (
    ANY_FLAVOUR,
    POLICIES,
    STARTS,
    WAITING,
    Decision,
    DecisionKind,
    FractionMode,
    Job,
    JobState,
    NodeState,
    PlacementOptions,
    PreemptMode,
    QueueOrder,
    QueuePolicy,
    Quotas,
    QuotaSpec,
    Scheduler,
    State,
    Statement,
    find_placement,
    queue_positions,
)
from .errors import QuotaError, SchedulingError, TraceOrderError, UnknownMigProfile
from .mig import MIG_TABLES, LayoutAdvice, advise_layouts, valid_layouts
from .planner import Schedule, actions_for, plan, state_from_snapshot


__all__ = [name for name in dir() if not name.startswith("_")]
