"""The node actions a health finding may lead to, weakest to strongest: what the fault catalogue
(:mod:`gpuwarden.analytics.health.catalogue`) recommends per fault, and what the remediation
planner ranks to keep the strongest per node. One ladder both read; which action a fault gets is
the catalogue's alone."""

from __future__ import annotations

from .vocabulary import ActionKind

# taint: new work prefers other nodes; cordon: no new work lands; drain: the work leaves too.
NODE_ACTIONS: tuple[ActionKind, ...] = (ActionKind.TAINT, ActionKind.CORDON, ActionKind.DRAIN)

# Actions that take a node out of scheduling (what "a cordon" means in the evaluation).
CORDONING_ACTIONS: frozenset[ActionKind] = frozenset({ActionKind.CORDON, ActionKind.DRAIN})


def stronger(action: ActionKind, than: ActionKind | None) -> bool:
    """Whether node action ``action`` is stronger than ``than`` (None: no action yet)."""
    return than is None or NODE_ACTIONS.index(action) > NODE_ACTIONS.index(than)
