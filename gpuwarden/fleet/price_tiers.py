"""Which price tier a node is billed at, read from its labels.

``gpuwarden.io/price-tier`` says it outright (``on-demand``, ``reserved``, ``spot``, ``owned``;
``committed`` is read as ``reserved``). Where it is absent, the capacity labels the common clouds
and autoscalers put on nodes are understood:

- ``karpenter.sh/capacity-type``: ``spot``, ``on-demand``, ``reserved``;
- ``eks.amazonaws.com/capacityType`` (EKS managed node groups): ``SPOT``, ``ON_DEMAND``,
  ``CAPACITY_BLOCK`` (a reservation);
- ``cloud.google.com/gke-spot`` / ``cloud.google.com/gke-preemptible``: ``true`` is spot;
- ``kubernetes.azure.com/scalesetpriority``: ``spot``, ``regular`` (on-demand).

``node.kubernetes.io/instance-type`` names the machine, not how it is paid for, so it gives no tier.
A value a label does not allow is a :class:`FleetValueError` naming the label and its allowed values.

kube-state-metrics exposes node labels as ``kube_node_labels`` with each label renamed
(``label_`` plus the name with every character outside ``[a-zA-Z0-9_]`` as ``_``):
:func:`ksm_label_name` gives that spelling and :func:`tier_from_labels` reads either.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .vocabulary import FleetValueError, PriceTier

TIER_LABEL = "gpuwarden.io/price-tier"
TIER_ALIASES = {"committed": PriceTier.RESERVED}  # what GCP calls a committed-use discount

# label -> {value: tier}; None: the value says nothing about the tier (e.g. gke-spot=false).
CLOUD_TIER_LABELS: dict[str, dict[str, PriceTier | None]] = {
    "karpenter.sh/capacity-type": {"spot": PriceTier.SPOT, "on-demand": PriceTier.ON_DEMAND,
                                   "reserved": PriceTier.RESERVED},
    "eks.amazonaws.com/capacityType": {"SPOT": PriceTier.SPOT, "ON_DEMAND": PriceTier.ON_DEMAND,
                                       "CAPACITY_BLOCK": PriceTier.RESERVED},
    "cloud.google.com/gke-spot": {"true": PriceTier.SPOT, "false": None},
    "cloud.google.com/gke-preemptible": {"true": PriceTier.SPOT, "false": None},
    "kubernetes.azure.com/scalesetpriority": {"spot": PriceTier.SPOT, "regular": PriceTier.ON_DEMAND},
}
TIER_LABELS: tuple[str, ...] = (TIER_LABEL, *CLOUD_TIER_LABELS)  # in order of precedence


def allowed_tiers() -> str:
    names = [tier.value for tier in PriceTier] + [f"{alias} (= {tier.value})" for alias, tier in TIER_ALIASES.items()]
    return ", ".join(names)


def parse_tier(value: object, where: str) -> PriceTier:
    """``value`` as a tier (aliases included), or FleetValueError naming ``where`` and the allowed tiers."""
    if isinstance(value, PriceTier):
        return value
    text = str(value).strip()
    if text in TIER_ALIASES:
        return TIER_ALIASES[text]
    try:
        return PriceTier(text)
    except ValueError:
        raise FleetValueError(f"{where}: price tier {value!r} is not one of: {allowed_tiers()}") from None


def ksm_label_name(label: str) -> str:
    """How kube-state-metrics' ``kube_node_labels`` spells a node label."""
    return "label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)


def tier_from_labels(labels: Mapping[str, str], node: str = "") -> tuple[PriceTier, str] | None:
    """The tier a node's labels give, and the label that gave it; None when no label says.
    ``labels`` may be spelt as on the node or as kube-state-metrics spells them."""
    where = f"node {node}: label " if node else "label "
    for label in TIER_LABELS:
        value = labels.get(label, labels.get(ksm_label_name(label)))
        if value is None or value == "":
            continue
        if label == TIER_LABEL:
            try:
                return parse_tier(value, ""), label
            except FleetValueError:
                raise FleetValueError(f"{where}{label}={value!r} is not one of: {allowed_tiers()}") from None
        values = CLOUD_TIER_LABELS[label]
        if value not in values:
            raise FleetValueError(f"{where}{label}={value!r} is not one of: {', '.join(values)}")
        tier = values[value]
        if tier is not None:
            return tier, label
    return None
