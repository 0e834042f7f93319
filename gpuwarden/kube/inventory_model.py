"""What the workload reader keeps while it reads a cluster: the inventory a ``KubeCluster`` acts
with (how each workload is run: its controller, pods, gated pods, reservations) and the pods and
Job of one workload as read (:mod:`.inventory_workloads` fills both)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from gpuwarden.fleet import workload_key
from gpuwarden.fleet.node_selection import NodeSelection

from .admission import PodView
from .api import Json
from .dra import DraInventory
from .inventory_nodes import PodRequest


@dataclass
class Inventory:
    """What the cluster needs beyond the snapshot to act: how each workload is run."""

    controller: dict[str, str] = field(default_factory=dict)  # "ns/name" -> Job, JobSet, Workload, Pod, ...
    names: dict[str, str] = field(default_factory=dict)  # key -> the owner's name, where not the key's
    pods: dict[str, list[str]] = field(default_factory=dict)
    gated: dict[str, list[PodView]] = field(default_factory=dict)  # gated pods, in name order
    gang_size: dict[str, int] = field(default_factory=dict)  # pods a pending workload needs admitted
    objects: dict[str, dict[tuple[str, str], dict[str, str]]] = field(default_factory=dict)  # (kind, name) -> annotations
    unschedulable: dict[str, str] = field(default_factory=dict)  # admitted, not bound in time: kube-scheduler's reason
    refused: dict[str, str] = field(default_factory=dict)  # left out: why its request cannot be read
    queue_namespaces: set[str] = field(default_factory=set)
    refused_teams: dict[str, str] = field(default_factory=dict)  # team -> the namespace whose quota annotation is wrong
    ignored: dict[str, str] = field(default_factory=dict)  # "ns/pod" -> why the scheduler leaves it alone
    suspended_by: dict[str, str] = field(default_factory=dict)  # key -> gpuwarden.io/suspended-by
    reserved: dict[str, list[str]] = field(default_factory=dict)  # key -> nodes held for its pods since a resume
    stop_seconds: dict[str, float] = field(default_factory=dict)  # node -> the longest grace period of its GPU pods
    kueue_workload: dict[str, str] = field(default_factory=dict)  # "ns/name" -> Kueue Workload name
    pdbs: int = 0
    priority_classes: dict[str, int] = field(default_factory=dict)
    workload_priority_classes: dict[str, int] = field(default_factory=dict)
    kueue: bool = False
    dra: DraInventory = field(default_factory=DraInventory)  # GPUs allocated by DRA: slices, claims, what was skipped


@dataclass
class Group:
    """The pods (and Job) of one workload, as read."""

    controller: str
    namespace: str
    name: str
    request: PodRequest = PodRequest()
    held: list[tuple[Json, str]] = field(default_factory=list)  # (pod, node it holds)
    gated: list[PodView] = field(default_factory=list)
    pod_names: list[str] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    objects: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    created: list[datetime] = field(default_factory=list)
    started: list[datetime] = field(default_factory=list)
    priority: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[str, ...] = ()
    node_selection: NodeSelection = ()
    size: int | None = None  # the pods it will have, where its owner says
    suspended: bool = False
    cpu_milli: int = 0  # what one pod asks besides GPUs
    memory_bytes: int = 0
    waiting: bool = False  # a pod of it waits behind gpuwarden's gate

    @property
    def key(self) -> str:
        return workload_key(self.namespace, self.name)
