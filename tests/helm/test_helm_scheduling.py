"""The chart's live scheduling (``scheduling.*``) and portal (``portal.teams``), rendered by the real
helm 3 (``scripts/get_helm.py``; skips with the reason without it, fails under CI=true).

``tests/helm/test_helm.py`` renders the ``scheduling.*`` switches with the others (every 3-way
combination: lint, schemas, lock-down, RBAC owners). Here a handful of renders, the portal's among
them (``portal.teams`` is no switch), go through the same checks (``tests/helm/test_helm.py``'s own
functions) and the specifics are asserted: with defaults none of it renders; the scheduler
Deployment, Service, webhook configuration and RBAC (exact verbs, secrets and the webhook
configuration by name only); the node label keys (the CLI's defaults) and ``extraArgs`` last;
cert-manager or the scheduler's own certificates; the portal's ConfigMap, the dashboard's identity
and per-namespace Roles; the rendered webhook agrees with the code that serves it (path, labels,
certificate names).
"""

from __future__ import annotations

import pytest
import yaml
from test_helm import CHART, NAMESPACE, RELEASE, WRITE_VERBS, by_kind, render, run_helm
from test_helm import cached_schemas, helm, kube_validate  # noqa: F401  (fixtures)
from test_helm import test_contradictions_are_rejected_with_the_key as refused_naming_the_key
from test_helm import test_every_3way_combination_passes_helm_lint_strict as lint_strict_passes
from test_helm import test_every_container_is_locked_down_in_every_combination as locked_down
from test_helm import test_every_manifest_validates_against_kubernetes_1_29_to_1_37 as validates

from gpuwarden.kube.certs import CertPolicy
from gpuwarden.kube.gates import KUEUE_QUEUE_LABEL, QUEUE_LABEL
from gpuwarden.kube.webhook import MUTATE_PATH
from gpuwarden.cli import build_parser

SCHEDULER = f"{RELEASE}-gpuwarden-scheduler"
DASHBOARD = f"{RELEASE}-gpuwarden-dashboard"
SECRET = f"{SCHEDULER}-webhook-cert"
CERT_MANAGER = "cert-manager.io/v1"
TEAMS = ["portal.teams.research.namespace=research", "portal.teams.research.images={nvcr.io/nvidia/pytorch:24.05-py3}",
         "portal.teams.research.shapes[0].gpus=8", "portal.teams.research.shapes[0].pods=4",
         "portal.teams.research.shapes[1].migProfile=1g.10gb", "portal.teams.research.priorityClasses={low,normal,high}",
         "portal.teams.research.leads={alice@example.com}", "portal.teams.research.maxGpus=32",
         "portal.teams.vision.namespace=vision-ml", "portal.teams.vision.images={img:1}",
         "portal.teams.vision.shapes[0].sharedGpu=true", "portal.teams.vision.priorityClasses={low}"]
OWN_CERTS = ("scheduling.enabled=true",)
CERT_MANAGER_ALL = ("scheduling.enabled=true", "scheduling.webhook.certManager.enabled=true",
                    "scheduling.migManager.enabled=true", "scheduling.kueue=true", "serviceMonitor.enabled=true")
PORTAL = ("scheduling.enabled=true", "dashboard.enabled=true", *TEAMS)
DEFAULT_LABELS = {"leaf_switch_label": "gpuwarden.io/leaf-switch", "nvlink_domain_label": "nvidia.com/gpu.clique",
                  "pool_label": "gpuwarden.io/pool"}
EXTRA_ARGS = ["--page-size=200", "--pool-label=pool.example.com/tier"]
NODE_LABELS = ("scheduling.enabled=true", "scheduling.nodeLabels.leafSwitch=net.example.com/tor",
               "scheduling.nodeLabels.nvlinkDomain=nvl", "scheduling.nodeLabels.pool=pool.example.com/name",
               f"scheduling.extraArgs={{{','.join(EXTRA_ARGS)}}}")


def named(docs, kind, name):
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def scheduler_args(docs) -> list[str]:
    return named(docs, "Deployment", SCHEDULER)["spec"]["template"]["spec"]["containers"][0]["args"]


def grants(docs) -> dict[tuple[str, str, str], set[str]]:
    """(role kind, namespace, resource[/resourceName]) -> verbs, for the scheduler's and the portal's roles."""
    out: dict[tuple[str, str, str], set[str]] = {}
    for doc in docs:
        if doc["kind"] in ("Role", "ClusterRole"):
            for rule in doc["rules"]:
                for resource in rule["resources"]:
                    for name in rule.get("resourceNames") or [""]:
                        key = (doc["kind"], doc["metadata"].get("namespace", ""), f"{resource}/{name}".rstrip("/"))
                        out.setdefault(key, set()).update(rule["verbs"])
    return out


@pytest.fixture(scope="module")
def renders(helm):
    """The renders this file checks, each linted once."""
    out = {}
    for sets in (OWN_CERTS, CERT_MANAGER_ALL, PORTAL, NODE_LABELS):
        args = [arg for item in sets for arg in ("--set", item)]
        out[sets] = (render(helm, *sets), run_helm(helm, "lint", "--strict", str(CHART), *args))
    return out


def test_with_defaults_none_of_it_renders(helm):
    for sets in ([], ["dashboard.enabled=true"]):
        docs = render(helm, *sets)
        names = [d["metadata"]["name"] for d in docs]
        assert not [n for n in names if "scheduler" in n or "portal" in n], names
        assert not by_kind(docs).keys() & {"MutatingWebhookConfiguration", "ConfigMap", "Role", "ClusterRole",
                                           "ServiceAccount", "Issuer", "Certificate"}
    pod = named(docs, "Deployment", DASHBOARD)["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod  # no API access
    env = {e["name"] for e in pod["containers"][0]["env"]}
    assert not env & {"GPUWARDEN_SCHEDULER_URL", "GPUWARDEN_PORTAL_TEMPLATES"}


def test_every_render_lints_validates_and_is_locked_down(renders, cached_schemas):
    lint_strict_passes(renders)
    for sets, (docs, _) in renders.items():
        crds = [d for d in docs if d["apiVersion"] == CERT_MANAGER]  # no schema in kubernetes-validate
        assert all(d["metadata"]["namespace"] == NAMESPACE for d in crds)
        validates({sets: ([d for d in docs if d not in crds], None)}, cached_schemas)
        ours = [d for d in docs if d["metadata"]["name"] in (SCHEDULER, DASHBOARD)]
        assert ours
        locked_down({sets: (ours, None)})


def test_the_scheduler_deployment_and_service(renders):
    docs, _ = renders[OWN_CERTS]
    deployment = named(docs, "Deployment", SCHEDULER)
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 2 and pod["serviceAccountName"] == SCHEDULER
    (container,) = pod["containers"]
    args = container["args"]
    assert args[:3] == ["scheduler", "run", "--in-cluster"]
    for arg in ("--leader-elect", "--port=8083", "--webhook-port=9443", "--policy=gpuwarden", "--interval-seconds=10",
                f"--lease-name={SCHEDULER}", "--identity=$(POD_NAME)", f"--namespace={NAMESPACE}",
                f"--webhook-secret={SECRET}", f"--webhook-service={SCHEDULER}", f"--webhook-configuration={SCHEDULER}"):
        assert arg in args, arg
    assert "--mig-manager" not in args
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http-metrics": 8083, "webhook": 9443}
    assert container["livenessProbe"]["httpGet"] == container["readinessProbe"]["httpGet"] == \
        {"path": "/healthz", "port": "http-metrics"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes["webhook-certs"]  # the scheduler writes its own pair there
    service = named(docs, "Service", SCHEDULER)
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert {(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == \
        {("http-metrics", 8083, "http-metrics"), ("webhook", 443, "webhook")}
    assert named(docs, "PodDisruptionBudget", SCHEDULER)["spec"]["maxUnavailable"] == 1
    assert "ServiceMonitor" not in by_kind(docs)


def test_the_rendered_arguments_are_ones_the_cli_accepts(renders):
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # noqa: SLF001 (argparse keeps them nowhere public)
    if "scheduler" not in commands:
        pytest.skip("`gpuwarden scheduler run` is not in this branch (wired at integration)")
    parsed = {}
    for sets in (OWN_CERTS, CERT_MANAGER_ALL, NODE_LABELS):
        parsed[sets] = parser.parse_args([a.replace("$(POD_NAME)", "scheduler-0") for a in scheduler_args(renders[sets][0])])
    # The chart's label defaults are the CLI's; the last of a repeated flag (extraArgs) wins.
    cli_defaults = parser.parse_args(["scheduler", "run"])
    assert {key: getattr(cli_defaults, key) for key in DEFAULT_LABELS} == DEFAULT_LABELS
    assert {key: getattr(parsed[OWN_CERTS], key) for key in DEFAULT_LABELS} == DEFAULT_LABELS
    custom = parsed[NODE_LABELS]
    assert (custom.leaf_switch_label, custom.nvlink_domain_label, custom.pool_label, custom.page_size) == \
        ("net.example.com/tor", "nvl", "pool.example.com/tier", 200)
    assert (custom.source, custom.prometheus_url) == ("prometheus", "http://prometheus-operated.monitoring.svc:9090")


def test_node_label_keys_render_and_extra_args_come_last(renders):
    defaults = scheduler_args(renders[OWN_CERTS][0])
    for arg in ("--leaf-switch-label=gpuwarden.io/leaf-switch", "--nvlink-domain-label=nvidia.com/gpu.clique",
                "--pool-label=gpuwarden.io/pool", "--source=prometheus",
                "--prometheus-url=http://prometheus-operated.monitoring.svc:9090"):
        assert defaults.count(arg) == 1, arg
    assert not [a for a in defaults if a.startswith("--page-size")]
    custom = scheduler_args(renders[NODE_LABELS][0])
    for arg in ("--leaf-switch-label=net.example.com/tor", "--nvlink-domain-label=nvl",
                "--pool-label=pool.example.com/name"):
        assert arg in custom, arg
    assert custom[-len(EXTRA_ARGS):] == EXTRA_ARGS  # verbatim, after every flag the chart sets
    chart_own = custom[:-len(EXTRA_ARGS)]
    assert [a.split("=")[0] for a in chart_own] == [a.split("=")[0] for a in defaults]


def test_the_webhook_configuration_never_blocks_and_matches_the_server(renders):
    docs, _ = renders[OWN_CERTS]
    config = named(docs, "MutatingWebhookConfiguration", SCHEDULER)
    (webhook,) = config["webhooks"]
    assert (webhook["failurePolicy"], webhook["sideEffects"], webhook["timeoutSeconds"], webhook["reinvocationPolicy"]) \
        == ("Ignore", "None", 5, "Never")
    assert webhook["admissionReviewVersions"] == ["v1"]
    assert webhook["clientConfig"] == {"service": {"name": SCHEDULER, "namespace": NAMESPACE, "path": MUTATE_PATH,
                                                   "port": 443}}  # no caBundle: the scheduler sets and keeps it
    (rule,) = webhook["rules"]
    assert (rule["apiGroups"], rule["apiVersions"], rule["operations"], rule["resources"]) == ([""], ["v1"], ["CREATE"], ["pods"])
    queue, system = webhook["namespaceSelector"]["matchExpressions"]
    assert queue == {"key": QUEUE_LABEL, "operator": "Exists"}
    assert system["operator"] == "NotIn" and set(system["values"]) == {"kube-system", NAMESPACE}
    assert webhook["objectSelector"] == {"matchExpressions": [{"key": KUEUE_QUEUE_LABEL, "operator": "DoesNotExist"}]}
    assert "annotations" not in config["metadata"]
    assert not [d for d in docs if d["apiVersion"] == CERT_MANAGER]


def test_scheduler_rbac_is_exactly_what_it_does(renders):
    granted = grants(renders[OWN_CERTS][0])
    cluster = {"pods": {"get", "list", "watch", "patch"}, "pods/eviction": {"create"}, "events": {"create"},
               "nodes": {"get", "list"}, "namespaces": {"list"}, "jobs": {"get", "list", "patch"},
               "jobsets": {"get", "patch"}, "poddisruptionbudgets": {"get", "list"}, "priorityclasses": {"get", "list"},
               f"mutatingwebhookconfigurations/{SCHEDULER}": {"get", "patch"},
               # read only: native gangs (scheduling.k8s.io; Kueue's workloads are not granted here) and DRA
               "podgroups": {"list"}, "workloads": {"list"}, "deviceclasses": {"list"}, "resourceslices": {"list"},
               "resourceclaims": {"get", "list"}, "resourceclaimtemplates": {"get", "list"}}
    expected = {("ClusterRole", "", r): v for r, v in cluster.items()}
    expected |= {("Role", NAMESPACE, "leases"): {"get", "create", "patch"}, ("Role", NAMESPACE, "secrets"): {"create"},
                 ("Role", NAMESPACE, f"secrets/{SECRET}"): {"get", "patch"}}
    assert granted == expected
    # With cert-manager, MIG layout changes and Kueue: no Secret or webhook writes; nodes and workloads patch.
    granted = grants(renders[CERT_MANAGER_ALL][0])
    writes = {key[2]: verbs & WRITE_VERBS for key, verbs in granted.items() if verbs & WRITE_VERBS}
    assert writes == {"pods": {"patch"}, "pods/eviction": {"create"}, "events": {"create"}, "nodes": {"patch"},
                      "jobs": {"patch"}, "jobsets": {"patch"}, "workloads": {"patch"}, "leases": {"create", "patch"}}


def test_cert_manager_issues_the_certificate_and_injects_the_ca(renders, helm):
    docs, _ = renders[CERT_MANAGER_ALL]
    config = named(docs, "MutatingWebhookConfiguration", SCHEDULER)
    certificate = named(docs, "Certificate", f"{SCHEDULER}-webhook")
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/{SCHEDULER}-webhook"
    # The name the API server calls is the one the self-managed path signs too.
    assert CertPolicy(SCHEDULER, NAMESPACE).dns_names[0] in certificate["spec"]["dnsNames"]
    issuer = named(docs, "Issuer", f"{SCHEDULER}-selfsigned")
    assert issuer["spec"] == {"selfSigned": {}}
    assert certificate["spec"]["issuerRef"] == {"name": issuer["metadata"]["name"], "kind": "Issuer", "group": "cert-manager.io"}
    pod = named(docs, "Deployment", SCHEDULER)["spec"]["template"]["spec"]
    volume = {v["name"]: v for v in pod["volumes"]}["webhook-certs"]
    assert volume["secret"]["secretName"] == certificate["spec"]["secretName"] == SECRET
    args = pod["containers"][0]["args"]
    assert "--mig-manager" in args and not [a for a in args if a.startswith(("--webhook-secret", "--webhook-configuration"))]
    monitor = named(docs, "ServiceMonitor", SCHEDULER)
    assert monitor["spec"]["endpoints"][0]["port"] == "http-metrics"
    # An existing issuer replaces the self-signed one.
    docs = render(helm, *CERT_MANAGER_ALL, "scheduling.webhook.certManager.issuerRef.name=corp-ca",
                  "scheduling.webhook.certManager.issuerRef.kind=ClusterIssuer")
    assert "Issuer" not in by_kind(docs)
    assert named(docs, "Certificate", f"{SCHEDULER}-webhook")["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer"}


def test_the_portal_templates_reach_the_dashboard_with_job_rights_in_team_namespaces_only(renders):
    docs, _ = renders[PORTAL]
    templates = yaml.safe_load(named(docs, "ConfigMap", f"{RELEASE}-gpuwarden-portal")["data"]["templates.yaml"])
    assert templates == {"teams": {
        "research": {"namespace": "research", "images": ["nvcr.io/nvidia/pytorch:24.05-py3"],
                     "shapes": [{"gpus": 8, "pods": 4}, {"migProfile": "1g.10gb"}],
                     "priorityClasses": ["low", "normal", "high"], "leads": ["alice@example.com"], "maxGpus": 32},
        "vision": {"namespace": "vision-ml", "images": ["img:1"], "shapes": [{"sharedGpu": True}],
                   "priorityClasses": ["low"]}}}
    pod = named(docs, "Deployment", DASHBOARD)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == DASHBOARD and pod["automountServiceAccountToken"] is True
    named(docs, "ServiceAccount", DASHBOARD)
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPUWARDEN_SCHEDULER_URL"] == f"http://{SCHEDULER}.{NAMESPACE}.svc:8083"
    mount = {m["name"]: m for m in container["volumeMounts"]}["portal-templates"]
    assert f"{mount['mountPath']}/templates.yaml" == env["GPUWARDEN_PORTAL_TEMPLATES"] and mount["readOnly"] is True
    assert {v["name"]: v for v in pod["volumes"]}["portal-templates"]["configMap"]["name"] == f"{RELEASE}-gpuwarden-portal"
    portal = {k: v for k, v in grants(docs).items() if k[1] in ("research", "vision-ml")}
    assert portal == {("Role", "research", "jobs"): {"create", "get", "patch"},
                      ("Role", "vision-ml", "jobs"): {"create", "get", "patch"}}
    for binding in by_kind(docs)["RoleBinding"]:
        if binding["metadata"]["namespace"] in ("research", "vision-ml"):
            assert binding["subjects"] == [{"kind": "ServiceAccount", "name": DASHBOARD, "namespace": NAMESPACE}]


@pytest.mark.parametrize("sets, expected", [
    (["dashboard.enabled=true", *TEAMS], ["portal.teams needs scheduling.enabled=true"]),
    (["scheduling.enabled=true", *TEAMS], ["portal.teams needs dashboard.enabled=true"]),
    ([*PORTAL, "portal.teams.other.namespace=research", "portal.teams.other.images={x}",
      "portal.teams.other.shapes[0].gpus=1", "portal.teams.other.priorityClasses={low}"],
     ["namespace=research is already team", "a namespace queues for one team"]),
    ([*PORTAL, "portal.teams.research.shapes[2].cpus=4"], ["portal.teams.research.shapes.2", "cpus"]),
    ([*PORTAL, "portal.teams.research.priorityClasses={urgent}"],
     ["portal.teams.research.priorityClasses.0", '"best-effort", "low", "normal", "high", "critical"']),
    (["scheduling.enabled=true", "scheduling.webhook.timeoutSeconds=60"], ["scheduling.webhook.timeoutSeconds", "30"]),
    (["scheduling.enabled=true", "scheduling.webhook.port=8083"], ["scheduling.webhook.port=8083 is scheduling.port too"]),
    (["scheduling.enabled=true", "scheduling.nodeLabels.pool=gpu pool"], ["scheduling.nodeLabels.pool", "pattern"]),
    (["scheduling.enabled=true", "scheduling.nodeLabels.leafSwitch=Net.Example.com/tor"],
     ["scheduling.nodeLabels.leafSwitch", "pattern"]),
    (["scheduling.enabled=true", f"scheduling.nodeLabels.nvlinkDomain={'a' * 254}/{'b' * 63}"],
     ["scheduling.nodeLabels.nvlinkDomain", "317"]),
    (["scheduling.enabled=true", "scheduling.extraArgs={--page-size=200,page-size=200}"],
     ["scheduling.extraArgs.1", "^--"]),
], ids=["portal-without-scheduler", "portal-without-dashboard", "two-teams-one-namespace", "unknown-shape-key",
        "unknown-priority-class", "webhook-timeout", "one-port-for-two", "label-key-with-space",
        "label-prefix-uppercase", "label-key-too-long", "extra-arg-not-a-flag"])
def test_bad_values_are_refused_naming_the_key(helm, sets, expected):
    refused_naming_the_key(helm, sets, expected)
