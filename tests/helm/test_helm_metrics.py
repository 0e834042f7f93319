"""The chart's metrics endpoint, Grafana dashboards, actuator Service and operations alerts, rendered
by the real helm 3 (``scripts/get_helm.py``; skips with the reason without it, fails under CI=true)
and validated against the Kubernetes JSON schemas of PyPI ``kubernetes-validate``. The rendered
arguments are ones ``gpuwarden metrics serve`` accepts."""

# ruff: noqa: F811 - the tests name the helm and kube_validate fixtures imported from test_helm as parameters
from __future__ import annotations

import json
from pathlib import Path

import yaml
from test_helm import KUBE_VERSIONS, helm, kube_validate, render  # noqa: F401  (fixtures)

from gpuwarden.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
ALL_ON = ("metricsEndpoint.enabled=true", "remediation.enabled=true", "serviceMonitor.enabled=true",
          "serviceMonitor.labels.release=kps", "prometheusRule.enabled=true", "prometheusRule.operationsAlerts=true",
          "prometheusRule.labels.release=kps")


def _named(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def test_nothing_new_is_rendered_by_default(helm):
    docs = render(helm)
    assert not [d for d in docs if d["kind"] in ("ConfigMap", "Deployment", "PrometheusRule")]
    assert list(_named(render(helm, "prometheusRule.enabled=true"), "PrometheusRule")) == ["gw-gpuwarden"]


def test_the_metrics_endpoint_serves_what_the_cli_accepts(helm):
    docs = render(helm, *ALL_ON, "metricsEndpoint.interval=2m", "metricsEndpoint.window=12h")
    deployment = _named(docs, "Deployment")["gw-gpuwarden-metrics"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = build_parser().parse_args(container["args"])
    assert (args.action, args.listen, args.interval, args.since.total_seconds()) == ("serve", ("0.0.0.0", 9402), 120.0, 43200.0)
    assert args.source == "prometheus" and args.prometheus_url == "http://prometheus-operated.monitoring.svc:9090"
    # The actuator's audit log, read-only, from the actuator's own claim.
    assert str(args.audit) == "/var/lib/gpuwarden/audit.jsonl"
    (audit,) = [v for v in pod["volumes"] if v["name"] == "audit"]
    assert audit["persistentVolumeClaim"] == {"claimName": "gw-gpuwarden-actuator", "readOnly": True}
    assert {"name": "audit", "mountPath": "/var/lib/gpuwarden", "readOnly": True} in container["volumeMounts"]
    assert container["securityContext"]["readOnlyRootFilesystem"] and not pod["automountServiceAccountToken"]
    service = _named(docs, "Service")["gw-gpuwarden-metrics"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["port"] == 9402
    # Without the actuator there is no audit volume (and so no actuator metrics).
    alone = _named(render(helm, "metricsEndpoint.enabled=true"), "Deployment")["gw-gpuwarden-metrics"]
    assert not [v for v in alone["spec"]["template"]["spec"]["volumes"] if v["name"] == "audit"]


def test_service_monitors_select_the_actuator_and_the_metrics_endpoint(helm):
    docs = render(helm, *ALL_ON)
    monitors = _named(docs, "ServiceMonitor")
    services = _named(docs, "Service")
    assert set(monitors) == {"gw-gpuwarden-exporter", "gw-gpuwarden-actuator", "gw-gpuwarden-metrics"}
    for name in ("gw-gpuwarden-actuator", "gw-gpuwarden-metrics"):
        monitor, service = monitors[name], services[name]
        assert monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
        assert monitor["metadata"]["labels"]["release"] == "kps"
        assert monitor["spec"]["endpoints"][0]["port"] == "metrics" == service["spec"]["ports"][0]["name"]
    actuator = _named(docs, "Deployment")["gw-gpuwarden-actuator"]
    assert services["gw-gpuwarden-actuator"]["spec"]["selector"] == actuator["spec"]["selector"]["matchLabels"]
    assert services["gw-gpuwarden-actuator"]["spec"]["ports"][0]["port"] == 9401


def test_dashboards_are_config_maps_for_the_grafana_sidecar(helm):
    docs = render(helm, *ALL_ON, "metricsEndpoint.dashboardAnnotations.grafana_folder=GPUs")
    maps = _named(docs, "ConfigMap")
    committed = {p.name: p.read_text() for p in (ROOT / "dashboards" / "grafana").glob("*.json")}
    assert len(maps) == len(committed) == 5
    for config_map in maps.values():
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["annotations"] == {"grafana_folder": "GPUs"}
        ((file_name, text),) = config_map["data"].items()
        assert json.loads(text) == json.loads(committed[file_name])
    off = render(helm, "metricsEndpoint.enabled=true", "metricsEndpoint.grafanaDashboards=false")
    assert not _named(off, "ConfigMap")


def test_operations_alerts_are_an_opt_in_prometheus_rule(helm):
    docs = render(helm, *ALL_ON)
    rules = _named(docs, "PrometheusRule")
    assert set(rules) == {"gw-gpuwarden", "gw-gpuwarden-operations"}
    shipped = yaml.safe_load((ROOT / "rules" / "operations" / "gpuwarden-operations.rules.yml").read_text())["groups"]
    assert rules["gw-gpuwarden-operations"]["spec"]["groups"] == shipped
    assert rules["gw-gpuwarden-operations"]["metadata"]["labels"]["release"] == "kps"


def test_bad_values_name_the_key(helm):
    from test_helm import CHART, RELEASE, run_helm

    result = run_helm(helm, "template", RELEASE, str(CHART), "--set", "metricsEndpoint.interval=soon")
    assert result.returncode != 0 and "metricsEndpoint.interval" in result.stderr


def test_rendered_manifests_validate_against_kubernetes(helm, kube_validate):
    errors = []
    for doc in render(helm, *ALL_ON):
        if doc["apiVersion"] == "monitoring.coreos.com/v1":
            continue  # a CRD: kubernetes-validate has no schema for it
        for version in (KUBE_VERSIONS[0], KUBE_VERSIONS[-1]):
            try:
                kube_validate.validate(doc, version, strict=True)
            except kube_validate.ValidationError as error:
                errors.append(f"{version} {doc['kind']}/{doc['metadata']['name']}: {error.message}")
    assert not errors, "\n".join(errors[:10])


def test_pricing_values_become_the_endpoints_price_book_and_inventory(helm, tmp_path):
    from test_helm import CHART, NAMESPACE, RELEASE, run_helm

    from gpuwarden.analytics import Inventory, PriceBook

    values = {"metricsEndpoint": {"enabled": True}, "pricing": {
        "priceBook": {"currency": "USD", "power": {"kwh_price": 0.2, "pue": 1.3}, "owned_defaults": {"lifetime_years": 5},
                      "models": {"NVIDIA H100 80GB HBM3": {"on-demand": 5.0, "reserved": 3.0, "spot": 2.0,
                                                           "owned": {"capex": 30000}}}},
        "inventory": {"default_tier": "reserved", "rules": [{"pattern": "gpu-*", "pool": "gpu", "tier": "owned"}]}}}
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    result = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(tmp_path / "values.yaml"))
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    pricing = _named(docs, "ConfigMap")["gw-gpuwarden-pricing"]["data"]
    for file_name, text in pricing.items():
        (tmp_path / file_name).write_text(text)
    book = PriceBook.from_yaml(tmp_path / "pricebook.yaml")
    assert book.currency == "USD" and list(book.models) == ["NVIDIA H100 80GB HBM3"]
    assert Inventory.from_yaml(tmp_path / "inventory.yaml").lookup("gpu-007")[1] == "owned"
    deployment = _named(docs, "Deployment")["gw-gpuwarden-metrics"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert (env["GPUWARDEN_PRICE_BOOK"], env["GPUWARDEN_INVENTORY"]) == ("/etc/gpuwarden/pricing/pricebook.yaml",
                                                                        "/etc/gpuwarden/pricing/inventory.yaml")
    assert env["GPUWARDEN_PRICING_SOURCE"] == f"ConfigMap {NAMESPACE}/gw-gpuwarden-pricing"
    assert {"name": "pricing", "mountPath": "/etc/gpuwarden/pricing", "readOnly": True} in container["volumeMounts"]
    # Without pricing values: the bundled book and inventory, no ConfigMap, no pricing environment.
    bundled = render(helm, "metricsEndpoint.enabled=true", "metricsEndpoint.grafanaDashboards=false")
    assert not _named(bundled, "ConfigMap")
    (plain,) = _named(bundled, "Deployment")["gw-gpuwarden-metrics"]["spec"]["template"]["spec"]["containers"]
    assert not [e for e in plain.get("env", []) if e["name"].startswith("GPUWARDEN_PRIC")]


def test_the_dashboard_prices_with_the_charts_price_book_and_inventory(helm, tmp_path):
    """The dashboard mounts the same ConfigMap the metrics endpoint reads, and the files its
    environment names load as the book and inventory the values hold, named by the ConfigMap."""
    from test_helm import CHART, NAMESPACE, RELEASE, run_helm

    from gpuwarden.analytics.pricing_files import load_pricing

    values = {"dashboard": {"enabled": True, "auth": {"public": True}}, "pricing": {
        "priceBook": {"version": "v7", "models": {"NVIDIA H100 80GB HBM3": {"on-demand": 5.0, "spot": 2.0}}},
        "inventory": {"rules": [{"pattern": "gpu-*", "pool": "gpu", "tier": "spot"}]}}}
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    result = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(tmp_path / "values.yaml"))
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    config_map = _named(docs, "ConfigMap")["gw-gpuwarden-pricing"]
    pod = _named(docs, "Deployment")["gw-gpuwarden-dashboard"]["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "pricing"]
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "pricing"]
    assert volume["configMap"]["name"] == "gw-gpuwarden-pricing" and mount["readOnly"] is True
    assert "checksum/pricing" in pod["metadata"]["annotations"]  # new values restart the pod
    # Lay the ConfigMap's files where the pod would see them and load them as the dashboard does.
    root = tmp_path / mount["mountPath"].lstrip("/")
    root.mkdir(parents=True)
    for file_name, text in config_map["data"].items():
        (root / file_name).write_text(text)
    env = {k: str(tmp_path / v.lstrip("/")) if k in ("GPUWARDEN_PRICE_BOOK", "GPUWARDEN_INVENTORY") else v
           for k, v in env.items()}
    book, inventory = load_pricing(environ=env)
    assert book.version == "v7" and book.hourly("H100", "spot") == 2.0
    assert book.source.startswith(f"ConfigMap {NAMESPACE}/gw-gpuwarden-pricing (")
    assert inventory.lookup("gpu-3")[1] == "spot"


def test_a_bad_tier_in_the_pricing_values_names_the_allowed_tiers(helm, tmp_path):
    from test_helm import CHART, NAMESPACE, RELEASE, run_helm

    values = {"metricsEndpoint": {"enabled": True},
              "pricing": {"inventory": {"rules": [{"pattern": "gpu-*", "pool": "gpu", "tier": "cheap"}]}}}
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    result = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(tmp_path / "values.yaml"))
    assert result.returncode != 0
    assert "pricing.inventory.rules.0.tier" in result.stderr.replace("/", ".") and "on-demand" in result.stderr
    # A price under a tier the book does not know (committed is reserved's other name, and allowed).
    values = {"metricsEndpoint": {"enabled": True}, "pricing": {"priceBook": {"models": {
        "NVIDIA H100 80GB HBM3": {"committed": 4.0, "preemptible": 2.0}}}}}
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    result = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(tmp_path / "values.yaml"))
    assert result.returncode != 0 and "preemptible" in result.stderr and "committed" not in result.stderr
    # A book without models (the code refuses it at run time): refused at install.
    values = {"metricsEndpoint": {"enabled": True}, "pricing": {"priceBook": {"power": {"kwh_price": 0.3}}}}
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    result = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(tmp_path / "values.yaml"))
    assert result.returncode != 0 and "models" in result.stderr


def test_the_bundled_book_and_inventory_pass_the_schema_and_keep_their_hash_through_the_config_map(helm, tmp_path):
    """Copying the bundled files into the values is how a user starts: the schema accepts them, and
    the ConfigMap's copy is the same book (same content hash) as the bundled one."""
    from test_helm import CHART, NAMESPACE, RELEASE, run_helm

    from gpuwarden.analytics import Inventory, PriceBook
    from gpuwarden.analytics.inventory import DEFAULT_INVENTORY_PATH
    from gpuwarden.analytics.pricebook import DEFAULT_PRICE_BOOK_PATH

    values = {"metricsEndpoint": {"enabled": True}, "pricing": {
        "priceBook": yaml.safe_load(DEFAULT_PRICE_BOOK_PATH.read_text()),
        "inventory": yaml.safe_load(DEFAULT_INVENTORY_PATH.read_text())}}
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    result = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(tmp_path / "values.yaml"))
    assert result.returncode == 0, result.stderr
    data = _named([d for d in yaml.safe_load_all(result.stdout) if d], "ConfigMap")["gw-gpuwarden-pricing"]["data"]
    (tmp_path / "pricebook.yaml").write_text(data["pricebook.yaml"])
    (tmp_path / "inventory.yaml").write_text(data["inventory.yaml"])
    assert PriceBook.from_yaml(tmp_path / "pricebook.yaml").digest == PriceBook.default().digest
    assert Inventory.from_yaml(tmp_path / "inventory.yaml").digest == Inventory.default().digest
