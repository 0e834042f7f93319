"""The Queue page and the portal read the scheduler's live queue (``GET {GPUWARDEN_SCHEDULER_URL}/queue``),
run headless with Streamlit's AppTest against a small real HTTP server serving contract-shaped JSON
(``tests/queue_server_stand_in.py``; the scheduler's own server, ``gpuwarden scheduler run`` and the
demo's loop, is wired to these pages at integration). Unset or unreachable: one line, no fallback."""

from __future__ import annotations

import socket

import pandas as pd
import pytest
from queue_server_stand_in import QueueServerStandIn, queue, team, waiting
from streamlit.testing.v1 import AppTest
from test_dashboard_idle_cost import fleet

from gpuwarden.dashboards import STORE_ENV, live_queue
from gpuwarden.dashboards.launch import APP_PATH
from gpuwarden.store import LocalStore, coerce

TEAMS = [team("alpha", 8, 16, 12, pending=1, pending_gpus=8, borrowed=4),
         team("beta", 8, 16, 4, pending=2, pending_gpus=3, lent=4)]
WAITING = [
    waiting(2, "beta", "eval-3", "beta", 1.0, "behind beta/train-9 in team beta's queue", requested_by="bob@example.com"),
    waiting(1, "beta", "train-9", "beta", 2.0, "team beta at its guarantee of 8 GPUs; 4 borrowable when alpha's end",
            priority_class="high", estimated_start="2026-12-01T13:30:00+00:00"),
    waiting(3, "alpha", "pretrain", "alpha", 8.0, "gang of 1 pod x 8 GPUs: no node has 8 free", state="suspended"),
]


@pytest.fixture
def scheduler():
    server = QueueServerStandIn(queue(TEAMS, WAITING)).start()
    yield server
    server.stop()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def queue_page(monkeypatch, store, url: str | None) -> AppTest:
    monkeypatch.setenv(STORE_ENV, str(store))
    if url is None:
        monkeypatch.delenv("GPUWARDEN_SCHEDULER_URL", raising=False)
    else:
        monkeypatch.setenv("GPUWARDEN_SCHEDULER_URL", url)
    live_queue._answer.clear()  # a fresh page: no answer kept from another test's server
    at = AppTest.from_file(str(APP_PATH), default_timeout=60)
    at.run()
    at.switch_page("views/queue.py")
    return at.run()


def test_the_queue_page_shows_the_schedulers_queue_in_its_order(monkeypatch, tmp_path, scheduler):
    at = queue_page(monkeypatch, tmp_path, scheduler.url)
    assert not at.exception, at.exception
    assert not at.error and not at.info, [e.value for e in [*at.error, *at.info]]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics == {"GPUs guaranteed": "16", "GPUs allocated": "16.0", "GPUs borrowed": "4.0", "Workloads waiting": "3"}
    assert any(f"scheduler at `{scheduler.url}`" in c.value and "round 42" in c.value for c in at.caption)
    [quotas] = [d.value for d in at.dataframe if "guaranteed_gpus" in d.value.columns]
    assert list(quotas["team"]) == ["alpha", "beta"] and list(quotas["pending_gpus"]) == [8, 3]
    assert quotas["used_gpus"].isna().all()  # no samples in this store: unknown, not 0
    [pending] = [d.value for d in at.dataframe if "reason" in d.value.columns]
    assert list(pending["workload"]) == ["beta/train-9", "beta/eval-3", "alpha/pretrain"]  # by position
    first = pending.iloc[0]
    assert first["reason"].startswith("team beta at its guarantee") and first["priority_class"] == "high"
    assert first["estimated_start"] == pd.Timestamp("2026-12-01 13:30") and pd.isna(pending.iloc[1]["estimated_start"])
    assert pending.iloc[1]["requested_by"] == "bob@example.com" and pending.iloc[2]["state"] == "suspended"
    assert pending.iloc[0]["waiting_hours"] == pytest.approx(600 / 3600)


def test_the_used_column_comes_from_the_store(monkeypatch, tmp_path, scheduler):
    from polling import wait_for

    LocalStore(tmp_path).append(coerce(fleet()))  # samples of teams alpha and beta

    def used():
        at = queue_page(monkeypatch, tmp_path, scheduler.url)
        assert not at.exception, at.exception
        [quotas] = [d.value for d in at.dataframe if "guaranteed_gpus" in d.value.columns]
        return quotas.set_index("team")["used_gpus"].to_dict() if quotas["used_gpus"].notna().any() else None

    shown = wait_for(used, timeout=60, what="the window's ledger", interval=0.5)  # computed in the background
    assert shown["alpha"] > 0 and shown["beta"] >= 0


@pytest.mark.parametrize("case", ["unset", "closed port", "no reason"])
def test_without_a_live_queue_the_page_says_why_in_one_line(monkeypatch, tmp_path, case):
    server = None
    if case == "unset":
        url = None
    elif case == "closed port":
        url = closed_port_url()
    else:  # a server that answers, but not with the contract's queue
        server = QueueServerStandIn(queue(TEAMS, [{k: v for k, v in WAITING[0].items() if k != "reason"}])).start()
        url = server.url
    try:
        at = queue_page(monkeypatch, tmp_path, url)
    finally:
        if server:
            server.stop()
    assert not at.exception, at.exception
    lines = [e.value for e in [*at.error, *at.info]]
    assert len(lines) == 1 and "\n" not in lines[0] and "GPUWARDEN_SCHEDULER_URL" in lines[0]
    assert not at.dataframe and not at.metric  # nothing drawn from anywhere else
    if case == "unset":
        assert at.info and "is not set" in lines[0]
    elif case == "closed port":
        assert at.error and f"{url}/queue: no answer" in lines[0]
    else:
        assert at.error and "workloads[0] has no 'reason'" in lines[0]


def test_the_queue_json_is_checked_key_by_key():
    with pytest.raises(ValueError, match=r"http://s/queue: no 'round' in the answer"):
        live_queue.parse({k: v for k, v in queue(TEAMS, WAITING).items() if k != "round"}, "http://s")
    with pytest.raises(ValueError, match=r"teams\[1\] has no 'lent_gpus'"):
        live_queue.parse(queue([TEAMS[0], {k: v for k, v in TEAMS[1].items() if k != "lent_gpus"}], []), "http://s")
    parsed = live_queue.parse(queue(TEAMS, WAITING), "http://s")
    assert parsed.held_gpus("beta") == 7.0 and parsed.held_gpus("gamma") == 0.0
    assert parsed.find("alpha/pretrain")["position"] == 3 and parsed.find("alpha/none") is None


# -- the portal --------------------------------------------------------------------------------------

TEMPLATES = """
teams:
  research:
    images: ["nvcr.io/nvidia/pytorch:24.05-py3", "nvcr.io/nvidia/tensorflow:24.05-tf2-py3"]
    shapes: [{gpus: 1}, {gpus: 8, pods: 4}]
    priorityClasses: [low, normal, high]
    leads: ["alice@example.com"]
    maxGpus: 40
  vision:
    images: ["vision:1"]
    shapes: [{migProfile: 1g.10gb}]
    priorityClasses: [normal]
"""


@pytest.fixture
def kube(tmp_path):
    from fake_kube_api import FakeKubeAPI

    server = FakeKubeAPI().start()
    yield server, server.kubeconfig(tmp_path / "kubeconfig.json")
    server.stop()


def portal_page(monkeypatch, tmp_path, who: str | None, **env) -> AppTest:
    templates = tmp_path / "teams.yaml"
    templates.write_text(TEMPLATES)
    for name in ("GPUWARDEN_DEMO_APPROVER", "GPUWARDEN_PORTAL_SUBMIT", "GPUWARDEN_KUBECONFIG", "KUBERNETES_SERVICE_HOST",
                 "GPUWARDEN_SCHEDULER_URL", "GPUWARDEN_APPROVER_TOKEN", "GPUWARDEN_ADMIN_TOKEN",
                 "GPUWARDEN_APPROVER_TOKEN_FILE", "GPUWARDEN_ADMIN_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUWARDEN_PORTAL_TEMPLATES", str(templates))
    if who:
        monkeypatch.setenv("GPUWARDEN_DEMO_APPROVER", who)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(STORE_ENV, str(tmp_path))
    live_queue._answer.clear()
    at = AppTest.from_file(str(APP_PATH.parent / "views" / "portal.py"), default_timeout=60)
    return at.run()


def fill(at: AppTest, team_name: str, name: str, shape_label: str, priority: str) -> AppTest:
    next(s for s in at.selectbox if s.label == "Team").set_value(team_name).run()
    next(t for t in at.text_input if t.label == "Job name").set_value(name)
    shape = next(s for s in at.selectbox if s.label == "Shape")
    shape.select_index(shape.options.index(shape_label))  # options are the shapes' labels
    next(s for s in at.selectbox if s.label == "Priority class").set_value(priority)
    next(t for t in at.text_input if t.label == "Command (optional)").set_value("torchrun --nproc-per-node 8 train.py")
    next(b for b in at.button if b.label == "Submit request").click()
    return at.run()


def test_a_signed_in_member_submits_a_job_and_sees_its_live_position(monkeypatch, tmp_path, kube, scheduler):
    from fake_kube_api import BATCH

    api, kubeconfig = kube
    at = portal_page(monkeypatch, tmp_path, "bob@example.com", GPUWARDEN_KUBECONFIG=kubeconfig,
                     GPUWARDEN_SCHEDULER_URL=scheduler.url)
    assert not at.exception, at.exception
    assert any("Signed in as **bob@example.com**" in c.value and kubeconfig in c.value for c in at.caption)
    # the form offers only the chosen team's template
    next(s for s in at.selectbox if s.label == "Team").set_value("vision").run()
    assert next(s for s in at.selectbox if s.label == "Image").options == ["vision:1"]
    assert next(s for s in at.selectbox if s.label == "Priority class").options == ["normal"]
    at = fill(at, "research", "train-7", "4 pods x 8 GPUs", "high")
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    [(namespace, name)] = api.store[(BATCH, "jobs")]
    job = api.store[(BATCH, "jobs")][(namespace, name)]
    assert (namespace, job["spec"]["parallelism"]) == ("research", 4)
    assert job["metadata"]["annotations"]["gpuwarden.io/requested-by"] == "bob@example.com"
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == ["torchrun", "--nproc-per-node", "8", "train.py"]
    assert at.success and f"research/{name}" in at.success[0].value
    assert any(f"`research/{name}`: not waiting in the scheduler's round 42" in c.value for c in at.caption)

    # the scheduler's next round queues it: the page shows its position and why it waits
    scheduler.document = queue(TEAMS, [*WAITING, waiting(4, "research", name, "research", 32.0,
                                                          "gang of 4 pods x 8 GPUs: 32 GPUs, 8 free")])
    live_queue._answer.clear()
    at.run()
    [mine] = [d.value for d in at.dataframe if "reason" in d.value.columns]
    # this session's Job, and what else waits with bob's identity on it (beta/eval-3 in WAITING)
    assert list(mine["workload"]) == ["beta/eval-3", f"research/{name}"] and list(mine["position"]) == [2, 4]
    assert mine.iloc[1]["reason"] == "gang of 4 pods x 8 GPUs: 32 GPUs, 8 free"
    assert "Only a team's leads (its template's `leads`) raise or lower its jobs." in [c.value for c in at.caption]


def test_a_request_over_max_gpus_is_refused_in_one_line(monkeypatch, tmp_path, kube, scheduler):
    api, kubeconfig = kube
    scheduler.document = queue([team("research", 8, 40, 9, pending_gpus=0)], [])  # 9 held + 32 asked > 40
    at = portal_page(monkeypatch, tmp_path, "bob@example.com", GPUWARDEN_KUBECONFIG=kubeconfig,
                     GPUWARDEN_SCHEDULER_URL=scheduler.url)
    at = fill(at, "research", "train-8", "4 pods x 8 GPUs", "normal")
    assert not at.exception and len(at.error) == 1
    assert at.error[0].value.startswith("Not submitted: shape '4 pods x 8 GPUs': 32 GPUs with the 9 team research")
    assert not api.calls("POST")


def test_a_lead_raises_a_waiting_job_of_their_team(monkeypatch, tmp_path, kube, scheduler):
    from fake_kube_api import BATCH

    api, kubeconfig = kube
    api.add(BATCH, "jobs", {"metadata": {"name": "sweep-1", "namespace": "research"}, "spec": {"suspend": False}})
    scheduler.document = queue(TEAMS, [*WAITING, waiting(4, "research", "sweep-1", "research", 1.0, "behind 3")])
    at = portal_page(monkeypatch, tmp_path, "alice@example.com", GPUWARDEN_KUBECONFIG=kubeconfig,
                     GPUWARDEN_SCHEDULER_URL=scheduler.url)
    assert not at.exception, at.exception
    [waiting_jobs] = [d.value for d in at.dataframe if "requested_by" in d.value.columns]
    assert list(waiting_jobs["workload"]) == ["research/sweep-1"]  # only the lead's team's
    next(s for s in at.selectbox if s.label == "New priority class").set_value("high")
    next(b for b in at.button if b.label == "Change priority").click().run()
    assert not at.exception and at.success and "research/sweep-1 is now high" in at.success[0].value
    assert api.get(BATCH, "jobs", "sweep-1", "research")["metadata"]["annotations"] == {
        "gpuwarden.io/priority-class": "high"}


def test_the_demo_endpoint_takes_the_request_but_no_priority_change(monkeypatch, tmp_path, scheduler):
    at = portal_page(monkeypatch, tmp_path, "alice@example.com", GPUWARDEN_SCHEDULER_URL=scheduler.url)
    at = fill(at, "research", "nb-2", "1 GPU", "low")
    assert not at.exception and not at.error, [e.value for e in at.error]
    [posted] = scheduler.posted
    assert posted["identity"] == "alice@example.com" and posted["request"]["shape"] == {"gpus": 1}
    assert at.success and "research/nb-2-1 queued" in at.success[0].value
    assert any(f"the scheduler at {scheduler.url} takes none" in c.value for c in at.caption)


@pytest.mark.parametrize(("who", "env", "line"), [
    (None, {"GPUWARDEN_SCHEDULER_URL": "http://127.0.0.1:9"}, "Sign in to request GPUs"),
    ("bob@example.com", {}, "Submitting is off: set `GPUWARDEN_KUBECONFIG`"),
    ("bob@example.com", {"GPUWARDEN_PORTAL_SUBMIT": "kube"}, "GPUWARDEN_PORTAL_SUBMIT='kube': allowed: kubernetes"),
    ("bob@example.com", {"GPUWARDEN_PORTAL_TEMPLATES": ""}, "`GPUWARDEN_PORTAL_TEMPLATES` is not set"),
])
def test_the_portal_says_in_one_line_what_it_lacks(monkeypatch, tmp_path, who, env, line):
    at = portal_page(monkeypatch, tmp_path, who, **env)
    assert not at.exception, at.exception
    lines = [e.value for e in [*at.error, *at.info]]
    assert len(lines) == 1 and line in lines[0], lines
    assert not [b for b in at.button if b.label == "Submit request"]
