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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterable, Mapping


from gpuwarden.fleet import PriceTier
from gpuwarden.fleet.gpu_catalogue import gpu_catalogue, name_key
from gpuwarden.fleet.price_tiers import TIER_ALIASES

from .params import AnalyticsError
from .yamlfile import content_digest, read_yaml

DEFAULT_PRICE_BOOK_PATH = Path(__file__).with_name("pricebook.yaml")
HOURS_PER_YEAR = 8760.0
HOURS_PER_MONTH = HOURS_PER_YEAR / 12
DEFAULT_TDP_WATTS = 400.0  # a model neither the book nor the GPU catalogue knows


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
        data = read_yaml(path, "price book", PriceBookError)
        return cls.from_mapping(data, source or str(path))

    @classmethod
    def from_mapping(cls, data: Mapping, source: str = "price book") -> PriceBook:
        if not isinstance(data, Mapping) or not isinstance(data.get("models"), Mapping):
            raise PriceBookError(f"{source}: expected a mapping with a 'models' mapping")
        power = data.get("power") or {}
        kwh_price = _number(power.get("kwh_price", 0.12), f"{source}: power.kwh_price")
        pue = _number(power.get("pue", 1.5), f"{source}: power.pue")
        if pue < 1.0:
            raise PriceBookError(f"{source}: power.pue {pue} must be >= 1")
        default_lifetime = _number((data.get("owned_defaults") or {}).get("lifetime_years", 4), f"{source}: owned_defaults.lifetime_years")
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
            hourly = {tier: _number(entry[tier], f"{where}.{tier}") for tier in tiers if tier in entry}
            owned = entry.get("owned") or {}
            capex = _number(owned["capex"], f"{where}.owned.capex") if "capex" in owned else None
            lifetime = _number(owned.get("lifetime_years", default_lifetime), f"{where}.owned.lifetime_years")
            if lifetime <= 0:
                raise PriceBookError(f"{where}.owned.lifetime_years: {lifetime} must be > 0")
            hardware = gpu_catalogue().get(str(name))
            default_tdp = hardware.tdp_watts if hardware is not None else DEFAULT_TDP_WATTS
            tdp = _number(entry.get("tdp_watts", default_tdp), f"{where}.tdp_watts")
            typical = _number(entry.get("typical_watts", 0.6 * tdp), f"{where}.typical_watts")
            models[str(name)] = ModelPrices(str(name), hourly, capex, lifetime, tdp, typical,
                                            tuple(str(a) for a in entry.get("aliases") or ()))
        version = data.get("version")
        return cls(models, kwh_price, pue, str(data.get("currency", "USD")), source,
                   None if version is None else str(version), content_digest(data))


def _number(value, where: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise PriceBookError(f"{where}: {value!r} is not a number") from None
    if number < 0:
        raise PriceBookError(f"{where}: {number} is negative; expected a number >= 0")
    return number
