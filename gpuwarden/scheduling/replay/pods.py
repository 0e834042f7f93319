"""Jobs that are no gang, as a replay plays them (``QueuePolicy.gang`` False: ``kube-default``).

kube-scheduler binds a job's pods one by one: a job of four pods may run two while the other two
wait, holding those two pods' GPUs, and it computes only once all four run. A replay models that
by handing the scheduler each pod of a multi-pod whole-GPU job as a one-pod job of its own
(:func:`split_pods`: ``<job>/pod-<i>``, submitted with the job, the same request per pod), so every
engine rule (queue order, placement, preemption, the plan verifier) applies to pods as kube-scheduler
applies its own to them; the driver gates the job's progress on all its pods running
(:class:`~.driver.Replay`): its pods hold their GPUs meanwhile (they are running work to the
scheduler and to a replay's metrics: allocated, counted in utilisation and in their team's share)
and accrue neither progress nor attained service. A pod stopped while the job computes stops the
job: the job keeps its progress when the pod was suspended and what its last periodic checkpoint
saved when it was killed; its other pods keep their GPUs. The job finishes when its work is done,
all its pods together, and its figures (first start, finish, progress, the spans it computed) are
written on the job the replay was given, so a replay's results read the job, never its pods.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..state import Job
from .jobs import fresh_copy


def splits(job: Job) -> bool:
    """Whether a policy that does not gang schedules ``job``'s pods one by one: several whole-GPU pods
    (a fraction or a MIG slice is one pod a job here)."""
    return job.pods > 1 and job.whole


def split_pods(jobs: Iterable[Job]) -> tuple[list[Job], dict[str, Job], dict[str, list[Job]]]:
    """The jobs the scheduler is given (each multi-pod whole-GPU job as its pods, the others as they
    are), each pod's job by the pod's name, and each split job's pods by the job's name."""
    given: list[Job] = []
    job_of: dict[str, Job] = {}
    pods_of: dict[str, list[Job]] = {}
    for job in jobs:
        if not splits(job):
            given.append(job)
            continue
        pods = [fresh_copy(job, name=f"{job.name}/pod-{i}", pods=1) for i in range(job.pods)]
        pods_of[job.name] = pods
        for pod in pods:
            job_of[pod.name] = job
        given += pods
    return given, job_of, pods_of
