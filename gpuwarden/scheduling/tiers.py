"""Cost by tier: a procurement plan for one replay's load (``gpuwarden simulate savings --tiers``).

Pure functions over a load curve (GPUs held over time, piecewise constant, and how many of them
are held by jobs that cannot checkpoint) and three prices per GPU-hour (on-demand, reserved, spot):

- **reserved**: ``R`` GPUs held for the whole horizon, by the classic rule: reserve the ``r``-th GPU
  when the load is at least ``r`` for at least ``reserved / on_demand`` of the horizon (the level at
  which a reserved GPU costs what on-demand would for the hours it is used). It is the cost-minimal
  level of a reserved + on-demand plan: the plan stays whole if spot capacity is gone;
- **spot**: the load above ``R`` held by checkpointable jobs (jobs that cannot checkpoint fill the
  reserved GPUs first), when spot, counting its losses, is cheaper than on-demand. Reclaims come at
  ``reclaims_per_hour`` per running spot job (a gang is reclaimed as one); jobs checkpoint every
  ``tau = sqrt(2 C / lambda)`` (Young/Daly, ``C`` the checkpoint cost); per billed spot hour the
  lost fraction is ``C / tau`` (writing checkpoints) plus ``lambda * (tau / 2 + restart)`` (work
  since the last checkpoint, and the restart, on each reclaim), so billed = useful / (1 - lost);
- **on-demand**: the rest (the peaks), paid only while held.

The plan is compared with the same load all on-demand (every GPU-hour held, at the on-demand
price). Figures: GPU-hours and cost per tier, the interval, GPU-hours lost to reclaims, and
``cost_saved_pct``. Also the reserved level that minimises the plan's cost if spot were always
there (``min_cost_reserved_gpus``): zero whenever spot, losses counted, is cheaper than reserved.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import SchedulingError

SECONDS_PER_HOUR = 3600.0
DEFAULT_RECLAIMS_PER_HOUR = 0.05  # an assumption (docs/savings.md): far above AWS's top published band
DEFAULT_CHECKPOINT_SECONDS = 60.0
RESERVED_RULE = ("classic: reserve the r-th GPU when the load is >= r for >= reserved/on-demand price of the "
                 "horizon; spot for checkpointable load above it; on-demand for the rest")


@dataclass(frozen=True)
class LoadCurve:
    """GPUs held over ``[edges[0], edges[-1])``: ``held[i]`` (of which ``rigid[i]`` by jobs that cannot
    checkpoint) during ``[edges[i], edges[i + 1])``; times in seconds."""

    edges: np.ndarray
    held: np.ndarray
    rigid: np.ndarray

    @classmethod
    def from_segments(cls, segments: Iterable[tuple[float, float, float, float]]) -> LoadCurve:
        """From ``(start, end, held, rigid)`` segments, contiguous and in time order."""
        rows = [s for s in segments if s[1] > s[0]]
        if not rows:
            return cls(np.zeros(1), np.zeros(0), np.zeros(0))
        table = np.asarray(rows, dtype=float)
        if np.any(table[1:, 0] < table[:-1, 1] - 1e-6) or np.any(table[:, 3] > table[:, 2] + 1e-9):
            raise SchedulingError("a load curve's segments overlap, or hold more rigid GPUs than GPUs")
        return cls(np.append(table[:, 0], table[-1, 1]), table[:, 2], table[:, 3])

    @classmethod
    def from_levels(cls, hours: Iterable[float], held: Iterable[float], rigid: Iterable[float] | None = None,
                    ) -> LoadCurve:
        """Consecutive levels lasting ``hours`` each, from time 0 (tests, worked examples)."""
        spans = np.asarray(list(hours), dtype=float) * SECONDS_PER_HOUR
        levels = np.asarray(list(held), dtype=float)
        stiff = np.zeros_like(levels) if rigid is None else np.asarray(list(rigid), dtype=float)
        return cls(np.concatenate([[0.0], np.cumsum(spans)]), levels, stiff)

    @property
    def seconds(self) -> np.ndarray:
        return np.diff(self.edges)

    @property
    def horizon_hours(self) -> float:
        return float(self.edges[-1] - self.edges[0]) / SECONDS_PER_HOUR

    @property
    def gpu_hours(self) -> float:
        return float(np.dot(self.held, self.seconds)) / SECONDS_PER_HOUR

    @property
    def peak(self) -> float:
        return float(self.held.max()) if self.held.size else 0.0

    def hours_at_or_above(self, level: float) -> float:
        return float(self.seconds[self.held >= level - 1e-9].sum()) / SECONDS_PER_HOUR


@dataclass(frozen=True)
class TierPrices:
    """Per GPU-hour, from one price book entry."""

    on_demand: float
    reserved: float
    spot: float
    model: str = ""
    book: str = ""  # the price book's identity (source, version, content hash)
    version: str | None = None
    currency: str = "USD"

    @classmethod
    def from_book(cls, book: Any, model: str) -> TierPrices:
        """``book``: a :class:`gpuwarden.analytics.pricebook.PriceBook`; raises its PriceBookError for a
        model or tier it cannot price."""
        name = book.model(model).name
        return cls(book.hourly(name, "on-demand"), book.hourly(name, "reserved"), book.hourly(name, "spot"),
                   name, book.identity, book.version, book.currency)


def young_daly_interval(checkpoint_seconds: float, reclaims_per_hour: float) -> float | None:
    """Seconds between checkpoints, ``sqrt(2 C / lambda)``; None when nothing is ever reclaimed."""
    if checkpoint_seconds < 0 or reclaims_per_hour < 0:
        raise SchedulingError("the checkpoint cost and the reclaim rate must be >= 0")
    if reclaims_per_hour == 0:
        return None
    return math.sqrt(2.0 * checkpoint_seconds * SECONDS_PER_HOUR / reclaims_per_hour)


@dataclass(frozen=True)
class SpotModel:
    """Reclaims per running spot job per hour, the checkpoint cost and the restart cost (seconds)."""

    reclaims_per_hour: float = DEFAULT_RECLAIMS_PER_HOUR
    checkpoint_seconds: float = DEFAULT_CHECKPOINT_SECONDS
    restart_seconds: float = 60.0

    @property
    def interval_seconds(self) -> float | None:
        return young_daly_interval(self.checkpoint_seconds, self.reclaims_per_hour)

    @property
    def checkpoint_fraction(self) -> float:
        """Of each billed spot hour, the part spent writing checkpoints: ``C / tau``."""
        tau = self.interval_seconds
        return 0.0 if tau is None or tau == 0 else self.checkpoint_seconds / tau

    @property
    def reclaim_fraction(self) -> float:
        """Of each billed spot hour, the part lost to reclaims: ``lambda * (tau / 2 + restart)``."""
        tau = self.interval_seconds
        rate = self.reclaims_per_hour / SECONDS_PER_HOUR
        return 0.0 if tau is None else rate * (tau / 2.0 + self.restart_seconds)

    @property
    def lost_fraction(self) -> float:
        return self.checkpoint_fraction + self.reclaim_fraction

    def billed_per_useful(self) -> float:
        """Spot GPU-hours billed per GPU-hour of work done (infinite once nothing gets done)."""
        lost = self.lost_fraction
        return math.inf if lost >= 1.0 else 1.0 / (1.0 - lost)


def classic_reserved_level(curve: LoadCurve, ratio: float) -> int:
    """The largest whole ``r`` such that the load is >= ``r`` for at least ``ratio`` of the horizon
    (``ratio`` = reserved / on-demand price); 0 when no GPU is held that long."""
    horizon = curve.horizon_hours
    if horizon <= 0:
        return 0
    level = 0
    while level < math.ceil(curve.peak) and curve.hours_at_or_above(level + 1) >= ratio * horizon - 1e-9:
        level += 1
    return level


@dataclass(frozen=True)
class TierPlan:
    """One load curve's plan and its cost against the same load all on-demand."""

    prices: TierPrices
    spot: SpotModel
    horizon_hours: float
    load_gpu_hours: float
    peak_gpus: float
    reserved_gpus: int
    reserved_gpu_hours: float
    reserved_used_gpu_hours: float
    spot_gpu_hours: float  # billed: the work placed on spot plus what checkpoints and reclaims cost
    spot_useful_gpu_hours: float
    on_demand_gpu_hours: float
    gpu_hours_lost_to_reclaims: float
    checkpoint_gpu_hours: float
    min_cost_reserved_gpus: int
    min_cost: float
    fleet_gpu_hours: float | None = None  # the served fleet, held for the horizon

    @property
    def uses_spot(self) -> bool:
        return spot_pays(self.prices, self.spot)

    @property
    def cost(self) -> float:
        p = self.prices
        return self.reserved_gpu_hours * p.reserved + self.spot_gpu_hours * p.spot + self.on_demand_gpu_hours * p.on_demand

    @property
    def cost_all_on_demand(self) -> float:
        return self.load_gpu_hours * self.prices.on_demand

    def saved_pct(self, cost: float) -> float | None:
        base = self.cost_all_on_demand
        return None if base <= 0 else 100.0 * (base - cost) / base

    def to_dict(self) -> dict[str, Any]:
        p = self.prices
        fleet_cost = None if self.fleet_gpu_hours is None else self.fleet_gpu_hours * p.on_demand
        return {
            "horizon_hours": self.horizon_hours, "load_gpu_hours": self.load_gpu_hours, "peak_gpus": self.peak_gpus,
            "reserved_gpus": self.reserved_gpus, "reserved_gpu_hours": self.reserved_gpu_hours,
            "reserved_utilisation": (self.reserved_used_gpu_hours / self.reserved_gpu_hours
                                     if self.reserved_gpu_hours > 0 else None),
            "spot_gpu_hours": self.spot_gpu_hours, "spot_useful_gpu_hours": self.spot_useful_gpu_hours,
            "on_demand_gpu_hours": self.on_demand_gpu_hours,
            "gpu_hours_lost_to_reclaims": self.gpu_hours_lost_to_reclaims,
            "checkpoint_gpu_hours": self.checkpoint_gpu_hours,
            "cost_reserved": self.reserved_gpu_hours * p.reserved, "cost_spot": self.spot_gpu_hours * p.spot,
            "cost_on_demand": self.on_demand_gpu_hours * p.on_demand, "cost": self.cost,
            "cost_all_on_demand": self.cost_all_on_demand, "cost_saved_pct": self.saved_pct(self.cost),
            "cost_fleet_held_on_demand": fleet_cost,
            "cost_saved_pct_vs_fleet_held": (None if not fleet_cost else 100.0 * (fleet_cost - self.cost) / fleet_cost),
            "min_cost_reserved_gpus": self.min_cost_reserved_gpus,
            "min_cost_saved_pct": self.saved_pct(self.min_cost),
        }


def spot_pays(prices: TierPrices, spot: SpotModel) -> bool:
    """Whether a GPU-hour of work costs less on spot, losses counted, than on-demand."""
    return prices.spot * spot.billed_per_useful() < prices.on_demand


def _split(curve: LoadCurve, level: float, use_spot: bool) -> tuple[float, float, float]:
    """GPU-hours of load on the ``level`` reserved GPUs, above them on spot (work done), on on-demand.
    Jobs that cannot checkpoint fill the reserved GPUs first."""
    s = curve.seconds / SECONDS_PER_HOUR
    above = np.maximum(curve.held - level, 0.0)
    rigid_above = np.maximum(curve.rigid - level, 0.0)
    on_reserved = float(np.dot(np.minimum(curve.held, level), s))
    if not use_spot:
        return on_reserved, 0.0, float(np.dot(above, s))
    return on_reserved, float(np.dot(above - rigid_above, s)), float(np.dot(rigid_above, s))


def plan_cost(curve: LoadCurve, prices: TierPrices, spot: SpotModel, level: int) -> float:
    """What the plan with ``level`` reserved GPUs costs over the curve's horizon."""
    use_spot = spot_pays(prices, spot)
    _, on_spot, on_demand = _split(curve, level, use_spot)
    spot_cost = on_spot * spot.billed_per_useful() * prices.spot if use_spot and on_spot > 0 else 0.0
    return level * curve.horizon_hours * prices.reserved + spot_cost + on_demand * prices.on_demand


def min_cost_level(curve: LoadCurve, prices: TierPrices, spot: SpotModel) -> int:
    """The reserved level (whole GPUs, smallest of the ties) that minimises :func:`plan_cost`."""
    costs = [plan_cost(curve, prices, spot, r) for r in range(math.ceil(curve.peak) + 1)]
    return int(np.argmin(np.round(costs, 9)))


def plan_tiers(curve: LoadCurve, prices: TierPrices, spot: SpotModel, fleet_gpus: int | None = None,
               reserved: int | None = None) -> TierPlan:
    """The plan for ``curve``: reserved by the classic rule (or ``reserved`` GPUs), spot above it for
    checkpointable load when it pays, on-demand for the rest."""
    if prices.on_demand <= 0:
        raise SchedulingError(f"price book: {prices.model or 'the GPU model'} has no on-demand price above 0")
    level = classic_reserved_level(curve, prices.reserved / prices.on_demand) if reserved is None else reserved
    use_spot = spot_pays(prices, spot)
    on_reserved, on_spot, on_demand = _split(curve, level, use_spot)
    billed = on_spot * spot.billed_per_useful() if on_spot > 0 else 0.0
    best = min_cost_level(curve, prices, spot)
    return TierPlan(
        prices=prices, spot=spot, horizon_hours=curve.horizon_hours, load_gpu_hours=curve.gpu_hours,
        peak_gpus=curve.peak, reserved_gpus=level, reserved_gpu_hours=level * curve.horizon_hours,
        reserved_used_gpu_hours=on_reserved, spot_gpu_hours=billed, spot_useful_gpu_hours=on_spot,
        on_demand_gpu_hours=on_demand, gpu_hours_lost_to_reclaims=billed * spot.reclaim_fraction,
        checkpoint_gpu_hours=billed * spot.checkpoint_fraction, min_cost_reserved_gpus=best,
        min_cost=plan_cost(curve, prices, spot, best),
        fleet_gpu_hours=None if fleet_gpus is None else fleet_gpus * curve.horizon_hours)


def tiers_header(prices: TierPrices, spot: SpotModel) -> dict[str, Any]:
    """What every plan of a run shares: the price book, the prices, the spot model and the rule."""
    return {
        "price_book": {"identity": prices.book, "version": prices.version}, "gpu_model": prices.model,
        "currency": prices.currency,
        "prices_per_gpu_hour": {"on-demand": prices.on_demand, "reserved": prices.reserved, "spot": prices.spot},
        "spot_reclaims_per_hour": spot.reclaims_per_hour, "checkpoint_seconds": spot.checkpoint_seconds,
        "restart_seconds": spot.restart_seconds, "checkpoint_interval_seconds": spot.interval_seconds,
        "spot_lost_fraction": spot.lost_fraction, "spot_used": spot_pays(prices, spot), "rule": RESERVED_RULE,
    }
