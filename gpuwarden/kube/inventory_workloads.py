"""GPU pods and Jobs of a Kubernetes cluster grouped into fleet workloads.

A workload is a native gang (a PodGroup with a gang policy, :mod:`.podgroups`, where the reader is
given the cluster's ``PodGroups``: ``minCount`` pods), one owner (Job, JobSet, PyTorchJob, another
controller) or, where pods carry the ``gpuwarden.io/gang`` label, that gang (``gpuwarden.io/gang-size``
pods): :mod:`.inventory_membership` says which. A gated pod whose PodGroup cannot be read is refused
with the reason (a bound one still holds its GPUs). Each pod is one of:

- *gated* by gpuwarden (``gpuwarden.io/admission``): waits for gpuwarden's admission;
- *held*: bound to a node (``spec.nodeName``), or admitted by gpuwarden (annotation
  ``gpuwarden.io/admitted-node``) and not bound yet: it holds that node's capacity until it is bound;
- *timed out*: admitted more than ``timeout_seconds`` ago and still not bound. It is left out (its
  capacity released) and named in ``Inventory.unschedulable`` with kube-scheduler's reason (the
  pod's ``PodScheduled=False`` condition message);
- *kube-scheduler's*: Pending, not gated by gpuwarden, not admitted by it (another scheduler's or
  Kueue's gate, or no gate at all in a namespace gpuwarden does not queue): left out.

A workload with gated pods is PENDING, its ``gang_size`` the pods it still needs: its PodGroups' ``minCount``, a
Job's ``parallelism`` (no more than the completions left), the gang-size label, else the pods seen, less the pods
it holds. A gang missing pods is pending at its full size; admitting it is refused until every pod is there (``KubeCluster``
BIND). A workload holding pods and waiting for more (a Job's replacement pod) holds its running pods under
``<name>~held`` and queues the rest under its name; a suspended Job whose pods are still stopping holds them
there too, marked ``stopping`` (no victim). A pod whose GPU request cannot be read (an unparseable quantity,
an unknown MIG profile, shares no node offers) leaves its workload out, named in ``Inventory.refused`` with
the reason; waiting work of the queue among them is listed (:meth:`WorkloadReader.unreadable`). A pod gated by
hand in a namespace outside the queue is left alone and named in ``Inventory.ignored``. Bound pods asking no
GPU are summed per node (:meth:`WorkloadReader.node_overhead`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime

from gpuwarden.fleet import (GpuRequest, Placement, PriorityClass, UnreadableWorkload, Workload, WorkloadKind, WorkloadPhase,
                             WorkloadState, workload_key)
from gpuwarden.fleet import NO_WHOLE_GPU_POOL
from gpuwarden.fleet.mig_geometry import UnknownMigProfile

from .api import Json
from .admission import pod_view
from .gates import (ADMISSION_GATE, QUEUE_LABEL, RESERVED_AT_ANNOTATION, RESERVED_NODES_ANNOTATION, CHECKPOINT_ANNOTATION,
                    ADMITTED_AT_ANNOTATION, ADMITTED_NODE_ANNOTATION, PRIORITY_CLASS_ANNOTATION, SUSPENDED_BY_ANNOTATION,
                    gated_by_gpuwarden)
from .dra_nodes import SPARE_DRA_ONLY
from .inventory_membership import NATIVE_CONTROLLER, gang_size_label, membership
from .inventory_model import Group, Inventory
from .inventory_nodes import SHARED_GPU, Layout, NodeOffer, PodRequest, overfull_nodes
from .inventory_pods import (_tolerations, _unscheduled_reason, cpu_memory_request, gpu_request, node_selection,
                             parse_time, priority_of)
from .podgroups import PodGroups

log = logging.getLogger("gpuwarden.kube")

KIND_LABEL = "gpuwarden.io/workload-kind"
DEFAULT_GRACE_SECONDS = 30.0  # a pod's terminationGracePeriodSeconds when it states none
HELD_SUFFIX = "~held"  # the running part of a workload that also waits for admission
TRAINING_CONTROLLERS = ("Job", "JobSet", "Workload", "PyTorchJob", "Gang", NATIVE_CONTROLLER)


class WorkloadReader:
    """Reads pods then Jobs, then builds the snapshot's workloads and fills the inventory."""

    def __init__(self, inventory: Inventory, now: datetime, timeout_seconds: float,
                 previous: Mapping[str, Workload] | None = None, pod_groups: PodGroups | None = None) -> None:
        self.inventory = inventory
        self.pod_groups = pod_groups  # the cluster's PodGroups (native gangs); None: not read
        self._native: dict[str, dict[str, int]] = {}  # key -> its native gangs' minCount, by gang name
        # the last snapshot's workloads: one equal to this round's is handed out again (the same
        # object), so a loop keeps the engine's job for it instead of building it anew each round
        self.previous = previous or {}
        self.now = now
        self.timeout_seconds = timeout_seconds
        self.groups: dict[str, Group] = {}
        self.teams_by_ns: Mapping[str, str] = {}
        self._overhead: dict[str, tuple[int, int]] = {}
        self._laid_past: set[str] = set()
        self._holding: set[str] = set()  # workloads whose reservation holds GPUs for pods still to admit

    def _refuse(self, key: str, reason: str) -> None:
        self.inventory.refused.setdefault(key, reason)

    def add_pod(self, pod: Json) -> None:
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        namespace, labels = str(meta.get("namespace", "")), dict(meta.get("labels") or {})
        member = membership(pod, self.pod_groups)
        controller, name = member.controller, member.name
        key = workload_key(namespace, name)
        node = spec.get("nodeName") or None
        gated = node is None and gated_by_gpuwarden(pod)
        if gated and namespace not in self.inventory.queue_namespaces:
            # the gate written by hand where nobody opted in: never admitted by gpuwarden, said once
            self.inventory.ignored[f"{namespace}/{meta['name']}"] = (
                f"carries the {ADMISSION_GATE} gate in namespace {namespace}, which has no {QUEUE_LABEL} label: "
                "gpuwarden leaves it alone (label the namespace to queue it, or remove the gate)")
            return
        try:
            request = self.inventory.dra.pod_request(pod, gpu_request(spec))
        except (ValueError, UnknownMigProfile) as error:
            self._refuse(key, f"pod {meta['name']}: {error}")
            if gated:
                self._identify(self._group(key, controller, namespace, name, PodRequest(), pod, labels), pod)
            return
        if request.empty:
            if node is not None:  # CPU and memory that GPU work on this node cannot have
                cpu, memory = cpu_memory_request(spec)
                used = self._overhead.get(str(node), (0, 0))
                self._overhead[str(node)] = (used[0] + cpu, used[1] + memory)
            return
        if gated and member.problem:
            self._refuse(key, f"pod {meta['name']}: {member.problem}")
        notes = dict(meta.get("annotations") or {})
        if gated:
            place = "gated"
        elif node is None and notes.get(ADMITTED_NODE_ANNOTATION):
            admitted_at = parse_time(notes.get(ADMITTED_AT_ANNOTATION))
            if admitted_at is not None and (self.now - admitted_at).total_seconds() >= self.timeout_seconds:
                self.inventory.unschedulable[key] = f"pod {meta['name']} not bound {self.timeout_seconds:g} s after " \
                                                    f"admission to {notes[ADMITTED_NODE_ANNOTATION]}: {_unscheduled_reason(pod)}"
                return
            place, node = "held", notes[ADMITTED_NODE_ANNOTATION]
        elif node is None:
            return  # kube-scheduler's (or Kueue's) to place
        else:
            place = "held"
        group = self._group(key, controller, namespace, name, request, pod, labels)
        if member.gang is not None:  # the gangs it is made of: their minCounts together, whatever its owner says
            gangs = self._native.setdefault(key, {})
            gangs[member.gang[0]] = member.gang[1]
            group.size = sum(gangs.values())
        self._identify(group, pod)
        started = parse_time(status.get("startTime"))
        if started:
            group.started.append(started)
        group.priority = group.priority or spec.get("priorityClassName")
        if place == "gated":
            group.gated.append(pod_view(pod))
            if request.dra_nodes is not None and group.request.dra_nodes is None:  # read first from a running pod
                group.request, group.node_selection = request, node_selection(pod, request)
        else:
            group.held.append((pod, str(node)))
            grace = spec.get("terminationGracePeriodSeconds")
            grace_seconds = DEFAULT_GRACE_SECONDS if grace is None else float(grace)
            self.inventory.stop_seconds[str(node)] = max(self.inventory.stop_seconds.get(str(node), 0.0), grace_seconds)

    def _group(self, key: str, controller: str, namespace: str, name: str, request: PodRequest, pod: Json,
               labels: Mapping[str, str]) -> Group:
        group = self.groups.get(key)
        if group is None:
            spec = pod.get("spec") or {}
            cpu, memory = cpu_memory_request(spec)
            group = self.groups[key] = Group(controller, namespace, name, request, labels=dict(labels),
                                             tolerations=_tolerations(pod), node_selection=node_selection(pod, request),
                                             cpu_milli=cpu, memory_bytes=memory)
            if controller == "Gang":
                group.size = self._gang_size(key, labels)
        return group

    @staticmethod
    def _identify(group: Group, pod: Json) -> None:
        """The pod's name, annotations and creation time on its workload (what Events and annotations need)."""
        meta = pod["metadata"]
        notes = dict(meta.get("annotations") or {})
        group.pod_names.append(str(meta["name"]))
        group.annotations.update(notes)
        group.objects[("Pod", str(meta["name"]))] = notes
        created = parse_time(meta.get("creationTimestamp"))
        if created:
            group.created.append(created)
        if not (pod.get("spec") or {}).get("nodeName") and gated_by_gpuwarden(pod):
            group.waiting = True

    def node_overhead(self) -> dict[str, tuple[int, int]]:
        """Per node: (CPU milli, memory bytes) of bound pods that ask no GPU."""
        return dict(self._overhead)

    def unreadable(self, team_of: Mapping[str, str]) -> dict[str, UnreadableWorkload]:
        """Waiting work in the queue whose request cannot be read, by key (shown in the queue, told once)."""
        out = {}
        for key, why in sorted(self.inventory.refused.items()):
            group = self.groups.get(key)
            if group is None or group.namespace not in self.inventory.queue_namespaces or not (
                    group.waiting or group.suspended):
                continue
            self.inventory.controller[key] = group.controller
            self.inventory.pods[key] = list(group.pod_names)
            self.inventory.objects[key] = group.objects
            if group.name != key.split("/", 1)[1]:
                self.inventory.names[key] = group.name
            out[key] = UnreadableWorkload(group.namespace, group.name, team_of.get(group.namespace, group.namespace),
                                          why, min(group.created) if group.created else None)
        return out

    def _gang_size(self, key: str, labels: Mapping[str, str]) -> int | None:
        size, problem = gang_size_label(labels)
        if problem:
            self._refuse(key, problem)
        return size

    def add_job(self, job: Json) -> None:
        """A Job: the size of its workload, its annotations; a suspended Job without pods is a workload."""
        meta, spec, status = job["metadata"], job.get("spec") or {}, job.get("status") or {}
        key = workload_key(meta.get("namespace", ""), meta["name"])
        parallelism = int(spec["parallelism"]) if spec.get("parallelism") is not None else 1
        if spec.get("completions") is not None:
            parallelism = min(parallelism, max(0, int(spec["completions"]) - int(status.get("succeeded") or 0)))
        notes = dict(meta.get("annotations") or {})
        group = self.groups.get(key)
        if group is not None:
            group.annotations.update(notes)
            created = parse_time(meta.get("creationTimestamp"))
            if created:  # submitted with its Job: pods made again after an eviction keep its place
                group.created.append(created)
            group.objects[("Job", meta["name"])] = notes
            group.suspended = bool(spec.get("suspend"))  # its pods are being terminated by the Job controller
            if group.controller == "Job" and key not in self._native:  # a native gang's minCount outranks it
                group.size = max(1, parallelism)
            return
        if not spec.get("suspend") and not notes.get(RESERVED_NODES_ANNOTATION):
            return  # a running Job's pods say all; a resumed one holds its reservation before its pods exist
        template = spec.get("template") or {}
        try:
            pod_spec = template.get("spec") or {}
            request = self.inventory.dra.template_request(str(meta.get("namespace", "")), pod_spec,
                                                          gpu_request(pod_spec))
        except (ValueError, UnknownMigProfile) as error:
            self._refuse(key, f"Job {meta['name']}: {error}")
            request = PodRequest()
        if request.empty and key not in self.inventory.refused:
            return
        created = parse_time(meta.get("creationTimestamp"))
        cpu, memory = cpu_memory_request(template.get("spec") or {})
        self.groups[key] = Group("Job", str(meta.get("namespace", "")), str(meta["name"]), request,
                                 annotations=notes, objects={("Job", meta["name"]): notes},
                                 created=[created] if created else [], priority=(template.get("spec") or {}).get(
                                     "priorityClassName"), size=max(1, parallelism), suspended=bool(spec.get("suspend")),
                                 tolerations=_tolerations(template), node_selection=node_selection(template, request),
                                 cpu_milli=cpu, memory_bytes=memory)

    def add_kueue_annotations(self, key: str, notes: Mapping[str, str]) -> None:
        if key in self.groups:
            self.groups[key].annotations.update(notes)

    # -- building --------------------------------------------------------------------------------
    def build(self, teams_by_ns: Mapping[str, str], offers: Mapping[str, NodeOffer],
              kueue: Callable[[Group], Json | None]) -> list[WorkloadState]:
        """The workloads. A reservation on a node others have filled since (a pod outside the queue
        that kube-scheduler bound there while the reserved pods were being made) is dropped: that
        workload waits again and is planned anew, rather than admitted onto GPUs that are taken."""
        out = self._build(teams_by_ns, offers, kueue, frozenset())
        full = overfull_nodes(out, offers) | self._laid_past
        # a hold still waiting for pods (one whose pods are all admitted holds nothing: its stale
        # annotation lapses by itself)
        taken = {key for key in self._holding if full & set(self.inventory.reserved[key])}
        if not taken:
            return out
        for key in sorted(taken):
            log.warning("%s: the GPUs held for it on %s were taken by pods gpuwarden does not schedule; planned anew",
                        key, ", ".join(sorted(full & set(self.inventory.reserved[key]))))
            del self.inventory.reserved[key]
        return self._build(teams_by_ns, offers, kueue, frozenset(taken))

    def _build(self, teams_by_ns: Mapping[str, str], offers: Mapping[str, NodeOffer],
               kueue: Callable[[Group], Json | None], unreserved: frozenset[str]) -> list[WorkloadState]:
        self.teams_by_ns = teams_by_ns
        for table in (self.inventory.gated, self.inventory.gang_size):  # a second pass keeps none of the first's
            table.clear()
        shared_replicas = [o.replicas for o in offers.values() if o.replicas > 1]
        shared_pools = tuple(sorted({o.node.pool for o in offers.values() if o.replicas > 1}))
        whole_pools = tuple(sorted({o.node.pool for o in offers.values() if o.replicas == 1}))
        layout = Layout(offers)
        self._laid_past = layout.overfull  # nodes whose pods needed a MIG instance of theirs none was left of
        self._holding = set()
        # nodes where pods are still stopping (a suspended Job's, or being deleted): a reservation
        # there is admitted only once they are gone, or kube-scheduler would make room itself
        stopping = {node for g in self.groups.values() for pod, node in g.held
                    if g.suspended or pod["metadata"].get("deletionTimestamp")}
        out = []
        for key, group in sorted(self.groups.items()):
            if key in self.inventory.refused:
                continue
            if group.request.shares and not shared_replicas:
                self._refuse(key, f"asks for {SHARED_GPU}; no node offers time-sliced GPUs "
                                  "(label nvidia.com/gpu.replicas > 1)")
                continue
            w = kueue(group)
            # a time-sliced node offers shares only: whole-GPU work keeps to the other pools (to none where
            # every GPU node is time-sliced)
            pools = shared_pools if group.request.shares else (whole_pools or (NO_WHOLE_GPU_POOL,)) if (
                group.request.count and shared_pools) else ()
            milli = 1000 // min(shared_replicas) if group.request.shares else 1000
            suspended = group.suspended or (w is not None and (w.get("spec") or {}).get("active") is False)
            if suspended:
                self.inventory.gang_size[key] = group.size or max(1, len(group.held) + len(group.gated))
                out.append(self._state(key, group, w, WorkloadPhase.SUSPENDED, group.size or max(
                    1, len(group.held) + len(group.gated)), (), pools, milli))
                if group.held:  # its pods are still stopping: their GPUs stay taken until they are gone
                    placements = tuple(p for pod, node in group.held for p in layout.lay(node, group.request, pod))
                    out.append(self._state(key + HELD_SUFFIX, group, w, WorkloadPhase.RUNNING, len(group.held),
                                           placements, pools, milli, stopping=True))
                continue
            waiting_for = self._reservation(group) if key not in unreserved else []
            if waiting_for:  # resumed: its pods are admitted onto the nodes the plan held for them
                self._holding.add(key)
                held = tuple(p for pod, node in group.held for p in layout.lay(node, group.request, pod))
                reserved = tuple(p for node in waiting_for for p in layout.lay(node, group.request))
                self.inventory.gated[key] = sorted(group.gated, key=lambda p: p.name)
                self.inventory.gang_size[key] = len(waiting_for)
                # every pod made by its controller, and nothing of others still stopping there: admit them now
                ready = len(group.gated) >= len(waiting_for) and not stopping & set(waiting_for)
                out.append(self._state(key, group, w, WorkloadPhase.RUNNING, len(group.held) + len(waiting_for),
                                       held + reserved, pools, milli, reserved=reserved if ready else ()))
                continue
            held_key = key + HELD_SUFFIX if group.gated else key
            if group.held:
                placements = tuple(p for pod, node in group.held for p in layout.lay(node, group.request, pod))
                # every pod of it on its way out (evicted, deleted): it holds its GPUs until gone, no victim again
                leaving = all(pod["metadata"].get("deletionTimestamp") for pod, _ in group.held)
                out.append(self._state(held_key, group, w, WorkloadPhase.RUNNING, len(group.held), placements,
                                       pools, milli, stopping=leaving))
            if group.gated:
                need = max(1, (group.size or len(group.held) + len(group.gated)) - len(group.held))
                self.inventory.gated[key] = sorted(group.gated, key=lambda p: p.name)
                self.inventory.gang_size[key] = need
                out.append(self._state(key, group, w, WorkloadPhase.PENDING, need, (), pools, milli))
        return out

    def _reservation(self, group: Group) -> list[str]:
        """The nodes still held for a resumed workload's pods that are not admitted yet (its
        ``gpuwarden.io/reserved-nodes`` less the nodes its admitted pods hold); [] when it has none,
        every pod is admitted, or the reservation is older than the admission timeout."""
        nodes = [n for n in (group.annotations.get(RESERVED_NODES_ANNOTATION) or "").split(",") if n]
        at = parse_time(group.annotations.get(RESERVED_AT_ANNOTATION))
        if not nodes or at is None or (self.now - at).total_seconds() >= self.timeout_seconds:
            return []
        self.inventory.reserved[group.key] = list(nodes)  # on the objects until a suspend or the lapse clears it
        running = [pod for pod, _ in group.held if not pod["metadata"].get("deletionTimestamp")]
        if not group.gated and group.size is not None and len(running) >= group.size:
            return []  # every pod of it admitted (there, or elsewhere when planned anew): nothing left to hold
        if any(RESERVED_NODES_ANNOTATION in p.annotations for p in group.gated):
            # held for its gated pods themselves (a start after its victims stop): the running pods
            # of the gang are not from it
            return nodes
        for pod, node in group.held:  # pods admitted from it; a pod still stopping from before holds its own GPUs
            if node in nodes and not pod["metadata"].get("deletionTimestamp"):
                nodes.remove(node)
        return nodes

    def _state(self, key: str, group: Group, w: Json | None, phase: WorkloadPhase, gang_size: int,
               placements: tuple[Placement, ...], pools: tuple[str, ...], milli: int,
               stopping: bool = False, reserved: tuple[Placement, ...] = ()) -> WorkloadState:
        inventory = self.inventory
        inventory.controller[key] = group.controller
        inventory.pods[key] = list(group.pod_names)
        inventory.objects[key] = group.objects
        if w is not None:
            inventory.kueue_workload[key] = w["metadata"]["name"]
        if group.annotations.get(SUSPENDED_BY_ANNOTATION):
            inventory.suspended_by[key] = group.annotations[SUSPENDED_BY_ANNOTATION]
        namespace, name = key.split("/", 1)
        if name != group.name:
            inventory.names[key] = group.name
        notes = group.annotations
        kind_label = group.labels.get(KIND_LABEL)
        kind = WorkloadKind(kind_label) if kind_label in {k.value for k in WorkloadKind} else (
            WorkloadKind.TRAINING if group.controller in TRAINING_CONTROLLERS else
            WorkloadKind.NOTEBOOK if group.controller == "Pod" else WorkloadKind.INFERENCE)
        checkpointable = str(notes.get(CHECKPOINT_ANNOTATION, "")).lower() == "true"
        priority_name = (w.get("spec") or {}).get("priorityClassName") if w is not None else group.priority
        request = group.request
        gpus = (GpuRequest(count=1, mig_profile=request.mig) if request.mig else
                GpuRequest(count=1, fraction_milli=milli) if request.shares else GpuRequest(count=request.count))
        workload = Workload(
            name=name, namespace=namespace, kind=kind, team=self.teams_by_ns.get(namespace, namespace),
            project=namespace, priority_class=priority_of(priority_name), gpus=gpus, gang_size=gang_size,
            checkpointable=checkpointable, checkpoint_interval_seconds=600.0 if checkpointable else None,
            tolerations=group.tolerations, pools=pools, node_selection=group.node_selection,
            spare_nodes=SPARE_DRA_ONLY if request.spare_dra_only else (),
            cpu_milli=group.cpu_milli, memory_bytes=group.memory_bytes)
        kept = self.previous.get(key)
        workload = kept if kept == workload and kept is not None else workload
        started = group.started if phase != WorkloadPhase.PENDING else []
        return WorkloadState(
            workload=workload, phase=phase, submitted_at=min(group.created) if group.created else self.now,
            started_at=min(started) if started else None, placements=placements, controller=group.controller,
            pods=tuple(group.pod_names), annotations=notes,
            priority_override=self._override(key, notes, priority_name), stopping=stopping, reserved=reserved,
        )  # attained_gpu_seconds stays 0: the scheduler loop fills it from metrics

    def _override(self, key: str, notes: Mapping[str, str], priority_name: str | None) -> str | None:
        wanted = notes.get(PRIORITY_CLASS_ANNOTATION)
        if wanted:
            allowed = [p.value for p in PriorityClass]
            if wanted in allowed:
                return wanted
            log.warning("%s: annotation %s=%r is not one of: %s; ignored", key, PRIORITY_CLASS_ANNOTATION, wanted,
                        ", ".join(allowed))
        return priority_name if priority_name and priority_of(priority_name).value != priority_name else None

