"""Price tiers per node (labels, inventory, default) reach the cost of every GPU-hour, and every
report, the metrics and the dashboard's cost data name the price book they used."""

from __future__ import annotations

from builders import TIER_HOURS as HOURS, TIER_START as START, TIER_WATTS as WATTS
from builders import tier_samples as samples

import json
import re

import pandas as pd
import pytest
import yaml

from gpuwarden.kube.inventory_nodes import read_node
from gpuwarden.analytics import Inventory, PriceBook
from gpuwarden.analytics.params import AnalyticsError
from gpuwarden.analytics.pricing_files import INVENTORY_ENV, PRICE_BOOK_ENV, PRICING_SOURCE_ENV, load_pricing
from gpuwarden.analytics.windows import Window
from gpuwarden.cli import main
from gpuwarden.fleet import FleetValueError, PriceTier
from gpuwarden.fleet.price_tiers import ksm_label_name, parse_tier, tier_from_labels

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tiers")
    samples().to_parquet(tmp / "samples.parquet")
    (tmp / "inventory.yaml").write_text(yaml.safe_dump({"default_tier": "on-demand", "rules": [
        {"pattern": "gpu-spot-*", "pool": "gpu", "tier": "spot"},
        {"pattern": "gpu-owned-*", "pool": "gpu", "tier": "owned"}]}))
    (tmp / "book.yaml").write_text(yaml.safe_dump({"version": "q1-2026", "power": {"kwh_price": 0.2, "pue": 1.25},
                                                   "models": {H100: {"on-demand": 8.0, "reserved": 5.0, "spot": 3.0,
                                                                     "owned": {"capex": 35040, "lifetime_years": 4}}}}))
    return tmp


def report(capsys, files, *extra: str) -> tuple[str, str]:
    until = (START + pd.Timedelta(hours=HOURS)).isoformat()
    code = main(["report", "cost", "--source", "file", "--file", str(files / "samples.parquet"), "--since", f"{HOURS}h",
                 "--until", until, "--price-book", str(files / "book.yaml"), "--inventory", str(files / "inventory.yaml"),
                 *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, err


def test_a_report_prices_spot_owned_and_on_demand_nodes_by_their_tier_and_names_the_book(capsys, files):
    out, _ = report(capsys, files, "--format", "json")
    data = json.loads(out)
    by_tier = {row["tier"]: row["cost"] for row in data["tables"]["by_tier"]}
    owned = 35040 / (4 * 8760) + WATTS / 1000 * 0.2 * 1.25  # capex per hour + energy at the measured power
    assert by_tier["on-demand"] == pytest.approx(8.0 * HOURS, rel=1e-6)
    assert by_tier["spot"] == pytest.approx(3.0 * HOURS, rel=1e-6)
    assert by_tier["owned"] == pytest.approx(owned * HOURS, rel=1e-6)
    book = PriceBook.from_yaml(files / "book.yaml")
    assert data["summary"]["price_book"]["version"] == "q1-2026"
    assert data["summary"]["price_book"]["sha256"] == book.digest
    assert f"price book: {files / 'book.yaml'} (version q1-2026, sha256 {book.digest[:12]})" in data["notes"]
    assert any(n.startswith("price tiers: 2 from the inventory") and "1 at the default tier on-demand" in n
               for n in data["notes"])
    table, _ = report(capsys, files)
    assert f"note: price book: {files / 'book.yaml'}" in table
    csv, err = report(capsys, files, "--format", "csv")  # the table stays a plain CSV; the book is named on stderr
    assert csv.splitlines()[0].startswith("pool,") and f"note: price book: {files / 'book.yaml'}" in err
    assert "note: price tiers: 2 from the inventory" in err  # every note of the report, as the table has them


def test_a_node_label_wins_over_the_inventory(files):
    from gpuwarden.analytics import build_ledger

    inventory = Inventory.from_yaml(files / "inventory.yaml").with_labels(
        {"gpu-plain-0": {ksm_label_name("karpenter.sh/capacity-type"): "spot"}}, "kube_node_labels")
    ledger = build_ledger(samples(), price_book=PriceBook.from_yaml(files / "book.yaml"), inventory=inventory)
    cost = ledger.rows.groupby("node")["cost"].sum()
    assert cost["gpu-plain-0"] == pytest.approx(3.0 * HOURS) and cost["gpu-spot-0"] == pytest.approx(3.0 * HOURS)
    assert "price tiers: 1 node(s) from label karpenter.sh/capacity-type; 2 from the inventory" in " ".join(ledger.notes)


@pytest.mark.parametrize(("labels", "tier"), [
    ({"gpuwarden.io/price-tier": "owned", "karpenter.sh/capacity-type": "spot"}, PriceTier.OWNED),  # ours first
    ({"gpuwarden.io/price-tier": "committed"}, PriceTier.RESERVED),
    ({"karpenter.sh/capacity-type": "spot"}, PriceTier.SPOT),
    ({"eks.amazonaws.com/capacityType": "CAPACITY_BLOCK"}, PriceTier.RESERVED),
    ({"cloud.google.com/gke-spot": "false", "eks.amazonaws.com/capacityType": "ON_DEMAND"}, PriceTier.ON_DEMAND),
    ({"label_cloud_google_com_gke_spot": "true"}, PriceTier.SPOT),  # as kube-state-metrics spells it
    ({"kubernetes.azure.com/scalesetpriority": "spot"}, PriceTier.SPOT),
])
def test_labels_give_the_tier(labels, tier):
    assert tier_from_labels(labels)[0] is tier


def test_no_tier_label_leaves_the_tier_to_the_inventory():
    assert tier_from_labels({"node.kubernetes.io/instance-type": "p5.48xlarge", "cloud.google.com/gke-spot": "false"}) is None


def test_a_bad_tier_name_is_an_error_naming_the_allowed_tiers(tmp_path):
    allowed = re.escape("on-demand, reserved, spot, owned, committed (= reserved)")
    with pytest.raises(FleetValueError, match=f"price tier 'cheap' is not one of: {allowed}"):
        parse_tier("cheap", "here")
    # a label that is no tier prices that node by the inventory and is named in the tier note (issue 35)
    labelled = Inventory.default().with_labels({"n1": {"label_gpuwarden_io_price_tier": "cheap"}})
    assert labelled.explain("n1")[2] == "default"
    assert re.search(r"node n1: label gpuwarden.io/price-tier='cheap' is not one of: on-demand, reserved, spot, owned",
                     labelled.tier_note(["n1"]))
    labelled = Inventory.default().with_labels({"n1": {"karpenter.sh/capacity-type": "preemptible"}})
    assert "karpenter.sh/capacity-type='preemptible' is not one of: spot, on-demand" in labelled.tier_note(["n1"])
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump({"rules": [{"pattern": "*", "pool": "p", "tier": "spott"}]}))
    with pytest.raises(AnalyticsError, match=rf"inv.yaml: rules\[0\]: price tier 'spott' is not one of: {allowed}"):
        Inventory.from_yaml(tmp_path / "inv.yaml")


def test_a_live_node_takes_its_tier_from_its_labels():
    def node(labels):
        return read_node({"metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": H100, **labels}},
                          "status": {"capacity": {"nvidia.com/gpu": "8"}}}).node

    assert node({"karpenter.sh/capacity-type": "spot"}).price_tier is PriceTier.SPOT
    assert node({"gpuwarden.io/price-tier": "owned"}).price_tier is PriceTier.OWNED
    assert node({}).price_tier is PriceTier.ON_DEMAND


def test_a_cloud_tier_label_value_not_understood_leaves_a_live_node_whole(caplog):
    """A cloud label value we do not know makes the node on-demand with a warning; its model, pool
    and capacity are still read (a wrong gpuwarden.io/price-tier: tests/kube/test_kube_snapshot.py)."""
    node = read_node({"metadata": {"name": "g1", "labels": {"nvidia.com/gpu.product": H100, "gpuwarden.io/pool": "train",
                                                            "cloud.google.com/gke-spot": "True"}},
                      "status": {"capacity": {"nvidia.com/gpu": "8", "cpu": "96"}}}).node
    assert (node.price_tier, node.gpu_model, node.pool, node.cpu_milli) == (PriceTier.ON_DEMAND, H100, "train", 96000)
    assert "node g1: label cloud.google.com/gke-spot='True' is not one of: true, false" in caplog.text


def test_the_environment_names_the_files_and_the_book_keeps_its_digest_across_copies(files, tmp_path):
    env = {PRICE_BOOK_ENV: str(files / "book.yaml"), INVENTORY_ENV: str(files / "inventory.yaml"),
           PRICING_SOURCE_ENV: "ConfigMap gpu/gw-pricing"}
    book, inventory = load_pricing(environ=env)
    assert book.source == f"ConfigMap gpu/gw-pricing ({files / 'book.yaml'})"
    assert inventory.lookup("gpu-owned-3")[1] is PriceTier.OWNED
    assert load_pricing(environ={})[0].source == "built-in"
    # The same book written another way (as a chart's toYaml would) has the same digest.
    (tmp_path / "copy.yaml").write_text(json.dumps(yaml.safe_load((files / "book.yaml").read_text())))
    assert PriceBook.from_yaml(tmp_path / "copy.yaml").digest == book.digest != PriceBook.default().digest


def test_the_dashboards_cost_data_uses_the_given_book(monkeypatch, files):
    from gpuwarden.dashboards.board import BUILDERS
    from gpuwarden.dashboards.pricing import bundle_variant, dashboard_pricing

    window = Window(START, START + pd.Timedelta(hours=HOURS), "2h")
    bundled = BUILDERS["ledger"](samples(), window, 0.0)
    monkeypatch.setenv(PRICE_BOOK_ENV, str(files / "book.yaml"))
    monkeypatch.setenv(INVENTORY_ENV, str(files / "inventory.yaml"))
    priced = BUILDERS["ledger"](samples(), window, 0.0)
    owned = 35040 / (4 * 8760) + WATTS / 1000 * 0.2 * 1.25
    assert priced["cost_headline"]["fleet_cost"] == pytest.approx((8.0 + 3.0 + owned) * HOURS, rel=1e-6)
    assert priced["cost_headline"]["fleet_cost"] != pytest.approx(bundled["cost_headline"]["fleet_cost"])
    assert priced["price_book"].startswith(f"{files / 'book.yaml'} (version q1-2026")
    assert bundled["price_book"].startswith("built-in (version ")
    assert priced["price_tiers"].startswith("price tiers: 2 from the inventory")
    # Bundles priced by other files are kept apart from the bundled book's.
    assert bundle_variant(*dashboard_pricing()) != "" == bundle_variant(PriceBook.default(), Inventory.default())


def test_the_metrics_name_the_environments_book_with_its_version_and_hash(capsys, monkeypatch, files):
    monkeypatch.setenv(PRICE_BOOK_ENV, str(files / "book.yaml"))
    monkeypatch.setenv(INVENTORY_ENV, str(files / "inventory.yaml"))
    until = (START + pd.Timedelta(hours=HOURS)).isoformat()
    code = main(["metrics", "show", "--source", "file", "--file", str(files / "samples.parquet"), "--since", f"{HOURS}h",
                 "--until", until])
    out, err = capsys.readouterr()
    assert code == 0, err
    book = PriceBook.from_yaml(files / "book.yaml")
    info = [line for line in out.splitlines() if line.startswith("gpuwarden_price_book_info{")]
    assert len(info) == 1 and f'sha256="{book.digest}"' in info[0] and 'version="q1-2026"' in info[0]
    assert f'price_book="{files / "book.yaml"}"' in info[0] and f'inventory="{files / "inventory.yaml"} (sha256 ' in info[0]
    (cost,) = [line for line in out.splitlines() if line.startswith("gpuwarden_fleet_cost_usd ")]
    owned = 35040 / (4 * 8760) + WATTS / 1000 * 0.2 * 1.25
    assert float(cost.split()[1]) == pytest.approx((8.0 + 3.0 + owned) * HOURS, rel=1e-6)


def test_a_book_may_call_reserved_committed():
    book = PriceBook.from_mapping({"models": {H100: {"committed": 4.5, "on-demand": 8.0}}}, "gcp.yaml")
    assert book.hourly(H100, PriceTier.RESERVED) == 4.5
    with pytest.raises(AnalyticsError, match=r"unknown key\(s\) preemptible; allowed: aliases, committed, on-demand"):
        PriceBook.from_mapping({"models": {H100: {"preemptible": 2.0}}}, "gcp.yaml")
    with pytest.raises(AnalyticsError, match=r"models\['.*'\]: committed and reserved name the same tier; give one"):
        PriceBook.from_mapping({"models": {H100: {"committed": 4.5, "reserved": 9.0}}}, "gcp.yaml")
