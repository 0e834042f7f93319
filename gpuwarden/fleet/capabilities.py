"""What a ``Cluster`` may offer beyond ``snapshot()`` and ``apply()``, each a small protocol, and
the table of action handlers every ``Cluster`` implementation keeps.

A caller asks ``isinstance(cluster, WorkloadNotices)`` (the protocols are runtime-checkable) and
then calls typed methods; it never probes a cluster for attributes. Every fact a round decides on
is in :class:`~gpuwarden.fleet.protocols.ClusterSnapshot`; these are only ways to tell people.

- :class:`EventSink`: an Event where the operator looks (the remediation circuit breaker opened).
- :class:`ConditionSink`: each GPU node's health published for other tools (node conditions).
- :class:`WorkloadNotices`: Events and annotations on a workload (its place in the queue, why it
  waits).
- :class:`TeamNotices`: an Event for a team (its quota could not be read).

Kubernetes offers all four; the simulated fleet offers none (its queue is read from the
scheduler's endpoint).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeVar, runtime_checkable

from .vocabulary import Action, ActionKind, Finding


@runtime_checkable
class EventSink(Protocol):
    """Where remediation tells people it stopped (circuit breaker)."""

    def record_event(self, reason: str, message: str) -> None: ...


@runtime_checkable
class ConditionSink(Protocol):
    """Where each GPU node's health is published for other tools; the conditions written."""

    def publish_conditions(self, health: Mapping[str, Sequence[Finding]]) -> int: ...


@runtime_checkable
class WorkloadNotices(Protocol):
    """Events and annotations on a workload (``namespace/name``); each returns the writes made and
    never raises (the queue's news never stops a round)."""

    def record_workload_event(self, target: str, reason: str, message: str, type: str = "Normal") -> int: ...  # noqa: A002 - the Event's field

    def annotate_workload(self, target: str, values: Mapping[str, str | None]) -> int: ...


@runtime_checkable
class TeamNotices(Protocol):
    """An Event for a team whose quota was refused (0 where the cluster knows no object to put it on)."""

    def record_team_event(self, team: str, reason: str, message: str, type: str = "Warning") -> int: ...  # noqa: A002 - the Event's field


Cluster_ = TypeVar("Cluster_")
Result_ = TypeVar("Result_")


class IncompleteHandlerTable(TypeError):
    """A ``Cluster`` implementation left an ``ActionKind`` without a handler or a reason: a bug."""


def handler_table(owner: str, table: Mapping[ActionKind, Callable[[Cluster_, Action], Result_] | str]
                  ) -> Mapping[ActionKind, Callable[[Cluster_, Action], Result_] | str]:
    """``table`` checked complete (at import, where the class is defined): every ``ActionKind`` has
    a handler (applying one action on the cluster), or a sentence saying why ``owner`` never does it."""
    missing = [kind.value for kind in ActionKind if kind not in table]
    if missing:
        raise IncompleteHandlerTable(f"{owner}: no handler (nor a reason) for {', '.join(missing)}")
    return dict(table)
