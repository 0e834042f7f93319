"""The dashboard's Cost and Idle pages, headless, price with the book and inventory the environment
names (what the chart sets from its pricing values) and say which book and where tiers came from."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest
from builders import TIER_HOURS as HOURS, tier_samples as samples

from gpuwarden.analytics import PriceBook
from gpuwarden.analytics.pricing_files import INVENTORY_ENV, PRICE_BOOK_ENV, PRICING_SOURCE_ENV
from gpuwarden.dashboards import STORE_ENV
from gpuwarden.dashboards.launch import APP_PATH
from gpuwarden.store import LocalStore


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("priced-store")
    LocalStore(root).append(samples())
    return str(root)


def test_the_cost_page_prices_with_the_charts_book_and_names_it(monkeypatch, store_dir, tmp_path):
    import yaml

    (tmp_path / "book.yaml").write_text(yaml.safe_dump({"version": "v9", "models": {
        "NVIDIA H100 80GB HBM3": {"on-demand": 10.0, "spot": 1.0, "reserved": 5.0, "owned": {"capex": 30000}}}}))
    (tmp_path / "inventory.yaml").write_text(yaml.safe_dump({"rules": [{"pattern": "*", "pool": "gpu", "tier": "spot"}]}))
    monkeypatch.setenv(STORE_ENV, store_dir)
    monkeypatch.setenv(PRICE_BOOK_ENV, str(tmp_path / "book.yaml"))
    monkeypatch.setenv(INVENTORY_ENV, str(tmp_path / "inventory.yaml"))
    monkeypatch.setenv(PRICING_SOURCE_ENV, "ConfigMap gpu/gw-gpuwarden-pricing")
    at = AppTest.from_file(str(APP_PATH), default_timeout=60)
    at.run()
    at.switch_page("views/cost.py")
    at.run()
    assert not at.exception, at.exception
    # Three GPUs on nodes the inventory calls spot, for two hours, at 1.0 an hour.
    assert {m.label: m.value for m in at.metric}["Fleet cost"] == f"{3 * HOURS * 1.0:.0f} USD"
    book = PriceBook.from_yaml(tmp_path / "book.yaml")
    captions = " ".join(c.value for c in at.caption)
    assert f"price book ConfigMap gpu/gw-gpuwarden-pricing ({tmp_path / 'book.yaml'}) (version v9, sha256 {book.digest[:12]})" \
        in captions
    assert "Price tiers: 3 from the inventory" in captions
