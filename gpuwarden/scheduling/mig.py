"""MIG fit checks and MIG layout advice over the GPU catalogue's profiles.

The profiles themselves (compute and memory slices, the most instances of a profile one GPU holds,
as NVIDIA's MIG user guide lists them) are data in :mod:`gpuwarden.fleet.gpu_catalogue`; this
module only reasons over them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from collections.abc import Mapping

from gpuwarden.fleet.mig_geometry import (  # re-exported
    MIG_TABLES as MIG_TABLES,
    MODEL_ALIASES as MODEL_ALIASES,
    UnknownMigProfile as UnknownMigProfile,
    check_profile as check_profile,
    compute_slices as compute_slices,
    fits as fits,
    fraction_slices as fraction_slices,
    known_profile as known_profile,
    mig_spec as mig_spec,
    mig_table as mig_table,
)


# ---------------------------------------------------------------------------------------------
# Layout advice


@dataclass(frozen=True)
class LayoutAdvice:
    model: str
    gpus: int
    layouts: tuple[tuple[tuple[str, ...], int], ...]  # (layout, how many GPUs get it)
    served: Mapping[str, int]  # instances of each profile the layouts provide
    unmet: Mapping[str, int]  # demand that does not fit
    wasted_compute_slices: int  # slices provisioned beyond the demand, over the pool
    unused_slices: int  # slices left unpartitioned

    def as_dict(self) -> dict[str, object]:
        return {
            "model": self.model, "gpus": self.gpus,
            "layouts": [{"layout": list(layout), "gpus": count} for layout, count in self.layouts],
            "served": dict(self.served), "unmet": dict(self.unmet),
            "wasted_compute_slices": self.wasted_compute_slices, "unused_slices": self.unused_slices,
        }


def valid_layouts(model: str) -> list[tuple[str, ...]]:
    """Every maximal multiset of profiles that fits one GPU (by compute, memory and instance limits)."""
    table = mig_table(model)
    names = sorted(table, key=lambda n: (-table[n].compute_slices, -table[n].memory_slices))
    found: set[tuple[str, ...]] = set()
    for size in range(1, compute_slices(model) + 1):  # every instance takes a slice at least
        for combo in itertools.combinations_with_replacement(names, size):
            used: list[str] = []
            ok = True
            for name in combo:
                if not fits(model, used, name):
                    ok = False
                    break
                used.append(name)
            if ok:
                found.add(tuple(sorted(combo)))
    maximal = [c for c in found if not any(fits(model, list(c), extra) for extra in table)]
    return sorted(maximal)


def advise_layouts(model: str, gpus: int, demand: Mapping[str, int]) -> LayoutAdvice:
    """Recommend per-GPU MIG layouts for a pool of ``gpus`` GPUs serving ``demand`` (profile -> instances).

    Greedy on the remaining demand: each GPU gets the valid layout that serves the most remaining
    compute slices. Ties go to the layout with the fewest slices of profiles nobody asked for (no
    pod can use them), then the fewest slices beyond the demand (spare instances of an asked
    profile are headroom for its next pods). Unknown profiles raise; a demand larger than the pool
    is reported as ``unmet``.
    """
    table = mig_table(model)
    if not table:
        raise UnknownMigProfile(f"GPU model {model!r} has no MIG profile table")
    for profile, count in demand.items():
        mig_spec(model, profile)
        if count < 0:
            raise UnknownMigProfile(f"demand for {profile} is negative ({count})")
    remaining = {p: int(c) for p, c in demand.items() if c > 0}
    layouts = valid_layouts(model)
    chosen: dict[tuple[str, ...], int] = {}
    wasted = unused = 0
    for _ in range(gpus):
        if not any(remaining.values()):
            break
        best: tuple[str, ...] | None = None
        best_key: tuple[int, int, int] | None = None
        for layout in layouts:
            served = waste = unasked = 0
            left = dict(remaining)
            for name in layout:
                if left.get(name, 0) > 0:
                    left[name] -= 1
                    served += table[name].compute_slices
                else:
                    waste += table[name].compute_slices
                    unasked += table[name].compute_slices if name not in demand else 0
            key = (served, -unasked, -waste)
            if best_key is None or key > best_key:
                best, best_key = layout, key
        if best is None or best_key is None or best_key[0] == 0:
            break
        chosen[best] = chosen.get(best, 0) + 1
        for name in best:
            if remaining.get(name, 0) > 0:
                remaining[name] -= 1
            else:
                wasted += table[name].compute_slices
        unused += compute_slices(model) - sum(table[name].compute_slices for name in best)
    provided = {p: int(demand[p]) - remaining.get(p, 0) for p in demand}
    return LayoutAdvice(model=model, gpus=gpus, layouts=tuple(sorted(chosen.items(), key=lambda kv: -kv[1])),
                        served=provided, unmet={p: c for p, c in remaining.items() if c > 0},
                        wasted_compute_slices=wasted, unused_slices=unused)
