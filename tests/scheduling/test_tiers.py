"""Cost by tier (gpuwarden/scheduling/tiers.py): the reserved-level rule on a hand-made load curve,
Young/Daly's interval and the work lost on known numbers, the split between tiers, the plan against
all on-demand, and the load curve a savings replay records."""

from __future__ import annotations

import math

import pytest

from gpuwarden.analytics.pricebook import PriceBook, PriceBookError
from gpuwarden.scheduling.errors import SchedulingError
from gpuwarden.scheduling.savings import find_savings
from gpuwarden.scheduling.savings_jobs import file_workload
from gpuwarden.scheduling.tiers import (
    LoadCurve, SpotModel, TierPrices, classic_reserved_level, min_cost_level, plan_cost, plan_tiers, spot_pays,
    young_daly_interval)

# Ten hours: 10 GPUs for 4 h, 6 for 3 h, 2 for 2 h, 20 for 1 h. Hours the load is >= r: r <= 2: 10 h;
# 3..6: 8 h; 7..10: 4 h; 11..20: 1 h.
CURVE = LoadCurve.from_levels([4, 3, 2, 1], [10, 6, 2, 20])
NO_RECLAIMS = SpotModel(reclaims_per_hour=0.0, checkpoint_seconds=60.0, restart_seconds=60.0)


@pytest.mark.parametrize(("ratio", "level"), [(1.0, 2), (0.8, 6), (0.6, 6), (0.4, 10), (0.1, 20), (0.05, 20),
                                              (1.01, 0)])
def test_the_classic_rule_reserves_up_to_the_level_held_at_least_the_price_ratio_of_the_time(ratio, level):
    assert classic_reserved_level(CURVE, ratio) == level


def test_the_classic_rule_is_the_cheapest_reserved_level_without_spot():
    prices = TierPrices(on_demand=10.0, reserved=6.0, spot=10.0)  # spot as dear as on-demand: never used
    assert not spot_pays(prices, NO_RECLAIMS)
    costs = {r: plan_cost(CURVE, prices, NO_RECLAIMS, r) for r in range(21)}
    assert min_cost_level(CURVE, prices, NO_RECLAIMS) == classic_reserved_level(CURVE, 0.6) == 6
    assert costs[6] == min(costs.values())
    # by hand: 6 GPUs x 10 h reserved; on-demand above 6: 4 x 4 h + 14 x 1 h
    assert costs[6] == pytest.approx(6 * 10 * 6.0 + (4 * 4 + 14) * 10.0)


def test_young_daly_interval_and_the_work_lost_on_known_numbers():
    # lambda = 0.05 per hour, C = 60 s: tau = sqrt(2 * 60 * 3600 / 0.05) = sqrt(8,640,000) s
    assert young_daly_interval(60.0, 0.05) == pytest.approx(2939.387691)
    assert young_daly_interval(60.0, 0.0) is None
    assert young_daly_interval(0.0, 0.05) == 0.0
    spot = SpotModel(0.05, 60.0, 60.0)
    tau = math.sqrt(8_640_000.0)
    assert spot.checkpoint_fraction == pytest.approx(60.0 / tau)
    assert spot.reclaim_fraction == pytest.approx(0.05 / 3600.0 * (tau / 2 + 60.0))
    # at the optimum both halves of Young's waste are sqrt(lambda C / 2): together sqrt(2 lambda C)
    assert spot.checkpoint_fraction + 0.05 / 3600.0 * tau / 2 == pytest.approx(math.sqrt(2 * 0.05 / 3600.0 * 60.0))
    assert spot.lost_fraction == pytest.approx(0.041658, abs=1e-6)
    assert spot.billed_per_useful() == pytest.approx(1 / (1 - spot.lost_fraction))
    assert SpotModel(0.05, 0.0, 60.0).lost_fraction == pytest.approx(0.05 / 60.0)  # free checkpoints: restarts only
    assert NO_RECLAIMS.lost_fraction == 0.0
    with pytest.raises(SchedulingError):
        young_daly_interval(60.0, -1.0)


def test_the_plan_splits_reserved_spot_and_on_demand():
    rigid = LoadCurve.from_levels([4, 3, 2, 1], [10, 6, 2, 20], [8, 0, 2, 4])  # GPUs of jobs that cannot checkpoint
    prices = TierPrices(on_demand=10.0, reserved=6.0, spot=3.0)
    spot = SpotModel(0.05, 60.0, 60.0)
    plan = plan_tiers(rigid, prices, spot, fleet_gpus=24)
    assert plan.reserved_gpus == 6 and plan.reserved_gpu_hours == 60.0
    assert plan.reserved_used_gpu_hours == 6 * 4 + 6 * 3 + 2 * 2 + 6 * 1
    # above 6: 4 GPUs for 4 h (2 of them rigid), 14 GPUs for 1 h (none rigid above 6)
    assert plan.on_demand_gpu_hours == 2 * 4
    assert plan.spot_useful_gpu_hours == 2 * 4 + 14 * 1
    assert plan.spot_gpu_hours == pytest.approx(22 / (1 - spot.lost_fraction))
    assert plan.gpu_hours_lost_to_reclaims == pytest.approx(plan.spot_gpu_hours * spot.reclaim_fraction)
    assert plan.load_gpu_hours == 40 + 18 + 4 + 20
    assert plan.cost == pytest.approx(60 * 6.0 + plan.spot_gpu_hours * 3.0 + 8 * 10.0)
    figures = plan.to_dict()
    assert figures["cost_all_on_demand"] == pytest.approx(82 * 10.0)
    assert figures["cost_saved_pct"] == pytest.approx(100 * (820 - plan.cost) / 820)
    assert figures["cost_fleet_held_on_demand"] == pytest.approx(24 * 10 * 10.0)
    assert figures["min_cost_reserved_gpus"] == min_cost_level(rigid, prices, spot)
    assert figures["min_cost_saved_pct"] >= figures["cost_saved_pct"] - 1e-9


@pytest.mark.parametrize("spot", [SpotModel(0.05, 60.0, 60.0), NO_RECLAIMS, SpotModel(2.0, 0.0, 600.0)])
def test_all_tiers_at_the_on_demand_price_save_nothing(spot):
    prices = TierPrices(on_demand=5.0, reserved=5.0, spot=5.0)
    plan = plan_tiers(CURVE, prices, spot)
    assert plan.spot_gpu_hours == 0.0 and plan.gpu_hours_lost_to_reclaims == 0.0
    assert plan.cost == pytest.approx(plan.cost_all_on_demand)
    assert plan.to_dict()["cost_saved_pct"] == pytest.approx(0.0, abs=1e-9)


def test_spot_that_loses_too_much_is_not_used():
    prices = TierPrices(on_demand=10.0, reserved=6.0, spot=9.0)
    assert spot_pays(prices, NO_RECLAIMS)
    assert not spot_pays(prices, SpotModel(1.0, 300.0, 600.0))  # loses about 40% of each spot hour
    assert plan_tiers(CURVE, prices, SpotModel(1.0, 300.0, 600.0)).spot_gpu_hours == 0.0


def test_prices_come_from_the_price_book():
    book = PriceBook.default()
    prices = TierPrices.from_book(book, "H100")
    assert prices.model == "NVIDIA H100 80GB HBM3" and prices.version == book.version and book.identity == prices.book
    assert (prices.on_demand, prices.reserved, prices.spot) == (book.hourly(prices.model, "on-demand"),
                                                                book.hourly(prices.model, "reserved"),
                                                                book.hourly(prices.model, "spot"))
    with pytest.raises(PriceBookError, match="no-such-gpu"):
        TierPrices.from_book(book, "no-such-gpu")


def test_a_load_curve_from_segments_fills_and_refuses():
    curve = LoadCurve.from_segments([(0, 10, 4, 1), (10, 10, 9, 9), (10, 30, 2, 0)])
    assert list(curve.edges) == [0, 10, 30] and list(curve.held) == [4, 2] and curve.gpu_hours == pytest.approx(80 / 3600)
    assert LoadCurve.from_segments([]).gpu_hours == 0.0
    with pytest.raises(SchedulingError):
        LoadCurve.from_segments([(0, 10, 1, 2)])


def test_a_savings_replay_records_the_gpus_it_held(tmp_path):
    path = tmp_path / "jobs.csv"
    path.write_text("submitted,duration_seconds,gpus,team,checkpointable\n"
                    "2017-10-09 00:00:00,3600,8,vision,true\n"
                    "2017-10-09 00:00:00,3600,8,speech,false\n"
                    "2017-10-09 02:00:00,3600,4,vision,yes\n")
    report = find_savings(file_workload(path, None, None), ("gpuwarden",), 16, 1800.0)
    curve = report.outcomes["gpuwarden"].load
    assert curve is not None and curve.horizon_hours == pytest.approx(3.0)  # the window's start to the last finish
    assert curve.gpu_hours == pytest.approx(20.0) and curve.peak == 16.0  # 16 GPUs for 1 h, 4 for 1 h
    assert float(curve.rigid.max()) == 8.0  # the speech job cannot checkpoint
    assert "tiers" not in report.to_dict()
    report.add_tiers(TierPrices(on_demand=10.0, reserved=6.0, spot=3.0), NO_RECLAIMS)
    plan = report.plans["gpuwarden"]
    # >= r for 2 of 3 h (r <= 4) >= 0.6: 4 reserved; above: 12 GPUs for 1 h, 4 of them rigid: on-demand
    assert (plan.reserved_gpus, plan.on_demand_gpu_hours, plan.spot_gpu_hours) == (4, 4.0, 8.0)
    assert plan.fleet_gpu_hours == pytest.approx(2 * 8 * 3.0)
    tiers = report.to_dict()["tiers"]
    assert tiers["cost_saved_pct"] == pytest.approx(100 * (200 - (72 + 24 + 40)) / 200)
    assert list(tiers["plans"]) == ["gpuwarden"]
