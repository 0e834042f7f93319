"""Random clusters for the scheduling invariants (issue 31): hypothesis strategies and the small
in-memory cluster they run on. Data and bookkeeping, no scheduling logic.

A :class:`ClusterSpec` is nodes (whole-GPU, time-sliced or MIG; taints, zones, leaf switches),
teams (in the queue or not: a namespace outside it runs work gpuwarden must never touch) and work
(whole GPUs, time-sliced shares or a MIG profile; gangs, priorities, checkpointable or not, bare
pods, node selectors and tolerations) arriving over rounds and running a few rounds each.

:class:`ModelCluster` carries a round's actions out on that state as the ``Cluster`` protocol says
(stops take effect at once, as in the simulator; the Kubernetes adapter's held starts are exercised
by the fake-API tests), and checks what it holds after every round from its own records, not the
scheduler's: no GPU, MIG instance, share, CPU or memory over-committed; nothing outside the queue
touched; nothing stopped in the round that started it. It never decides anything.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from hypothesis import strategies as st

from gpuwarden.fleet import (Action, ActionKind, ActionResult, ClusterSnapshot, Gpu, GpuRequest, Location, MigInstance,
                             Node, Placement, PriceTier, PriorityClass, Team, Topology, Workload, WorkloadKind,
                             WorkloadPhase, WorkloadState)
from gpuwarden.fleet.node_selection import LabelRequirement

H100 = "NVIDIA H100 80GB HBM3"
START = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
ROUND = timedelta(seconds=60)
MIG_LAYOUTS = {"all-1g.10gb": ("1g.10gb",) * 7, "balanced": ("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb")}
TAINT = "dedicated=infer:NoSchedule"
SUSPENDED_BY = "gpuwarden.io/suspended-by"


@dataclass(frozen=True)
class NodeSpec:
    name: str
    kind: str  # whole | shared | mig
    gpus: int
    replicas: int = 1  # shared: pods per GPU
    layout: str = "all-1g.10gb"  # mig: each GPU's instances
    leaf: str = "leaf-a"
    zone: str = "a"
    tainted: bool = False
    cpu_milli: int = 96000


@dataclass(frozen=True)
class WorkSpec:
    name: str
    team: str
    kind: str  # whole | share | mig
    count: int = 1  # whole GPUs per pod
    pods: int = 1
    priority: str = "normal"
    checkpointable: bool = False
    bare: bool = False
    arrive: int = 0  # round
    runs: int = 3  # rounds it runs once started
    zone: str | None = None  # node selector
    tolerates: bool = False
    profile: str = "1g.10gb"
    cpu_milli: int = 4000


@dataclass(frozen=True)
class ClusterSpec:
    nodes: tuple[NodeSpec, ...]
    teams: tuple[Team, ...]  # the queue's
    outside: tuple[str, ...]  # namespaces that never opted in, running work of their own
    work: tuple[WorkSpec, ...]


@st.composite
def cluster_specs(draw, max_nodes: int = 5, max_work: int = 30) -> ClusterSpec:
    """A cluster that fills up: more work than GPUs, arriving over the first rounds, later arrivals
    often of higher priority or of teams within their guarantee (so that preemption is asked for)."""
    kinds = draw(st.lists(st.sampled_from(["whole", "whole", "shared", "mig"]), min_size=2, max_size=max_nodes))
    nodes = []
    for i, kind in enumerate(kinds):
        gpus = draw(st.sampled_from([1, 2]) if kind == "mig" else st.sampled_from([4, 8, 8]))
        nodes.append(NodeSpec(f"n{i}-{kind}", kind, gpus, replicas=draw(st.sampled_from([2, 4])),
                              layout=draw(st.sampled_from(sorted(MIG_LAYOUTS))), leaf=draw(st.sampled_from(["leaf-a", "leaf-b"])),
                              zone=draw(st.sampled_from(["a", "b"])), tainted=draw(st.booleans()) and i > 0,
                              cpu_milli=draw(st.sampled_from([32000, 96000]))))
    teams = []
    for t in range(draw(st.integers(2, 4))):
        guaranteed = float(draw(st.sampled_from([0, 2, 4, 8, 8])))
        burst = guaranteed + float(draw(st.sampled_from([2, 4, 8, 1000, 1000])))
        teams.append(Team(f"team{t}", guaranteed, burst))
    outside = ("outside",) if draw(st.booleans()) else ()
    work = []
    for w in range(draw(st.integers(8, max_work))):
        arrive = draw(st.sampled_from([0, 0, 0, 1, 2, 3, 4, 6, 8]))
        kind = draw(st.sampled_from(["whole", "whole", "whole", "share", "mig"]))
        pods = draw(st.sampled_from([1, 1, 1, 2, 3])) if kind == "whole" else draw(st.sampled_from([1, 1, 2]))
        work.append(WorkSpec(
            f"w{w}", draw(st.sampled_from([t.name for t in teams] + list(outside))), kind,
            count=draw(st.sampled_from([1, 1, 1, 2, 4, 8])) if kind == "whole" else 1, pods=pods,
            # later arrivals into the full cluster tend to matter more: preemption is asked for
            priority=draw(st.sampled_from(["low", "low", "normal", "high"] if arrive < 2 else ["normal", "high", "high"])),
            checkpointable=draw(st.booleans()), bare=pods == 1 and draw(st.booleans()),
            arrive=arrive, runs=draw(st.integers(2, 10)),
            zone=draw(st.sampled_from([None, None, None, None, "a", "b", "nowhere"])), tolerates=draw(st.booleans()),
            profile=draw(st.sampled_from(["1g.10gb", "1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"])),
            cpu_milli=draw(st.sampled_from([1000, 4000, 16000]))))
    return ClusterSpec(tuple(nodes), tuple(teams), outside, tuple(work))


# -- the cluster it describes -------------------------------------------------------------------------

def fleet_node(spec: NodeSpec) -> Node:
    return Node(spec.name, spec.kind if spec.kind != "whole" else "whole", Location("on-prem"), PriceTier("on-demand"),
                Topology(f"nvl-{spec.name}", spec.leaf, "rack-0"), H100, spec.gpus, spec.cpu_milli, 2**40,
                shares_gpus=spec.kind == "shared")


def fleet_gpus(spec: NodeSpec) -> list[Gpu]:
    out = []
    for g in range(spec.gpus):
        instances = tuple(MigInstance(i + 1, p) for i, p in enumerate(MIG_LAYOUTS[spec.layout])) if spec.kind == "mig" else ()
        out.append(Gpu(f"{spec.name}/gpu-{g}", g, spec.name, H100, mig_enabled=bool(instances), mig_instances=instances))
    return out


@dataclass
class Violations:
    found: list[str] = field(default_factory=list)

    def add(self, text: str) -> None:
        self.found.append(text)


class ModelCluster:
    """The ``Cluster`` a :class:`ClusterSpec` describes, carried forward round by round."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.nodes = {n.name: fleet_node(n) for n in spec.nodes}
        self.node_specs = {n.name: n for n in spec.nodes}
        self.gpus = [g for n in spec.nodes for g in fleet_gpus(n)]
        self.gpu = {g.uuid: g for g in self.gpus}
        self.queue = frozenset(t.name for t in spec.teams)
        self.shared_milli = {n.name: 1000 // n.replicas for n in spec.nodes if n.kind == "shared"}
        self.round = 0
        self.states: dict[str, WorkloadState] = {}
        self.runs_left: dict[str, int] = {}
        self.started_this_round: set[str] = set()
        self.stopped_this_round: set[str] = set()
        self.violations = Violations()
        self.binds = 0
        self.lost_bare = 0
        self.taints = {n.name: (TAINT,) for n in spec.nodes if n.tainted}
        self.labels = {n.name: {"zone": n.zone} for n in spec.nodes}
        self._arrive(0)
        for work in spec.work:  # work outside the queue already runs where it fits, as kube-scheduler put it
            if work.team in spec.outside and work.arrive == 0:
                self._place_outside(work)

    # -- the protocol -------------------------------------------------------------------------------
    def snapshot(self) -> ClusterSnapshot:
        return ClusterSnapshot(
            taken_at=START + self.round * ROUND, nodes=tuple(self.nodes.values()), gpus=tuple(self.gpus),
            workloads=tuple(self.states.values()),
            teams=self.spec.teams,
            taints=self.taints, node_labels=self.labels, queue_namespaces=self.queue)

    def apply(self, action: Action) -> ActionResult:
        key = action.target
        if key.split("/", 1)[0] not in self.queue:
            self.violations.add(f"round {self.round}: {action.kind.value} {key} outside the queue")
        ws = self.states.get(key)
        if ws is None:
            return ActionResult(action, False, "no such workload")
        if action.kind in (ActionKind.BIND, ActionKind.RESUME):
            placements = self._placements(ws, action.params.get("placements", ()))
            if placements is None:
                return ActionResult(action, False, "does not fit what the cluster holds")
            self.states[key] = dataclasses.replace(ws, phase=WorkloadPhase.RUNNING, placements=placements,
                                                   started_at=START + self.round * ROUND,
                                                   annotations={k: v for k, v in ws.annotations.items() if k != SUSPENDED_BY})
            self.started_this_round.add(key)
            self.binds += 1
        elif action.kind in (ActionKind.SUSPEND, ActionKind.PREEMPT):
            if key in self.started_this_round:
                self.violations.add(f"round {self.round}: {key} stopped in the round that started it")
            self.stopped_this_round.add(key)
            notes = {**ws.annotations, SUSPENDED_BY: str(action.params.get("by", "scheduler"))}
            if ws.controller == "Pod":  # a bare pod evicted is gone
                self.lost_bare += 1
                if "last resort" not in action.reason:
                    self.violations.add(f"round {self.round}: bare pod {key} evicted without saying it was the last resort")
                del self.states[key]
            elif action.kind == ActionKind.SUSPEND or ws.workload.checkpointable:
                self.states[key] = dataclasses.replace(ws, phase=WorkloadPhase.SUSPENDED, placements=(), annotations=notes,
                                                       preemptions=ws.preemptions + 1)
            else:
                self.states[key] = dataclasses.replace(ws, phase=WorkloadPhase.PENDING, placements=(), started_at=None,
                                                       preemptions=ws.preemptions + 1)
        return ActionResult(action, True, "done")

    # -- time ---------------------------------------------------------------------------------------
    def next_round(self) -> None:
        """Work that ran its rounds ends; the next round's arrivals come."""
        self.check()
        self.round += 1
        self.started_this_round, self.stopped_this_round = set(), set()
        for key, ws in list(self.states.items()):
            if ws.phase == WorkloadPhase.RUNNING and key.split("/", 1)[0] in self.queue:
                self.runs_left[key] -= 1
                if self.runs_left[key] <= 0:
                    del self.states[key]
        self._arrive(self.round)

    def _arrive(self, round_number: int) -> None:
        for work in self.spec.work:
            if work.arrive == round_number and work.team in self.queue:
                self.states[f"{work.team}/{work.name}"] = self._state(work, WorkloadPhase.PENDING, ())
                self.runs_left[f"{work.team}/{work.name}"] = work.runs

    def _state(self, work: WorkSpec, phase: WorkloadPhase, placements: tuple[Placement, ...]) -> WorkloadState:
        shares = bool(self.shared_milli)
        if work.kind == "mig":
            request, pools = GpuRequest(count=1, mig_profile=work.profile), ()
        elif work.kind == "share":
            milli = min(self.shared_milli.values()) if shares else 500
            request, pools = GpuRequest(count=1, fraction_milli=milli), ("shared",) if shares else ()
        else:
            request, pools = GpuRequest(count=work.count), ("whole",) if shares else ()
        selection = ((LabelRequirement("zone", "In", (work.zone,)),),) if work.zone else ()
        workload = Workload(work.name, work.team, WorkloadKind.TRAINING, work.team, work.team,
                            PriorityClass(work.priority), request, gang_size=work.pods,
                            checkpointable=work.checkpointable, checkpoint_interval_seconds=600.0 if work.checkpointable else None,
                            pools=pools, tolerations=("dedicated",) if work.tolerates else (), node_selection=selection,
                            cpu_milli=work.cpu_milli)
        submitted = START + work.arrive * ROUND
        return WorkloadState(workload, phase, submitted, submitted if placements else None, placements,
                             controller="Pod" if work.bare else "Job")

    def _place_outside(self, work: WorkSpec) -> None:
        """Outside work where it fits (whole GPUs only: the simple case kube-scheduler would take)."""
        if work.kind != "whole":
            return
        used, cpu = self._gpu_use(), self._cpu_use()
        for node in self.node_specs.values():
            if node.kind != "whole" or cpu.get(node.name, 0) + work.cpu_milli * work.pods > node.cpu_milli:
                continue
            free = [g.uuid for g in self.gpus if g.node == node.name and not used.get(g.uuid)]
            if len(free) >= work.count * work.pods:
                placements = tuple(Placement(node.name, uuid) for uuid in free[:work.count * work.pods])
                self.states[f"{work.team}/{work.name}"] = self._state(work, WorkloadPhase.RUNNING, placements)
                return

    def _placements(self, ws: WorkloadState, given) -> tuple[Placement, ...] | None:
        out = []
        taken: set[tuple[str, int]] = {(p.gpu_uuid, p.mig_instance_id) for s in self.states.values() for p in s.placements
                                       if p.mig_instance_id is not None}
        for p in given:
            gpu = self.gpu.get(p["gpu_uuid"])
            if gpu is None:
                return None
            if p.get("mig_profile"):
                free = [i.gpu_instance_id for i in gpu.mig_instances
                        if i.profile == p["mig_profile"] and (gpu.uuid, i.gpu_instance_id) not in taken]
                if not free:
                    self.violations.add(f"round {self.round}: {ws.workload.key} on a {p['mig_profile']} instance of "
                                        f"{gpu.uuid} that is not free")
                    return None
                taken.add((gpu.uuid, free[0]))
                out.append(Placement(p["node"], gpu.uuid, free[0]))
            else:
                out.append(Placement(p["node"], gpu.uuid))
        return tuple(out)

    # -- the checks ------------------------------------------------------------------------------------
    def _gpu_use(self) -> dict[str, int]:
        """Milli-GPU held per GPU (a pod on a GPU that takes no fractions holds it whole)."""
        used: dict[str, int] = {}
        for ws in self.states.values():
            for p in ws.placements:
                if p.mig_instance_id is not None:
                    continue
                node = self.node_specs[p.node]
                milli = ws.workload.gpus.fraction_milli if node.kind == "shared" else 1000
                used[p.gpu_uuid] = used.get(p.gpu_uuid, 0) + milli
        return used

    def _cpu_use(self) -> dict[str, int]:
        """CPU milli held per node: each pod's request on the node its GPUs are on."""
        cpu: dict[str, int] = {}
        for ws in self.states.values():
            per_node: dict[str, int] = {}
            for p in ws.placements:
                per_node[p.node] = per_node.get(p.node, 0) + 1
            for node, slots in per_node.items():
                pods = ws.workload.gang_size * slots / max(len(ws.placements), 1)
                cpu[node] = cpu.get(node, 0) + int(ws.workload.cpu_milli * pods)
        return cpu

    def check(self) -> None:
        """What the cluster holds, from its own records: nothing over-committed."""
        for uuid, milli in self._gpu_use().items():
            gpu = self.gpu[uuid]
            if gpu.mig_enabled or milli > 1000:
                self.violations.add(f"round {self.round}: GPU {uuid} holds {milli} milli-GPU"
                                    + (" on a MIG GPU" if gpu.mig_enabled else ""))
        instances: dict[tuple[str, int], int] = {}
        for ws in self.states.values():
            for p in ws.placements:
                if p.mig_instance_id is not None:
                    instances[(p.gpu_uuid, p.mig_instance_id)] = instances.get((p.gpu_uuid, p.mig_instance_id), 0) + 1
        for (uuid, instance), count in instances.items():
            if count > 1:
                self.violations.add(f"round {self.round}: MIG instance {instance} of {uuid} held {count} times")
        for node, used in self._cpu_use().items():
            if used > self.nodes[node].cpu_milli:
                self.violations.add(f"round {self.round}: node {node} holds {used} of {self.nodes[node].cpu_milli} CPU milli")
