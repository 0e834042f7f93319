"""Where the real data sets live (no heavy imports: the exporter uses this too)."""

from __future__ import annotations

import os
from pathlib import Path


def default_data_dir() -> Path:
    """``$GPUWARDEN_DATA``, else ``../shared/data`` from the working directory, else beside the checkout."""
    env = os.environ.get("GPUWARDEN_DATA")
    if env:
        return Path(env)
    for base in (Path.cwd(), Path(__file__).resolve().parents[2]):
        candidate = base.parent / "shared" / "data"
        if candidate.is_dir():
            return candidate
    return Path.cwd().parent / "shared" / "data"
