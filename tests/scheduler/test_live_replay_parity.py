"""Issue 21 item 7: the same decisions live and in the simulator.

One slice of the simulator's own Philly training arrivals (80 jobs of 1-32 GPUs, gangs of 8-GPU
pods, priorities, checkpointable or not; 12 hours of the trace submitted 12 times as fast, run
times capped at 2 hours) is played into the in-process simulator (its arrivals off, the slice
submitted through ``Simulation.submit``) and into the fake cluster over HTTP (``SchedulingRound``
on ``KubeCluster`` through the official client; the slice as gated Jobs), both with the
simulator's 2 x 8-GPU fleet and its six teams (``tests/parity_harness.py`` says how each side is
set up). Both must admit the same workloads onto the same nodes in the same order, round for round.

What differs by construction and is normalised in the slice, not in the comparison: a live Job
states no checkpoint interval (the live reader assumes 600 s; the slice uses 600 s), no pool
constraint the reader turns into ``Workload.pools`` (the slice asks for any pool) and its
namespace as its project. The simulator runs a round only when something changed (an arrival,
an end, an action); the live loop runs one every minute: the admissions are compared, and a
round with nothing new admits nothing on either side.

A RESUME is carried out differently and decided the same: the simulator starts a resumed job on
the planned GPUs in that round; a live Job in a queue namespace resumes with ``spec.suspend: false``
and its pods' nodes held for it (``gpuwarden.io/reserved-nodes``): its new gated pods are admitted
there by a BIND a round later (not a decision: the harness keeps those apart), and nobody is given
those GPUs meanwhile. (Before that reservation the freed GPUs went to other work in between, and
the two sides parted at the first resume.)

Found by this comparison and fixed: a live team had no fair-share weight (every team weighed 1;
the simulator's weigh 0.91-2.73): the reader now takes ``gpuwarden.io/weight``; the planner broke
ties in the order nodes were listed, which is name order from the API and pool order in the
simulator (the first admission went to different nodes): ``SimCluster`` lists them by name.
An evicted live workload's pods are made again, and it was read as submitted then (to the back of
the queue; the simulator keeps a requeued job's submission): the reader counts the Job's creation.
The harness mirrors the simulator's MIG nodes as MIG nodes (as whole GPUs, the first admission on
an 8-node fleet went to a MIG node live).
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from fake_kube_api import CORE, FakeKubeAPI
from gated_scenario import FakeCluster, job_manifest, submit
from kube_fleet import namespace, priority_class
from parity_harness import START, Played, config, first_divergence, install, play_live, play_sim, record_slice

from gpuwarden.kube import KubeApi, KubeCluster, load_client
from gpuwarden.kube.gates import QUEUE_LABEL
from gpuwarden.kube.team_quotas import WEIGHT_ANNOTATION
from gpuwarden.cli.simfleet import simulated_fleet
from gpuwarden.fleet.clock import ModelClock
from gpuwarden.sim import ConfigError

HORIZON_SECONDS = 3 * 3600


@pytest.fixture(scope="module")
def played(tmp_path_factory):
    cfg = config(nodes=2, max_job_hours=2, training_load=3.0)
    jobs = record_slice(cfg, hours=12, jobs=80, speedup=12)
    sim, simulation = play_sim(cfg, jobs, HORIZON_SECONDS)
    live = play_live(simulation, jobs, HORIZON_SECONDS, tmp_path_factory.mktemp("parity"))
    return jobs, sim, live, simulation


def test_the_live_loop_and_the_simulator_admit_the_same_workloads_on_the_same_nodes_in_the_same_order(played):
    jobs, sim, live, _ = played
    assert len(jobs) == 80
    assert first_divergence(sim, live) is None, first_divergence(sim, live)
    assert sim.stops == live.stops
    # the slice exercised the queue: most jobs ran, and many waited for GPUs first
    submitted = {j.workload.key: j.submit_s for j in jobs}
    waited = [at for at, kind, key, _ in sim.admissions if kind == "bind" and at > submitted[key] + 60]
    assert len(sim.admissions) >= 60 and len(waited) >= 20, (len(sim.admissions), len(waited))
    assert any(len(nodes) > 1 for *_, nodes in sim.admissions)  # gangs and multi-GPU jobs among them


def test_the_fake_cluster_states_the_simulated_fleet_as_the_simulator_does(played, tmp_path):
    """Nodes (pool, model, GPUs, topology, tier, location) and teams (guarantee, burst, weight) read
    back through the live inventory equal the simulator's snapshot."""
    *_, simulation = played
    api = FakeKubeAPI().start()
    try:
        install(api, simulation)
        clock = ModelClock(lambda: START)
        snapshot = KubeCluster(KubeApi(load_client(api.kubeconfig(tmp_path / "kc.json")), clock=clock), clock=clock).snapshot()
    finally:
        api.stop()
    expected = simulation.cluster.snapshot()
    assert [n for n in snapshot.nodes] == list(expected.nodes)
    teams = {t.name: t for t in snapshot.teams}
    for team in expected.teams:
        assert teams[team.name] == team


def test_with_preemptions_and_resumes_they_still_make_the_same_admissions(tmp_path):
    """A slice that preempts and resumes. The planner's RESUME carries placements: the simulator
    starts the job on them in that round; a live Job in a queue namespace resumes with
    ``spec.suspend: false`` and the nodes of its pods held for it (``gpuwarden.io/reserved-nodes``),
    so its new gated pods are admitted there a round later and nobody is given those GPUs meanwhile.
    The decisions (admissions, resumes, stops) are the same on both sides; the live side's BINDs
    that carry a resume out land on the nodes that RESUME named.

    The horizon stops before the first end of a resumed job: its pods start one round later live (the
    Job controller makes them after the resume, the next round admits them), so it ends one round
    later, and from there the two fleets free GPUs at different times (the horizon is that round,
    taken from the simulator's run, at most 1680 s). That lag is
    the interval of the live loop (10 s by default; 60 s here), a difference of timing, not of a
    decision; the fake Job controller credits a checkpointable Job the run it kept, as the simulator does."""
    cfg = config(nodes=4, max_job_hours=2, training_load=3.0)
    jobs = record_slice(cfg, hours=48, jobs=400, speedup=16)
    sim, simulation = play_sim(cfg, jobs, 1680)
    # past the round in which the simulator first frees a resumed job's GPUs, the fleets free them at
    # different times (see below): compare up to it
    resumed = {key for _, kind, key, _ in sim.admissions if kind == "resume"}
    ends = [j.finished_s for j in simulation.jobs if j.spec.workload.key in resumed and j.finished_s is not None]
    horizon = min([1680, *(math.ceil(end / 60) * 60 for end in ends)])
    sim = before(sim, horizon)
    live = before(play_live(simulation, jobs, horizon, tmp_path), horizon)
    resumes = [(at, key, nodes) for at, kind, key, nodes in sim.admissions if kind == "resume"]
    assert resumes and sim.stops, (sim.admissions, sim.stops)
    assert first_divergence(sim, live) is None, first_divergence(sim, live)
    assert sorted(sim.stops) == sorted(live.stops)  # the same stops each round (the victims of one are listed
    assert not sim.carried_out                      # in snapshot order, which differs; the outcome does not)
    resumed_live = {(at, key): nodes for at, kind, key, nodes in live.admissions if kind == "resume"}
    for at, key, nodes in live.carried_out:  # each the round after its resume, on its nodes
        (resumed_at,) = [r for r, k in resumed_live if k == key and r < at][-1:]
        assert at == resumed_at + 60 and nodes == resumed_live[(resumed_at, key)], (at, key, nodes)
    assert len(live.carried_out) >= len([r for r in resumes if r[0] + 60 < horizon]) - 1


def before(played: Played, horizon: int) -> Played:
    """What one side did in the rounds before ``horizon`` seconds."""
    return replace(played, admissions=[a for a in played.admissions if a[0] < horizon],
                   stops=[s for s in played.stops if s[0] < horizon],
                   carried_out=[c for c in played.carried_out if c[0] < horizon])


def test_with_arrivals_off_only_submitted_work_arrives():
    cfg = config(nodes=2, max_job_hours=2, training_load=3.0)
    job = record_slice(cfg, hours=12, jobs=1)[0]
    on, off = simulated_fleet(cfg), simulated_fleet(replace(cfg, arrivals=False))
    for sim in (on, off):
        sim.run(60)
    assert on.counts["submitted"] > 0 and off.counts["submitted"] == 0
    assert off.submit(job.workload, job.run_s) == job.workload.key and off.counts["submitted"] == 1
    with pytest.raises(ConfigError, match="arrivals: 'no' is not allowed; expected true or false"):
        replace(cfg, arrivals="no")


def test_a_team_weight_that_is_not_a_positive_number_is_named_and_read_as_1(tmp_path, caplog):
    api = FakeKubeAPI().start()
    try:
        namespace(api, "research", {QUEUE_LABEL: "research"}, {WEIGHT_ANNOTATION: "heavy"})
        namespace(api, "vision", {QUEUE_LABEL: "vision"}, {WEIGHT_ANNOTATION: "0"})
        namespace(api, "speech", {QUEUE_LABEL: "speech"}, {WEIGHT_ANNOTATION: "2.5"})
        clock = ModelClock(lambda: START)
        snapshot = KubeCluster(KubeApi(load_client(api.kubeconfig(tmp_path / "kc.json")), clock=clock), clock=clock).snapshot()
    finally:
        api.stop()
    weights = {t.name: t.weight for t in snapshot.teams}
    assert (weights["research"], weights["vision"], weights["speech"]) == (1.0, 1.0, 2.5)
    assert "gpuwarden.io/weight='heavy' is not a number > 0" in caplog.text


def test_a_workload_whose_pods_were_made_again_keeps_its_jobs_submission_time(tmp_path):
    """The simulator keeps a requeued job's submission time; live, an evicted pod is replaced by a new
    one (a new creationTimestamp), so the reader takes the Job's creation as the workload's."""
    api = FakeKubeAPI().start()
    try:
        namespace(api, "research", {QUEUE_LABEL: "research"})
        priority_class(api, "normal", 1000)
        fake = FakeCluster(api)
        assert submit(api, job_manifest("train", "research", count=1, grace_seconds=0))[0] == 201
        fake.step(0)
        (first,) = api.objects(CORE, "pods")
        fake.step(600)
        api.handle("DELETE", f"/api/v1/namespaces/research/pods/{first['metadata']['name']}", "application/json", b"{}")
        fake.step(0)  # the Job controller replaces it
        (again,) = api.objects(CORE, "pods")
        assert again["metadata"]["creationTimestamp"] != first["metadata"]["creationTimestamp"]
        clock = ModelClock(lambda: datetime.fromtimestamp(fake.clock.now, UTC))
        snapshot = KubeCluster(KubeApi(load_client(api.kubeconfig(tmp_path / "kc.json")), clock=clock), clock=clock).snapshot()
    finally:
        api.stop()
    (state,) = [ws for ws in snapshot.workloads if ws.workload.key == "research/train"]
    assert state.submitted_at == START
