"""GPU models the simulated fleet is built from: every model the GPU catalogue prices, with its
hardware (memory, power, clocks, GPM support, MIG profiles) and the prices that seed the simulated
nodes, all read from :mod:`gpuwarden.fleet.gpu_catalogue` (``gpu_models.csv``: the one place they
are written; analytics has its own price book, these only seed the simulated nodes).

A model new to the simulator is one priced row of the catalogue: :data:`MODELS` and
:data:`MIG_LAYOUTS` read the catalogue in force (:func:`~gpuwarden.fleet.gpu_catalogue.gpu_catalogue`)
on each lookup.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

from gpuwarden.fleet import GpuModel, MigProfile, PriceTier
from gpuwarden.fleet.gpu_catalogue import GIB, GpuCatalogue, GpuSpec, gpu_catalogue

__all__ = ["GIB", "MIG_LAYOUTS", "MODELS", "sim_models"]

V = TypeVar("V")


def _model(spec: GpuSpec) -> GpuModel:
    profiles = tuple(MigProfile(p.name, p.compute_slices, p.memory_bytes, p.max_instances)
                     for p in spec.mig_profiles.values())
    prices = tuple((PriceTier(tier), price) for tier, price in spec.price_per_hour)
    return GpuModel(spec.name, spec.memory_bytes, spec.tdp_watts, spec.max_sm_clock_mhz, spec.gpm_supported,
                    profiles, prices)


def _mixed_layout(spec: GpuSpec) -> tuple[str, ...] | None:
    """The simulated MIG nodes' layout: a mixed one using every compute slice, half of what is left
    at a time (7 slices: 3g + 2g + 1g + 1g), each the smallest-memory profile of its size (NVIDIA's
    order breaks ties); None when the model's profiles allow no such layout (tests/fleet/test_gpu_catalogue.py
    checks the layouts against the placement rules)."""
    layout: list[str] = []
    left = spec.mig_compute_slices
    while left:
        size = max(1, left // 2)
        profile = spec.smallest_profile(size)
        if profile is None or not spec.fits_mig(layout, profile.name):
            return None
        layout.append(profile.name)
        left -= size
    return tuple(layout) or None


@functools.cache
def sim_models(catalogue: GpuCatalogue) -> tuple[dict[str, GpuModel], dict[str, tuple[str, ...]]]:
    """The priced models of ``catalogue`` as the simulator's :class:`GpuModel` s, and the MIG layout
    of those with MIG."""
    priced = [spec for spec in catalogue.models.values() if spec.price_per_hour]
    layouts = {spec.name: _mixed_layout(spec) for spec in priced if spec.mig_compute_slices}
    return ({spec.name: _model(spec) for spec in priced},
            {name: layout for name, layout in layouts.items() if layout is not None})


class _CatalogueView(Mapping[str, V]):
    """A read-only mapping over the catalogue in force."""

    def __init__(self, table: Callable[[GpuCatalogue], Mapping[str, V]]) -> None:
        self._of = table

    def _table(self) -> Mapping[str, V]:
        return self._of(gpu_catalogue())

    def __getitem__(self, name: str) -> V:
        return self._table()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def __repr__(self) -> str:
        return repr(dict(self._table()))


MODELS: Mapping[str, GpuModel] = _CatalogueView(lambda catalogue: sim_models(catalogue)[0])
MIG_LAYOUTS: Mapping[str, tuple[str, ...]] = _CatalogueView(lambda catalogue: sim_models(catalogue)[1])
