"""How numbers read on every page: %, currency, GPU-hours with 0-2 decimals (pure: no Streamlit)."""

from __future__ import annotations

import math

import pandas as pd


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA


def percent(ratio, decimals: int = 0, missing: str = "n/a") -> str:
    """0.4951 -> '50%' (a ratio in, a percentage out)."""
    return missing if _missing(ratio) else f"{float(ratio) * 100:.{decimals}f}%"


def money(value, currency: str, decimals: int | None = None, missing: str = "n/a") -> str:
    """1533815.5 -> '1,533,816 USD'; under 100 keeps 2 decimals."""
    if _missing(value):
        return missing
    value = float(value)
    if decimals is None:
        decimals = 0 if abs(value) >= 100 else 2
    return f"{value:,.{decimals}f} {currency}"


def gpu_hours(value, missing: str = "n/a") -> str:
    if _missing(value):
        return missing
    value = float(value)
    return f"{value:,.0f} GPU-h" if abs(value) >= 100 else f"{value:,.1f} GPU-h"


def title(name: str) -> str:
    """snake_case column -> a header with its unit: 'idle_gpu_hours' -> 'Idle GPU-h'."""
    words = name.split("_")
    unit = ""
    if name.endswith("_gpu_hours"):
        words, unit = words[:-2], "GPU-h"
    elif name == "gpu_hours":
        words, unit = [], "GPU-h"
    elif name.endswith(("_ratio", "_share")) or name in ("utilisation", "efficiency_score", "idle_share"):
        words, unit = [w for w in words if w != "ratio"], "%"
    elif name.endswith("_kwh"):
        words, unit = words[:-1], "kWh"
    text = " ".join(words).replace("gpu", "GPU").replace("gpus", "GPUs").strip()
    text = text[:1].upper() + text[1:]
    return f"{text} ({unit})" if unit and text else (unit if unit else text)
