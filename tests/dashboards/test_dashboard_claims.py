"""The dashboards name the DRA claim a pod held its GPU through (issue 34 item 4): the GPU detail's
holders, the idle page's hoarding pods and the cost page's By DRA claim table, run headless with
Streamlit's AppTest on a store whose samples carry ``dra_claim``; without claims none of it shows."""

from __future__ import annotations

import pandas as pd
from test_dashboard_idle_cost import fleet
from test_dashboard_views import run

from gpuwarden.analytics.fleet_report import holders_table
from gpuwarden.store import LocalStore, coerce

CLAIMS = {"GPU-hoard": "ns-beta/nb-1-gpu-4bq7z", "GPU-busy": "ns-alpha/train-1-gpu-x8k2m"}


def claimed() -> pd.DataFrame:
    frame = fleet()
    frame["dra_claim"] = frame["gpu_uuid"].astype(object).map(CLAIMS)
    return coerce(frame)


def tables(at) -> list[pd.DataFrame]:
    return [element.value for element in at.dataframe]


def test_holders_name_the_claim_and_none_without_one():
    held = holders_table(claimed()).set_index("gpu_uuid")
    assert held.loc["GPU-hoard", "dra_claim"] == CLAIMS["GPU-hoard"] and pd.isna(held.loc["GPU-l40s", "dra_claim"])
    assert pd.isna(held.loc["GPU-free", "pod"])
    assert holders_table(fleet())["dra_claim"].isna().all()


def test_pages_show_the_claim_where_a_claim_held_the_gpu(monkeypatch, tmp_path):
    LocalStore(tmp_path).append(claimed())
    at = run(monkeypatch, tmp_path, "idle.py")
    assert not at.exception
    hoarding = [t for t in tables(at) if "hoarded_gpu_hours" in t.columns]
    assert hoarding and hoarding[0][["pod", "claim"]].values.tolist() == [["nb-1", CLAIMS["GPU-hoard"]]]
    at.switch_page("views/cost.py").run()
    assert not at.exception and any(h.value == "By DRA claim" for h in at.subheader)
    by_claim = [t for t in tables(at) if "claim" in t.columns]
    assert by_claim and set(by_claim[0]["claim"]) == set(CLAIMS.values())
    at.query_params["gpu"] = "GPU-hoard"
    at.switch_page("views/gpu.py").run()
    assert not at.exception
    assert any(f"claim `{CLAIMS['GPU-hoard']}`" in m.value for m in at.markdown), [m.value for m in at.markdown]


def test_without_claims_no_claim_column_or_table(monkeypatch, tmp_path):
    LocalStore(tmp_path).append(coerce(fleet()))
    at = run(monkeypatch, tmp_path, "idle.py")
    assert not at.exception and not any("claim" in t.columns for t in tables(at))
    at.switch_page("views/cost.py").run()
    assert not at.exception and not any(h.value == "By DRA claim" for h in at.subheader)
