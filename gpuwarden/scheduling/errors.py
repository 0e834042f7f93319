"""Errors the scheduling room raises for input a user can get wrong.

``SchedulingError`` is a ``FleetValueError`` so the CLI prints it as one line and exits 2.
Placement *failures* (a pod that does not fit) are not errors: they are recorded with a reason.
"""

from __future__ import annotations

from gpuwarden.fleet import FleetValueError
from gpuwarden.fleet.mig_geometry import UnknownMigProfile as UnknownMigProfile  # a fact about hardware, raised in fleet


class SchedulingError(FleetValueError):
    """Bad scheduling input: an unknown MIG profile, a negative quota, an out-of-order trace..."""


class QuotaError(SchedulingError):
    pass


class TraceOrderError(SchedulingError):
    pass


class PlanRefused(RuntimeError):
    """A pass's plan broke an invariant (:mod:`.verify`): a bug in the engine, never a user's input
    (so not a ``SchedulingError``: the CLI reports it as a bug, exit 1)."""
