"""Queue policies are made of registered parts: a queue order, a victim choice, an admission check and
a placement scorer, each named by the policy and looked up once. A new part is one registration (no
branch elsewhere changes), and an unknown name says which key and which names are allowed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuwarden.scheduling import Job, NodeState, QueuePolicy, Quotas, Scheduler, State
from gpuwarden.scheduling.admission_checks import ADMISSION_CHECKS
from gpuwarden.scheduling.errors import SchedulingError
from gpuwarden.scheduling.parts import Registry
from gpuwarden.scheduling.placement import PlacementOptions
from gpuwarden.scheduling.policy import POLICIES, PreemptMode, QueueOrder
from gpuwarden.scheduling.queue_orders import QUEUE_ORDERS, QueueOrdering, SortKey
from gpuwarden.scheduling.quotas import Admission
from gpuwarden.scheduling.scorers import SCORERS, Choice, Scorer
from gpuwarden.scheduling.state import Shape
from gpuwarden.scheduling.victim_choices import VICTIM_CHOICES, VictimChoice, VictimRule


def node(name: str, gpus: int = 2) -> NodeState:
    return NodeState(name=name, model="gpu", gpu_count=gpus, cpu_free=10**9, mem_free=10**15, nvlink_domain=name,
                     leaf_switch="leaf")


def started(decisions: list) -> list[str]:
    return [d.job for d in decisions if d.kind in ("bind", "resume")]


@pytest.fixture
def registered() -> Iterator[list[tuple[Registry[object], str]]]:
    """Registrations a test makes, taken out again after it (registries are module-wide)."""
    made: list[tuple[Registry[object], str]] = []
    yield made
    for registry, name in made:
        registry.unregister(name)


def test_the_built_in_parts_are_registered_under_the_names_policies_give():
    assert list(QUEUE_ORDERS) == ["fifo", "las"]
    assert list(VICTIM_CHOICES) == ["none", "priority", "las"]
    assert list(ADMISSION_CHECKS) == ["open", "quotas"]
    assert list(SCORERS) == ["fgd", "bestfit", "firstfit", "random", "leastallocated"]
    for policy in POLICIES.values():  # every shipped policy names registered parts
        assert policy.order in QUEUE_ORDERS and policy.preempt in VICTIM_CHOICES
        assert policy.admission_check in ADMISSION_CHECKS and policy.placement.scorer in SCORERS


def test_a_policy_written_with_strings_is_the_policy_written_with_enums():
    by_string = QueuePolicy("p", order="las", preempt="priority")
    assert by_string.order is QueueOrder.LAS and by_string.preempt is PreemptMode.PRIORITY
    assert by_string == QueuePolicy("p", order=QueueOrder.LAS, preempt=PreemptMode.PRIORITY)
    assert QueuePolicy("q", quotas=True).admission_check == "quotas"
    assert QueuePolicy("q").admission_check == "open"


@pytest.mark.parametrize(("field", "allowed"), [("order", "fifo, las"), ("preempt", "none, priority, las"),
                                                ("admission", "open, quotas")])
def test_an_unknown_part_name_names_the_key_and_the_allowed_names(field: str, allowed: str):
    with pytest.raises(SchedulingError, match=f"policy 'p': {field} 'toy' is not one of: {allowed}$"):
        QueuePolicy("p", **{field: "toy"})


def test_an_unknown_name_looked_up_directly_names_the_key_too():
    with pytest.raises(SchedulingError, match="order: queue order 'toy' is not one of: fifo, las"):
        QUEUE_ORDERS["toy"]
    with pytest.raises(SchedulingError, match="placement scorer 'toy' is not one of: fgd, bestfit, firstfit, random"):
        PlacementOptions(scorer="toy")


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="queue order 'fifo' is registered already"):
        QUEUE_ORDERS.register("fifo", QueueOrdering)


class SmallestFirst(QueueOrdering):
    """A toy queue order: the fewest GPUs first, then submit time."""

    def sort_key(self, job: Job, now: float, quotas: Quotas | None) -> SortKey:
        return (-job.priority, job.pods * job.gpus_per_pod, job.submitted, job.name)


def test_a_queue_order_registered_by_name_runs_through_the_real_engine(registered):
    QUEUE_ORDERS.register("smallest_first", SmallestFirst)
    registered.append((QUEUE_ORDERS, "smallest_first"))

    def pass_with(order: str) -> list[str]:
        state = State([node("n0", gpus=2)])
        state.add_job(Job(name="big", team="t", gpus_per_pod=2, submitted=0.0))
        state.add_job(Job(name="small-a", team="t", gpus_per_pod=1, submitted=1.0))
        state.add_job(Job(name="small-b", team="t", gpus_per_pod=1, submitted=2.0))
        return started(Scheduler(QueuePolicy("toy", order=order)).schedule(state, now=10.0))

    assert pass_with("fifo") == ["big"]
    assert pass_with("smallest_first") == ["small-a", "small-b"]
    policy = QueuePolicy("toy", order="smallest_first")
    assert policy.order == "smallest_first" and not policy.reads_service


def test_an_admission_check_registered_by_name_holds_jobs_back_with_its_reason(registered):
    def weekdays_only(quotas: Quotas, job: Job) -> tuple[Admission, str]:
        return (Admission.NO, "toy: team night starts at night") if job.team == "night" else (Admission.NOMINAL, "")
    ADMISSION_CHECKS.register("weekdays_only", weekdays_only)
    registered.append((ADMISSION_CHECKS, "weekdays_only"))
    state = State([node("n0")])
    day, night = Job(name="day", team="day"), Job(name="night", team="night")
    state.add_job(day)
    state.add_job(night)
    assert started(Scheduler(QueuePolicy("toy", admission="weekdays_only")).schedule(state, now=0.0)) == ["day"]
    assert night.wait_reason == "toy: team night starts at night"


class LastFit(Scorer):
    name = "lastfit"

    def choose(self, nodes, shape: Shape) -> Choice:
        node = int(nodes[-1])
        return node, self._gpus_on(node, shape)


def test_a_placement_scorer_registered_by_name_places_through_the_real_engine(registered):
    SCORERS.register(LastFit.name, LastFit)
    registered.append((SCORERS, LastFit.name))
    state = State([node("n0"), node("n1"), node("n2")])
    state.add_job(Job(name="j", team="t"))
    policy = QueuePolicy("toy", placement=PlacementOptions(topology=False, scorer="lastfit"))
    decisions = Scheduler(policy).schedule(state, now=0.0)
    assert [slot[0] for slot in decisions[0].placements] == ["n2"]


class OtherTeamsFirst(VictimChoice):
    """A toy victim choice: a job may preempt another team's job of its own priority class."""

    preempts = True

    def same_class(self, job: Job, now: float, floor: int, verdict: Admission,
                   keeps_guarantee: VictimRule) -> VictimRule | None:
        return lambda victim: victim.priority == job.priority and victim.team != job.team


def test_a_victim_choice_registered_by_name_preempts_through_the_real_engine(registered):
    VICTIM_CHOICES.register("other_teams_first", OtherTeamsFirst)
    registered.append((VICTIM_CHOICES, "other_teams_first"))

    def pass_with(preempt: str) -> list[tuple[str, str]]:
        state = State([node("n0", gpus=2)])
        state.add_running(Job(name="running", team="x", gpus_per_pod=2), [("n0", 0, 1000), ("n0", 1, 1000)])
        state.add_job(Job(name="waiting", team="y", gpus_per_pod=2, submitted=1.0))
        return [(d.kind.value, d.job) for d in Scheduler(QueuePolicy("toy", preempt=preempt)).schedule(state, 5.0)]

    assert pass_with("none") == []
    assert pass_with("other_teams_first") == [("preempt", "running"), ("bind", "waiting")]


@pytest.mark.parametrize("admission, quotas", [("open", True), ("quotas", False)])
def test_a_built_in_admission_check_that_contradicts_quotas_is_refused(admission, quotas):
    """``quotas`` also drives the verifier and the victim guards: open admission with quotas on was
    refused by the verifier on every pass (a burst it let through), so the pair is refused up front."""
    with pytest.raises(SchedulingError, match=f"admission '{admission}' contradicts quotas={quotas}"):
        QueuePolicy("p", quotas=quotas, admission=admission)


def test_las_preemption_without_the_las_order_is_refused():
    """LAS preemption compares the levels the queue order gives: under fifo (level 0 for every job) it
    never preempts, so the pairing is refused rather than silently inert."""
    with pytest.raises(SchedulingError, match="preempt 'las' needs order 'las'"):
        QueuePolicy("p", order="fifo", preempt="las")
