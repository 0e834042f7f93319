"""The price book: what a GPU-hour costs, per GPU model and price tier, from a YAML file.

The bundled ``pricebook.yaml`` holds sensible defaults (round public list prices of late 2025 for
the cloud tiers; capex amortised over a lifetime plus power at a kWh price for ``owned``) for the
simulated fleet's models and a few common others. The file's header documents the format.

Costs:

- cloud tiers: ``price[model][tier]`` per GPU-hour, for every hour the GPU is in the fleet,
  allocated or not (the bill does not care);
- owned: ``capex / (lifetime_years * 8760)`` per GPU-hour plus energy, ``watts / 1000 * hours *
  pue * kwh_price`` with the measured board power (``typical_watts`` where a sample has none).

A model name resolves as the GPU catalogue resolves it (``H100``, ``NVIDIA-H100-80GB-HBM3``), and
``tdp_watts`` defaults to the catalogue's; an entry's ``aliases`` are other products billed at its
prices.

Reports name the book they used by :attr:`PriceBook.identity`: its file (or ``built-in``), its
optional ``version:`` and a hash of its content.

A model the book does not know raises :class:`PriceBookError` naming the model (and the tier).

Every figure changes money, so each is checked where the book is read, naming its key: a number
(never a boolean: YAML reads ``yes`` as true), finite, >= 0 and at most a bound no real book
reaches (:data:`MOST`); ``pue`` 1..5. A key the format does not have (at the top, under ``power``,
``owned_defaults``, an entry or its ``owned``), a key given twice in one mapping, two entries that
price the same GPU model, and YAML whose aliases expand past a bound are refused, not read as
something else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterable, Mapping


from gpuwarden.fleet import PriceTier
from gpuwarden.fleet.gpu_catalogue import gpu_catalogue, name_key
from gpuwarden.fleet.inputs import read_yaml_file
from gpuwarden.fleet.price_tiers import TIER_ALIASES

from .params import AnalyticsError
from .yamlfile import content_digest

DEFAULT_PRICE_BOOK_PATH = Path(__file__).with_name("pricebook.yaml")
HOURS_PER_YEAR = 8760.0
HOURS_PER_MONTH = HOURS_PER_YEAR / 12
DEFAULT_TDP_WATTS = 400.0  # a model neither the book nor the GPU catalogue knows
# The most each kind of figure may be, in any currency (a GPU-hour in yen or won is ~10^3-10^4).
MOST = {"price": 1e6, "capex": 1e10, "kwh_price": 1e4, "lifetime_years": 100.0, "watts": 10_000.0}
MAX_PUE = 5.0  # facility power over IT power: 1.1 for the best, ~2.5 for the worst rooms
TOP_KEYS = ("version", "currency", "power", "owned_defaults", "models")


class PriceBookError(AnalyticsError):
    """A price book that cannot price something; the message names the GPU model and tier."""


@dataclass(frozen=True)
class ModelPrices:
    name: str
    hourly: Mapping[str, float]  # cloud tiers: tier value -> price per GPU-hour
    capex: float | None
    lifetime_years: float
    tdp_watts: float
    typical_watts: float
    aliases: tuple[str, ...] = ()

    @property
    def owned_hourly_capex(self) -> float | None:
        return None if self.capex is None else self.capex / (self.lifetime_years * HOURS_PER_YEAR)


@dataclass(frozen=True)
class PriceBook:
    models: Mapping[str, ModelPrices]
    kwh_price: float = 0.12
    pue: float = 1.5
    currency: str = "USD"
    source: str = "built-in"  # the file, or "built-in"
    version: str | None = None  # the book's own ``version:``, where it sets one
    digest: str = ""  # sha256 of the content: the same book in another file reads the same
    _by_alias: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        aliases = {}
        for name, prices in self.models.items():
            for spelling in (name, *prices.aliases):
                aliases[name_key(spelling)] = name
                canonical = gpu_catalogue().resolve(spelling)  # an entry may be keyed by any spelling
                if canonical is not None:
                    aliases.setdefault(name_key(canonical), name)
        object.__setattr__(self, "_by_alias", aliases)

    def _entry(self, name: str) -> str | None:
        """The entry pricing ``name``: by its own spelling, else by the GPU catalogue's name for it."""
        key = self._by_alias.get(name_key(name))
        if key is None:
            canonical = gpu_catalogue().resolve(str(name))
            key = None if canonical is None else self._by_alias.get(name_key(canonical))
        return key

    # -- lookups -----------------------------------------------------------------------------------
    def model(self, name: str) -> ModelPrices:
        key = self._entry(name)
        if key is None:
            known = ", ".join(sorted(self.models))
            raise PriceBookError(f"price book ({self.source}) has no entry for GPU model {name!r}; "
                                 f"add it to the price book (known models: {known})")
        return self.models[key]

    def check(self, models: Iterable[str], tiers: Iterable[tuple[str, str]] = ()) -> None:
        """Fail naming every model (and model/tier pair) the book cannot price."""
        missing = sorted({str(m) for m in models if self._entry(str(m)) is None})
        if missing:
            known = ", ".join(sorted(self.models))
            raise PriceBookError(f"price book ({self.source}) has no entry for GPU model(s) "
                                 f"{', '.join(repr(m) for m in missing)}; add them (known models: {known})")
        for model, tier in tiers:
            self.hourly(model, tier)

    def hourly(self, model: str, tier: PriceTier | str) -> float:
        """Price per GPU-hour without energy: the cloud price, or the amortised capex for owned."""
        prices = self.model(model)
        tier = PriceTier(tier)
        if tier is PriceTier.OWNED:
            if prices.owned_hourly_capex is None:
                raise PriceBookError(f"price book ({self.source}): GPU model {prices.name!r} has no owned capex; "
                                     "add owned: {capex: ...}")
            return prices.owned_hourly_capex
        if tier.value not in prices.hourly:
            raise PriceBookError(f"price book ({self.source}): GPU model {prices.name!r} has no {tier.value!r} price")
        return prices.hourly[tier.value]

    def energy_price_per_kwh(self) -> float:
        """What one kWh of board energy costs at the facility (PUE included)."""
        return self.kwh_price * self.pue

    def owned_hourly(self, model: str, watts: float | None = None) -> float:
        """All-in owned cost of one GPU-hour at ``watts`` (default ``typical_watts``)."""
        prices = self.model(model)
        watts = prices.typical_watts if watts is None else watts
        return self.hourly(model, PriceTier.OWNED) + watts / 1000.0 * self.energy_price_per_kwh()

    @property
    def identity(self) -> str:
        """What every report prints: the source, the book's version and a short content hash."""
        version = f"version {self.version}, " if self.version else ""
        return f"{self.source} ({version}sha256 {self.digest[:12]})" if self.digest else self.source

    def to_dict(self) -> dict:
        return {"source": self.source, "version": self.version, "sha256": self.digest, "currency": self.currency,
                "kwh_price": self.kwh_price, "pue": self.pue, "models": sorted(self.models)}

    # -- constructors ------------------------------------------------------------------------------
    @classmethod
    def default(cls) -> PriceBook:
        return cls.from_yaml(DEFAULT_PRICE_BOOK_PATH, source="built-in")

    @classmethod
    def from_yaml(cls, path: str | Path, source: str | None = None) -> PriceBook:
        """``source``: what reports call the book (default the path)."""
        path = Path(path)
        if not path.exists() and not path.is_symlink():
            raise PriceBookError(f"{path}: price book file not found")
        data = read_yaml_file(path, "the price book file", PriceBookError)
        return cls.from_mapping(data, source or str(path))

    @classmethod
    def from_mapping(cls, data: Mapping, source: str = "price book") -> PriceBook:
        if not isinstance(data, Mapping) or not isinstance(data.get("models"), Mapping):
            raise PriceBookError(f"{source}: expected a mapping with a 'models' mapping")
        _known_keys(data, TOP_KEYS, source)
        power = _section(data, "power", ("kwh_price", "pue"), source)
        kwh_price = _number(power.get("kwh_price", 0.12), f"{source}: power.kwh_price", MOST["kwh_price"])
        pue = _number(power.get("pue", 1.5), f"{source}: power.pue", MAX_PUE)
        if pue < 1.0:
            raise PriceBookError(f"{source}: power.pue {pue} must be >= 1")
        defaults = _section(data, "owned_defaults", ("lifetime_years",), source)
        default_lifetime = _number(defaults.get("lifetime_years", 4), f"{source}: owned_defaults.lifetime_years",
                                   MOST["lifetime_years"])
        tiers = {t.value for t in PriceTier} - {PriceTier.OWNED.value}
        allowed_keys = tiers | set(TIER_ALIASES) | {"owned", "aliases", "tdp_watts", "typical_watts"}
        models = {}
        for name, entry in data["models"].items():
            where = f"{source}: models[{name!r}]"
            if not isinstance(entry, Mapping):
                raise PriceBookError(f"{where}: expected a mapping of tier prices")
            twice = [f"{k} and {TIER_ALIASES[k].value}" for k in entry if k in TIER_ALIASES and TIER_ALIASES[k].value in entry]
            if twice:
                raise PriceBookError(f"{where}: {', '.join(twice)} name the same tier; give one")
            entry = {TIER_ALIASES[k].value if k in TIER_ALIASES else k: v for k, v in entry.items()}  # committed: reserved
            unknown = set(entry) - allowed_keys
            if unknown:
                raise PriceBookError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}; "
                                     f"allowed: {', '.join(sorted(allowed_keys))}")
            hourly = {tier: _number(entry[tier], f"{where}.{tier}", MOST["price"]) for tier in tiers if tier in entry}
            owned = _section(entry, "owned", ("capex", "lifetime_years"), where)
            capex = _number(owned["capex"], f"{where}.owned.capex", MOST["capex"]) if "capex" in owned else None
            lifetime = _number(owned.get("lifetime_years", default_lifetime), f"{where}.owned.lifetime_years",
                               MOST["lifetime_years"])
            if lifetime <= 0:
                raise PriceBookError(f"{where}.owned.lifetime_years: {lifetime} must be > 0")
            hardware = gpu_catalogue().get(str(name))
            default_tdp = hardware.tdp_watts if hardware is not None else DEFAULT_TDP_WATTS
            tdp = _number(entry.get("tdp_watts", default_tdp), f"{where}.tdp_watts", MOST["watts"])
            typical = _number(entry.get("typical_watts", 0.6 * tdp), f"{where}.typical_watts", MOST["watts"])
            aliases = entry.get("aliases") or ()
            if not isinstance(aliases, (list, tuple)) or not all(isinstance(a, (str, int, float)) for a in aliases):
                raise PriceBookError(f"{where}.aliases: expected a list of GPU model names")
            models[str(name)] = ModelPrices(str(name), hourly, capex, lifetime, tdp, typical,
                                            tuple(str(a) for a in aliases))
        _one_entry_per_model(models, source)
        version = data.get("version")
        return cls(models, kwh_price, pue, str(data.get("currency", "USD")), source,
                   None if version is None else str(version), content_digest(data))


def _known_keys(mapping: Mapping, allowed: Iterable[str], where: str) -> None:
    unknown = [key for key in mapping if key not in allowed]
    if unknown:
        raise PriceBookError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(allowed)}")


def _section(data: Mapping, key: str, allowed: tuple[str, ...], where: str) -> Mapping:
    """``data[key]``, a mapping of only ``allowed`` keys ({} when absent or empty)."""
    section = data.get(key) or {}
    if not isinstance(section, Mapping):
        raise PriceBookError(f"{where}: {key}: expected a mapping of {', '.join(allowed)}")
    _known_keys(section, allowed, f"{where}: {key}")
    return section


def _one_entry_per_model(models: Mapping[str, ModelPrices], source: str) -> None:
    """Two entries (or an entry's alias) that name one GPU model: which prices it would be billed at
    depended on their order."""
    owner: dict[str, str] = {}
    for name, prices in models.items():
        for spelling in (name, *prices.aliases):
            canonical = gpu_catalogue().resolve(spelling)
            for key in {name_key(spelling), *([] if canonical is None else [f"catalogue:{name_key(canonical)}"])}:
                other = owner.setdefault(key, name)
                if other != name:
                    first, second = sorted((other, name))
                    model = canonical or spelling
                    raise PriceBookError(f"{source}: models {first!r} and {second!r} price the same GPU model "
                                         f"({model!r}); give it one entry (aliases: other products at its prices)")


def _number(value: object, where: str, most: float) -> float:
    """``value`` as a finite number in 0..``most``, or PriceBookError naming ``where``."""
    if isinstance(value, bool):
        raise PriceBookError(f"{where}: {value!r} is a boolean, not a number")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise PriceBookError(f"{where}: {value!r} is not a number") from None
    if not math.isfinite(number):
        raise PriceBookError(f"{where}: {value!r} is not a finite number")
    if number < 0:
        raise PriceBookError(f"{where}: {number} is negative; expected a number >= 0")
    if number > most:
        raise PriceBookError(f"{where}: {number:g} is more than {most:g}; is it in the right unit?")
    return number
