"""The plan verifier: the rules no plan may break, written once and checked on every plan before
anything of it is carried out (the live round, the demo, every replay).

A plan is refused whole when it would:
- **over-commit** a node, per resource kind: a whole GPU (1000 milli), each MIG profile's instances
  on a GPU, a time-sliced GPU's shares, CPU, memory. Stopping work still holds what it holds: a
  start that is not held back for its victims (``deferred``: admitted once they are gone) must fit
  beside them, and every start must fit once they are gone;
- take a team **below its guarantee** to serve another team's borrowing (a victim's team ends under
  its guarantee while the team it made room for ends over its own);
- take a team **past its burst** limit;
- start a workload **in part** (every pod of it, or none; where ``kube-default`` binds a job's pods
  one by one, a replay hands the scheduler each pod as a workload of its own, so the rule holds);
- **stop what it starts** (admitted and evicted in one round), or stop work that is not running;
- act **outside its scope**: on work in a namespace not in the queue (or of a team whose quota was
  refused).

It reads a :class:`Ledger` (what the cluster holds before the plan) and the plan's :class:`Step` s, so
the live round (a ``ClusterSnapshot`` and fleet ``Action`` s) and the replays (the engine's
``State`` and ``Decision`` s) are judged by the same rules; :mod:`.ledgers` builds both. It never
trusts the engine's own bookkeeping: usage is summed again from where each workload's pods are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from .state import MILLI

EPSILON = 1e-6
INVARIANTS = ("over-commit", "guarantee", "burst", "gang", "victim", "scope")
Amount = int | str  # milli-GPU on a GPU, or the MIG profile of one instance
GpuKey = tuple[str, "str | int"]  # (node, the GPU's id there: a UUID live, an index in a replay)
Slot3 = tuple[str, "str | int", Amount]  # (node, GPU, amount)


@dataclass(frozen=True)
class Violation:
    invariant: str  # one of INVARIANTS
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.detail}"


@dataclass(frozen=True)
class Holder:
    """A workload as the rules read it: its team, size, where its pods are (running) and what one pod asks."""

    key: str
    team: str
    gpus: float  # whole-GPU equivalents of the whole workload, as quotas count them
    pods: int
    slots: tuple[Slot3, ...] = ()  # (node, GPU, amount): empty unless it runs
    cpu_milli: int = 0  # per pod
    memory_bytes: int = 0
    slots_per_pod: int = 1
    in_scope: bool = True


@dataclass
class Ledger:
    """What the cluster holds before the plan."""

    # every GPU, and the instances of a MIG GPU (None: a GPU offered whole or by shares)
    gpus: dict[GpuKey, tuple[str, ...] | None] = field(default_factory=dict)
    shared_nodes: frozenset[str] = frozenset()  # nodes whose GPUs take fractions (time-sliced)
    host: dict[str, tuple[int, int]] = field(default_factory=dict)  # node -> CPU milli, memory bytes for workloads
    running: dict[str, Holder] = field(default_factory=dict)
    waiting: dict[str, Holder] = field(default_factory=dict)
    teams: dict[str, tuple[float, float]] = field(default_factory=dict)  # team -> (guaranteed, burst)
    # GPUs each team holds, where the ledger lists only the running work a plan touches (a replay's);
    # None: summed from ``running``
    used: dict[str, float] | None = None


@dataclass(frozen=True)
class Step:
    """One part of a plan: a start (BIND / RESUME) or a stop (SUSPEND / PREEMPT / EVICT)."""

    start: bool
    key: str
    slots: tuple[Slot3, ...] = ()
    deferred: bool = False  # held for its victims, admitted once they are gone
    reserved: bool = False  # admitted onto GPUs the ledger already counts as its own
    beneficiary: str = ""  # a stop: the workload it makes room for


# -- the rules -----------------------------------------------------------------------------------------

def violations(ledger: Ledger, steps: Sequence[Step], in_scope: Callable[[str], bool] = lambda key: True,
               ) -> list[Violation]:
    """Every rule ``steps`` break on ``ledger``; [] for a plan that may be carried out."""
    found: list[Violation] = []
    starts = [s for s in steps if s.start]
    stops = [s for s in steps if not s.start]
    started: set[str] = set()
    stopped: set[str] = set()
    for step in steps:
        holder = _started(ledger, step, stopped) if step.start else ledger.running.get(step.key)
        if not in_scope(step.key) or (holder is not None and not holder.in_scope):
            found.append(Violation("scope", f"{'start' if step.start else 'stop'} of {step.key}, outside the queue"))
        if step.start:
            started.add(step.key)
            if holder is None:
                found.append(Violation("gang", f"start of {step.key}, which waits for nothing the cluster holds"))
            elif not step.reserved and len(step.slots) != holder.pods * holder.slots_per_pod:
                found.append(Violation("gang", f"{step.key} started with {len(step.slots)} of its "
                                               f"{holder.pods * holder.slots_per_pod} GPU slot(s)"))
        else:
            stopped.add(step.key)
            if step.key in started:
                found.append(Violation("victim", f"{step.key} is stopped in the round that started it"))
            elif step.key not in ledger.running:
                found.append(Violation("victim", f"{step.key} is stopped, but it does not run"))
    moved = {s.key for s in stops} & {s.key for s in starts}  # stopped and started again: moved
    found += _over_commit(ledger, starts, stops)
    found += _quota(ledger, steps, moved)
    return found


def _over_commit(ledger: Ledger, starts: list[Step], stops: list[Step]) -> list[Violation]:
    """Usage is summed again, from where each workload's pods are, on the nodes the plan starts work on."""
    stopped = {s.key for s in stops}
    placed = [_placed(ledger, s) for s in starts if not s.reserved]
    touched = {node for holder in placed for node, _, _ in holder.slots}
    if not touched:
        return []
    near = [h for h in ledger.running.values() if any(node in touched for node, _, _ in h.slots)]
    before = _usage(ledger, near)
    victims = _usage(ledger, (h for h in near if h.key in stopped))
    now_added = _usage(ledger, (h for h, s in zip(placed, (s for s in starts if not s.reserved), strict=True)
                                if not s.deferred))
    all_added = _usage(ledger, placed)
    found: list[Violation] = []
    for when, added, less in (("while its victims still stop", now_added, None),
                              ("once its victims stopped", all_added, victims)):
        for resource, amount in added.items():
            total = before.get(resource, 0) + amount - (less.get(resource, 0) if less else 0)
            capacity = _capacity(ledger, resource)
            if total > capacity + EPSILON:
                found.append(Violation("over-commit", f"{_name(resource)} would hold {_fmt(total)} of "
                                                      f"{_fmt(capacity)} {when}"))
    return found


def _quota(ledger: Ledger, steps: Sequence[Step], moved: set[str]) -> list[Violation]:
    """Guarantees and bursts, in the plan's order (each start follows the stops made for it, as a
    pass decides them): at each start, no team it took work from is below its guarantee while the
    starting team is over its own, and the starting team is within its burst. Work moved (stopped
    and started again in the plan) keeps its team's GPUs throughout."""
    used: dict[str, float] = dict(ledger.used) if ledger.used is not None else {}
    if ledger.used is None:
        for held in ledger.running.values():
            if held.in_scope:
                used[held.team] = used.get(held.team, 0.0) + held.gpus
    taken: dict[str, list[Holder]] = {}  # beneficiary -> the victims stopped for it so far
    found: list[Violation] = []
    for step in steps:
        if not step.start:
            victim = ledger.running.get(step.key)
            if victim is not None and step.key not in moved:
                used[victim.team] = used.get(victim.team, 0.0) - victim.gpus
                taken.setdefault(step.beneficiary, []).append(victim)
            continue
        started = _started(ledger, step, moved)
        if started is None or step.reserved or step.key in moved:
            continue
        team = started.team
        used[team] = used.get(team, 0.0) + started.gpus
        guaranteed, burst = ledger.teams.get(team, (0.0, float("inf")))
        if used[team] > burst + EPSILON:
            found.append(Violation("burst", f"{step.key} would take team {team} to {_fmt(used[team])} GPUs, past its "
                                            f"burst limit {_fmt(burst)}"))
        if used[team] <= guaranteed + EPSILON:
            continue  # within its own guarantee: it may take back what others borrow
        for victim in taken.get(step.key, ()):
            theirs = ledger.teams.get(victim.team, (0.0, 0.0))[0]
            if victim.team != team and used.get(victim.team, 0.0) < theirs - EPSILON:
                found.append(Violation("guarantee", f"{victim.key} stopped for {step.key}: team {victim.team} would "
                                                    f"hold {_fmt(used.get(victim.team, 0.0))} GPUs, below its "
                                                    f"guarantee {_fmt(theirs)}, for team {team}'s borrowing "
                                                    f"({_fmt(used[team])} of its {_fmt(guaranteed)})"))
    return found


def _started(ledger: Ledger, step: Step, stopped: set[str]) -> Holder | None:
    """The workload a start starts: one that waits, one the plan stopped before (moved), or a
    reserved one (it runs on the GPUs held for it)."""
    if step.reserved or (step.key not in ledger.waiting and step.key in stopped):
        return ledger.running.get(step.key)
    return ledger.waiting.get(step.key)


def _placed(ledger: Ledger, step: Step) -> Holder:
    """The started workload with the plan's slots."""
    holder = ledger.waiting.get(step.key) or ledger.running.get(step.key) or Holder(step.key, "", 0.0, 1)
    return Holder(holder.key, holder.team, holder.gpus, holder.pods, step.slots, holder.cpu_milli,
                  holder.memory_bytes, holder.slots_per_pod, holder.in_scope)


Resource = tuple[str, str, "str | int", str]  # ("gpu", node, GPU, "" | profile) or ("cpu" | "memory", node, "", "")


def _usage(ledger: Ledger, holders: Iterable[Holder]) -> dict[Resource, float]:
    used: dict[Resource, float] = {}
    for holder in holders:
        pods_on: dict[str, int] = {}
        for node, gpu, amount in holder.slots:
            pods_on[node] = pods_on.get(node, 0) + 1
            if isinstance(amount, str):
                key: Resource = ("gpu", node, gpu, amount)
                used[key] = used.get(key, 0) + 1
            elif amount:  # 0: a pod asking CPU and memory only
                # a GPU that takes no fractions is held whole by any pod on it
                taken = amount if node in ledger.shared_nodes else max(amount, MILLI)
                key = ("gpu", node, gpu, "")
                used[key] = used.get(key, 0) + taken
        total = len(holder.slots)
        for node, count in pods_on.items():
            pods = holder.pods * count / total
            for kind, per_pod in (("cpu", holder.cpu_milli), ("memory", holder.memory_bytes)):
                if per_pod:
                    used[(kind, node, "", "")] = used.get((kind, node, "", ""), 0) + per_pod * pods
    return used


def _capacity(ledger: Ledger, resource: Resource) -> float:
    kind, node, gpu, profile = resource
    if kind in ("cpu", "memory"):
        cpu, memory = ledger.host.get(node, (0, 0))
        return cpu if kind == "cpu" else memory
    if (node, gpu) not in ledger.gpus:
        return 0  # no such GPU
    layout = ledger.gpus[(node, gpu)]
    if profile:
        return layout.count(profile) if layout else 0
    return 0 if layout else MILLI


def _name(resource: Resource) -> str:
    kind, node, gpu, profile = resource
    if kind == "gpu":
        return f"GPU {gpu} of {node}" + (f" ({profile} instances)" if profile else " (milli-GPU)")
    return f"node {node} ({kind})"


def _fmt(value: float) -> str:
    return f"{value:g}" if abs(value) < 1e6 else f"{value:.3g}"
