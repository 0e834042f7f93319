"""Guarantees and burst limits per (team, flavour): unused guarantee is lent, borrowers are reclaimed."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol
from collections.abc import Iterable

from .errors import QuotaError

ANY_FLAVOUR = "*"


class QuotaRequest(Protocol):
    """What admission reads of a job (``state.Job`` has it). A protocol, not an import of ``state``:
    ``state`` keeps the quotas, so importing it back would make an import circle."""

    @property
    def team(self) -> str: ...
    @property
    def flavour(self) -> str: ...
    @property
    def gpu_equivalents(self) -> float: ...


class Admission(StrEnum):
    """What the quota says about starting a job now."""

    NOMINAL = "nominal"  # within the team's guarantee
    BORROW = "borrow"  # above the guarantee, within the burst limit: runs on lent capacity
    NO = "no"  # over the burst limit


@dataclass(frozen=True)
class QuotaSpec:
    team: str
    guaranteed: float
    burst: float
    flavour: str = ANY_FLAVOUR
    weight: float = 1.0

    def __post_init__(self) -> None:
        if self.guaranteed < 0 or self.burst < 0:
            raise QuotaError(f"team {self.team!r}: negative quota (guaranteed {self.guaranteed}, burst {self.burst})")
        if self.burst < self.guaranteed:
            raise QuotaError(f"team {self.team!r}: burst {self.burst} is below the guarantee {self.guaranteed}")
        if self.weight <= 0:
            raise QuotaError(f"team {self.team!r}: weight {self.weight} must be > 0")


class Quotas:
    """Guarantees and burst limits per (team, flavour). Unused guarantee is lent; borrowers are reclaimed."""

    def __init__(self, specs: Iterable[QuotaSpec] = ()) -> None:
        self.specs: dict[tuple[str, str], QuotaSpec] = {}
        for spec in specs:
            self.specs[(spec.team, spec.flavour)] = spec
        self.usage: dict[tuple[str, str], float] = {}

    def spec(self, team: str, flavour: str) -> QuotaSpec | None:
        return self.specs.get((team, flavour)) or self.specs.get((team, ANY_FLAVOUR))

    def flavour_of(self, team: str, flavour: str) -> str:
        return flavour if (team, flavour) in self.specs else ANY_FLAVOUR

    def used(self, team: str, flavour: str) -> float:
        return self.usage.get((team, self.flavour_of(team, flavour)), 0.0)

    def add(self, team: str, flavour: str, amount: float) -> None:
        key = (team, self.flavour_of(team, flavour))
        self.usage[key] = self.usage.get(key, 0.0) + amount

    def lendable(self, flavour: str, exclude_team: str) -> float:
        """Unused guarantee of the other teams in this flavour."""
        total = 0.0
        for (team, flv), spec in self.specs.items():
            if team != exclude_team and flv == self.flavour_of(team, flavour):
                total += max(0.0, spec.guaranteed - self.usage.get((team, flv), 0.0))
        return total

    def borrowed(self, team: str, flavour: str) -> float:
        spec = self.spec(team, flavour)
        return max(0.0, self.used(team, flavour) - (spec.guaranteed if spec else 0.0))

    def within_guarantee(self, job: QuotaRequest) -> bool:
        """Whether starting ``job`` keeps its team within its guarantee."""
        spec = self.spec(job.team, job.flavour)
        return spec is not None and self.used(job.team, job.flavour) + job.gpu_equivalents <= spec.guaranteed + 1e-9

    def admit(self, job: QuotaRequest) -> tuple[Admission, str]:
        """(admission, reason). A team without a quota only ever borrows."""
        spec = self.spec(job.team, job.flavour)
        if spec is None:
            return Admission.BORROW, ""
        after = self.used(job.team, job.flavour) + job.gpu_equivalents
        if after <= spec.guaranteed + 1e-9:
            return Admission.NOMINAL, ""
        if after > spec.burst + 1e-9:
            return Admission.NO, f"quota: team {job.team} would use {after:g} GPUs, over its burst limit {spec.burst:g}"
        return Admission.BORROW, ""
