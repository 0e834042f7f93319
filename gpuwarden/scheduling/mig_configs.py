"""Which named MIG configuration a drained node should take for the MIG work that waits.

The GPU operator's MIG manager applies the configuration a node's ``nvidia.com/mig.config`` label
names, from its mig-parted config (NVIDIA's default ConfigMap names ``all-disabled``,
``all-<profile>``: as many instances of one profile as fit each GPU, and ``all-balanced``). This
module is the advice; the scheduler's opt-in MIG manager (``scheduler run --mig-manager``) turns it
into a ``set-mig-config`` action, only on a node no GPU pod runs on (a new layout destroys the
instances on it).

The choice is greedy and per node: the waiting MIG demand that the free instances elsewhere do not
already cover is weighed in compute slices, and the node gets the named configuration serving the
most of it, when that is more than its current one serves. Whole-GPU demand is not weighed (a MIG
node is never turned back to whole GPUs here).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .mig import fits, mig_table

DISABLED = "all-disabled"
BALANCED = "all-balanced"


def named_configs(model: str) -> dict[str, tuple[str, ...]]:
    """Per-GPU layouts of the default mig-parted configurations for ``model`` ({} without MIG):
    ``all-<profile>`` for each profile, ``all-balanced`` (two of the smallest, one 2-slice and one
    3-slice instance, the default config's pattern) and ``all-disabled``."""
    table = mig_table(model)
    if not table:
        return {}
    configs: dict[str, tuple[str, ...]] = {DISABLED: ()}
    plain = [name for name in table if "+" not in name]  # "+me" / "+gfx" variants are not in the defaults
    for profile in plain:
        used: list[str] = []
        while fits(model, used, profile):
            used.append(profile)
        configs[f"all-{profile}"] = tuple(used)

    def smallest(slices: int) -> str | None:
        sized = [n for n in plain if table[n].compute_slices == slices]
        return min(sized, key=lambda n: (table[n].memory_slices, n)) if sized else None

    balanced: list[str] = []
    for slices, count in ((1, 2), (2, 1), (3, 1)):
        name = smallest(slices)
        for _ in range(count):
            if name is not None and fits(model, balanced, name):
                balanced.append(name)
    if balanced:
        configs[BALANCED] = tuple(balanced)
    return configs


@dataclass(frozen=True)
class MigNode:
    name: str
    model: str
    gpus: int
    config: str  # its nvidia.com/mig.config label
    drained: bool  # no GPU pod runs on it (a new layout would destroy nothing in use)
    free: Mapping[str, int]  # free instances it offers now, by profile


@dataclass(frozen=True)
class MigChange:
    node: str
    current: str
    wanted: str
    served_slices: int  # compute slices of waiting demand the new configuration serves
    reason: str


def _served(model: str, layout: Iterable[str], gpus: int, unmet: Mapping[str, int]) -> int:
    table = mig_table(model)
    offered: dict[str, int] = {}
    for name in layout:
        offered[name] = offered.get(name, 0) + gpus
    return sum(min(unmet.get(name, 0), count) * table[name].compute_slices for name, count in offered.items())


def advise_change(nodes: Iterable[MigNode], demand: Mapping[str, int]) -> MigChange | None:
    """The one configuration change (or None) that serves most of ``demand`` (waiting MIG pods by
    profile) beyond what free instances cover; one node a round, so each change is seen applied
    (its instances advertised) before the next is weighed."""
    nodes = list(nodes)
    best: MigChange | None = None
    for node in sorted(nodes, key=lambda n: n.name):
        configs = named_configs(node.model)
        if not node.drained or not configs:
            continue
        free_elsewhere: dict[str, int] = {}
        for other in nodes:
            if other.name != node.name:
                for profile, count in other.free.items():
                    free_elsewhere[profile] = free_elsewhere.get(profile, 0) + count
        unmet = {p: n - free_elsewhere.get(p, 0) for p, n in demand.items() if n > free_elsewhere.get(p, 0)}
        if not unmet:
            continue
        current = _served(node.model, configs.get(node.config, ()), node.gpus, unmet)
        name, served = max(((name, _served(node.model, layout, node.gpus, unmet)) for name, layout in configs.items()),
                           key=lambda item: (item[1], item[0] == node.config, -len(item[0])))
        if served > current and (best is None or served > best.served_slices):
            wanted = ", ".join(f"{n} {p}" for p, n in sorted(unmet.items()))
            best = MigChange(node.name, node.config, name, served,
                             f"MIG layout for waiting work ({wanted} beyond free instances): {name} serves "
                             f"{served} of its compute slices on {node.gpus} GPU(s), {node.config or 'no config'} {current}")
    return best
