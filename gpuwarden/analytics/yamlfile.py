"""Reading the YAML files analytics is configured by (price book, inventory): one clear line when
the file is missing or not YAML."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from gpuwarden.fleet.inputs import read_yaml_file


def read_yaml(path: str | Path, what: str, error: type[Exception]) -> object:
    """The parsed document of ``path`` (an empty file is ``{}``); ``error`` names the file and
    what is wrong with it."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise error(f"{path}: {what} file not found")
    # a FIFO or a device, aliases expanding past a bound ("billion laughs"), a key given twice: refused
    return read_yaml_file(path, f"the {what} file", error) or {}


def content_digest(data: object) -> str:
    """sha256 of a parsed document's content (keys sorted, every number as a float): the same book
    or inventory written as another file has the same digest (a chart's ``toYaml`` writes 11.00 as 11)."""
    return hashlib.sha256(json.dumps(_numbers_as_floats(data), sort_keys=True, default=str).encode()).hexdigest()


def _numbers_as_floats(value: object) -> object:
    if isinstance(value, dict):
        return {str(k): _numbers_as_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers_as_floats(v) for v in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return value
