"""What the image and chart tests need from the machine, shared by tests/test_image*.py and
tests/test_helm*.py: a missing tool skips the test with the reason, except under ``CI=true``, where
it fails (CI must never go green by skipping); and the repository's scripts load as modules."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[1]


def unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI=true, so this is a failure, not a skip", pytrace=False)
    pytest.skip(reason)


def load_script(relative_path: str) -> ModuleType:
    """The module of a script under the repository root (scripts are not a package)."""
    path = ROOT / relative_path
    spec = importlib.util.spec_from_file_location(f"gpuwarden_script_{path.stem}", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
