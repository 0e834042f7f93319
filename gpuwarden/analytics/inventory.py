"""Which pool and price tier each node belongs to.

Fleet samples name the node but not what it costs: a reserved H100 and a spot H100 read the same.
The *inventory* maps node names to a pool and a price tier by an ordered list of rules; the first
rule whose glob pattern (``fnmatch``, case-sensitive) matches the node name wins. It comes from:

- a YAML file (:meth:`Inventory.from_yaml`)::

      default_tier: on-demand        # for nodes no rule matches
      rules:
        - {pattern: "train-h100-spot-*", pool: train-h100-spot, tier: spot}
        - {pattern: "gpu-a-*",           pool: batch,           tier: reserved}
      nodes:                          # exact names; they win over patterns
        special-node-7: {pool: batch, tier: owned}

- a table with columns ``node`` (or ``pattern``), ``pool``, ``tier`` (:meth:`Inventory.from_table`);
- the fleet's :class:`~gpuwarden.fleet.Node` objects, which carry pool and tier
  (:meth:`Inventory.from_nodes`; the CLI hands the simulated cluster's nodes over this way).

:data:`DEFAULT_RULES` (the bundled ``inventory.yaml``) follow the simulated fleet's naming:
``train-h100-spot-NNN`` spot, ``train-h100-NNN`` reserved, ``train-h200-NNN`` owned on-prem,
``infer-a100-NNN`` and ``infer-l40s-NNN`` on-demand. A node no rule matches gets the pool of its name
without the trailing ``-NNN`` ordinal and ``default_tier`` (on-demand unless set).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterable, Mapping

import pandas as pd

from gpuwarden.fleet import FleetValueError, Node, PriceTier
from gpuwarden.fleet.semantics import default_pool

from .params import AnalyticsError
from .yamlfile import read_yaml

DEFAULT_INVENTORY_PATH = Path(__file__).with_name("inventory.yaml")


def _tier(value, where: str) -> PriceTier:
    try:
        return PriceTier(value)
    except ValueError:
        allowed = ", ".join(t.value for t in PriceTier)
        raise AnalyticsError(f"{where}: tier {value!r} is not one of: {allowed}") from None


@dataclass(frozen=True)
class Rule:
    pattern: str
    pool: str
    tier: PriceTier

    def matches(self, node: str) -> bool:
        return fnmatch.fnmatchcase(node, self.pattern)


@dataclass(frozen=True)
class Inventory:
    rules: tuple[Rule, ...] = ()
    nodes: Mapping[str, tuple[str, PriceTier]] = field(default_factory=dict)
    default_tier: PriceTier = PriceTier.ON_DEMAND

    def lookup(self, node: str) -> tuple[str, PriceTier]:
        """``(pool, tier)`` of ``node``."""
        if node in self.nodes:
            return self.nodes[node]
        for rule in self.rules:
            if rule.matches(node):
                return rule.pool, rule.tier
        return default_pool(node), self.default_tier

    def table(self, nodes: Iterable[str]) -> pd.DataFrame:
        """Columns node, pool, tier for ``nodes``."""
        rows = [(node, *self.lookup(node)) for node in nodes]
        return pd.DataFrame({"node": [r[0] for r in rows], "pool": [r[1] for r in rows],
                             "tier": [r[2].value for r in rows]})

    # -- constructors ------------------------------------------------------------------------------
    @classmethod
    def default(cls) -> Inventory:
        return cls.from_yaml(DEFAULT_INVENTORY_PATH)

    @classmethod
    def from_mapping(cls, data: Mapping, source: str = "inventory") -> Inventory:
        if not isinstance(data, Mapping):
            raise AnalyticsError(f"{source}: expected a mapping with 'rules' and/or 'nodes'")
        unknown = set(data) - {"rules", "nodes", "default_tier"}
        if unknown:
            raise AnalyticsError(f"{source}: unknown key(s) {', '.join(sorted(unknown))}; allowed: rules, nodes, default_tier")
        rules = []
        for position, entry in enumerate(data.get("rules") or []):
            where = f"{source}: rules[{position}]"
            if not isinstance(entry, Mapping) or not {"pattern", "pool", "tier"} <= set(entry):
                raise AnalyticsError(f"{where}: expected pattern, pool and tier")
            rules.append(Rule(str(entry["pattern"]), str(entry["pool"]), _tier(entry["tier"], where)))
        nodes = {}
        for name, entry in (data.get("nodes") or {}).items():
            where = f"{source}: nodes[{name!r}]"
            if not isinstance(entry, Mapping) or not {"pool", "tier"} <= set(entry):
                raise AnalyticsError(f"{where}: expected pool and tier")
            nodes[str(name)] = (str(entry["pool"]), _tier(entry["tier"], where))
        default_tier = _tier(data.get("default_tier", "on-demand"), f"{source}: default_tier")
        return cls(tuple(rules), nodes, default_tier)

    @classmethod
    def from_yaml(cls, path: str | Path) -> Inventory:
        return cls.from_mapping(read_yaml(path, "inventory", AnalyticsError), str(path))

    @classmethod
    def from_table(cls, table: pd.DataFrame, default_tier: str = "on-demand") -> Inventory:
        """Rows of ``node`` (exact) or ``pattern`` (glob), ``pool`` and ``tier``."""
        if "pool" not in table or "tier" not in table or not ({"node", "pattern"} & set(table.columns)):
            raise AnalyticsError("inventory table: expected columns node (or pattern), pool, tier")
        rules, nodes = [], {}
        for position, row in enumerate(table.to_dict("records")):
            where = f"inventory table row {position}"
            tier = _tier(row["tier"], where)
            if "node" in row and isinstance(row["node"], str) and row["node"]:
                nodes[row["node"]] = (str(row["pool"]), tier)
            else:
                rules.append(Rule(str(row["pattern"]), str(row["pool"]), tier))
        return cls(tuple(rules), nodes, _tier(default_tier, "default_tier"))

    @classmethod
    def from_nodes(cls, nodes: Iterable[Node], fallback: Inventory | None = None) -> Inventory:
        """Exact entries from fleet ``Node`` objects; other nodes go by ``fallback``'s rules."""
        fallback = fallback or cls.default()
        mapping = dict(fallback.nodes)
        for node in nodes:
            try:
                mapping[node.name] = (node.pool, PriceTier(node.price_tier))
            except (ValueError, FleetValueError) as error:
                raise AnalyticsError(f"node {node.name}: {error}") from None
        return cls(fallback.rules, mapping, fallback.default_tier)


DEFAULT_RULES: tuple[Rule, ...] = Inventory.default().rules
