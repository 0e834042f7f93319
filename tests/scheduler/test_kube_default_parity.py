"""Issue 32 item 1: ``kube-default`` decides what kube-scheduler alone decides, pod for pod.

One small slice on one fake cluster (four GPU nodes of different GPU, CPU and memory sizes; Jobs of
1-4 GPUs and varied CPU and memory, three priority classes, one Job of two pods, a few that cannot
fit), played twice over the same virtual timeline of two waves (the second after some of the first
wave ended):

- **kube-scheduler alone**: the Jobs' pods are made ungated, and the kube-scheduler stand-in
  (``tests/fake_kube_scheduler.py`` with ``scoring="LeastAllocated"``: NodeResourcesFit, its default
  LeastAllocated score on cpu, memory and ``nvidia.com/gpu``, equal scores to the first node in name
  order) binds them, one pass per wave;
- **gpuwarden's live loop running kube-default**: the same Jobs with gpuwarden's gate; at each wave
  one ``SchedulingRound(KubeCluster, policy="kube-default")`` over the official client admits them
  (ungated, pinned to a node), and the stand-in binds what was admitted.

Every pod must land on the same node on both sides (or stay pending on both). The comparison is by
(Job, index of its pod in name order), so a pod that moves, or a pod one side binds and the other
does not, fails it. Neither side preempts here (what misfits has the lowest priority).
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from fake_job_controller import JOB_NAME_LABEL
from fake_kube_api import CORE, FakeKubeAPI
from gated_scenario import FakeCluster, job_manifest, submit
from kube_fleet import namespace, priority_class

from gpuwarden.fleet.clock import ModelClock
from gpuwarden.kube import KubeApi, KubeCluster, load_client
from gpuwarden.kube.gates import QUEUE_LABEL
from gpuwarden.scheduler.scheduling_round import SchedulingRound

TEAM = "research"
# name -> (GPUs, CPU cores, memory GiB); capacity = allocatable (the reader reads capacity, the scheduler allocatable)
NODES = {"node-a": (8, 64, 512), "node-b": (8, 128, 1024), "node-c": (4, 96, 256), "node-d": (4, 32, 768)}
# name, GPUs per pod, pods, CPU cores, memory GiB, priority, run seconds; submitted one second apart
WAVE_1 = [
    ("small-1", 1, 1, 4, 32, "normal", 1800),
    ("small-2", 1, 1, 4, 32, "normal", 7200),
    ("cpu-heavy", 1, 1, 48, 64, "normal", 7200),
    ("mem-heavy", 2, 1, 8, 600, "high", 1800),
    ("pair", 2, 2, 16, 128, "normal", 7200),
    ("quad", 4, 1, 16, 128, "high", 7200),
    ("late-1", 1, 1, 2, 16, "low", 7200),
    ("too-big", 8, 1, 8, 64, "low", 7200),
    ("mid", 2, 1, 24, 200, "normal", 1800),
]
WAVE_2 = [
    ("second-1", 2, 1, 8, 64, "normal", 7200),
    ("second-2", 1, 1, 30, 300, "high", 7200),
    ("second-3", 4, 1, 8, 64, "low", 7200),
    ("second-4", 1, 1, 2, 8, "normal", 7200),
]
WAVE_GAP_SECONDS = 3600  # after wave 1's round: the 1800 s Jobs ended


def _node(api: FakeKubeAPI, name: str, gpus: int, cpu: int, memory_gi: int) -> None:
    resources = {"nvidia.com/gpu": str(gpus), "cpu": str(cpu), "memory": f"{memory_gi}Gi", "pods": "110"}
    api.add(CORE, "nodes", {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                                   "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                                                   "nvidia.com/gpu.count": str(gpus)}},
                            "spec": {}, "status": {"capacity": resources, "allocatable": resources}})


def _manifest(row: tuple, gated: bool) -> dict:
    name, gpus, pods, cpu, memory, priority, run = row
    manifest = job_manifest(name, TEAM, count=gpus, parallelism=pods, priority=priority, run_seconds=run,
                            gated=gated, grace_seconds=0)
    requests = manifest["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    requests.update({"cpu": str(cpu), "memory": f"{memory}Gi"})
    return manifest


def _install(api: FakeKubeAPI) -> FakeCluster:
    namespace(api, TEAM, {QUEUE_LABEL: TEAM})
    for name, value in {"low": 100, "normal": 1000, "high": 10000}.items():
        priority_class(api, name, value)
    for name, (gpus, cpu, memory) in NODES.items():
        _node(api, name, gpus, cpu, memory)
    return FakeCluster(api)


def _submit_wave(fake: FakeCluster, wave: list[tuple], gated: bool) -> None:
    """Each Job one second after the last, its pods made at once (no scheduling pass in between)."""
    for row in wave:
        fake.clock.now += 1
        status, answer = submit(fake.api, _manifest(row, gated))
        assert status == 201, answer
        fake.jobs.step(fake.clock.now)


def _where(api: FakeKubeAPI) -> dict[tuple[str, int], str | None]:
    """(Job, index of the pod among its Job's pods in name order) -> its node (None: not bound), for
    pods that have not ended."""
    by_job: dict[str, list[dict]] = {}
    for pod in api.objects(CORE, "pods"):
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        by_job.setdefault(pod["metadata"]["labels"][JOB_NAME_LABEL], []).append(pod)
    return {(job, i): pod["spec"].get("nodeName")
            for job, pods in by_job.items() for i, pod in enumerate(sorted(pods, key=lambda p: p["metadata"]["name"]))}


def _play_kube_alone() -> list[dict[tuple[str, int], str | None]]:
    api = FakeKubeAPI().start()
    try:
        fake = _install(api)
        fake.scheduler.scoring = "LeastAllocated"
        seen = []
        for wave in (WAVE_1, WAVE_2):
            if seen:
                fake.clock.now += WAVE_GAP_SECONDS
                fake.jobs.step(fake.clock.now)  # the Jobs whose run ended complete
                fake.scheduler.step()  # the kubelet's part: nothing new to bind before the wave
            _submit_wave(fake, wave, gated=False)
            result = fake.scheduler.step()
            assert result.preempted == []
            seen.append(_where(api))
        return seen
    finally:
        api.stop()


def _play_kube_default(workdir) -> list[dict[tuple[str, int], str | None]]:
    api = FakeKubeAPI().start()
    try:
        fake = _install(api)
        clock = ModelClock(lambda: datetime.fromtimestamp(fake.clock.now, UTC))
        client = load_client(api.kubeconfig(workdir / "kc.json"))
        cluster = KubeCluster(KubeApi(client, backoff_seconds=0.01, max_backoff_seconds=0.05, clock=clock), clock=clock)
        loop = SchedulingRound(cluster, policy="kube-default")
        seen = []
        for wave in (WAVE_1, WAVE_2):
            if seen:
                fake.clock.now += WAVE_GAP_SECONDS
                fake.jobs.step(fake.clock.now)
                fake.scheduler.step()
            _submit_wave(fake, wave, gated=True)
            results = loop.run_round()
            assert all(r.ok for r in results), [r for r in results if not r.ok]
            assert {r.action.kind.value for r in results} <= {"bind"}, results  # no stop: nothing preempted
            fake.scheduler.step()  # the stand-in binds what the round admitted, where it pinned it
            seen.append(_where(api))
        return seen
    finally:
        api.stop()


@pytest.fixture(scope="module")
def played(tmp_path_factory):
    return _play_kube_alone(), _play_kube_default(tmp_path_factory.mktemp("kube-default"))


def test_kube_default_binds_every_pod_where_kube_scheduler_alone_binds_it(played):
    alone, engine = played
    for wave, (theirs, ours) in enumerate(zip(alone, engine, strict=True), start=1):
        assert set(theirs) == set(ours), (wave, sorted(set(theirs) ^ set(ours)))
        differ = {pod: (theirs[pod], ours[pod]) for pod in sorted(theirs) if theirs[pod] != ours[pod]}
        assert not differ, f"wave {wave}: pod -> (kube-scheduler, kube-default): {differ}"


def test_the_slice_spreads_waits_and_reuses_freed_room(played):
    """The slice is not trivial: both waves bind pods on all four nodes, some pods wait, the two pods
    of one Job go to different nodes (spreading, not packing), and wave 2 binds into room wave 1 freed."""
    alone, _ = played
    first, second = alone
    assert {node for node in first.values() if node} == set(NODES)
    assert first[("too-big", 0)] is None and first[("late-1", 0)] is not None
    assert first[("pair", 0)] != first[("pair", 1)] and None not in (first[("pair", 0)], first[("pair", 1)])
    assert ("small-1", 0) not in second and ("mem-heavy", 0) not in second  # ended before wave 2
    assert all(second[(name, 0)] is not None for name in ("second-1", "second-2", "second-4"))
