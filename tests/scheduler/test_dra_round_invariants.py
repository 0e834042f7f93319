"""The invariants of live scheduling hold for DRA work (issue 34 item 2): random clusters of nodes
publishing GPUs and MIG devices through DRA, nodes running the device plugin beside the DRA driver,
device-plugin-only nodes, claims other pods already hold, and gated pods whose claims ask GPUs by
kind, count, MIG profile, product and memory, driven round by round through the production round
(``SchedulingRound`` on ``KubeCluster``, the official client over HTTP to the fake API server).

This file plays kube-scheduler's DRA allocator itself (allocating each admitted pod's claim on the
node gpuwarden pinned it to, from the devices the fake's ResourceSlices publish and no claim or
device-plugin pod holds, then binding it) and checks, from the fake's objects, never from
gpuwarden's snapshot:
- every pod admitted is pinned to a node whose free devices of its kind that match its selectors
  cover what it asks, with the other pods admitted there in the same round: the allocation always
  succeeds; never a node that publishes no matching device (a device-plugin-only node);
- no device counted twice: gpuwarden's snapshot lays no two pods on one GPU or MIG instance and no
  node past what it publishes;
- quotas count DRA devices in GPU units (a MIG 1g.10gb device of an A100 is 1/7): a team's allocated
  GPUs in the queue are what its pods' claims hold, and an admission never takes it past its burst;
- a gang is admitted whole, in one round.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from fake_kube_api import CORE, DEFAULT_RESOURCES, RESOURCE, FakeKubeAPI
from fake_kube_dra import A100, DRIVER, H100, dra_node, gpu_device, mig_device, nvidia_classes, resource_slice
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kube_fleet import connect, namespace, node

from gpuwarden.fleet import ClusterSnapshot
from gpuwarden.kube.gates import ADMISSION_GATE, ADMITTED_NODE_ANNOTATION, QUEUE_LABEL, RESERVED_NODES_ANNOTATION
from gpuwarden.scheduler.scheduling_round import RoundOutcome, SchedulingRound

L4 = "NVIDIA L4"
GIB = 1 << 30
MEMORY_GIB = {H100: 80, A100: 80, L4: 24}
# A100 MIG layouts a GPU may have (NVIDIA's mig-parted), and each profile's share of the GPU (compute slices / 7)
MIG_LAYOUTS = {"all-1g": ("1g.10gb",) * 7, "balanced": ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")}
SHARE = {"1g.10gb": 1 / 7, "2g.20gb": 2 / 7, "3g.40gb": 3 / 7}
ROUNDS = 5
OUTSIDE = "outside"  # a namespace not in the queue: its claims and device-plugin pods only hold devices


@dataclass(frozen=True)
class NodeSpec:
    name: str
    kind: str  # h100 | a100 | l4 | mig | both (H100s of DRA and the device plugin on the same GPUs) | plugin
    gpus: int
    layouts: tuple[str, ...] = ()  # mig: each GPU's layout
    claimed: int = 0  # devices held by claims of work outside the queue
    plugin_pods: int = 0  # GPUs held by device-plugin pods (both, plugin)


@dataclass(frozen=True)
class WorkSpec:
    name: str
    team: str
    kind: str  # gpu | h100 | a100 | big | small | mig
    count: int = 1
    profile: str = "1g.10gb"
    pods: int = 1  # > 1: a gang (gpuwarden.io/gang)
    arrive: int = 0
    runs: int = 2


@dataclass(frozen=True)
class DraCluster:
    nodes: tuple[NodeSpec, ...]
    teams: tuple[tuple[str, int, int], ...]  # name, guaranteed, burst
    work: tuple[WorkSpec, ...]


@st.composite
def dra_clusters(draw) -> DraCluster:
    nodes = []
    for i, kind in enumerate(draw(st.lists(st.sampled_from(["h100", "a100", "l4", "mig", "mig", "both", "both", "plugin"]),
                                           min_size=2, max_size=5))):
        gpus = draw(st.integers(1, 2) if kind == "mig" else st.integers(1, 4))
        layouts = tuple(draw(st.sampled_from(sorted(MIG_LAYOUTS))) for _ in range(gpus)) if kind == "mig" else ()
        devices = sum(len(MIG_LAYOUTS[x]) for x in layouts) if kind == "mig" else gpus
        claimed = draw(st.integers(0, devices // 2)) if kind != "plugin" else 0
        room = gpus - claimed
        plugin = draw(st.integers(min(1, room) if kind == "both" else 0, room)) if kind in ("both", "plugin") else 0
        nodes.append(NodeSpec(f"n{i}-{kind}", kind, gpus, layouts, claimed, plugin))
    teams = tuple((f"team{t}", g, g + draw(st.sampled_from([1, 2, 4, 8, 100]))) for t, g in
                  enumerate(draw(st.lists(st.sampled_from([0, 1, 2, 4]), min_size=1, max_size=2))))
    work = []
    for w in range(draw(st.integers(2, 10))):
        kind = draw(st.sampled_from(["gpu", "gpu", "h100", "a100", "big", "small", "mig", "mig"]))
        work.append(WorkSpec(f"w{w}", draw(st.sampled_from([t[0] for t in teams])), kind,
                             count=1 if kind == "mig" else draw(st.integers(1, 3)),
                             profile=draw(st.sampled_from(sorted(SHARE))), pods=draw(st.sampled_from([1, 1, 2])),
                             arrive=draw(st.integers(0, 2)), runs=draw(st.integers(1, 3))))
    return DraCluster(tuple(nodes), teams, tuple(work))


# -- the cluster on the fake API server --------------------------------------------------------------------

def _devices(spec: NodeSpec) -> list[dict]:
    if spec.kind == "mig":
        return [mig_device(spec.name, minor, profile, start) for minor, layout in enumerate(spec.layouts)
                for start, profile in enumerate(MIG_LAYOUTS[layout])]
    product = {"l4": L4, "a100": A100}.get(spec.kind, H100)
    return [gpu_device(spec.name, minor, product, MEMORY_GIB[product]) for minor in range(spec.gpus)]


def _selector(work: WorkSpec) -> tuple[str, str | None]:
    """(device class, CEL) of each pod's claim."""
    attr = f"device.attributes['{DRIVER}']"
    memory = f"device.capacity['{DRIVER}'].memory"
    return {"gpu": ("gpu.nvidia.com", None), "h100": ("gpu.nvidia.com", f"{attr}.productName == '{H100}'"),
            "a100": ("gpu.nvidia.com", f"{attr}.productName == '{A100}'"),
            "big": ("gpu.nvidia.com", f"{memory}.compareTo(quantity('40Gi')) >= 0"),
            "small": ("gpu.nvidia.com", f"{memory}.isLessThan(quantity('32Gi'))"),
            "mig": ("mig.nvidia.com", f"{attr}.profile == '{work.profile}'")}[work.kind]


def _claim(api: FakeKubeAPI, ns: str, name: str, device_class: str, count: int, cel: str | None,
           devices: list[str] = (), pool: str = "", pod: str = "") -> None:
    exactly: dict = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    if cel:
        exactly["selectors"] = [{"cel": {"expression": cel}}]
    status: dict = {}
    if devices:
        status = {"allocation": {"devices": {"results": [{"request": "gpus", "driver": DRIVER, "pool": pool, "device": d}
                                                         for d in devices]}},
                  "reservedFor": [{"resource": "pods", "name": pod, "uid": f"uid-{pod}"}]}
    api.add(RESOURCE, "resourceclaims", {"metadata": {"name": name, "namespace": ns},
                                         "spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}},
                                         "status": status})


def _pod(api: FakeKubeAPI, ns: str, name: str, claim: str | None, node_name: str | None = None, gang: tuple = (),
         plugin_gpus: int = 0) -> None:
    spec: dict = {"containers": [{"name": "main", "image": "trainer", "resources": {
        "limits": {"nvidia.com/gpu": str(plugin_gpus)} if plugin_gpus else {}}}]}
    if claim:
        spec["resourceClaims"] = [{"name": "gpus", "resourceClaimName": claim}]
    if node_name:
        spec["nodeName"] = node_name
    else:
        spec["schedulingGates"] = [{"name": ADMISSION_GATE}]
    labels = {"gpuwarden.io/gang": gang[0], "gpuwarden.io/gang-size": str(gang[1])} if gang else {}
    api.add(CORE, "pods", {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "labels": labels,
                                        "creationTimestamp": "2026-11-30T11:00:00Z"},
                           "spec": spec, "status": {"phase": "Running" if node_name else "Pending"}})


def install(api: FakeKubeAPI, cluster: DraCluster) -> None:
    nvidia_classes(api)
    namespace(api, OUTSIDE)
    for team, guaranteed, burst in cluster.teams:
        namespace(api, team, {QUEUE_LABEL: team}, {"gpuwarden.io/guaranteed-gpus": str(guaranteed),
                                                   "gpuwarden.io/burst-gpus": str(burst)})
    for spec in cluster.nodes:
        if spec.kind == "plugin":
            node(api, spec.name, spec.gpus)
        else:
            dra_node(api, spec.name, allocatable_gpus=spec.gpus if spec.kind == "both" else 0,
                     labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"} if spec.kind == "mig" else None)
            devices = _devices(spec)
            resource_slice(api, spec.name, devices)
            for i, device in enumerate(devices[:spec.claimed]):  # held by work outside the queue
                _claim(api, OUTSIDE, f"{spec.name}-held-{i}", "gpu.nvidia.com" if spec.kind != "mig" else "mig.nvidia.com",
                       1, None, [device["name"]], spec.name, f"{spec.name}-holder-{i}")
                _pod(api, OUTSIDE, f"{spec.name}-holder-{i}", f"{spec.name}-held-{i}", spec.name)
        for i in range(spec.plugin_pods):
            _pod(api, OUTSIDE, f"{spec.name}-plugin-{i}", None, spec.name, plugin_gpus=1)


# -- kube-scheduler's DRA allocator, and the checks ---------------------------------------------------------

@dataclass
class World:
    """What the fake cluster holds, read from its objects."""

    api: FakeKubeAPI
    cluster: DraCluster
    nodes: dict[str, NodeSpec] = field(default_factory=dict)
    work: dict[str, WorkSpec] = field(default_factory=dict)  # pod name -> its work
    bound_at: dict[str, int] = field(default_factory=dict)  # "ns/pod" -> round bound
    violations: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.nodes = {n.name: n for n in self.cluster.nodes}

    def published(self, node_name: str) -> list[dict]:
        return _devices(self.nodes[node_name]) if self.nodes[node_name].kind != "plugin" else []

    def allocated(self) -> dict[tuple[str, str], str]:
        """(pool, device) -> "ns/claim" holding it; a device held twice is a violation."""
        out: dict[tuple[str, str], str] = {}
        for c in self.api.objects(RESOURCE, "resourceclaims"):
            for r in ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", ()):
                key = (r["pool"], r["device"])
                if key in out:
                    self.violations.append(f"device {key} allocated to {out[key]} and {c['metadata']['name']}")
                out[key] = f"{c['metadata']['namespace']}/{c['metadata']['name']}"
        return out

    def plugin_gpus(self, node_name: str) -> int:
        return sum(int(p["spec"]["containers"][0]["resources"].get("limits", {}).get("nvidia.com/gpu", 0))
                   for p in self.api.objects(CORE, "pods") if p["spec"].get("nodeName") == node_name)

    def free(self, node_name: str, work: WorkSpec) -> list[str]:
        """The node's devices of ``work``'s kind that match its selectors, that no claim and no device-plugin
        pod holds (the device plugin does not say which GPUs: a count, taken off the end)."""
        spec, taken = self.nodes[node_name], self.allocated()
        matching = []
        for device in self.published(node_name):
            attrs = device["attributes"]
            kind, product = attrs["type"]["string"], attrs["productName"]["string"]
            memory = int(device["capacity"]["memory"]["value"].removesuffix("Gi"))
            ok = {"gpu": kind == "gpu", "h100": kind == "gpu" and product == H100,
                  "a100": kind == "gpu" and product == A100, "big": kind == "gpu" and memory >= 40,
                  "small": kind == "gpu" and memory < 32,
                  "mig": kind == "mig" and attrs["profile"]["string"] == work.profile}[work.kind]
            if ok and (node_name, device["name"]) not in taken:
                matching.append(device["name"])
        plugin = self.plugin_gpus(node_name) if spec.kind == "both" else 0
        return matching[:max(0, len(matching) - plugin)]

    def held_units(self) -> dict[str, float]:
        """Per team: GPU units its pods hold, were admitted to or are held for (whole GPU 1, a MIG device its share)."""
        out: dict[str, float] = {}
        for p in self.api.objects(CORE, "pods"):
            ns, name = p["metadata"]["namespace"], p["metadata"]["name"]
            notes = p["metadata"].get("annotations") or {}
            work = self.work.get(name)
            # bound, admitted, or held for it while the pods it preempted stop
            if work is None or not (p["spec"].get("nodeName") or notes.get(ADMITTED_NODE_ANNOTATION)
                                    or notes.get(RESERVED_NODES_ANNOTATION)):
                continue
            out[ns] = out.get(ns, 0.0) + (SHARE[work.profile] if work.kind == "mig" else work.count)
        return out

    def arrive(self, round_number: int) -> None:
        for work in self.cluster.work:
            if work.arrive != round_number:
                continue
            device_class, cel = _selector(work)
            for i in range(work.pods):
                pod = f"{work.name}-{i}"
                self.work[pod] = work
                _claim(self.api, work.team, f"{pod}-gpus", device_class, work.count, cel)
                _pod(self.api, work.team, pod, f"{pod}-gpus", gang=(work.name, work.pods) if work.pods > 1 else ())

    def allocate_admitted(self, round_number: int) -> None:
        """kube-scheduler's part: each admitted pod's claim allocated on its pinned node, then the pod bound."""
        admitted = [p for p in self.api.objects(CORE, "pods") if not p["spec"].get("nodeName")
                    and (p["metadata"].get("annotations") or {}).get(ADMITTED_NODE_ANNOTATION)]
        gangs: dict[str, int] = {}
        for p in sorted(admitted, key=lambda p: p["metadata"]["name"]):
            ns, name = p["metadata"]["namespace"], p["metadata"]["name"]
            target, work = p["metadata"]["annotations"][ADMITTED_NODE_ANNOTATION], self.work[name]
            gangs[work.name] = gangs.get(work.name, 0) + 1
            free = self.free(target, work) if target in self.nodes else []
            if len(free) < work.count:
                self.violations.append(f"round {round_number}: {ns}/{name} ({work.kind} x{work.count}"
                                       f"{' ' + work.profile if work.kind == 'mig' else ''}) pinned to {target}, "
                                       f"which has {len(free)} free matching device(s)")
                continue
            _claim(self.api, ns, f"{name}-gpus", *_selector(work)[:1], work.count, _selector(work)[1],
                   free[:work.count], target, name)
            bound = {**p, "spec": {**p["spec"], "nodeName": target}, "status": {"phase": "Running"}}
            self.api.add(CORE, "pods", bound)
            self.bound_at[f"{ns}/{name}"] = round_number
        for gang, count in gangs.items():
            work = next(w for w in self.cluster.work if w.name == gang)
            if count != work.pods:
                self.violations.append(f"round {round_number}: gang {gang} admitted {count} of its {work.pods} pods")

    def finish(self, round_number: int) -> None:
        """Pods that ran their rounds end; a pod gone (ended, evicted) releases its claim, as the claim
        controller deallocates one whose pod is gone."""
        live = set()
        for p in self.api.objects(CORE, "pods"):
            key = f"{p['metadata']['namespace']}/{p['metadata']['name']}"
            work = self.work.get(p["metadata"]["name"])
            if work is not None and key in self.bound_at and round_number - self.bound_at[key] >= work.runs:
                del self.api.store[(CORE, "pods")][(p["metadata"]["namespace"], p["metadata"]["name"])]
            else:
                live.add(key)
        for c in self.api.objects(RESOURCE, "resourceclaims"):
            reserved = [r["name"] for r in (c.get("status") or {}).get("reservedFor", ())]
            if reserved and f"{c['metadata']['namespace']}/{reserved[0]}" not in live:
                del self.api.store[(RESOURCE, "resourceclaims")][(c["metadata"]["namespace"], c["metadata"]["name"])]


def _snapshot_checks(world: World, snapshot: ClusterSnapshot, round_number: int) -> None:
    """No device counted twice in gpuwarden's view: one pod per MIG instance, none past a node's GPUs."""
    whole: dict[str, int] = {}
    instances: set[tuple[str, int]] = set()
    for ws in snapshot.workloads:
        for p in ws.placements:
            if p.mig_instance_id is not None:
                if (p.gpu_uuid, p.mig_instance_id) in instances:
                    world.violations.append(f"round {round_number}: MIG instance {p} counted twice")
                instances.add((p.gpu_uuid, p.mig_instance_id))
            else:
                whole[p.node] = whole.get(p.node, 0) + 1
    for n in snapshot.nodes:
        if whole.get(n.name, 0) > n.gpu_count:
            world.violations.append(f"round {round_number}: {whole[n.name]} whole GPUs laid on {n.name}, "
                                    f"which has {n.gpu_count}")


@pytest.fixture(scope="module")
def server():
    running = FakeKubeAPI().start()
    yield running
    running.stop()


def _drive(server: FakeKubeAPI, tmp_path, cluster: DraCluster) -> World:
    server.store.clear()
    server.requests.clear()
    server.resources = set(DEFAULT_RESOURCES)
    api = server.with_dra()
    install(api, cluster)
    world = World(api, cluster)
    outcomes: list[RoundOutcome] = []
    loop = SchedulingRound(connect(api, tmp_path), on_round=[outcomes.append])
    burst = {team: b for team, _, b in cluster.teams}
    for round_number in range(ROUNDS):
        world.arrive(round_number)
        held_before = world.held_units()
        loop.run_round()
        outcome = outcomes[-1]
        assert not outcome.refused, outcome.refused  # the plan verifier found nothing to refuse
        _snapshot_checks(world, outcome.snapshot, round_number)
        for row in outcome.queue["teams"]:  # gpuwarden's GPU units are what the pods' claims hold (3 places in the queue)
            if row["team"] in burst and abs(row["allocated_gpus"] - held_before.get(row["team"], 0.0)) > 5e-4:
                world.violations.append(f"round {round_number}: team {row['team']} allocated "
                                        f"{row['allocated_gpus']} GPUs in the queue, its claims hold "
                                        f"{held_before.get(row['team'], 0.0)}")
        after = world.held_units()
        for team, units in after.items():
            if units > held_before.get(team, 0.0) + 1e-9 and units > burst[team] + 1e-9:
                world.violations.append(f"round {round_number}: team {team} admitted to {units:.3f} GPUs, "
                                        f"over its burst {burst[team]}")
        world.allocate_admitted(round_number)
        world.finish(round_number)
    return world


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                                    HealthCheck.too_slow])
@given(dra_clusters())
def test_dra_pods_are_pinned_only_where_their_claims_can_be_allocated(server, tmp_path, cluster):
    world = _drive(server, tmp_path, cluster)
    assert not world.violations, "\n".join(world.violations)


def test_the_generator_admits_work_at_all(server, tmp_path):
    """The property is not vacuous: a cluster with room admits and allocates DRA work of each kind."""
    cluster = DraCluster(
        nodes=(NodeSpec("n0-h100", "h100", 4), NodeSpec("n1-l4", "l4", 2), NodeSpec("n2-mig", "mig", 1, ("balanced",)),
               NodeSpec("n3-both", "both", 4, claimed=1, plugin_pods=2), NodeSpec("n4-plugin", "plugin", 8)),
        teams=(("team0", 8, 100),),
        work=(WorkSpec("big", "team0", "big", 3), WorkSpec("small", "team0", "small", 2),
              WorkSpec("mig", "team0", "mig", profile="3g.40gb"), WorkSpec("gang", "team0", "h100", 1, pods=2)))
    world = _drive(server, tmp_path, cluster)
    assert not world.violations, "\n".join(world.violations)
    assert set(world.bound_at) == {"team0/big-0", "team0/small-0", "team0/mig-0", "team0/gang-0", "team0/gang-1"}
