"""Teams and their quotas, read from namespaces (docs/scheduling-live.md, "Set up teams").

- A namespace labelled ``gpuwarden.io/queue=<team>`` is in the queue: gpuwarden schedules its GPU
  pods. The label's value names the team; several namespaces with one value are one team (their
  work counts against one quota).
- The team's quota is given by annotations on any of its namespaces, in GPUs (whole-GPU
  equivalents: a MIG slice counts its share of its GPU, a time-sliced replica 1/replicas):
  ``gpuwarden.io/guaranteed-gpus`` (default 0) is what the team always gets back within the
  scheduling interval and what nobody's borrowing can take; ``gpuwarden.io/burst-gpus`` is the
  team's total cap, guarantee included (default: no cap; idle GPUs of other teams are lent);
  ``gpuwarden.io/weight`` its fair-share weight (default 1; a wrong one is logged and read as 1: it
  only orders the queue). Two namespaces of one team that give different values for one annotation
  are an error, as is a guarantee or burst that is not a plain number, is negative or not finite, or
  a burst below the guarantee: the team is refused (:class:`TeamQuotas`
  ``refused``), its waiting work held with the reason naming the namespace and the annotation, its
  running work left alone, and the rest of the cluster scheduled.
- Namespaces outside the queue are no team: their pods hold capacity and are never touched.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuwarden.fleet import NO_CAP_GPUS, Team

from .gates import QUEUE_LABEL, in_queue

log = logging.getLogger("gpuwarden.kube")

TEAM_LABEL = "gpuwarden.io/team"  # read by reports (chargeback) for namespaces outside the queue too
GUARANTEE_ANNOTATION = "gpuwarden.io/guaranteed-gpus"
BURST_ANNOTATION = "gpuwarden.io/burst-gpus"
WEIGHT_ANNOTATION = "gpuwarden.io/weight"
QUOTA_ANNOTATIONS = (GUARANTEE_ANNOTATION, BURST_ANNOTATION, WEIGHT_ANNOTATION)
MAX_QUOTA_GPUS = 1e6  # larger is a typo, not a fleet


@dataclass
class TeamQuotas:
    """What the namespaces say: the queue, each namespace's team, each team's quota, and refusals."""

    queue_namespaces: set[str] = field(default_factory=set)
    team_of: dict[str, str] = field(default_factory=dict)  # every namespace -> its team (reports read it)
    teams: dict[str, Team] = field(default_factory=dict)  # the queue's teams
    refused: dict[str, str] = field(default_factory=dict)  # team -> why its quota cannot be read
    refused_at: dict[str, str] = field(default_factory=dict)  # team -> the namespace whose annotation is wrong
    # annotation -> (namespace, value) per team, as read
    _given: dict[str, dict[str, tuple[str, str]]] = field(default_factory=dict)

    def add_namespace(self, name: str, labels: Mapping[str, str], annotations: Mapping[str, str]) -> None:
        team = labels.get(QUEUE_LABEL) or labels.get(TEAM_LABEL) or name
        self.team_of[name] = team
        if not in_queue(labels):
            return
        self.queue_namespaces.add(name)
        given = self._given.setdefault(team, {})
        for annotation in QUOTA_ANNOTATIONS:
            if annotation not in annotations:
                continue
            value = str(annotations[annotation])
            earlier = given.get(annotation)
            if earlier is not None and _number_or_text(earlier[1]) != _number_or_text(value):
                self._refuse(team, name, f"namespaces {earlier[0]} and {name} of team {team} give different "
                                         f"{annotation} ({earlier[1]!r}, {value!r}); set it on one of them")
                continue
            given[annotation] = (name, value)

    def _refuse(self, team: str, namespace: str, why: str) -> None:
        if team not in self.refused:
            self.refused[team], self.refused_at[team] = why, namespace

    def finish(self) -> TeamQuotas:
        """Each queue team's ``Team``, or its refusal."""
        for team in sorted({self.team_of[ns] for ns in self.queue_namespaces}):
            if team in self.refused:
                continue
            given = self._given.get(team, {})
            try:
                guaranteed = _gpus(given.get(GUARANTEE_ANNOTATION), GUARANTEE_ANNOTATION, 0.0)
                burst = _gpus(given.get(BURST_ANNOTATION), BURST_ANNOTATION, NO_CAP_GPUS)
                if burst < guaranteed:
                    namespace = given[BURST_ANNOTATION][0]
                    raise _Refusal(namespace, f"namespace {namespace}: {BURST_ANNOTATION}={burst:g} is below "
                                              f"{GUARANTEE_ANNOTATION}={guaranteed:g} (the burst is the team's total cap, "
                                              "guarantee included)")
            except _Refusal as refusal:
                self._refuse(team, refusal.namespace, refusal.why)
                continue
            self.teams[team] = Team(team, guaranteed, burst, weight=_weight(given.get(WEIGHT_ANNOTATION)))
        return self


class _Refusal(Exception):
    def __init__(self, namespace: str, why: str) -> None:
        super().__init__(why)
        self.namespace, self.why = namespace, why


def _number_or_text(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def _weight(given: tuple[str, str] | None) -> float:
    """The fair-share weight, a number > 0; a wrong one only orders the queue, so it is said and read as 1
    rather than holding the team's work."""
    if given is None:
        return 1.0
    namespace, text = given
    try:
        weight = float(text)
    except ValueError:
        weight = math.nan
    if math.isfinite(weight) and 0 < weight <= MAX_QUOTA_GPUS:
        return weight
    log.warning("namespace %s: %s=%r is not a number > 0; weight 1 used", namespace, WEIGHT_ANNOTATION, text)
    return 1.0


def _gpus(given: tuple[str, str] | None, annotation: str, default: float) -> float:
    """An annotation's value as a plain non-negative number (``"8"``, ``"2.5"``); _Refusal naming the
    namespace, the annotation and the value otherwise (a quantity such as ``"8Gi"``, ``"true"``, ``"-1"``,
    ``"nan"``)."""
    if given is None:
        return default
    namespace, text = given
    try:
        value = float(text.strip())
    except ValueError:
        raise _Refusal(namespace, f"namespace {namespace}: {annotation}={text!r} is not a number of GPUs") from None
    if not math.isfinite(value) or value < 0 or value > MAX_QUOTA_GPUS:
        raise _Refusal(namespace, f"namespace {namespace}: {annotation}={text!r} must be a number of GPUs from 0 to "
                                  f"{MAX_QUOTA_GPUS:g}")
    return value
