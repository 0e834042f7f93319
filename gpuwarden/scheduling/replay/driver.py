"""The one replay event loop: jobs arrive, run, finish, are suspended or killed, and the production
scheduler makes every decision.

A step goes to the next event (an arrival, a completion, or a tick), accrues what happened since
the last one (the metrics hook first, then each running job's progress and attained service),
submits the arrivals, finishes the completions, and runs one scheduling pass if anything changed.
Ticks (``tick_seconds``) exist for LAS policies: attained service grows while jobs run, so their
queue order changes with no event; a tick runs a pass when a LAS policy has jobs waiting.

Every pass's plan goes through the plan verifier (:mod:`..verify`, the rules the live round checks)
before it is carried out; a plan that breaks one stops the replay (:class:`..errors.PlanRefused`).

A policy that does not gang (``QueuePolicy.gang`` False) is given the pods of a multi-pod job one by
one, and the job computes only while all of them run (:mod:`.pods`).

The replay ends when nothing runs and nothing is left to arrive (what still waits can never start:
nothing will free room for it), or when only pods of jobs that wait for the rest of their pods hold
GPUs and nothing computes (no end will free room either), or at ``horizon_seconds`` (accrued up to it). Finished jobs leave
the scheduler's state: every pass scans the jobs it holds.

The job model (what a restart costs, what a kill loses) is :class:`.jobs.JobModel`; what a replay
measures is a :class:`ReplayMetrics` hook. Running jobs accrue progress and attained service as
arrays (:class:`.accrual.Accrual`): a running job's ``progress`` and ``attained`` are current when it
stops or finishes and when the replay ends, and its ``attained`` before each pass of a policy that
reads it (``QueuePolicy.reads_service``: nothing else in a pass reads them); not inside ``accrue``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable

from ..scheduler import STARTS, Decision, DecisionKind, Scheduler
from ..errors import PlanRefused
from ..state import Job, JobState, Slot, State
from ..ledgers import capacity_of_state, ledger_of_state, steps_of_decisions
from ..verify import violations
from .accrual import Accrual
from .jobs import JobModel
from .pods import split_pods

MAX_REPLAY_SECONDS = 400 * 86400.0  # a replay that has not ended by then never will


class ReplayMetrics:
    """What a replay measures, told as it happens. Every method is optional (no-op here)."""

    def accrue(self, replay: Replay, start: float, end: float) -> None:
        """``[start, end)`` passed with ``replay.running`` and ``replay.waiting`` as they are."""

    def started(self, replay: Replay, job: Job, kind: DecisionKind) -> None:
        """``job`` was bound or resumed at ``replay.now``."""

    def stopped(self, replay: Replay, job: Job, kind: DecisionKind) -> None:
        """``job`` was suspended or killed at ``replay.now`` (a kill has already lost its work)."""

    def finished(self, replay: Replay, job: Job) -> None:
        """``job`` completed at ``replay.now``."""


class Replay:
    """Drives ``scheduler`` over ``state`` through ``jobs`` (fresh copies: the replay changes them)."""

    def __init__(self, state: State, scheduler: Scheduler, jobs: Iterable[Job], model: JobModel | None = None,
                 metrics: ReplayMetrics | None = None, tick_seconds: float | None = None,
                 horizon_seconds: float = MAX_REPLAY_SECONDS) -> None:
        if tick_seconds is not None and not tick_seconds > 0:
            raise ValueError(f"tick_seconds {tick_seconds!r} must be > 0 (or None: no ticks)")
        self.state, self.scheduler, self.model = state, scheduler, model or JobModel()
        self.metrics = metrics or ReplayMetrics()
        self.tick_seconds, self.horizon_seconds = tick_seconds, horizon_seconds
        # a policy that does not gang is given each pod of a multi-pod job as a job (``pods``)
        self.job_of: dict[str, Job] = {}  # a pod's job, by the pod's name
        self.pods_of: dict[str, list[Job]] = {}  # a split job's pods, by the job's name
        if not scheduler.policy.gang:
            jobs, self.job_of, self.pods_of = split_pods(jobs)
        self.arrivals = sorted(jobs, key=lambda j: (j.submitted, j.name))
        self.now = 0.0
        self.running: dict[str, Job] = {}
        self.waiting: dict[str, Job] = {}
        self.runs: dict[str, list[tuple[float, float]]] = {j.name: [] for j in self.arrivals}  # [start, end) held
        self.runs.update((name, []) for name in self.pods_of)  # a split job's: [start, end) computed
        self.computes_from: dict[str, float] = {}  # a running job computes from here (after its resume overhead)
        self._progress_at_start: dict[str, float] = {}
        self._opened: dict[str, float] = {}
        self._completions: list[tuple[float, int, str]] = []  # (time, epoch, job); stale when the epoch moved on
        self._epoch: dict[str, int] = {}
        self._accrual = Accrual()
        self._capacity = capacity_of_state(state)  # what the nodes offer, for the plan verifier

    def run(self) -> Replay:
        next_arrival = 0
        rerank = self.tick_seconds is not None and self.scheduler.policy.reranks_with_service
        reads_service = self.scheduler.policy.reads_service
        next_tick = self.now + self.tick_seconds if self.tick_seconds is not None else math.inf
        while True:
            self._drop_stale()
            if next_arrival >= len(self.arrivals) and (not self.running or (self.job_of and not self._completions)):
                break  # the second: only pods waiting for the rest of their job hold GPUs
            to = min(next_tick, self._completions[0][0] if self._completions else math.inf,
                     self.arrivals[next_arrival].submitted if next_arrival < len(self.arrivals) else math.inf)
            if to > self.horizon_seconds:
                self._advance(self.horizon_seconds)
                break
            self._advance(to)
            changed = False
            while next_arrival < len(self.arrivals) and self.arrivals[next_arrival].submitted <= self.now:
                job = self.arrivals[next_arrival]
                job.state = JobState.PENDING
                self.state.add_job(job)
                self.waiting[job.name] = job
                next_arrival += 1
                changed = True
            while self._completions and self._completions[0][0] <= self.now:
                _, epoch, name = heapq.heappop(self._completions)
                if epoch == self._epoch[name] and name in self.running:
                    self._finish(self.running.pop(name))
                    changed = True
            if self.now >= next_tick:
                next_tick = self.now + (self.tick_seconds or math.inf)
                changed = changed or (rerank and bool(self.waiting))
            if changed:
                if reads_service:  # nothing else in a pass reads what the running jobs accrued
                    self._accrual.write_back(progress=False)
                before = {name: job.placements for name, job in self.running.items()}  # lists a pass replaces
                decisions = self.scheduler.schedule(self.state, self.now)
                if decisions:
                    self._verify(before, decisions)
                self._apply(decisions)
        self._accrual.write_back()
        for name, pods in self.pods_of.items():
            if name in self._opened:  # computing at the horizon
                self.job_of[pods[0].name].progress = pods[0].progress
        return self

    def _verify(self, before: dict[str, list[Slot]], decisions: list[Decision]) -> None:
        """The pass's plan against the rules (:mod:`..verify`): the figures a replay publishes are the
        shipped policy's only while it keeps them."""
        ledger = ledger_of_state(self.state, before, decisions, self.scheduler.policy.quotas, self._capacity)
        broken = violations(ledger, steps_of_decisions(decisions))  # a split job's pods are workloads of their own
        if broken:
            raise PlanRefused(f"replay at {self.now:g} s: the pass's plan breaks " + "; ".join(map(str, broken)))

    def computing_seconds(self, name: str, start: float, end: float) -> float:
        """Seconds of ``[start, end)`` running job ``name`` computed (not paying its resume overhead)."""
        return max(0.0, end - max(start, self.computes_from[name]))

    def _drop_stale(self) -> None:
        heap = self._completions
        while heap and (heap[0][2] not in self.running or heap[0][1] != self._epoch[heap[0][2]]):
            heapq.heappop(heap)

    def _advance(self, to: float) -> None:
        if to <= self.now:
            return
        self.metrics.accrue(self, self.now, to)
        self._accrual.advance(self.now, to)  # computing_seconds, and held GPUs are service received
        self.now = to

    def _finish(self, job: Job) -> None:
        self._accrual.remove(job)
        self.state.release(job, job.placements)
        job.placements, job.state, job.finished = [], JobState.DONE, self.now
        del self.state.jobs[job.name]
        self.runs[job.name].append((self._opened.pop(job.name), self.now))
        self.metrics.finished(self, job)
        whole = self.job_of.get(job.name)
        if whole is not None and all(pod.state == JobState.DONE for pod in self.pods_of[whole.name]):
            whole.progress, whole.state, whole.finished = job.progress, JobState.DONE, self.now
            self.runs[whole.name].append((self._opened.pop(whole.name), self.now))

    def _apply(self, decisions: list[Decision]) -> None:
        now = self.now
        for decision in decisions:
            job = self.state.jobs[decision.job]
            name = job.name
            self._epoch[name] = self._epoch.get(name, 0) + 1
            whole = self.job_of.get(name)
            if whole is not None:
                self._apply_pod(job, whole, decision.kind)
            elif decision.kind in STARTS:
                overhead = self.model.resume_overhead_seconds if decision.kind == DecisionKind.RESUME else 0.0
                self.computes_from[name] = now + overhead
                self._accrual.add(job, now + overhead)
                self._progress_at_start[name] = job.progress
                self._opened[name] = now
                remaining = max((job.duration or 0.0) - job.progress, 0.0)
                heapq.heappush(self._completions, (now + overhead + remaining, self._epoch[name], name))
                self.running[name] = job
                self.waiting.pop(name, None)
                self.metrics.started(self, job, decision.kind)
            else:
                self._accrual.remove(job)
                if decision.kind == DecisionKind.PREEMPT:
                    job.progress = self.model.progress_after_kill(job, self._progress_at_start[name])
                del self.running[name]
                self.waiting[name] = job
                self.runs[name].append((self._opened.pop(name), now))
                self.metrics.stopped(self, job, decision.kind)

    def _apply_pod(self, pod: Job, job: Job, kind: DecisionKind) -> None:
        """A start or stop of ``pod``, one of split ``job``'s pods (:mod:`.pods`): the pod holds its GPUs
        from its start; the job computes once all its pods run, and stops when one of them stops."""
        name, now = pod.name, self.now
        if kind in STARTS:
            self.running[name] = pod
            self.waiting.pop(name, None)
            self._opened[name] = now
            self.computes_from[name] = math.inf  # it holds its GPUs; it computes once all the job's pods run
            self.metrics.started(self, pod, kind)
            pods = self.pods_of[job.name]
            if all(p.name in self.running for p in pods):
                self._compute(job, pods)
            return
        if job.name in self._opened:  # the job computed: it stops, its other pods keep their GPUs
            pods = self.pods_of[job.name]
            for p in pods:
                if p.name in self.running:
                    self._accrual.remove(p)
                    self.computes_from[p.name] = math.inf
                    self._epoch[p.name] = self._epoch.get(p.name, 0) + 1  # no completion while it waits
            job.progress = pod.progress
            if kind == DecisionKind.PREEMPT:
                job.progress = self.model.progress_after_kill(job, self._progress_at_start[job.name])
            for p in pods:
                p.progress = job.progress
            self.runs[job.name].append((self._opened.pop(job.name), now))
        del self.running[name]
        self.waiting[name] = pod
        self.runs[name].append((self._opened.pop(name), now))
        self.metrics.stopped(self, pod, kind)

    def _compute(self, job: Job, pods: list[Job]) -> None:
        """All of ``job``'s pods run: it computes (after the resume overhead when it computed before),
        and each pod's completion is due when its work is done."""
        now = self.now
        overhead = self.model.resume_overhead_seconds if job.first_started is not None else 0.0
        if job.first_started is None:
            job.first_started = now
        self._progress_at_start[job.name] = job.progress
        self._opened[job.name] = now
        done_at = now + overhead + max((job.duration or 0.0) - job.progress, 0.0)
        for p in pods:
            p.progress = job.progress
            self.computes_from[p.name] = now + overhead
            self._accrual.add(p, now + overhead)
            self._epoch[p.name] = self._epoch.get(p.name, 0) + 1
            heapq.heappush(self._completions, (done_at, self._epoch[p.name], p.name))
