"""The GPU catalogue: what each GPU model is, as data every room reads.

``gpu_models.csv`` (memory, TDP, clocks, GPM, MIG slices, NVLink, aliases) and
``gpu_mig_profiles.csv`` (NVIDIA's MIG profiles per model) sit beside this module; their header
comments document the columns. :func:`load_gpu_catalogue` parses and checks both, naming the file
and line of the first broken row; :func:`gpu_catalogue` is the one every room reads, loaded once:
the bundled files, or the two files of the folder ``$GPUWARDEN_GPU_CATALOGUE`` names (a GPU model
the bundle lacks is then one row there; its prices there seed the simulator only, while reports
bill from the analytics price book, whose cloud prices a test keeps equal to these).

Names resolve through :meth:`GpuCatalogue.resolve`: the NVML name, an alias, or GPU feature
discovery's label form, ignoring case and treating runs of spaces, ``-`` and ``_`` alike. Standard
library only: the exporter imports :mod:`gpuwarden.fleet` and carries no numpy.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .errors import UserError
from .catalogue import CatalogueError, data_rows

MODELS_PATH = Path(__file__).with_name("gpu_models.csv")
MIG_PROFILES_PATH = Path(__file__).with_name("gpu_mig_profiles.csv")
CATALOGUE_ENV = "GPUWARDEN_GPU_CATALOGUE"  # a folder holding its own gpu_models.csv and gpu_mig_profiles.csv
GIB = 1024**3

# Price columns, in the order of the price tiers' values (gpuwarden.fleet.PriceTier): on-demand,
# reserved, spot, owned. Tier values, not PriceTier: vocabulary imports this module.
PRICE_TIERS = ("on-demand", "reserved", "spot", "owned")
_PRICE_COLUMNS = tuple(f"price_{tier.replace('-', '_')}" for tier in PRICE_TIERS)
_MODEL_COLUMNS = ("model", "memory_gib", "tdp_watts", "max_sm_clock_mhz", "gpm_supported", "mig_compute_slices",
                  "mig_memory_slices", "nvlink_links", "nvlink_gbytes_per_second", "aliases", *_PRICE_COLUMNS)
_PROFILE_COLUMNS = ("models", "profile", "compute_slices", "memory_slices", "memory_gib", "max_instances",
                    "placements")
_PROFILE_NAME = re.compile(r"^(\d+)g\.(\d+)gb$")
_SEPARATORS = re.compile(r"[\s_-]+")
# GPU feature discovery's nvidia.com/gpu.product suffixes: time-slicing and the mixed MIG strategy.
_LABEL_SUFFIX = re.compile(r"(?: shared| mig .*)$")


class GpuCatalogueError(UserError, ValueError):
    """A GPU model the catalogue does not know; the message names it and the known models."""


@dataclass(frozen=True)
class MigProfileSpec:
    """One MIG GPU-instance profile of one model."""

    name: str
    compute_slices: int
    memory_slices: int
    memory_bytes: int
    max_instances: int
    placements: tuple[int, ...]  # memory slices an instance may start at


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model."""

    name: str
    memory_bytes: int
    tdp_watts: float
    max_sm_clock_mhz: int
    gpm_supported: bool
    mig_compute_slices: int  # 0: no MIG
    mig_memory_slices: int
    nvlink_links: int
    nvlink_gbytes_per_second: float
    aliases: tuple[str, ...] = ()
    mig_profiles: Mapping[str, MigProfileSpec] = field(default_factory=dict)  # NVIDIA's order
    # (tier value, price per GPU-hour) for every tier of PRICE_TIERS, or () for a model not priced
    price_per_hour: tuple[tuple[str, float], ...] = ()

    def fits_mig(self, used: Sequence[str], profile: str) -> bool:
        """Whether one more ``profile`` instance fits on a GPU of this model already holding ``used``
        instances: compute and memory slices, and the profile's most instances per GPU."""
        if profile not in self.mig_profiles:
            return False
        specs = [self.mig_profiles[name] for name in used] + [self.mig_profiles[profile]]
        if (sum(s.compute_slices for s in specs) > self.mig_compute_slices
                or sum(s.memory_slices for s in specs) > self.mig_memory_slices):
            return False
        return sum(1 for s in specs if s.name == profile) <= self.mig_profiles[profile].max_instances

    def smallest_profile(self, compute_slices: int) -> MigProfileSpec | None:
        """The smallest-memory MIG profile of ``compute_slices`` compute slices (NVIDIA's order breaks
        ties); None when the model offers none of that size."""
        sized = [p for p in self.mig_profiles.values() if p.compute_slices == compute_slices]
        return min(sized, key=lambda p: p.memory_slices) if sized else None


def name_key(name: str) -> str:
    """The form names are compared in: case folded, runs of spaces, ``-`` and ``_`` as one space."""
    return _SEPARATORS.sub(" ", str(name).strip().casefold())


class GpuCatalogue:
    """GPU models by name, with alias resolution."""

    def __init__(self, models: Sequence[GpuSpec], source: str = "built-in") -> None:
        self.models: dict[str, GpuSpec] = {m.name: m for m in models}
        self.source = source
        self._keys: dict[str, str] = {}
        self._resolved: dict[str, str | None] = {}
        for model in models:  # the loader made sure no spelling names two models
            self._keys.update((name_key(spelling), model.name) for spelling in (model.name, *model.aliases))
        # A model the catalogue does not know splits as the largest MIG GPU it knows (7 today).
        self.max_compute_slices = max((m.mig_compute_slices for m in models), default=0)

    def resolve(self, name: str | None) -> str | None:
        """The catalogue's name for ``name`` (an NVML name, an alias, a GPU feature discovery
        label), or None when the catalogue does not know it."""
        if name is None:
            return None
        if name not in self._resolved:  # rows repeat a few names many times
            key = name_key(name)
            self._resolved[name] = self._keys.get(key) or self._keys.get(_LABEL_SUFFIX.sub("", key))
        return self._resolved[name]

    def get(self, name: str | None) -> GpuSpec | None:
        resolved = self.resolve(name)
        return None if resolved is None else self.models[resolved]

    def model(self, name: str) -> GpuSpec:
        """The model ``name`` resolves to; an error naming it and the known models otherwise."""
        spec = self.get(name)
        if spec is None:
            raise GpuCatalogueError(f"GPU model {name!r} is not in the GPU catalogue ({self.source}); "
                                    f"known models: {', '.join(sorted(self.models))}")
        return spec

    def mig_profiles(self, name: str | None) -> Mapping[str, MigProfileSpec]:
        """The MIG profiles ``name`` offers ({} for a model without MIG or not in the catalogue)."""
        spec = self.get(name)
        return spec.mig_profiles if spec is not None else {}

    def compute_slices(self, name: str | None) -> int:
        """Compute slices a GPU of ``name`` splits into under MIG; a model the catalogue does not
        know, or one without MIG, counts as the largest split the catalogue knows."""
        spec = self.get(name)
        return spec.mig_compute_slices if spec is not None and spec.mig_compute_slices else self.max_compute_slices

    def profile_names(self) -> list[str]:
        """Every MIG profile name any model offers, sorted."""
        return sorted({p for m in self.models.values() for p in m.mig_profiles})


# The most a column may hold (default ``_MOST_DEFAULT``): a price per GPU-hour in any currency, a
# board's watts; past these the value is a typo or another unit, never a GPU.
_MOST = {"tdp_watts": 10_000.0, "memory_gib": 10_000.0, "max_sm_clock_mhz": 10_000.0, "nvlink_links": 1_000.0,
         "mig_compute_slices": 64.0, "mig_memory_slices": 64.0, "compute_slices": 64.0, "memory_slices": 64.0,
         "max_instances": 64.0, **{column: 1e6 for column in _PRICE_COLUMNS}}
_MOST_DEFAULT = 1e6


def _number(row: Mapping[str, str], column: str, kind: type[int] | type[float] = float, low: float = 0.0) -> float:
    text = row[column]
    try:
        value = float(kind(text))
    except (ValueError, OverflowError):
        raise ValueError(f"{column} {text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if not math.isfinite(value):  # float("nan") and "inf" parse: a NaN price would be summed into costs
        raise ValueError(f"{column} {text!r} is not a finite number")
    if value < low:
        raise ValueError(f"{column} {value} must be >= {low:g}")
    most = _MOST.get(column, _MOST_DEFAULT)
    if value > most:
        raise ValueError(f"{column} {text!r} is more than {most:g}")
    return value


def _model(row: Mapping[str, str]) -> GpuSpec:
    if not row["model"]:
        raise ValueError("model is empty")
    if row["gpm_supported"] not in ("true", "false"):
        raise ValueError(f"gpm_supported must be true or false, not {row['gpm_supported']!r}")
    compute, memory = int(_number(row, "mig_compute_slices", int)), int(_number(row, "mig_memory_slices", int))
    if (compute == 0) != (memory == 0):
        raise ValueError("mig_compute_slices and mig_memory_slices are both 0 (no MIG) or both > 0")
    return GpuSpec(
        name=row["model"], memory_bytes=int(_number(row, "memory_gib", low=1) * GIB),
        tdp_watts=_number(row, "tdp_watts", low=1), max_sm_clock_mhz=int(_number(row, "max_sm_clock_mhz", int, 1)),
        gpm_supported=row["gpm_supported"] == "true", mig_compute_slices=compute, mig_memory_slices=memory,
        nvlink_links=int(_number(row, "nvlink_links", int)),
        nvlink_gbytes_per_second=_number(row, "nvlink_gbytes_per_second"),
        aliases=tuple(a.strip() for a in row["aliases"].split("|") if a.strip()),
        price_per_hour=_prices(row),
    )


def _prices(row: Mapping[str, str]) -> tuple[tuple[str, float], ...]:
    """Every tier's price, or none (all price columns empty)."""
    given = [column for column in _PRICE_COLUMNS if row[column]]
    if not given:
        return ()
    if len(given) != len(_PRICE_COLUMNS):
        missing = [column for column in _PRICE_COLUMNS if column not in given]
        raise ValueError(f"{', '.join(missing)} empty: give every price column ({', '.join(_PRICE_COLUMNS)}) or none")
    return tuple((tier, _number(row, column)) for tier, column in zip(PRICE_TIERS, _PRICE_COLUMNS))


def _profile(row: Mapping[str, str], model: GpuSpec) -> MigProfileSpec:
    name = row["profile"]
    match = _PROFILE_NAME.match(name)
    compute = int(_number(row, "compute_slices", int, 1))
    memory = int(_number(row, "memory_slices", int, 1))
    if not match or int(match.group(1)) != compute:
        raise ValueError(f"profile {name!r} must be named <compute slices>g.<memory>gb, {compute}g. first")
    if not model.mig_compute_slices:
        raise ValueError(f"{model.name} has no MIG (mig_compute_slices 0)")
    if compute > model.mig_compute_slices or memory > model.mig_memory_slices:
        raise ValueError(f"profile {name} takes {compute}/{memory} slices; {model.name} has "
                         f"{model.mig_compute_slices} compute and {model.mig_memory_slices} memory slices")
    memory_bytes = int(_number(row, "memory_gib", low=1) * GIB)
    if memory_bytes > model.memory_bytes:
        raise ValueError(f"profile {name} has more memory than {model.name}")
    try:
        placements = tuple(int(p) for p in row["placements"].split())
    except ValueError:
        raise ValueError(f"placements {row['placements']!r} must be space-separated integers") from None
    max_instances = int(_number(row, "max_instances", int, 1))
    if len(placements) < max_instances or any(p < 0 or p + memory > model.mig_memory_slices for p in placements):
        raise ValueError(f"placements {row['placements']!r}: need at least max_instances ({max_instances}) starts, "
                         f"each + {memory} memory slices within {model.mig_memory_slices}")
    return MigProfileSpec(name, compute, memory, memory_bytes, max_instances, placements)


def load_gpu_catalogue(models_path: str | Path = MODELS_PATH,
                       profiles_path: str | Path = MIG_PROFILES_PATH) -> GpuCatalogue:
    """Read and check the two catalogue files; :class:`CatalogueError` names the file and line."""
    models_path, profiles_path = Path(models_path), Path(profiles_path)
    models: dict[str, GpuSpec] = {}
    spellings: dict[str, str] = {}
    for lineno, row in data_rows(models_path, _MODEL_COLUMNS):
        try:
            spec = _model(row)
            for spelling in (spec.name, *spec.aliases):
                other = spellings.setdefault(name_key(spelling), spec.name)
                if other != spec.name or (spelling == spec.name and spec.name in models):
                    raise ValueError(f"{spelling!r} names both {other!r} and {spec.name!r}")
        except ValueError as exc:
            raise CatalogueError(f"{models_path}:{lineno}: {exc}") from None
        models[spec.name] = spec
    profiles: dict[str, dict[str, MigProfileSpec]] = {name: {} for name in models}
    for lineno, row in data_rows(profiles_path, _PROFILE_COLUMNS):
        try:
            for name in (n.strip() for n in row["models"].split("|")):
                if name not in models:
                    raise ValueError(f"model {name!r} is not in {models_path.name}")
                profile = _profile(row, models[name])
                if profile.name in profiles[name]:
                    raise ValueError(f"duplicate profile {profile.name} for {name}")
                profiles[name][profile.name] = profile
        except ValueError as exc:
            raise CatalogueError(f"{profiles_path}:{lineno}: {exc}") from None
    specs = []
    for name, spec in models.items():
        full = [p for p in profiles[name].values() if p.compute_slices == spec.mig_compute_slices]
        if spec.mig_compute_slices and not full:
            raise CatalogueError(f"{profiles_path}: {name} has MIG but no profile taking all "
                                 f"{spec.mig_compute_slices} compute slices")
        specs.append(GpuSpec(**{**spec.__dict__, "mig_profiles": profiles[name]}))
    return GpuCatalogue(specs, source=f"{models_path.name}, {profiles_path.name}")


@functools.cache
def gpu_catalogue() -> GpuCatalogue:
    """The catalogue (loaded on first use): the bundled files, or those of ``$GPUWARDEN_GPU_CATALOGUE``."""
    folder = os.environ.get(CATALOGUE_ENV, "").strip()
    if not folder:
        return load_gpu_catalogue()
    return load_gpu_catalogue(Path(folder) / MODELS_PATH.name, Path(folder) / MIG_PROFILES_PATH.name)
