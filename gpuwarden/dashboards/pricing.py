"""The dashboard's price book and inventory: the files ``GPUWARDEN_PRICE_BOOK`` and
``GPUWARDEN_INVENTORY`` name (the chart mounts its ``pricing`` values there), else the bundled ones
(:mod:`gpuwarden.analytics.pricing_files`, as ``gpuwarden report`` and ``gpuwarden metrics`` read
them). Read again when a file changes; a ledger bundle priced by other files is another bundle."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from gpuwarden.analytics.inventory import Inventory
from gpuwarden.analytics.pricebook import PriceBook
from gpuwarden.analytics.pricing_files import load_pricing, pricing_paths

_loaded: dict[tuple[object, ...], tuple[PriceBook, Inventory]] = {}
_lock = threading.Lock()


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0  # missing: load_pricing says so, naming the file


def dashboard_pricing() -> tuple[PriceBook, Inventory]:
    """The price book and inventory to price with now; PriceBookError / AnalyticsError (UserErrors)
    naming the file for a bad one."""
    files = pricing_paths()
    key = tuple(None if f is None else (str(f[0]), f[1], _mtime(f[0])) for f in files)
    with _lock:
        if key not in _loaded:
            _loaded.clear()
            _loaded[key] = load_pricing()
        return _loaded[key]


def bundle_variant(book: PriceBook, inventory: Inventory) -> str:
    """What sets apart the bundles priced by ``book`` and ``inventory``: nothing for the bundled
    ones (the bundles ``gpuwarden demo`` precomputes), else a hash of both contents."""
    if book.source == "built-in" and inventory.source == "built-in":
        return ""
    return "-pricing-" + hashlib.sha256(f"{book.digest}\n{inventory.digest}".encode()).hexdigest()[:12]
