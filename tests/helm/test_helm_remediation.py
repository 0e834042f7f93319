"""The chart's remediation switch, rendered by the real helm 3 (``scripts/get_helm.py``; skips with
the reason without it, fails under CI=true) and checked against the Kubernetes JSON schemas of
PyPI ``kubernetes-validate``: the default install grants no write verb; ``remediation.enabled=true``
deploys the actuator with leader election, a PDB and exactly the write verbs of the action kinds
switched on; the rendered arguments are ones ``gpuwarden actuator run`` accepts."""

from __future__ import annotations

import pytest
from test_helm import IMAGE_UID, KUBE_VERSIONS, NAMESPACE, WRITE_VERBS, helm, kube_validate, render  # noqa: F401  (fixtures)

from gpuwarden.cli import build_parser


def writes(docs) -> dict[tuple[str, str], set[str]]:
    """(kind of role, resource) -> write verbs granted."""
    out: dict[tuple[str, str], set[str]] = {}
    for doc in docs:
        if doc["kind"] in ("Role", "ClusterRole"):
            for rule in doc["rules"]:
                for resource in rule["resources"]:
                    verbs = set(rule["verbs"]) & WRITE_VERBS
                    if verbs:
                        out.setdefault((doc["kind"], resource), set()).update(verbs)
    return out


def one(docs, kind):
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def test_a_default_install_has_no_write_verb_and_no_actuator(helm):
    docs = render(helm)
    assert writes(docs) == {}
    assert not [d for d in docs if d["kind"] in ("Role", "ClusterRole", "Deployment", "ServiceAccount")]


@pytest.mark.parametrize("sets, expected", [
    ([], {("ClusterRole", "nodes"): {"patch"}, ("ClusterRole", "pods/eviction"): {"create"},
          ("ClusterRole", "jobs"): {"patch"},  # jobs: a suspend-first drain (issue 24)
          ("ClusterRole", "pods"): {"patch"}, ("ClusterRole", "events"): {"create"}}),  # a checkpoint-first drain's request
    (["remediation.actions.health=false", "remediation.actions.idle=true"],
     {("ClusterRole", "pods"): {"patch"}, ("ClusterRole", "pods/eviction"): {"create"},
      ("ClusterRole", "events"): {"create"}, ("ClusterRole", "jobs"): {"patch"}}),
    (["remediation.actions.health=false", "remediation.actions.scheduling=true", "remediation.kueue=true"],
     {("ClusterRole", "pods/eviction"): {"create"}, ("ClusterRole", "jobs"): {"patch"},
      ("ClusterRole", "jobs/status"): {"patch"}, ("ClusterRole", "workloads"): {"patch"}}),
    (["remediation.actions.health=false"], {}),
], ids=["health", "idle", "scheduling-kueue", "observe-only"])
def test_write_verbs_are_exactly_those_of_the_actions_switched_on(helm, sets, expected):
    # Acting modes (observe renders no action verb, issue 24: tests/helm/test_helm_least_privilege.py).
    docs = render(helm, "remediation.enabled=true", "remediation.mode=auto", *sets)
    granted = writes(docs)
    lease_and_event = {("Role", "leases"): {"create", "patch"}, ("Role", "events"): {"create"},
                       ("ClusterRole", "nodes/status"): {"patch"}}  # GPUHealthy, every mode
    assert granted == {**expected, **lease_and_event}
    role = one(docs, "Role")
    assert role["metadata"]["namespace"] == NAMESPACE  # leases and breaker Events only beside the actuator


def test_remediation_deploys_a_leader_elected_actuator_with_a_pdb(helm, kube_validate):
    docs = render(helm, "remediation.enabled=true", "remediation.mode=auto", "remediation.protectedNodes={a,b}",
                  "remediation.actions.idle=true", "remediation.actions.scheduling=true")
    kinds = sorted(d["kind"] for d in docs)
    for kind in ("Deployment", "ServiceAccount", "PodDisruptionBudget", "PersistentVolumeClaim", "ClusterRole",
                 "ClusterRoleBinding", "Role", "RoleBinding"):
        assert kind in kinds
    for doc in docs:
        try:
            [kube_validate.validate(doc, version, strict=True) for version in KUBE_VERSIONS]
        except kube_validate.ValidationError as error:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {'.'.join(map(str, error.path))}: {error.message}")
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]
    # The image's user (scripts/image/install.py), and the audit volume group-writable to it.
    assert {k: pod["securityContext"][k] for k in ("runAsNonRoot", "runAsUser", "runAsGroup", "fsGroup")} == \
        {"runAsNonRoot": True, "runAsUser": IMAGE_UID, "runAsGroup": IMAGE_UID, "fsGroup": IMAGE_UID}
    container = pod["containers"][0]
    args = [a.replace("$(POD_NAME)", "actuator-0") for a in container["args"]]
    parsed = build_parser().parse_args(args)  # the CLI accepts exactly what the chart renders
    assert (parsed.mode, parsed.in_cluster, parsed.leader_elect, parsed.identity) == ("auto", True, True, "actuator-0")
    assert parsed.protect_node == ["a", "b"] and parsed.scheduling == "gpuwarden" and not parsed.no_hoarding
    assert parsed.lease_name == deployment["metadata"]["name"] and parsed.namespace == NAMESPACE
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/var/lib/gpuwarden" in mounts and str(parsed.audit).startswith("/var/lib/gpuwarden/")


def test_bad_remediation_values_fail_with_the_key(helm):
    from test_helm import CHART, RELEASE, run_helm

    result = run_helm(helm, "template", RELEASE, str(CHART), "--set", "remediation.enabled=true",
                      "--set", "remediation.actions.everything=true")
    assert result.returncode != 0 and "everything" in result.stderr
