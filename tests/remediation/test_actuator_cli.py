"""``gpuwarden actuator`` end to end: samples file -> health finding -> plan / run -> the request the
API server received -> list -> undo. The Kubernetes side is ``tests/fake_kube_api.py``, a fake API
server speaking the real REST protocol (the official client runs unmodified over HTTP)."""

from __future__ import annotations

import re

import pandas as pd
import pytest
from builders import fleet_samples
from fake_kube_api import COORDINATION, CORE, FakeKubeAPI
from kube_fleet import node

from gpuwarden.remediation.approvals import pending
from gpuwarden.cli import main

START = pd.Timestamp("2026-11-23T00:00:00Z")
# Windows end at now unless told otherwise; the recorded file ends at START + 30 min.
UNTIL = ["--until", "2026-11-23T00:30:00Z"]


def samples(path, broken_node="gpu-a", minutes=30):
    """Two busy nodes of two GPUs; GPU 1 of ``broken_node`` reports an XID 79 from minute 20."""
    def xid79(minute: int, node: str, gpu: int) -> dict[str, int]:
        return {"xid_79_total": 1 if (node == broken_node and gpu == 1 and minute >= 20) else 0}

    fleet_samples(minutes, start=START, vary=xid79).to_csv(path, index=False)
    return path


@pytest.fixture
def api():
    server = FakeKubeAPI().start()
    node(server, "gpu-a")
    node(server, "gpu-b")
    yield server
    server.stop()


def test_plan_run_list_undo(api, tmp_path, capsys):
    common = [*UNTIL, "--source", "file", "--file", str(samples(tmp_path / "s.csv")), "--kubeconfig",
              api.kubeconfig(tmp_path / "kc.json"), "--audit", str(tmp_path / "audit.jsonl"), "--no-hoarding"]
    assert main(["actuator", "plan", *common]) == 0
    out = capsys.readouterr().out
    assert re.search(r"blocked-by-limit\s+drain\s+gpu-a .*would be blocked: would leave 1 of 2 nodes", out), out
    assert not (tmp_path / "audit.jsonl").exists() and api.calls("PATCH") == []

    roomy = [*common, "--max-cordoned-node-ratio", "0.5"]
    assert main(["actuator", "run", "--mode", "auto", "--rounds", "1", "--interval", "0.01", "--leader-elect",
                 "--identity", "replica-a", *roomy]) == 0
    assert api.get(COORDINATION, "leases", "gpuwarden-actuator", "gpuwarden")["spec"]["holderIdentity"] == "replica-a"
    assert api.get(CORE, "nodes", "gpu-a")["spec"]["unschedulable"] is True
    capsys.readouterr()
    assert main(["actuator", "list", "--audit", str(tmp_path / "audit.jsonl")]) == 0
    entry_id = re.search(r"^  (\w+)  .*drain\s+gpu-a\s+undo: uncordon", capsys.readouterr().out, re.M).group(1)
    assert main(["actuator", "undo", entry_id, "--by", "ops", "--audit", str(tmp_path / "audit.jsonl"),
                 "--kubeconfig", api.kubeconfig(tmp_path / "kc.json")]) == 0
    assert "unschedulable" not in api.get(CORE, "nodes", "gpu-a")["spec"]
    assert main(["actuator", "undo", entry_id, "--by", "ops", "--audit", str(tmp_path / "audit.jsonl"),
                 "--kubeconfig", api.kubeconfig(tmp_path / "kc.json")]) == 2
    assert "already undone" in capsys.readouterr().err


def test_approve_mode_queues_and_a_person_approves_from_the_command_line(api, tmp_path, capsys):
    audit = tmp_path / "audit.jsonl"
    args = [*UNTIL, "--source", "file", "--file", str(samples(tmp_path / "s.csv")), "--kubeconfig",
            api.kubeconfig(tmp_path / "kc.json"), "--audit", str(audit), "--no-hoarding", "--max-cordoned-node-ratio", "0.5"]
    assert main(["actuator", "run", "--mode", "approve", "--rounds", "1", "--interval", "0.01", *args]) == 0
    (waiting,) = pending(audit)
    assert main(["actuator", "approve", waiting.approval_id, "--by", "ops", "--audit", str(audit)]) == 0
    # issue 24: the run writes the GPUHealthy condition (nodes/status) in every mode; no other PATCH yet
    assert {c.path for c in api.calls("PATCH")} == {"/api/v1/nodes/gpu-a/status", "/api/v1/nodes/gpu-b/status"}
    assert main(["actuator", "run", "--mode", "approve", "--rounds", "1", "--interval", "0.01", *args]) == 0
    assert api.get(CORE, "nodes", "gpu-a")["spec"]["unschedulable"] is True


RATIO_NAN = "'nan' is not a finite number; expected a number >= 0 and <= 1"


@pytest.mark.parametrize("argv, words", [
    (["actuator", "run", "--mode", "sometimes"], "invalid choice"),
    (["actuator", "run", "--interval", "0"], "--interval"),
    (["actuator", "run", "--max-cordoned-node-ratio", "nan"], RATIO_NAN),
    (["actuator", "plan", "--kubeconfig", "/no/such/file"], "cannot load the kubeconfig"),
    (["actuator", "approve", "nope", "--by", "me", "--audit", "/no/such/audit.jsonl"], "no action awaits approval"),
    (["actuator", "run", "--kubeconfig", "x", "--in-cluster"], "not allowed with argument"),
])
def test_bad_input_is_one_line_and_exit_2(argv, words, capsys):
    with pytest.raises(SystemExit) if words in ("invalid choice", "--interval", RATIO_NAN, "not allowed with argument") \
            else _no_raise():
        code = main(argv)
        assert code == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


class _no_raise:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False



