"""Work held out of a scheduling round: what can never start as it stands, with why.

A waiting workload in the queue is held (stays gated, planned by nobody, shown in the queue with
why, its owner told once by :mod:`.queue_publication`) when:
- the cluster could not read its request (``ClusterSnapshot.unreadable``: an unparseable quantity, a
  MIG profile no GPU catalogue knows; it is no workload of the snapshot);
- its team's quota cannot be read (``ClusterSnapshot.refused_teams``: the namespace and annotation);
- it can never start as written (:func:`gpuwarden.scheduling.feasibility.never_fits`: no node offers
  its kind, its selector or affinity selects no such node, their taints are not tolerated, a pod is
  larger than any node it may use, a gang fits under no leaf switch, more than its team's burst).
Holding them out keeps one bad workload from blocking or slowing the rest of the queue (a
never-fitting head would spend the pass's preemption attempts every round).
"""

from __future__ import annotations

from gpuwarden.fleet import ClusterSnapshot, WorkloadPhase
from gpuwarden.scheduling.feasibility import never_fits
from gpuwarden.scheduling.placement import PlacementOptions

WAITING = (WorkloadPhase.PENDING, WorkloadPhase.SUSPENDED)


def screen(snapshot: ClusterSnapshot, options: PlacementOptions, mig_manager: bool = False) -> dict[str, str]:
    """{workload key: why it cannot start as it stands} for the waiting work of ``snapshot``'s queue."""
    held = {key: item.reason for key, item in snapshot.unreadable.items()}
    refused = snapshot.refused_teams
    waiting = [ws for ws in snapshot.workloads if ws.phase in WAITING and snapshot.in_queue(ws.workload.namespace)]
    rest = []
    for ws in waiting:
        why = refused.get(ws.workload.team)
        if why is not None:
            held[ws.workload.key] = f"team {ws.workload.team}'s quota is refused: {why}"
        else:
            rest.append(ws)
    held.update(never_fits(snapshot, rest, options, mig_manager))
    return held
