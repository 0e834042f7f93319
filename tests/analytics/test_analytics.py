"""Analytics: the idle taxonomy on hand-built GPUs, bad input, the price book and inventory, cost,
chargeback reconciliation, the reclaim what-if and buy-vs-rent, and the engine against the
row-by-row reference."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpuwarden.analytics import (
    AnalyticsError,
    IdleParams,
    Inventory,
    PriceBook,
    PriceBookError,
    build_ledger,
    buy_vs_rent,
    chargeback,
    chargeback_report,
    classify,
    headline,
    idle_report,
    reclaim_whatif,
)
from gpuwarden.analytics.reference import states_by_gpu
from gpuwarden.fleet import SAMPLE_COLUMN_NAMES, FleetValueError, Location, Node, PriceTier, Topology
from gpuwarden.fleet.semantics import counter_increase
from gpuwarden.store import LocalStore, coerce
from gpuwarden.store.schema import ValidationReport

START = pd.Timestamp("2026-03-02T00:00:00Z")
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
GIB = 2**30


def gpu_rows(uuid: str, node: str, model: str, util, sm, mem_gib, pod=None, minutes=None, team="alpha",
             power=None, start=START, mig=None, attribution="known") -> pd.DataFrame:
    """One GPU's samples at 60 s: scalars or per-minute arrays; ``pod`` a name, None, or an array;
    ``attribution`` known | off | failed | None (not recorded)."""
    n = minutes if minutes is not None else len(np.atleast_1d(util))
    def arr(value, dtype=object):
        out = np.empty(n, dtype=dtype)
        out[:] = value
        return out
    pods = arr(pod)
    allocated = np.array([p is not None for p in pods])
    frame = {name: np.full(n, np.nan) for name in SAMPLE_COLUMN_NAMES}
    frame.update(
        timestamp=start + pd.to_timedelta(np.arange(n) * 60, unit="s"), cluster="c1", node=node, gpu_uuid=uuid,
        gpu_index=0, model=model, mig_instance=mig, pod=pods,
        namespace=np.where(allocated, f"ns-{team}", None), team=np.where(allocated, team, None),
        project=np.where(allocated, f"{team}-p", None), attribution=arr(attribution),
        gpu_util_ratio=arr(util, float), sm_active_ratio=arr(sm, float), mem_used_bytes=arr(mem_gib, float) * GIB,
        mem_total_bytes=80.0 * GIB, power_watts=arr(300.0 if power is None else power, float),
    )
    return pd.DataFrame(frame)


def states_of(ledger, uuid: str) -> dict[str, float]:
    rows = ledger.rows[ledger.rows["gpu_uuid"] == uuid]
    minutes = rows.groupby(rows["state"].astype(str))["gpu_hours"].sum() * 60
    return {state: round(value, 6) for state, value in minutes.items() if value > 0}


@pytest.fixture(scope="module")
def taxonomy():
    n = 60
    starved = np.where(np.arange(n) % 3 == 0, 0.3, 0.0)
    frame = pd.concat([
        gpu_rows("GPU-free", "train-h100-000", H100, 0.0, 0.0, 0.6, None, n),
        gpu_rows("GPU-ctx", "train-h100-000", H100, 0.0, 0.0, 1.0, "notebook-1", n),
        gpu_rows("GPU-hoard", "train-h100-000", H100, 0.0, 0.0, 60.0, "notebook-2", n),
        gpu_rows("GPU-fake", "train-h100-000", H100, 0.22, 0.0003, 30.0, "tiny-1", n),
        gpu_rows("GPU-starved", "train-h100-001", H100, starved, starved, 30.0, "loader-1", n),
        gpu_rows("GPU-under", "train-h100-001", H100, 0.25, 0.2, 30.0, "small-1", n),
        gpu_rows("GPU-busy", "train-h100-001", H100, 1.0, 0.9, 70.0, "train-1", n),
        gpu_rows("GPU-a100-idle", "infer-a100-000", A100, 0.0, np.nan, 60.0, "svc-1", n, team="beta"),
        gpu_rows("GPU-a100-tiny", "infer-a100-000", A100, 0.22, np.nan, 30.0, "svc-2", n, team="beta"),
    ], ignore_index=True)
    return frame, build_ledger(frame)


def test_each_gpu_lands_in_its_state(taxonomy):
    _frame, ledger = taxonomy
    assert states_of(ledger, "GPU-free") == {"unallocated": 60}
    assert states_of(ledger, "GPU-ctx") == {"allocated_idle": 60}  # 1 GiB of 80 is a context, not a hoard
    # Idle from minute 0 (its first interval starts a step earlier): hoarded once idle > 30 min.
    assert states_of(ledger, "GPU-hoard") == {"allocated_idle": 30, "hoarded": 30}
    assert states_of(ledger, "GPU-fake") == {"fake_busy": 60}
    # The first sample has no gaps behind it yet; then bursts with long gaps.
    assert states_of(ledger, "GPU-starved") == {"underutilized": 1, "starved": 59}
    assert states_of(ledger, "GPU-under") == {"underutilized": 60}
    assert states_of(ledger, "GPU-busy") == {"busy": 60}
    assert states_of(ledger, "GPU-a100-idle") == {"allocated_idle": 30, "hoarded": 30}
    # Without SM activity, 22% NVML utilisation cannot be told from real work: underutilised.
    assert states_of(ledger, "GPU-a100-tiny") == {"underutilized": 60}


def test_fallback_to_nvml_utilisation_is_reported_per_gpu(taxonomy):
    _frame, ledger = taxonomy
    report = idle_report(ledger)
    sources = report.tables["activity_source"].set_index("gpu_uuid")["activity_source"]
    assert sources["GPU-a100-idle"] == "gpu_util_fallback" and sources["GPU-a100-tiny"] == "gpu_util_fallback"
    assert sources["GPU-busy"] == "sm_active"
    assert report.summary["gpus_gpu_util_fallback"] == 2 and report.summary["gpus_sm_active"] == 7
    assert any("fell back to NVML utilisation" in note for note in report.notes)
    # A GPU that measures SM activity in some samples only is "mixed".
    mixed = gpu_rows("GPU-m", "train-h100-000", H100, 0.5, np.r_[np.full(5, 0.5), np.full(5, np.nan)], 10, "p", 10)
    assert idle_report(build_ledger(mixed)).tables["activity_source"]["activity_source"].tolist() == ["mixed"]


def test_hoarding_pods_list(taxonomy):
    _frame, ledger = taxonomy
    pods = idle_report(ledger).tables["hoarding_pods"]
    assert pods["pod"].tolist() == ["notebook-2", "svc-1"]
    row = pods.set_index("pod").loc["notebook-2"]
    assert row["hoarded_share"] == pytest.approx(0.5) and row["mean_hoarded_mem_gib"] == pytest.approx(60.0)
    assert idle_report(ledger, hoarding_share=0.6).tables["hoarding_pods"].empty


def test_classify_gives_per_sample_states(taxonomy):
    frame, _ledger = taxonomy
    states = classify(frame)
    assert len(states) == len(frame)
    hoard = states.loc[frame.index[frame["gpu_uuid"] == "GPU-hoard"]].sort_values("timestamp")
    assert hoard["state"].astype(str).tolist() == ["allocated_idle"] * 30 + ["hoarded"] * 30


def test_thresholds_are_parameters(taxonomy):
    frame, _ledger = taxonomy
    strict = build_ledger(frame, params=IdleParams(underutilized_below=0.1, hoard_grace=pd.Timedelta(minutes=50)))
    assert states_of(strict, "GPU-under") == {"busy": 60}
    assert states_of(strict, "GPU-hoard") == {"allocated_idle": 50, "hoarded": 10}
    with pytest.raises(AnalyticsError, match="idle_activity"):
        IdleParams(idle_activity=1.5)
    with pytest.raises(AnalyticsError, match="window_samples"):
        IdleParams(window_samples=0)


# -- bad input ---------------------------------------------------------------------------------------


def test_gaps_are_missing_data_not_idle_time():
    # 10 minutes, a 30 minute silence, 10 minutes: the gap is neither classified nor charged.
    minutes = np.r_[np.arange(10), np.arange(40, 50)]
    frame = gpu_rows("GPU-g", "train-h100-000", H100, 0.0, 0.0, 60.0, "nb", 20)
    frame["timestamp"] = START + pd.to_timedelta(minutes * 60, unit="s")
    ledger = build_ledger(frame, params=IdleParams(hoard_grace=pd.Timedelta(minutes=15)))
    assert ledger.gpu_hours == pytest.approx(20 / 60)
    assert ledger.quality["gaps"] == 1
    assert ledger.quality["gap_gpu_hours"] == pytest.approx(30 / 60)  # 31 min apart: one step counted, 30 missing
    # The idle stretch restarts after the gap: never 15 idle minutes in a row, so never hoarded.
    assert states_of(ledger, "GPU-g") == {"allocated_idle": 20}


def test_duplicated_timestamps_keep_one_row():
    frame = gpu_rows("GPU-d", "train-h100-000", H100, 0.9, 0.9, 60.0, "job", 10)
    doubled = pd.concat([frame, frame.iloc[3:6].assign(sm_active_ratio=0.0)], ignore_index=True)
    ledger = build_ledger(doubled)
    assert ledger.quality["duplicate_rows"] == 3
    assert ledger.gpu_hours == pytest.approx(10 / 60)
    assert sum(states_of(ledger, "GPU-d").values()) == pytest.approx(10)


def test_counter_resets_are_counted_and_do_not_disturb_the_reports():
    frame = gpu_rows("GPU-c", "train-h100-000", H100, 0.9, 0.9, 60.0, "job", 6)
    frame["xid_79_total"] = pd.array([3, 4, 0, 0, 1, 2], dtype="Int64")  # reset after 4
    plain = build_ledger(frame.drop(columns=["xid_79_total"]))
    ledger = build_ledger(frame)
    assert ledger.quality["counter_resets"] == {"xid_79_total": 1}
    assert plain.quality["counter_resets"] == {}
    pd.testing.assert_frame_equal(ledger.rows, plain.rows)
    assert counter_increase(frame, "xid_79_total").to_dict() == {"GPU-c": 3.0}  # +1, reset (0), +1, +1


def test_gpus_appearing_mid_window_add_no_time_before_they_existed():
    early = gpu_rows("GPU-early", "train-h100-000", H100, 0.9, 0.9, 60.0, "job", 60)
    late = gpu_rows("GPU-late", "train-h100-000", H100, 0.0, 0.0, 0.6, None, 30, start=START + pd.Timedelta(minutes=30))
    ledger = build_ledger(pd.concat([early, late]), START, START + pd.Timedelta(hours=1))
    assert states_of(ledger, "GPU-late") == {"unallocated": 30}
    assert ledger.quality["gpus_appearing_late"] == ["GPU-late"]
    assert ledger.quality["gpus_leaving_early"] == []
    assert ledger.gpu_hours == pytest.approx(1.5)


def test_negative_and_out_of_range_values_are_not_measurements():
    frame = gpu_rows("GPU-n", "train-h100-000", H100, 0.9, 0.9, 60.0, "job", 10)
    frame.loc[2, "sm_active_ratio"] = -0.5  # negative ratio: dropped, falls back to NVML utilisation
    frame.loc[3, "gpu_util_ratio"] = 57.0  # a percent written as a ratio: dropped
    frame.loc[4, "power_watts"] = -20.0
    frame.loc[5, "mem_used_bytes"] = -1.0
    ledger = build_ledger(frame)
    assert ledger.quality["negative_values"] == {"sm_active_ratio": 1, "power_watts": 1, "mem_used_bytes": 1}
    assert ledger.quality["out_of_range_values"] == {"gpu_util_ratio": 1}
    assert states_of(ledger, "GPU-n") == {"busy": 10}
    # The store refuses such rows when they are written, and counts each one it rejected.
    report = ValidationReport()
    assert len(coerce(frame, report=report)) == len(frame) - 4
    assert report.rejected_total == 4


def test_allocated_samples_without_any_activity_are_unmeasured():
    frame = gpu_rows("GPU-u", "train-h100-000", H100, np.nan, np.nan, 10.0, "job", 5)
    ledger = build_ledger(frame)
    assert states_of(ledger, "GPU-u") == {"unmeasured": 5}
    assert ledger.quality["unmeasured_samples"] == 5
    assert ledger.fleet_cost > 0  # still priced


def test_missing_columns_and_empty_input():
    with pytest.raises(AnalyticsError, match="gpu_uuid"):
        build_ledger(pd.DataFrame({"timestamp": [START], "pod": [None]}))
    empty = build_ledger(gpu_rows("GPU-e", "train-h100-000", H100, 0.0, 0.0, 0.0, None, 0), params=IdleParams(step=pd.Timedelta("60s")))
    assert empty.rows.empty and empty.fleet_cost == 0.0
    assert headline(empty)["gpu_hours"] == 0.0


# -- price book and inventory -----------------------------------------------------------------------


def test_price_book_defaults_cover_the_simulated_models():
    book = PriceBook.default()
    for model in (H100, "NVIDIA H200", A100, "NVIDIA L40S"):
        for tier in PriceTier:
            assert book.hourly(model, tier) > 0
    # owned: capex over the lifetime, plus power at the kWh price and PUE
    h200 = book.model("NVIDIA H200")
    assert book.hourly("NVIDIA H200", "owned") == pytest.approx(h200.capex / (h200.lifetime_years * 8760))
    assert book.owned_hourly("NVIDIA H200", watts=700) == pytest.approx(
        h200.capex / (4 * 8760) + 0.7 * book.kwh_price * book.pue)
    assert book.model("nvidia h100-sxm5-80gb").name == H100  # aliases, case-insensitive


def test_price_book_missing_a_model_names_it(tmp_path):
    path = tmp_path / "prices.yaml"
    path.write_text("models:\n  NVIDIA H100 80GB HBM3: {on-demand: 6.0, reserved: 4.0, spot: 2.0, owned: {capex: 30000}}\n")
    book = PriceBook.from_yaml(path)
    frame = gpu_rows("GPU-x", "infer-l40s-000", "NVIDIA L40S", 0.5, np.nan, 10.0, "svc", 5)
    with pytest.raises(PriceBookError, match="'NVIDIA L40S'") as error:
        build_ledger(frame, price_book=book)
    assert isinstance(error.value, FleetValueError)  # the CLI reports it as one line, exit 2
    with pytest.raises(PriceBookError, match="no 'spot' price"):
        PriceBook.from_mapping({"models": {"X": {"on-demand": 1.0}}}).hourly("X", "spot")
    with pytest.raises(PriceBookError, match="negative"):
        PriceBook.from_mapping({"models": {"X": {"on-demand": -1.0}}})
    with pytest.raises(PriceBookError, match="unknown key"):
        PriceBook.from_mapping({"models": {"X": {"ondemand": 1.0}}})


def test_inventory_default_patterns_follow_the_simulated_fleet():
    inventory = Inventory.default()
    assert inventory.lookup("train-h100-spot-003") == ("train-h100-spot", PriceTier.SPOT)
    assert inventory.lookup("train-h100-012") == ("train-h100", PriceTier.RESERVED)
    assert inventory.lookup("train-h200-000") == ("train-h200", PriceTier.OWNED)
    assert inventory.lookup("infer-a100-001") == ("infer-a100", PriceTier.ON_DEMAND)
    assert inventory.lookup("infer-l40s-007") == ("infer-l40s", PriceTier.ON_DEMAND)
    assert inventory.lookup("gpu-node-17") == ("gpu-node", PriceTier.ON_DEMAND)


def test_inventory_from_yaml_table_and_nodes(tmp_path):
    path = tmp_path / "inventory.yaml"
    path.write_text("default_tier: reserved\nrules:\n  - {pattern: 'dgx-*', pool: dgx, tier: owned}\n"
                    "nodes:\n  dgx-special: {pool: lab, tier: spot}\n")
    inventory = Inventory.from_yaml(path)
    assert inventory.lookup("dgx-01") == ("dgx", PriceTier.OWNED)
    assert inventory.lookup("dgx-special") == ("lab", PriceTier.SPOT)
    assert inventory.lookup("other-3") == ("other", PriceTier.RESERVED)
    table = Inventory.from_table(pd.DataFrame({"node": ["n1"], "pool": ["p"], "tier": ["spot"]}))
    assert table.lookup("n1") == ("p", PriceTier.SPOT)
    node = Node("edge-1", "edge", Location.ON_PREM, PriceTier.OWNED, Topology("d", "l", "r"), H100, 8, 1, 1)
    assert Inventory.from_nodes([node]).lookup("edge-1") == ("edge", PriceTier.OWNED)
    with pytest.raises(AnalyticsError, match="'free' is not one of"):
        Inventory.from_mapping({"rules": [{"pattern": "*", "pool": "x", "tier": "free"}]})


# -- cost, chargeback, what-if -------------------------------------------------------------------------


def test_cost_follows_tier_and_owned_energy():
    book = PriceBook.default()
    reserved = gpu_rows("GPU-r", "train-h100-000", H100, 0.9, 0.9, 60.0, "job", 60)
    owned = gpu_rows("GPU-o", "train-h200-000", "NVIDIA H200", 0.9, 0.9, 60.0, "job", 60, power=500.0)
    ledger = build_ledger(pd.concat([reserved, owned]))
    cost = ledger.rows.groupby("gpu_uuid")["cost"].sum()
    assert cost["GPU-r"] == pytest.approx(book.hourly(H100, "reserved"))
    assert cost["GPU-o"] == pytest.approx(book.owned_hourly("NVIDIA H200", watts=500.0))


@pytest.fixture(scope="module")
def sim_frame():
    from gpuwarden.cli.simfleet import simulated_fleet
    from gpuwarden.sim import SimConfig

    simulation = simulated_fleet(SimConfig(nodes=8, seed=3))
    return pd.concat(list(simulation.iter_chunks(360)), ignore_index=True)


def test_chargeback_totals_reconcile_to_the_fleet_cost(sim_frame):
    ledger = build_ledger(sim_frame)
    for policy in ("separate", "proportional"):
        report = chargeback_report(ledger, unallocated=policy)
        table = report.tables["by_team_project"]
        assert report.summary["reconciles"] is True
        assert table["cost"].sum() == pytest.approx(ledger.fleet_cost, rel=1e-9)
        assert report.tables["by_team"]["cost"].sum() == pytest.approx(ledger.fleet_cost, rel=1e-9)
    separate = chargeback(ledger)
    assert separate["gpu_hours"].sum() == pytest.approx(ledger.gpu_hours)
    assert separate["team"].iloc[-1] == "(unallocated)"
    assert (separate["idle_cost"] <= separate["cost"] + 1e-9).all()
    reasons = [c for c in separate.columns if c.endswith("_cost") and c not in ("idle_cost", "unallocated_share_cost")]
    assert separate[reasons].sum(axis=1).to_numpy() == pytest.approx(separate["idle_cost"].to_numpy())
    assert ledger.gpu_hours == pytest.approx(64 * 360 / 60)  # 8 nodes x 8 GPUs x 6 h, MIG slices adding up


def test_reclaim_whatif_by_hand():
    book = PriceBook.default()
    frame = pd.concat([
        gpu_rows("GPU-od", "infer-l40s-000", "NVIDIA L40S", 0.0, np.nan, 0.6, None, 60),  # on-demand, nobody holds it
        gpu_rows("GPU-rs", "train-h100-000", H100, 0.0, 0.0, 1.0, "nb", 60),  # reserved, held idle
        gpu_rows("GPU-w", "train-h100-001", H100, 0.8, 0.8, 60.0, "job", 60),  # working at 0.8
    ])
    ledger = build_ledger(frame)
    table = reclaim_whatif(ledger, (0.5, 1.0)).set_index("fraction")
    assert table.loc[0.5, "reclaimed_gpu_hours"] == pytest.approx(1.0)
    assert table.loc[0.5, "cost_reduction"] == pytest.approx(0.5 * book.hourly("NVIDIA L40S", "on-demand"))
    assert table.loc[0.5, "committed_value_freed"] == pytest.approx(0.5 * book.hourly(H100, "reserved"))
    assert table.loc[1.0, "throughput_gain"] == pytest.approx(2 * 0.8 / 0.8)  # 2 h more at 0.8 over 0.8 used hours
    with pytest.raises(AnalyticsError, match="not in 0..1"):
        reclaim_whatif(ledger, (1.5,))


def test_buy_vs_rent_break_even_by_hand():
    book = PriceBook.default()
    frame = pd.concat([gpu_rows(f"GPU-{i}", "infer-a100-000", A100, 0.5, np.nan, 30.0, "svc" if i < 3 else None, 60,
                                power=250.0) for i in range(4)])
    table = buy_vs_rent(build_ledger(frame)).set_index("model")
    row = table.loc[A100]
    assert row["avg_gpus"] == pytest.approx(4) and row["allocation_ratio"] == pytest.approx(0.75)
    rent = 4 * 0.75 * 730 * book.hourly(A100, "on-demand")
    own = 4 * 730 * 0.25 * book.energy_price_per_kwh()
    assert row["rent_on_demand_monthly"] == pytest.approx(rent)
    assert row["own_opex_monthly"] == pytest.approx(own)
    assert row["break_even_months"] == pytest.approx(4 * book.model(A100).capex / (rent - own))
    assert row["verdict"] == "buy"


def test_headline_for_the_demo(sim_frame, tmp_path):
    store = LocalStore(tmp_path / "store")
    store.append(sim_frame)
    figures = headline(store)
    assert set(figures) == {"window_start", "window_end", "currency", "gpus", "gpu_hours", "allocated_gpu_hours",
                            "unattributed_gpu_hours", "unattributed_share", "efficiency_score", "fleet_cost", "idle_gpu_hours", "idle_cost", "idle_gpu_hours_by_reason",
                            "idle_cost_by_reason", "hoarding_pods", "gpus_gpu_util_fallback"}
    assert set(figures["idle_cost_by_reason"]) == {"unallocated", "idle_unattributed", "allocated_idle", "hoarded",
                                                   "fake_busy", "starved"}
    assert figures["unattributed_gpu_hours"] == 0  # the simulator knows every holder
    assert sum(figures["idle_gpu_hours_by_reason"].values()) == pytest.approx(figures["idle_gpu_hours"])
    other = headline(sim_frame)  # the store and the frame agree
    for key, value in figures.items():
        assert value == (pytest.approx(other[key]) if isinstance(value, (float, dict)) else other[key]), key


# -- the engine against the row-by-row reference --------------------------------------------------------


def test_engine_matches_the_row_by_row_reference(sim_frame, taxonomy):
    frame = pd.concat([sim_frame, taxonomy[0]], ignore_index=True)
    # Some bad input too: a duplicate, a gap, a negative value.
    frame = pd.concat([frame, frame.iloc[100:110]], ignore_index=True)
    frame = frame.drop(index=frame.index[(frame["gpu_uuid"] == "GPU-hoard") & (frame["timestamp"] > START + pd.Timedelta(minutes=20))
                                         & (frame["timestamp"] < START + pd.Timedelta(minutes=40))])
    frame.loc[frame.index[5], "gpu_util_ratio"] = -1.0
    params = IdleParams(step=pd.Timedelta("60s"))
    reference = states_by_gpu(frame, params).groupby("state")[["gpu_hours", "cost"]].sum()
    for chunk in ("1D", "90min"):
        ledger = build_ledger(frame, params=params, chunk=chunk)
        ours = ledger.rows.assign(state=ledger.rows["state"].astype(str)).groupby("state")[["gpu_hours", "cost"]].sum()
        pd.testing.assert_frame_equal(ours.loc[reference.index], reference, check_exact=False, rtol=1e-9)


def test_chunked_reading_gives_the_same_ledger(sim_frame, tmp_path):
    store = LocalStore(tmp_path / "store")
    store.append(sim_frame)
    whole = build_ledger(sim_frame)
    for chunk in ("1h", "7min"):
        chunked = build_ledger(store, chunk=chunk)
        pd.testing.assert_frame_equal(chunked.rows.drop(columns=["samples"]), whole.rows.drop(columns=["samples"]),
                                      check_exact=False, rtol=1e-9, check_categorical=False)
        assert chunked.timeseries["gpu_hours"].sum() == pytest.approx(whole.timeseries["gpu_hours"].sum())


def test_arrow_input_gives_the_same_ledger_as_pandas(sim_frame, taxonomy):
    import pyarrow as pa

    from gpuwarden.analytics import LedgerBuilder

    frame = pd.concat([sim_frame.iloc[:3000], taxonomy[0]], ignore_index=True)
    # Bad input: duplicates, rows out of order, a negative and an out-of-range gauge, a row without a GPU.
    frame = pd.concat([frame, frame.iloc[100:110]], ignore_index=True).iloc[::-1].reset_index(drop=True)
    frame.loc[1000, "gpu_util_ratio"] = -1.0
    frame.loc[1001, "sm_active_ratio"] = 3.0
    frame["gpu_uuid"] = frame["gpu_uuid"].astype(object)
    frame.loc[1002, "gpu_uuid"] = None
    frame["xid_79_total"] = pd.array(np.arange(len(frame)) % 5, dtype="Int64")
    ledgers = []
    for table in (None, pa.Table.from_pandas(frame, preserve_index=False)):
        builder = LedgerBuilder(params=IdleParams(step=pd.Timedelta("60s")), keep_rows=True)
        builder.add(frame) if table is None else builder.add_arrow(table)
        ledgers.append(builder.finish())
    pandas_ledger, arrow_ledger = ledgers
    pd.testing.assert_frame_equal(arrow_ledger.rows, pandas_ledger.rows)
    pd.testing.assert_frame_equal(arrow_ledger.timeseries, pandas_ledger.timeseries)
    assert arrow_ledger.quality == pandas_ledger.quality
    assert pandas_ledger.quality["rows_dropped_unidentified"] == 1 and pandas_ledger.quality["duplicate_rows"] == 10
    assert pandas_ledger.quality["negative_values"] == {"gpu_util_ratio": 1}
    assert pandas_ledger.quality["out_of_range_values"] == {"sm_active_ratio": 1}
    assert pandas_ledger.quality["counter_resets"]["xid_79_total"] > 0
    # Per-sample states, by row position (instance codes follow first appearance, so row order may differ).
    pd.testing.assert_frame_equal(arrow_ledger.classified.sort_index(), pandas_ledger.classified.sort_index())


def test_unattributed_gpus_are_classified_by_activity_never_unallocated():
    """No pod label means "free" only where attribution answered; off, failed or not recorded is
    unknown: the GPU is classified by its activity, and every report says how much was unknown."""
    n = 60
    frame = pd.concat([
        gpu_rows("GPU-free", "train-h100-000", H100, 0.0, 0.0, 0.6, None, n),  # attribution known: free
        gpu_rows("GPU-off-busy", "train-h100-000", H100, 0.97, 0.96, 70.0, None, n, attribution="off"),
        gpu_rows("GPU-failed-idle", "train-h100-000", H100, 0.0, 0.0, 60.0, None, n, attribution="failed"),
        gpu_rows("GPU-null-fake", "train-h100-001", H100, 0.22, 0.0003, 30.0, None, n, attribution=None),
        gpu_rows("GPU-held", "train-h100-001", H100, 0.9, 0.9, 70.0, "train-1", n, attribution=None),
    ], ignore_index=True)
    ledger = build_ledger(frame)
    assert states_of(ledger, "GPU-free") == {"unallocated": 60}
    assert states_of(ledger, "GPU-off-busy") == {"busy": 60}
    assert states_of(ledger, "GPU-failed-idle") == {"idle_unattributed": 60}  # never hoarded: nobody holds it
    assert states_of(ledger, "GPU-null-fake") == {"fake_busy": 60}
    assert states_of(ledger, "GPU-held") == {"busy": 60}  # a pod label proves attribution answered
    # The row-by-row reference agrees.
    reference = states_by_gpu(frame).groupby(["gpu_uuid", "state"])["gpu_hours"].sum()
    engine = ledger.rows.groupby([ledger.rows["gpu_uuid"].astype(str), ledger.rows["state"].astype(str)])["gpu_hours"].sum()
    assert engine[engine > 0].to_dict() == pytest.approx(reference[reference > 0].to_dict())

    report = idle_report(ledger)
    assert report.summary["unattributed_gpu_hours"] == pytest.approx(3.0)
    assert report.summary["unattributed_share"] == pytest.approx(3 / 5)
    assert report.summary["allocated_gpu_hours"] == pytest.approx(1.0)  # unattributed time is not allocated
    assert report.summary["efficiency_score"] == pytest.approx(0.9)
    assert any("60.0% of GPU-hours are unattributed" in note for note in report.notes)
    from gpuwarden.analytics import build_report

    for kind in ("efficiency", "cost", "chargeback"):
        other = build_report(kind, ledger)
        assert other.summary["unattributed_share"] == pytest.approx(3 / 5), kind
        assert any("unattributed" in note for note in other.notes), kind
    for policy in ("separate", "proportional"):
        table = chargeback(ledger, unallocated=policy)
        assert table["cost"].sum() == pytest.approx(ledger.fleet_cost)
        assert table.loc[table["team"] == "(unattributed)", "gpu_hours"].sum() == pytest.approx(3.0), policy
    # Attribution known everywhere: nothing unattributed, no note.
    known = idle_report(build_ledger(gpu_rows("GPU-free", "train-h100-000", H100, 0.0, 0.0, 0.6, None, n)))
    assert known.summary["unattributed_share"] == 0 and not any("unattributed" in n for n in known.notes)


def test_one_sample_per_gpu_is_valid_and_says_its_interval():
    frame = pd.concat([gpu_rows("GPU-a", "train-h100-000", H100, 0.9, 0.9, 70.0, "train-1", 1),
                       gpu_rows("GPU-b", "train-h100-000", H100, 0.0, 0.0, 0.5, None, 1)], ignore_index=True)
    report = idle_report(build_ledger(frame))  # no interval can be measured: the default, said so
    assert report.summary["gpu_hours"] == pytest.approx(2 / 60)
    assert report.ledger.quality["step_assumed"] is True
    assert any("single sample" in note and "--since" in note for note in report.notes)
    given = idle_report(build_ledger(frame, params=IdleParams(step="15s")))  # a source's grid: no note
    assert given.summary["gpu_hours"] == pytest.approx(2 * 15 / 3600) and given.ledger.quality["step_assumed"] is False
    assert not any("single sample" in note for note in given.notes)


def test_a_window_wider_than_the_data_is_trimmed_with_a_note():
    """``report cost --since 7d`` over two days of data: GPUs averaged over the two days, not seven."""
    from gpuwarden.analytics import cost_report

    frame = gpu_rows("GPU-a", "infer-a100-000", A100, 0.9, np.nan, 40.0, "svc-1", 2 * 24 * 60, team="beta")
    end = START + pd.Timedelta(days=2)
    trimmed = build_ledger(frame, end - pd.Timedelta(days=7), end)
    report = cost_report(trimmed)
    assert report.ledger.start == START - pd.Timedelta(minutes=1) and report.ledger.end == end
    row = report.tables["buy_vs_rent"].set_index("model").loc[A100]
    assert row["avg_gpus"] == pytest.approx(1.0, rel=1e-3)
    assert any(note.startswith("window trimmed to the data held") for note in report.notes)
    exact = cost_report(build_ledger(frame, START, end))
    assert not any(note.startswith("window trimmed") for note in exact.notes)


def test_an_unreadable_mig_profile_gets_what_its_siblings_leave_in_every_report():
    """One rule (fleet.semantics): the engine, its time series and the row-by-row reference all give
    the unreadable instance 1 - 3/7, so the GPU's hours add up to the time it was observed."""
    from gpuwarden.fleet.semantics import mig_shares

    n = 30
    frame = pd.concat([
        gpu_rows("GPU-m", "train-h100-000", H100, 0.5, 0.5, 1.0, "a", n, mig="1:3g.40gb"),
        gpu_rows("GPU-m", "train-h100-000", H100, 0.5, 0.5, 1.0, "b", n, mig="2:custom-layout"),
    ], ignore_index=True)
    ledger = build_ledger(frame)
    shares = ledger.instances.set_index("mig_instance")["share"]
    assert shares["2:custom-layout"] == pytest.approx(4 / 7)
    assert shares["1:3g.40gb"] == pytest.approx(3 / 7)
    assert ledger.gpu_hours == pytest.approx(n / 60)  # the whole GPU for n minutes
    assert ledger.timeseries["gpu_hours"].sum() == pytest.approx(ledger.gpu_hours)
    assert sorted(mig_shares(frame).unique()) == pytest.approx(sorted(shares))
    reference = states_by_gpu(frame, step="60s")
    assert reference["gpu_hours"].sum() == pytest.approx(ledger.gpu_hours)
