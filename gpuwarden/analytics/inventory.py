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

A node's own labels win over the file for its tier (:meth:`Inventory.with_labels`: ``gpuwarden.io/price-tier``
or a cloud's capacity label, :mod:`gpuwarden.fleet.price_tiers`); :meth:`Inventory.tier_note` says
which nodes got their tier where.
"""

from __future__ import annotations

import fnmatch
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from collections.abc import Iterable, Mapping

import pandas as pd

from gpuwarden.fleet import FleetValueError, Node, PriceTier
from gpuwarden.fleet.price_tiers import parse_tier, tier_from_labels
from gpuwarden.fleet.semantics import default_pool

from .params import AnalyticsError
from .yamlfile import content_digest, read_yaml

DEFAULT_INVENTORY_PATH = Path(__file__).with_name("inventory.yaml")
TIER_NOTE_PREFIX = "price tiers: "


def _tier(value, where: str) -> PriceTier:
    try:
        return parse_tier(value, where)
    except FleetValueError as error:
        raise AnalyticsError(str(error)) from None


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
    source: str = "built-in"  # the file, or "built-in": reports name it
    digest: str = ""  # sha256 of the content: two copies of one inventory read the same
    labelled: Mapping[str, tuple[PriceTier, str]] = field(default_factory=dict)  # node -> tier, label that gave it
    labels_from: str = ""  # where node labels were looked for (e.g. kube_node_labels), for the note
    # node -> why its tier label was not read (a value that is no tier): that node is priced by the
    # file, the other nodes by their labels; the tier note says so
    unreadable: Mapping[str, str] = field(default_factory=dict)

    def lookup(self, node: str) -> tuple[str, PriceTier]:
        """``(pool, tier)`` of ``node``: a tier from its labels wins over the file's."""
        pool, tier, _origin = self.explain(node)
        return pool, tier

    def explain(self, node: str) -> tuple[str, PriceTier, str]:
        """``(pool, tier, where the tier came from)``: ``label <name>``, ``inventory`` or ``default``."""
        pool, tier, origin = default_pool(node), self.default_tier, "default"
        if node in self.nodes:
            (pool, tier), origin = self.nodes[node], "inventory"
        else:
            rule = next((r for r in self.rules if r.matches(node)), None)
            if rule is not None:
                pool, tier, origin = rule.pool, rule.tier, "inventory"
        if node in self.labelled:
            tier, label = self.labelled[node]
            origin = f"label {label}"
        return pool, tier, origin

    @property
    def identity(self) -> str:
        """What reports print: the source and a short content hash."""
        return f"{self.source} (sha256 {self.digest[:12]})" if self.digest else self.source

    def with_labels(self, labels: Mapping[str, Mapping[str, str]], origin: str = "node labels") -> Inventory:
        """This inventory with the tiers ``labels`` (node -> its labels, read from ``origin``) give. A
        node whose label value is no tier keeps the file's tier and is named in :meth:`tier_note`: one
        bad label must not fail every priced read of the fleet."""
        labelled, unreadable = dict(self.labelled), dict(self.unreadable)
        for node, node_labels in labels.items():
            try:
                found = tier_from_labels(node_labels, node)
            except FleetValueError as error:
                unreadable[node] = str(error)
                continue
            if found is not None:
                labelled[node] = found
        return replace(self, labelled=labelled, labels_from=origin, unreadable=unreadable)

    def tier_note(self, nodes: Iterable[str]) -> str:
        """One line saying where ``nodes``' price tiers came from."""
        origins = Counter(self.explain(node)[2] for node in nodes)
        parts = [f"{n} node(s) from {origin}" for origin, n in sorted(origins.items()) if origin.startswith("label ")]
        if origins["inventory"]:
            parts.append(f"{origins['inventory']} from the inventory {self.identity}")
        if origins["default"]:
            parts.append(f"{origins['default']} at the default tier {self.default_tier.value} (no tier label, "
                         "no inventory entry)")
        note = TIER_NOTE_PREFIX + ("; ".join(parts) or "no nodes")
        bad = sorted(node for node in set(nodes) if node in self.unreadable)
        if bad:
            note += (f"; {len(bad)} node(s) priced by the inventory because their tier label is no tier: "
                     + "; ".join(self.unreadable[node] for node in bad[:3]) + ("; ..." if len(bad) > 3 else ""))
        if self.labels_from and not any(origin.startswith("label ") for origin in origins):
            note += (f"; {self.labels_from} gave no tier label for these nodes (kube-state-metrics exports only "
                     "the node labels its --metric-labels-allowlist names)")
        return note

    def table(self, nodes: Iterable[str]) -> pd.DataFrame:
        """Columns node, pool, tier for ``nodes``."""
        rows = [(node, *self.lookup(node)) for node in nodes]
        return pd.DataFrame({"node": [r[0] for r in rows], "pool": [r[1] for r in rows],
                             "tier": [r[2].value for r in rows]})

    # -- constructors ------------------------------------------------------------------------------
    @classmethod
    def default(cls) -> Inventory:
        return cls.from_yaml(DEFAULT_INVENTORY_PATH, "built-in")

    @classmethod
    def from_mapping(cls, data: Mapping, source: str = "inventory", name: str | None = None) -> Inventory:
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
        return cls(tuple(rules), nodes, default_tier, name or source, content_digest(data))

    @classmethod
    def from_yaml(cls, path: str | Path, name: str | None = None) -> Inventory:
        """``name``: what reports call it (default the path)."""
        return cls.from_mapping(read_yaml(path, "inventory", AnalyticsError), str(path), name)

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
        return cls(tuple(rules), nodes, _tier(default_tier, "default_tier"), "inventory table")

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
        return replace(fallback, nodes=mapping, source=f"{fallback.source} and the cluster's nodes")


DEFAULT_RULES: tuple[Rule, ...] = Inventory.default().rules
