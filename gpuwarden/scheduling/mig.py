"""MIG profile tables, MIG fit checks and MIG layout advice.

Tables follow NVIDIA's MIG user guide (A100 80GB, H100 80GB, H200 141GB): compute slices out of 7,
memory slices out of 8, and the most instances of a profile one GPU can hold. Scheduling keeps its
own copy so it never imports the simulator.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from collections.abc import Mapping, Sequence

from .errors import UnknownMigProfile

GIB = 1024**3


@dataclass(frozen=True)
class MigSpec:
    name: str
    compute_slices: int  # of 7
    memory_slices: int  # of 8
    memory_gib: float
    max_instances: int


def _table(rows: Sequence[tuple[str, int, int, float, int]]) -> dict[str, MigSpec]:
    return {name: MigSpec(name, c, m, gib, n) for name, c, m, gib, n in rows}


_80GB = [("1g.10gb", 1, 1, 10, 7), ("1g.20gb", 1, 2, 20, 4), ("2g.20gb", 2, 2, 20, 3),
         ("3g.40gb", 3, 4, 40, 2), ("4g.40gb", 4, 4, 40, 1), ("7g.80gb", 7, 8, 80, 1)]
MIG_TABLES: dict[str, dict[str, MigSpec]] = {
    "NVIDIA A100-SXM4-80GB": _table(_80GB),
    "NVIDIA H100 80GB HBM3": _table(_80GB),
    "NVIDIA H200": _table([("1g.18gb", 1, 1, 18, 7), ("1g.35gb", 1, 2, 35, 4), ("2g.35gb", 2, 2, 35, 3),
                           ("3g.71gb", 3, 4, 71, 2), ("4g.71gb", 4, 4, 71, 1), ("7g.141gb", 7, 8, 141, 1)]),
}
# short names people type
MODEL_ALIASES = {"A100": "NVIDIA A100-SXM4-80GB", "H100": "NVIDIA H100 80GB HBM3", "H200": "NVIDIA H200"}


def mig_table(model: str) -> dict[str, MigSpec]:
    return MIG_TABLES.get(MODEL_ALIASES.get(model, model), {})


def mig_spec(model: str, profile: str) -> MigSpec:
    table = mig_table(model)
    if profile not in table:
        allowed = ", ".join(table) or "none (this model has no MIG)"
        raise UnknownMigProfile(f"MIG profile {profile!r} is not offered by {model}; allowed: {allowed}")
    return table[profile]


def known_profile(profile: str) -> bool:
    return any(profile in table for table in MIG_TABLES.values())


def check_profile(profile: str) -> None:
    if not known_profile(profile):
        allowed = sorted({p for table in MIG_TABLES.values() for p in table})
        raise UnknownMigProfile(f"unknown MIG profile {profile!r}; known profiles: {', '.join(allowed)}")


def fits(model: str, used: Sequence[str], profile: str) -> bool:
    """Whether one more ``profile`` instance fits on a GPU already holding ``used`` instances."""
    table = mig_table(model)
    if profile not in table:
        return False
    specs = [table[name] for name in used] + [table[profile]]
    if sum(s.compute_slices for s in specs) > 7 or sum(s.memory_slices for s in specs) > 8:
        return False
    return sum(1 for s in specs if s.name == profile) <= table[profile].max_instances


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
    for size in range(1, 8):
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
        unused += 7 - sum(table[name].compute_slices for name in best)
    provided = {p: int(demand[p]) - remaining.get(p, 0) for p in demand}
    return LayoutAdvice(model=model, gpus=gpus, layouts=tuple(sorted(chosen.items(), key=lambda kv: -kv[1])),
                        served=provided, unmet={p: c for p, c in remaining.items() if c > 0},
                        wasted_compute_slices=wasted, unused_slices=unused)
