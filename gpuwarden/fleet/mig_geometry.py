"""MIG geometry over the GPU catalogue's profiles: which profiles a model offers, how many compute
slices a GPU splits into, and whether one more instance fits beside others. Facts about hardware
read by the Kubernetes adapter (a node's MIG devices), the portal (a request's profile) and the
engine (placement, layout advice in :mod:`gpuwarden.scheduling.mig`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .gpu_catalogue import MigProfileSpec, gpu_catalogue
from .vocabulary import FleetValueError


class UnknownMigProfile(FleetValueError):
    """A MIG profile no catalogue model offers (or the model named does not)."""


# Views of the catalogue for callers that index by name: model -> its profiles (MIG models only),
# and every alias -> the catalogue's name.
MIG_TABLES: dict[str, Mapping[str, MigProfileSpec]] = {
    name: spec.mig_profiles for name, spec in gpu_catalogue().models.items() if spec.mig_profiles}
MODEL_ALIASES: dict[str, str] = {alias: spec.name for spec in gpu_catalogue().models.values() for alias in spec.aliases}


def mig_table(model: str) -> Mapping[str, MigProfileSpec]:
    """The MIG profiles ``model`` (a name or an alias) offers; {} for a model without MIG."""
    return gpu_catalogue().mig_profiles(model)


def compute_slices(model: str | None) -> int:
    """Compute slices a GPU of ``model`` splits into (the catalogue's largest split when unknown)."""
    return gpu_catalogue().compute_slices(model)


def fraction_slices(fraction_ratio: float, model: str | None) -> int:
    """Compute slices that hold ``fraction_ratio`` of a GPU of ``model`` (rounded, at least one)."""
    return max(1, round(fraction_ratio * compute_slices(model)))


def mig_spec(model: str, profile: str) -> MigProfileSpec:
    table = mig_table(model)
    if profile not in table:
        allowed = ", ".join(table) or "none (this model has no MIG)"
        raise UnknownMigProfile(f"MIG profile {profile!r} is not offered by {model}; allowed: {allowed}")
    return table[profile]


def known_profile(profile: str) -> bool:
    return any(profile in table for table in MIG_TABLES.values())


def check_profile(profile: str) -> None:
    if not known_profile(profile):
        allowed = gpu_catalogue().profile_names()
        raise UnknownMigProfile(f"unknown MIG profile {profile!r}; known profiles: {', '.join(allowed)}")


def fits(model: str, used: Sequence[str], profile: str) -> bool:
    """Whether one more ``profile`` instance fits on a GPU already holding ``used`` instances."""
    gpu = gpu_catalogue().get(model)
    return gpu is not None and gpu.fits_mig(used, profile)
