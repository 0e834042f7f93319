"""The one duration parser: Prometheus-style durations such as ``90s``, ``15m``, ``6h``, ``7d``,
``1w`` or ``1h30m``, for the CLI's windows and the Prometheus client alike.

A duration is one or more ``<number><unit>`` parts, units from the largest to the smallest, each
at most once (Prometheus' own rule); numbers may carry a fraction (``1.5h``), which Prometheus
itself does not accept but people type. Standard library only.
"""

from __future__ import annotations

import re

from .errors import UserError

UNIT_SECONDS: dict[str, float] = {
    "y": 365 * 86400.0, "w": 7 * 86400.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001,
}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|[ywdhms])")
_EXAMPLES = "e.g. 90s, 15m, 6h, 7d, 1w, 1h30m"


class DurationError(UserError, ValueError):
    """Text that is not a duration; the message names it and the units allowed."""


def parse_duration_seconds(text: str) -> float:
    """Seconds in a duration (rules in the module doc); :class:`DurationError` otherwise."""
    value = str(text).strip()
    units = ", ".join(UNIT_SECONDS)
    parts = list(_PART.finditer(value))
    if not parts or "".join(p.group(0) for p in parts) != value:
        raise DurationError(f"{text!r} is not a duration; expected a number and a unit, one of {units} ({_EXAMPLES})")
    order = [list(UNIT_SECONDS).index(p.group(2)) for p in parts]
    if any(later <= earlier for earlier, later in zip(order, order[1:])):
        raise DurationError(f"{text!r} is not a duration: its units must go from the largest to the smallest, "
                            f"each once, in the order {units} ({_EXAMPLES})")
    return sum(float(p.group(1)) * UNIT_SECONDS[p.group(2)] for p in parts)
