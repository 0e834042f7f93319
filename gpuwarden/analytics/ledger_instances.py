"""The GPU instances a ledger has seen (a whole GPU, or one MIG instance of it): their codes, where
they run (cluster, node, model), what an hour of each costs, its share of its GPU, and when it was
first and last seen. :class:`~gpuwarden.analytics.ledger.LedgerBuilder` keeps one
:class:`InstanceBook` and sums its GPU time per instance code.

An instance's share of its GPU (:func:`gpuwarden.fleet.semantics.mig_share`: a ``3g`` instance is
3/7) is settled by its MIG profile; where the profile cannot be read it is what the instance's
siblings (the other instances its GPU showed over the window) leave, so it may change as siblings
appear and is read at the end.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gpuwarden.fleet.semantics import mig_share, profile_slices
from gpuwarden.fleet.vocabulary import PriceTier

from .codes import Registry, dense_factorize
from .inventory import Inventory
from .pricebook import PriceBook

Local = tuple[np.ndarray, np.ndarray]  # a column's chunk-local codes and the global code of each
META = ("cluster", "node", "model", "share", "price", "owned", "watts")


def global_code(local: Local, row: int) -> int:
    """The global code of ``row``'s value in a chunk-local column (-1 for null)."""
    codes, mapping = local
    return int(mapping[codes[row]]) if codes[row] >= 0 else -1


class InstanceBook:
    """Instances by (GPU, MIG instance) code; ``strings`` are the ledger's string registries."""

    def __init__(self, strings: dict[str, Registry[str]], inventory: Inventory, price_book: PriceBook,
                 price: bool) -> None:
        self.strings = strings
        self.inventory = inventory
        self.price_book = price_book
        self.price = price
        self.registry: Registry[tuple[int, int]] = Registry()  # (gpu code, mig code) -> instance
        self.meta: dict[str, list[Any]] = {k: [] for k in META}
        self.profile: list[str | None] = []  # MIG profile per instance (None: a whole GPU)
        self.gpu_instances: dict[int, list[int]] = {}  # gpu code -> its instance codes
        self.first: list[int] = []
        self.last: list[int] = []
        self.samples: list[int] = []
        self.sm: list[int] = []
        self.classes: Registry[tuple[float, float, bool]] = Registry()  # (share key, price, owned), for the time series

    def codes(self, local: dict[str, Local], bad: np.ndarray) -> np.ndarray:
        """Each row's instance code (new instances registered and priced); ``bad`` rows get -1."""
        gpu, mig = local["gpu_uuid"][0].astype(np.int64), local["mig_instance"][0]
        n_mig = len(local["mig_instance"][1]) + 1
        size = (len(local["gpu_uuid"][1]) + 1) * n_mig
        packed = np.maximum(gpu, 0) * n_mig + (mig.astype(np.int64) + 1)
        packed[bad] = size - 1
        inverse, uniques, first = dense_factorize(packed, size)
        mapping = np.full(len(uniques), -1, np.int64)
        for position, row in enumerate(first):
            if bad[row]:
                continue
            key = (global_code(local["gpu_uuid"], row), global_code(local["mig_instance"], row))
            code = self.registry.code(key)
            meta = (global_code(local["cluster"], row), global_code(local["node"], row), global_code(local["model"], row))
            if code == len(self.meta["cluster"]):
                self._new(key, meta)
            elif meta != (self.meta["cluster"][code], self.meta["node"][code], self.meta["model"][code]):
                self._set(code, meta)  # the GPU moved or was relabelled: the latest wins
            mapping[position] = code
        return np.asarray(mapping[inverse], dtype=np.int64)

    def _pricing(self, meta: tuple[int, int, int]) -> tuple[float, bool, float]:
        model = self.strings["model"].values[meta[2]] if meta[2] >= 0 else "(unknown model)"
        node = self.strings["node"].values[meta[1]] if meta[1] >= 0 else "(unknown node)"
        _pool, tier = self.inventory.lookup(node)
        if not self.price:
            return 0.0, False, 0.0
        price = self.price_book.hourly(model, tier)  # raises naming the model
        return price, tier is PriceTier.OWNED, self.price_book.model(model).typical_watts

    def _new(self, key: tuple[int, int], meta: tuple[int, int, int]) -> None:
        mig = self.strings["mig_instance"].values[key[1]] if key[1] >= 0 else None
        price, owned, watts = self._pricing(meta)
        for name, value in zip(META, (*meta, 1.0, price, owned, watts)):
            self.meta[name].append(value)
        self.profile.append(mig)
        siblings = self.gpu_instances.setdefault(key[0], [])
        siblings.append(len(self.profile) - 1)
        for code in siblings:  # a new sibling changes what an unreadable profile is left
            self.meta["share"][code] = self._share(code, siblings)
        self.first.append(np.iinfo(np.int64).max)
        self.last.append(np.iinfo(np.int64).min)
        self.samples.append(0)
        self.sm.append(0)

    def _share(self, code: int, gpu_instances: list[int]) -> float:
        model_code = self.meta["model"][code]
        model = self.strings["model"].values[model_code] if model_code >= 0 else None
        siblings = [self.profile[other] for other in gpu_instances if other != code]
        return mig_share(self.profile[code], model, siblings)

    def _share_key(self, code: int) -> float | int:
        """The share itself where it is settled, else ``-1 - code`` (an unreadable MIG profile,
        whose share may still change as siblings appear; read at the end)."""
        profile = self.profile[code]
        if profile is None or profile_slices(profile) is not None:
            return float(self.meta["share"][code])
        return -1 - code

    def _set(self, code: int, meta: tuple[int, int, int]) -> None:
        price, owned, watts = self._pricing(meta)
        for name, value in zip(("cluster", "node", "model", "price", "owned", "watts"), (*meta, price, owned, watts)):
            self.meta[name][code] = value

    def price_class(self, inst: np.ndarray) -> np.ndarray:
        """Instances with the same (share, price, owned) share a class: the time series keeps
        classes instead of instances."""
        meta = self.meta
        mapping = np.array([self.classes.code((self._share_key(i), meta["price"][i], meta["owned"][i]))
                            for i in range(len(meta["share"]))], dtype=np.int64)
        return np.asarray(mapping[inst], dtype=np.int64)

    def typical_watts(self) -> np.ndarray:
        """Per instance: its model's typical watts times its share (stands in for no power reading)."""
        return np.asarray(self.meta["watts"], dtype=np.float64) * np.asarray(self.meta["share"], dtype=np.float64)

    def seen(self, code: int, first: int, last: int, samples: int, sm_samples: int) -> None:
        """Widen ``code``'s first / last seen (ns) and count its samples (``sm_samples`` with SM activity)."""
        if first < self.first[code]:
            self.first[code] = first
        if last > self.last[code]:
            self.last[code] = last
        self.samples[code] += samples
        self.sm[code] += sm_samples

    def seen_rows(self, inst: np.ndarray, ts: np.ndarray, measured: np.ndarray, group_start: np.ndarray,
                  carried: np.ndarray | None = None) -> None:
        """First and last timestamps and sample counts per instance; rows are sorted by (instance,
        time) and ``group_start`` is where each instance's rows begin (carried rows first)."""
        if not len(inst):
            return
        uniques = inst[group_start]
        group_end = np.r_[group_start[1:], len(inst)]  # exclusive
        counts = group_end - group_start
        sm_counts = np.add.reduceat(measured.view(np.int8), group_start, dtype=np.int64)
        first_idx = group_start
        if carried is not None:  # carried rows come first in their instance: skip them
            held = np.bincount(np.searchsorted(group_start, np.flatnonzero(carried), "right") - 1, minlength=len(group_start))
            counts = counts - held
            first_idx = group_start + held
        first_ts = ts[np.minimum(first_idx, len(ts) - 1)]
        last_ts = ts[group_end - 1]
        for code, first, last, c, sm in zip(uniques.tolist(), first_ts.tolist(), last_ts.tolist(), counts.tolist(),
                                            sm_counts.tolist()):
            if c:
                self.seen(code, first, last, c, sm)

    def table(self) -> pd.DataFrame:
        """One row per instance: identity, pool and tier, share, price, first / last seen, samples
        and where its activity came from."""
        keys = self.registry.values
        strings = self.strings

        def name(registry: str, code: int) -> str | None:
            return strings[registry].values[code] if code >= 0 else None

        nodes = [name("node", c) for c in self.meta["node"]]
        lookups = [self.inventory.lookup(n or "") for n in nodes]
        samples = np.asarray(self.samples, dtype=np.int64)
        sm = np.asarray(self.sm, dtype=np.int64)
        source = np.where(sm == samples, "sm_active", np.where(sm == 0, "gpu_util_fallback", "mixed"))
        return pd.DataFrame({
            "inst": np.arange(len(keys), dtype=np.int64),
            "cluster": [name("cluster", c) for c in self.meta["cluster"]],
            "node": nodes,
            "gpu_uuid": [name("gpu_uuid", k[0]) for k in keys],
            "mig_instance": [name("mig_instance", k[1]) for k in keys],
            "model": [name("model", c) for c in self.meta["model"]],
            "pool": [lookup[0] for lookup in lookups],
            "tier": [lookup[1].value for lookup in lookups],
            "share": np.asarray(self.meta["share"], dtype=np.float64),
            "price_per_hour": np.asarray(self.meta["price"], dtype=np.float64),
            "first_seen": pd.to_datetime(np.asarray(self.first, dtype=np.int64), utc=True),
            "last_seen": pd.to_datetime(np.asarray(self.last, dtype=np.int64), utc=True),
            "samples": samples,
            "sm_samples": sm,
            "activity_source": source,
        })
