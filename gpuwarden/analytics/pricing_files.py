"""Which price book and inventory a report, the metrics endpoint or the dashboard uses: the file
given on the command line, else the one the environment names (the chart mounts its ``pricing``
values as files and sets these for the dashboard), else the bundled one.

- ``GPUWARDEN_PRICE_BOOK``: a price book YAML (``pricebook.yaml``'s format);
- ``GPUWARDEN_INVENTORY``: an inventory YAML (``inventory.yaml``'s format);
- ``GPUWARDEN_PRICING_SOURCE``: what reports call files taken from those two (the chart sets
  ``ConfigMap <namespace>/<name>``), printed before the path.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from .inventory import Inventory
from .pricebook import PriceBook

PRICE_BOOK_ENV = "GPUWARDEN_PRICE_BOOK"
INVENTORY_ENV = "GPUWARDEN_INVENTORY"
PRICING_SOURCE_ENV = "GPUWARDEN_PRICING_SOURCE"


def pricing_paths(price_book: str | Path | None = None, inventory: str | Path | None = None,
                  environ: Mapping[str, str] | None = None) -> tuple[tuple[Path, str] | None, tuple[Path, str] | None]:
    """Each file to read and the name reports give it; None for the bundled one."""
    env = os.environ if environ is None else environ
    origin = env.get(PRICING_SOURCE_ENV, "").strip()

    def pick(given: str | Path | None, variable: str) -> tuple[Path, str] | None:
        if given:
            return Path(given), str(given)
        path = env.get(variable, "").strip()
        if not path:
            return None
        return Path(path), f"{origin} ({path})" if origin else path

    return pick(price_book, PRICE_BOOK_ENV), pick(inventory, INVENTORY_ENV)


def load_pricing(price_book: str | Path | None = None, inventory: str | Path | None = None,
                 environ: Mapping[str, str] | None = None) -> tuple[PriceBook, Inventory]:
    """The price book and inventory to use (see the module doc); PriceBookError / AnalyticsError
    naming the file for a bad one."""
    book_file, inventory_file = pricing_paths(price_book, inventory, environ)
    book = PriceBook.from_yaml(*book_file) if book_file else PriceBook.default()
    places = Inventory.from_yaml(*inventory_file) if inventory_file else Inventory.default()
    return book, places
