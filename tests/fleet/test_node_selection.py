"""A pod's nodeSelector and required node affinity keep gpuwarden's plan where kube-scheduler would
bind the pod (before: the plan could pin a pod to a node its own selector forbids, it never bound and
its capacity was released after the admission timeout, round after round). The matcher against
kube-scheduler's rules, and a scheduling round on the fake API server (tests/fake_kube_api.py: no real
API server runs here) with the official client over HTTP."""

from __future__ import annotations

import pytest
from fake_kube_api import CORE, FakeKubeAPI
from kube_fleet import namespace, node
from kube_fleet import gated_job
from kube_fleet import connect, gpu_pod

from gpuwarden.kube.gates import QUEUE_LABEL
from gpuwarden.scheduler.scheduling_round import SchedulingRound
from gpuwarden.fleet import ActionKind
from gpuwarden.fleet.cluster_state import snapshot_from_dict, snapshot_to_dict
from gpuwarden.fleet.node_selection import LabelRequirement, selection_of, selects

@pytest.fixture
def api():
    server = FakeKubeAPI().start()
    yield server
    server.stop()


H200 = {"nvidia.com/gpu.product": "NVIDIA-H200", "zone": "b", "gpuwarden.io/generation": "9"}
H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "zone": "a", "gpuwarden.io/generation": "8"}


@pytest.mark.parametrize("operator, values, h100, h200", [
    ("In", ("a", "c"), True, False),
    ("NotIn", ("a",), False, True),
    ("Exists", (), True, True),
    ("DoesNotExist", (), False, False),
    ("Gt", ("8",), False, True),
    ("Lt", ("9",), True, False),
])
def test_each_operator_matches_as_kube_scheduler_does(operator, values, h100, h200):
    key = "gpuwarden.io/generation" if operator in ("Gt", "Lt") else "zone"
    requirement = LabelRequirement(key, operator, values)
    assert (requirement.matches(H100), requirement.matches(H200)) == (h100, h200)


def test_a_missing_label_is_not_in_any_set_and_never_greater():
    assert LabelRequirement("rack", "NotIn", ("r1",)).matches({}) is True
    assert LabelRequirement("rack", "Gt", ("1",)).matches({"rack": "r7"}) is False  # not an integer
    with pytest.raises(ValueError, match="operator 'Near' is not one of: In, NotIn"):
        LabelRequirement("zone", "Near", ("a",))


def test_node_selector_is_anded_into_every_affinity_term_and_terms_are_ored():
    selection = selection_of({"zone": "b"}, [[LabelRequirement("gpuwarden.io/generation", "Gt", ("8",))],
                                             [LabelRequirement("nvidia.com/gpu.product", "In", ("NVIDIA-H100-80GB-HBM3",))]])
    assert selects(selection, H200) is True  # zone b and generation 9
    assert selects(selection, H100) is False  # its product matches the second term, but zone a is not b
    assert selects(selection_of({}, []), H100) is True  # no selection: any node


def test_a_round_admits_a_selected_pod_only_onto_the_nodes_it_selects(api, tmp_path):
    node(api, "a0", gpus=8, labels=H100)  # first in node order, empty: where the plan went before
    node(api, "b0", gpus=8, labels=H200)
    namespace(api, "ml", {QUEUE_LABEL: "ml"}, {"gpuwarden.io/guaranteed-gpus": "16"})
    gpu_pod(api, "ml", "on-h200", gpus=4, affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}}})
    gated_job(api, "ml", "anywhere", pods=1, gpus=2)
    pod = api.get(CORE, "pods", "anywhere-0", "ml")
    pod["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-H200"}  # a Job pod with a plain nodeSelector
    api.add(CORE, "pods", pod)
    cluster = connect(api, tmp_path)
    states = {s.workload.key: s for s in cluster.snapshot().workloads}
    assert states["ml/on-h200"].workload.node_selection == (
        (LabelRequirement("zone", "In", ("b",)),),)
    results = SchedulingRound(cluster).run_round()
    assert sorted(r.action.target for r in results if r.action.kind == ActionKind.BIND and r.ok) == [
        "ml/anywhere", "ml/on-h200"]
    for name in ("on-h200", "anywhere-0"):
        terms = api.get(CORE, "pods", name, "ml")["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert {t["matchFields"][0]["values"][0] for t in terms} == {"b0"}, name
    # The user's own expressions are kept beside the pin (admission only narrows).
    (term,) = api.get(CORE, "pods", "on-h200", "ml")["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "zone", "operator": "In", "values": ["b"]}]


def test_a_pod_no_node_selects_waits_and_the_snapshot_codec_keeps_its_selection(api, tmp_path):
    node(api, "a0", gpus=8, labels=H100)
    namespace(api, "ml", {QUEUE_LABEL: "ml"}, {"gpuwarden.io/guaranteed-gpus": "16"})
    gpu_pod(api, "ml", "on-b200", gpus=1, affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                                     "values": ["NVIDIA-B200"]}]}]}}})
    cluster = connect(api, tmp_path)
    snapshot = cluster.snapshot()
    assert snapshot_from_dict(snapshot_to_dict(snapshot)) == snapshot
    results = SchedulingRound(cluster).run_round()
    assert [r for r in results if r.action.kind == ActionKind.BIND] == []
    assert api.get(CORE, "pods", "on-b200", "ml")["spec"]["schedulingGates"]  # still gated: nothing selects it
