"""What-if on your own history: workloads rebuilt from a hand-built samples frame, the policies'
order on a tiny contended fleet worked out by hand, the ``simulate whatif`` command on a store the
simulator filled, and the dashboard page run headless with Streamlit's AppTest."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from gpuwarden.cli import main
from gpuwarden.dashboards import STORE_ENV
from gpuwarden.dashboards.launch import APP_PATH
from gpuwarden.scheduling.whatif import (
    AS_IT_RAN,
    WHATIF_POLICIES,
    Prices,
    as_it_ran,
    build_report,
    measure,
    replay,
)
from gpuwarden.scheduling.whatif_history import FleetNode, History, Workload, rebuild
from gpuwarden.store import LocalStore

START = pd.Timestamp("2026-11-23T00:00:00Z")
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
MIN = 60.0


def _rows(node, uuid, index, model, minutes, pod=None, namespace=None, team=None, mig=None, attribution="known"):
    return [{"timestamp": START + pd.Timedelta(minutes=m), "node": node, "gpu_uuid": uuid, "gpu_index": index,
             "model": model, "mig_instance": mig, "namespace": namespace, "pod": pod, "team": team,
             "attribution": attribution} for m in minutes]


def hand_built() -> pd.DataFrame:
    """60 one-minute samples. n1: 4 H100s; n2: one A100 cut in 3g + 2g; n3: one GPU nobody could attribute.
    n1 reported nothing at minutes 20-24 (a scrape outage)."""
    n1_minutes = [m for m in range(60) if not 20 <= m < 25]
    rows = []
    # pod-a holds GPUs 0 and 1 from minute 0 to 29 (through the outage)
    for uuid, index in (("GPU-0", 0), ("GPU-1", 1)):
        rows += _rows("n1", uuid, index, H100, [m for m in n1_minutes if m < 30], "pod-a", "ns-a", "alpha")
        rows += _rows("n1", uuid, index, H100, [m for m in n1_minutes if m >= 30])
    # pod-b: minutes 0-4, gone 5-7 while n1 reported, back 8-9: one workload, paused
    b = [m for m in n1_minutes if m < 5 or 8 <= m < 10]
    rows += _rows("n1", "GPU-2", 2, H100, b, "pod-b", "ns-b", None)  # no team: the namespace is the team
    # pod-c: minutes 10-12, and again 50-52 (37 min later, beyond max_gap): two workloads
    c = [m for m in n1_minutes if 10 <= m < 13 or 50 <= m < 53]
    rows += _rows("n1", "GPU-2", 2, H100, c, "pod-c", "ns-b", "beta")
    rows += _rows("n1", "GPU-2", 2, H100, [m for m in n1_minutes if m not in b and m not in c])
    # pod-e and pod-f share GPU-3 (time-slicing) at minutes 30-39
    shared = [m for m in n1_minutes if 30 <= m < 40]
    rows += _rows("n1", "GPU-3", 3, H100, shared, "pod-e", "ns-e", "beta")
    rows += _rows("n1", "GPU-3", 3, H100, shared, "pod-f", "ns-e", "beta")
    rows += _rows("n1", "GPU-3", 3, H100, [m for m in n1_minutes if m not in shared])
    # n2: pod-d on the 3g instance the whole hour; the 2g instance is free
    rows += _rows("n2", "GPU-M", 0, A100, range(60), "pod-d", "ns-d", "alpha", mig="1:3g.40gb")
    rows += _rows("n2", "GPU-M", 0, A100, range(60), mig="2:2g.20gb")
    # n3: attribution off: nobody knows who held it
    rows += _rows("n3", "GPU-X", 0, H100, range(60), attribution="off")
    return pd.DataFrame(rows)


def test_rebuild_turns_samples_into_workloads_by_the_documented_rules():
    history = rebuild(hand_built(), START, START + pd.Timedelta(hours=1))
    assert history.step_seconds == MIN
    got = {w.name: w for w in history.workloads}
    assert got == {
        "ns-a/pod-a": Workload("ns-a/pod-a", "alpha", H100, 2, None, 1.0, 0.0, ((0.0, 30 * MIN),)),
        "ns-b/pod-b": Workload("ns-b/pod-b", "ns-b", H100, 1, None, 1.0, 0.0, ((0.0, 5 * MIN), (8 * MIN, 10 * MIN))),
        "ns-b/pod-c": Workload("ns-b/pod-c", "beta", H100, 1, None, 1.0, 10 * MIN, ((10 * MIN, 13 * MIN),)),
        "ns-b/pod-c#2": Workload("ns-b/pod-c#2", "beta", H100, 1, None, 1.0, 50 * MIN, ((50 * MIN, 53 * MIN),)),
        "ns-e/pod-e": Workload("ns-e/pod-e", "beta", H100, 1, None, 0.5, 30 * MIN, ((30 * MIN, 40 * MIN),)),
        "ns-e/pod-f": Workload("ns-e/pod-f", "beta", H100, 1, None, 0.5, 30 * MIN, ((30 * MIN, 40 * MIN),)),
        "ns-d/pod-d": Workload("ns-d/pod-d", "alpha", A100, 1, "3g.40gb", 1.0, 0.0, ((0.0, 60 * MIN),)),
    }
    assert got["ns-d/pod-d"].gpu_equivalents == pytest.approx(3 / 7)
    assert history.nodes == (FleetNode("n1", H100, ("GPU-0", "GPU-1", "GPU-2", "GPU-3"), (None,) * 4),
                             FleetNode("n2", A100, ("GPU-M",), (("2g.20gb", "3g.40gb"),)))
    assert any("1 GPU(s) left out of the fleet" in note and "GPU-X" in note for note in history.notes)


def test_as_it_ran_is_measured_from_the_samples():
    history = rebuild(hand_built(), START, START + pd.Timedelta(hours=1))
    row, teams = measure(history, as_it_ran(history), {"alpha": 2.0, "beta": 1.0, "ns-b": 1.0},
                         Prices({H100: 2.0, A100: 1.0}))
    held_h100 = (2 * 30 + 7 + 3 + 3 + 10 * 0.5 * 2) / 60  # GPU-hours: pod-a, pod-b, pod-c twice, pod-e + pod-f
    held_a100 = 3 / 7
    assert row["idle_gpu_hours"] == pytest.approx(4 - held_h100 + 1 - held_a100)
    assert row["idle_cost"] == pytest.approx(2.0 * (4 - held_h100) + 1.0 * (1 - held_a100))
    assert row["fleet_cost"] == pytest.approx(4 * 2.0 + 1 * 1.0)
    waits = {"ns-b/pod-b": 3 * MIN}  # its pause; everything else started at its first sample
    assert row["wait_mean_seconds"] == pytest.approx(sum(waits.values()) / 7)
    assert row["policy"] == AS_IT_RAN and row["finished_in_window"] == 7 and row["unfinished"] == 0
    # ns-b's only workload paused 3 of 10 minutes while asking for its 1-GPU guarantee
    assert {t["team"]: t["guarantee_met_ratio"] for t in teams}["ns-b"] == pytest.approx(7 / 10)


def contended() -> History:
    """Two GPUs. 'big' runs one 2-GPU job for 10 h from t=0; at t=4500 s 'small' submits two 1-GPU
    jobs of 10 min. Guarantees: one GPU each."""
    big = Workload("big/long", "big", H100, 2, None, 1.0, 0.0, ((0.0, 36000.0),))
    smalls = tuple(Workload(f"small/s{i}", "small", H100, 1, None, 1.0, 4500.0, ((4500.0, 5100.0),)) for i in (1, 2))
    return History(START, START + pd.Timedelta(hours=10), MIN, (big, *smalls),
                   (FleetNode("n1", H100, ("GPU-0", "GPU-1"), (None, None)),))


def test_replay_orders_the_policies_as_worked_out_by_hand():
    history, guarantees, prices = contended(), {"big": 1.0, "small": 1.0}, Prices({H100: 1.0})
    rows = {p: measure(history, replay(history, p, guarantees), guarantees, prices)[0] for p in WHATIF_POLICIES}
    # fifo: the small jobs wait for the long one (36000 - 4500 s each)
    assert rows["fifo"]["wait_mean_seconds"] == pytest.approx(2 * 31500 / 3)
    assert rows["fifo"]["suspends"] == rows["fifo"]["preemptions"] == 0
    # tiresias and gpuwarden suspend the long job (checkpointed) for the two short ones: it waits 600 s
    # and pays a 60 s resume
    for policy in ("tiresias", "gpuwarden"):
        assert rows[policy]["suspends"] == 1 and rows[policy]["preemptions"] == 0
        assert rows[policy]["wait_mean_seconds"] == pytest.approx(600 / 3)
        assert rows[policy]["all_done_seconds"] == pytest.approx(36000 + 600 + 60)
    # kueue reclaims small's guarantee by killing the borrower: 900 s since its checkpoint at 3600 s are lost
    assert rows["kueue"]["preemptions"] == 1
    assert rows["kueue"]["wait_mean_seconds"] == pytest.approx(600 / 3)
    assert rows["kueue"]["all_done_seconds"] == pytest.approx(36000 + 600 + 60 + 900)
    assert rows["kueue"]["fleet_cost"] > rows["tiresias"]["fleet_cost"]
    # small's guarantee: starved under fifo, met by the others
    assert rows["fifo"]["worst_team_guarantee_met_ratio"] < 0.1
    assert min(rows[p]["worst_team_guarantee_met_ratio"] for p in ("kueue", "tiresias", "gpuwarden")) > 0.99


def test_bad_policy_or_team_is_refused_naming_the_choices():
    from gpuwarden.scheduling.whatif import WhatIfError

    with pytest.raises(WhatIfError, match="unknown policy 'lifo'; choose from fifo, kueue, tiresias, gpuwarden"):
        build_report(contended(), ("lifo",))
    with pytest.raises(WhatIfError, match="team 'nobody', which has no workload in the window; teams: big, small"):
        build_report(contended(), ("fifo",), {"nobody": 1.0})


# -- the command and the page on a store the simulator filled -------------------------------------------------


@pytest.fixture(scope="module")
def sim_store(tmp_path_factory, data_dir) -> tuple[str, pd.Timestamp]:
    store = tmp_path_factory.mktemp("whatif-store")
    code = main(["sim", "generate", "--nodes", "3", "--days", "0.25", "--warmup-days", "0.1", "--fault-scale", "0",
                 "--data-dir", str(data_dir), "--store", str(store)])
    assert code == 0
    _, newest = LocalStore(store).time_range()
    return str(store), newest


def test_cli_whatif_json_on_a_simulated_store(sim_store, capsys):
    store, newest = sim_store
    until = newest + pd.Timedelta(minutes=1)  # the last sample + one step: no run is cut
    code = main(["simulate", "whatif", "--store", store, "--until", until.isoformat(), "--since", "7d",
                 "--format", "json", "--policies", "fifo,gpuwarden"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "trimmed to the data held" in err  # a 7-day window over a quarter of a day
    report = json.loads(out)
    assert report["report"] == "whatif" and report["schema_version"] == 1
    rows = {r["policy"]: r for r in report["tables"]["policies"]}
    assert list(rows) == [AS_IT_RAN, "fifo", "gpuwarden"]
    frame = LocalStore(store).read(columns=["timestamp", "gpu_uuid", "mig_instance", "namespace", "pod"])
    held = frame.dropna(subset=["pod"])
    assert rows[AS_IT_RAN]["workloads"] == held.groupby(["namespace", "pod"], observed=True).ngroups
    # as it ran, from the samples directly: each sample stands for one step of its device
    start = frame["timestamp"].min()
    slices = held["mig_instance"].astype(object).map(lambda m: 1.0 if pd.isna(m) else int(str(m).split(":")[1][0]) / 7)
    gpus = frame["gpu_uuid"].nunique()
    idle = gpus * (until - start).total_seconds() / 3600 - slices.sum() * 60 / 3600
    assert rows[AS_IT_RAN]["idle_gpu_hours"] == pytest.approx(idle)
    assert rows[AS_IT_RAN]["wait_mean_seconds"] == 0.0
    assert {t["policy"] for t in report["tables"]["teams"]} == {AS_IT_RAN, "fifo", "gpuwarden"}
    assert any("submitted at its first sample" in n for n in report["notes"])


@pytest.mark.parametrize("args, expected", [
    (["--policies", "fifo,lifo"], "argument --policies: 'lifo' is not a policy; choose from fifo, kueue, tiresias, gpuwarden"),
    (["--guarantees", "alpha"], "argument --guarantees: 'alpha' is not TEAM=GPUS"),
    (["--guarantees", "nobody=2", "--policies", "fifo"], "guarantee for team 'nobody', which has no workload"),
    (["--max-gap", "soon"], "argument --max-gap: 'soon' is not a duration"),
])
def test_cli_whatif_bad_input_is_one_line_exit_2(sim_store, capsys, args, expected):
    store, newest = sim_store
    code = _exit_code(["simulate", "whatif", "--store", store,
                       "--until", (newest + pd.Timedelta(minutes=1)).isoformat(), *args])
    err = capsys.readouterr().err
    assert code == 2 and expected in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cli_whatif_on_unattributed_samples_says_why_there_is_nothing_to_replay(tmp_path, capsys):
    """Busy GPUs whose exporter could not see pods (attribution off): no workload can be rebuilt, and
    the command says so instead of printing every policy's table of zeros."""
    from builders import fleet_samples

    frame = fleet_samples(30, attribution="off", pod=None, namespace=None, team=None, project=None)
    LocalStore(tmp_path).append(frame)
    code = main(["simulate", "whatif", "--store", str(tmp_path), "--since", "30m",
                 "--until", (frame["timestamp"].max() + pd.Timedelta(minutes=1)).isoformat()])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert "nothing to replay" in err and "no sample names a pod" in err and "4 GPU(s) left out of the fleet" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def _exit_code(argv: list[str]) -> int:
    """The command's exit status, whether it returns it or argparse exits."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)


def test_cli_whatif_table_puts_the_policies_side_by_side(sim_store, capsys):
    store, newest = sim_store
    code = main(["simulate", "whatif", "--store", store, "--until", (newest + pd.Timedelta(minutes=1)).isoformat(),
                 "--policies", "fifo"])
    out = capsys.readouterr().out
    assert code == 0
    header = next(line for line in out.splitlines() if line.startswith("figure"))
    assert header.split() == ["figure", AS_IT_RAN, "fifo"]
    assert max(len(line) for line in out.splitlines() if not line.startswith("note:")) <= 120


def test_whatif_page_renders_on_the_store(monkeypatch, sim_store):
    store, _ = sim_store
    monkeypatch.setenv(STORE_ENV, store)
    at = AppTest.from_file(str(APP_PATH), default_timeout=60)
    at.run()
    at.switch_page("views/whatif.py")
    at.run()
    assert not at.exception, at.exception
    assert at.title[0].value == "What-if: your history under each policy"
    assert {m.label for m in at.metric} >= {"Workloads", "Fleet", "Idle as it ran"}
    assert int(next(m.value for m in at.metric if m.label == "Workloads").replace(",", "")) > 0
    assert len(at.dataframe) == 2  # the policies side by side, and guarantee met per team
    at.multiselect(key="whatif_policies").set_value(["fifo"]).run()
    assert not at.exception, at.exception


def test_whatif_page_explains_an_empty_store(monkeypatch, tmp_path):
    monkeypatch.setenv(STORE_ENV, str(tmp_path))
    at = AppTest.from_file(str(APP_PATH), default_timeout=30)
    at.run()
    at.switch_page("views/whatif.py")
    at.run()
    assert not at.exception, at.exception
    assert any("holds no samples yet" in i.value for i in at.info)


def test_the_cli_names_the_replay_policies_of_the_engine():
    """The CLI names the policies without importing the scheduler (a fast --help); they must agree,
    and each must be a policy of the engine."""
    from gpuwarden.cli.simulate_cmd import WHATIF_POLICIES as CLI_POLICIES
    from gpuwarden.scheduling import POLICIES

    assert CLI_POLICIES == WHATIF_POLICIES
    assert set(WHATIF_POLICIES) <= set(POLICIES)
