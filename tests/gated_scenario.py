"""Builders for issue 21's scenario on the fake cluster: data, not logic (kueue's ``MakeWorkload``).

``build(seed)`` makes, deterministically from the seed:
- 3 teams: namespaces labelled ``gpuwarden.io/queue=<team>`` (and ``gpuwarden.io/team``, which the
  snapshot reader read before the queue label) with ``gpuwarden.io/guaranteed-gpus`` /
  ``gpuwarden.io/burst-gpus`` annotations; PriorityClasses low / normal / high;
- 8 nodes x 8 H100: ``gpu-00``..``gpu-04`` whole GPUs, ``gpu-05`` time-sliced (``nvidia.com/gpu.replicas=4``,
  capacity ``nvidia.com/gpu.shared`` 32, ``nvidia.com/gpu`` 0, as the device plugin's
  ``renameByDefault`` publishes it), ``gpu-06`` MIG ``all-1g.10gb`` and ``gpu-07`` MIG ``all-balanced``
  (``nvidia.com/mig-<profile>`` capacity, ``nvidia.com/mig.config`` label, ``nvidia.com/gpu`` 0);
  topology labels ``gpuwarden.io/leaf-switch`` (leaf-a: gpu-00..03, leaf-b: gpu-04..07) and
  ``nvidia.com/gpu.clique`` (one NVLink domain per HGX node); ``install_cluster(api, racks=N)``
  repeats that rack N times for a bench (quotas scaled; ``build``'s counts are parameters);
- about 200 pods in Jobs submitted over the first hour: gangs of 4 x 8 GPUs (parallelism 4,
  Indexed), MIG pods, time-sliced pods, single-GPU (and a few 2/4/8-GPU) jobs; priority classes;
  some checkpointable (``gpuwarden.io/checkpointable: "true"``); every pod template carries the
  gate ``gpuwarden.io/admission`` (``gated=False`` leaves it to the webhook) and its run time in
  ``fake.gpuwarden.io/run-seconds`` (read by ``tests/fake_job_controller.py``).
``FakeCluster`` runs the stand-ins on one virtual clock with graceful pod deletion:
``step(seconds)`` advances it, then the JobSet and Job controllers, the ResourceClaim controller (where
the API serves DRA) and kube-scheduler (with the kubelet's start and end of pods) each take one pass.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from fake_job_controller import RUN_SECONDS_ANNOTATION, FakeJobController, FakeJobSetController
from fake_kube_api import CORE, FakeKubeAPI, epoch_seconds
from fake_kube_dra_alloc import FakeResourceClaimController
from fake_kube_scheduler import FakeKubeScheduler, StepResult
from kube_fleet import namespace, priority_class

from gpuwarden.kube.gates import ADMISSION_GATE, QUEUE_LABEL  # the names a user writes in manifests
H100 = "NVIDIA-H100-80GB-HBM3"
START_SECONDS = epoch_seconds("2026-12-01T08:00:00Z")
TEAMS = {"research": (16, 40), "vision": (16, 32), "nlp": (8, 24)}  # team -> (guaranteed, burst) GPUs
PRIORITY_CLASSES = {"low": 100, "normal": 1000, "high": 10000}
SUBMITTER = "alice@example.com"
# H100 80GB MIG layouts of NVIDIA's default mig-parted config, per GPU
MIG_LAYOUTS = {"all-1g.10gb": {"1g.10gb": 7}, "all-balanced": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}


@dataclass
class ScenarioJob:
    manifest: dict
    submit_at_seconds: float  # after START_SECONDS

    @property
    def key(self) -> str:
        return f"{self.manifest['metadata']['namespace']}/{self.manifest['metadata']['name']}"

    @property
    def pods(self) -> int:
        return int(self.manifest["spec"]["parallelism"])


@dataclass
class Scenario:
    seed: int
    jobs: list[ScenarioJob]
    submitted: set[str] = field(default_factory=set)

    @property
    def pods(self) -> int:
        return sum(j.pods for j in self.jobs)

    def arrive(self, manifest: dict, at_seconds: float) -> ScenarioJob:
        """One more Job submitted ``at_seconds`` after the start: e.g. the issue's high-priority arrival into a full
        cluster, ``job_manifest("urgent", "research", count=8, parallelism=4, priority="high")``."""
        job = ScenarioJob(manifest, at_seconds)
        self.jobs.append(job)
        self.jobs.sort(key=lambda j: (j.submit_at_seconds, j.key))
        return job


def gpu_node(api: FakeKubeAPI, name: str, index: int, capacity: dict[str, int], labels: dict[str, str]) -> None:
    """An HGX H100 node: 8 GPUs as ``capacity`` publishes them, topology labels by position (4 nodes a leaf switch)."""
    rack, slot = divmod(index, 8)
    leaf = ("leaf-a" if slot < 4 else "leaf-b") if rack == 0 else f"leaf-{rack}-{'a' if slot < 4 else 'b'}"
    resources = {"cpu": "190", "memory": "1900Gi", "pods": "110", **{k: str(v) for k, v in capacity.items()}}
    api.add(CORE, "nodes", {
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "nvidia.com/gpu.product": H100, "nvidia.com/gpu.count": "8",
            "gpuwarden.io/leaf-switch": leaf, "nvidia.com/gpu.clique": f"clique-{index}",
            **labels}},
        "spec": {},
        "status": {"capacity": resources, "allocatable": resources}})


def install_cluster(api: FakeKubeAPI, racks: int = 1) -> None:
    """Nodes, team namespaces and PriorityClasses (what an administrator set up before the scenario).
    ``racks`` > 1 repeats the 8-node rack (and scales the teams' quotas) for a bench: 125 racks = 1,000 nodes."""
    width = max(2, len(str(8 * racks - 1)))
    for team, (guaranteed, burst) in TEAMS.items():
        namespace(api, team, {QUEUE_LABEL: team, "gpuwarden.io/team": team},
                  {"gpuwarden.io/guaranteed-gpus": str(guaranteed * racks), "gpuwarden.io/burst-gpus": str(burst * racks)})
    for name, value in PRIORITY_CLASSES.items():
        priority_class(api, name, value)
    for rack in range(racks):
        for slot in range(8):
            i = 8 * rack + slot
            name = f"gpu-{i:0{width}d}"
            if slot < 5:
                gpu_node(api, name, i, {"nvidia.com/gpu": 8}, {})
            elif slot == 5:
                gpu_node(api, name, i, {"nvidia.com/gpu": 0, "nvidia.com/gpu.shared": 32},
                         {"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing",
                          "nvidia.com/gpu.product": f"{H100}-SHARED"})
            else:
                layout = "all-1g.10gb" if slot == 6 else "all-balanced"
                capacity = {f"nvidia.com/mig-{p}": 8 * n for p, n in MIG_LAYOUTS[layout].items()}
                gpu_node(api, name, i, {"nvidia.com/gpu": 0, **capacity},
                         {"nvidia.com/mig.config": layout, "nvidia.com/mig.strategy": "mixed",
                          "nvidia.com/mig.config.state": "success"})


def job_manifest(name: str, team: str, resource: str = "nvidia.com/gpu", count: int = 1, parallelism: int = 1,
                 priority: str = "normal", checkpointable: bool = False, run_seconds: float = 3600,
                 gated: bool = True, suspend: bool = False, grace_seconds: int = 30) -> dict:
    """A Job of ``parallelism`` pods each asking ``count`` of ``resource``; a gang when parallelism > 1."""
    gpus = count if resource == "nvidia.com/gpu" else 1
    requests = {resource: str(count), "cpu": str(min(8 * gpus, 64)), "memory": f"{64 * gpus}Gi"}
    annotations = {RUN_SECONDS_ANNOTATION: str(int(run_seconds))}
    if checkpointable:
        annotations["gpuwarden.io/checkpointable"] = "true"
    pod_spec: dict = {"restartPolicy": "Never", "priorityClassName": priority, "terminationGracePeriodSeconds": grace_seconds,
                      "containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                                      "resources": {"requests": requests, "limits": {resource: str(count)}}}]}
    if gated:
        pod_spec["schedulingGates"] = [{"name": ADMISSION_GATE}]
    spec: dict = {"parallelism": parallelism, "completions": parallelism, "suspend": suspend, "backoffLimit": 0,
                  "template": {"metadata": {"labels": {"app": name}, "annotations": annotations}, "spec": pod_spec}}
    if parallelism > 1:
        spec["completionMode"] = "Indexed"
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": team, "annotations": dict(annotations)}, "spec": spec}


def build(seed: int = 0, gated: bool = True, gangs: int = 5, mig_pods: int = 36, shared_pods: int = 32,
          single_jobs: int = 112) -> Scenario:
    """The issue's workload mix (200 pods by default), deterministic from ``seed``."""
    rng = random.Random(seed)
    teams = list(TEAMS)
    kinds = (["gang"] * gangs + ["mig"] * mig_pods + ["shared"] * shared_pods + ["single"] * single_jobs)
    jobs = []
    for i, kind in enumerate(kinds):
        team = rng.choice(teams)
        priority = rng.choices(list(PRIORITY_CLASSES), weights=(3, 5, 2))[0]
        run = rng.randrange(600, 7200, 60)
        checkpointable = rng.random() < 0.4
        if kind == "gang":
            manifest = job_manifest(f"gang-{i:03d}", team, count=8, parallelism=4, priority=priority,
                                    checkpointable=checkpointable, run_seconds=run, gated=gated)
        elif kind == "mig":
            profile = rng.choices(["1g.10gb", "2g.20gb", "3g.40gb"], weights=(4, 1, 1))[0]
            manifest = job_manifest(f"mig-{i:03d}", team, f"nvidia.com/mig-{profile}", priority=priority,
                                    run_seconds=run, gated=gated)
        elif kind == "shared":
            manifest = job_manifest(f"shared-{i:03d}", team, "nvidia.com/gpu.shared", priority=priority,
                                    run_seconds=run, gated=gated)
        else:
            gpus = rng.choices([1, 2, 4, 8], weights=(10, 2, 1, 1))[0]
            manifest = job_manifest(f"train-{i:03d}", team, count=gpus, priority=priority,
                                    checkpointable=checkpointable, run_seconds=run, gated=gated)
        jobs.append(ScenarioJob(manifest, float(rng.randrange(0, 3600, 10))))
    jobs.sort(key=lambda j: (j.submit_at_seconds, j.key))
    return Scenario(seed, jobs)


def submit(api: FakeKubeAPI, manifest: dict, user: str = SUBMITTER) -> tuple[int, dict]:
    """POST a Job as a user would (through the API's rules)."""
    ns = manifest["metadata"]["namespace"]
    return api.handle("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", "application/json",
                      json.dumps(manifest).encode(), user=user)


def submit_due(api: FakeKubeAPI, scenario: Scenario, now: float) -> list[str]:
    """POST the scenario's Jobs whose time has come (``now`` in epoch seconds); their keys in order."""
    done = []
    for job in scenario.jobs:
        if job.key not in scenario.submitted and START_SECONDS + job.submit_at_seconds <= now:
            status, answer = submit(api, job.manifest)
            if status != 201:
                raise RuntimeError(f"submitting {job.key}: {status} {answer.get('message')}")
            scenario.submitted.add(job.key)
            done.append(job.key)
    return done


@dataclass
class VirtualClock:
    now: float = START_SECONDS

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeCluster:
    """The fake API server with its stand-in controllers on one virtual clock."""

    api: FakeKubeAPI
    clock: VirtualClock = field(default_factory=VirtualClock)

    def __post_init__(self) -> None:
        self.api.clock = self.clock
        self.api.graceful_deletion = True  # deleted pods hold their GPUs for their grace period, as on a cluster
        self.jobsets = FakeJobSetController(self.api)
        self.jobs = FakeJobController(self.api)
        self.claims = FakeResourceClaimController(self.api)  # at work only where the API serves DRA
        self.scheduler = FakeKubeScheduler(self.api)

    def step(self, seconds: float = 0.0) -> StepResult:
        self.clock.now += seconds
        self.jobsets.step(self.clock.now)
        self.jobs.step(self.clock.now)
        self.claims.step()
        return self.scheduler.step()
