"""The import layering of ARCHITECTURE.md, checked with import-linter's contracts in pyproject.toml:
the real tree keeps them, and a copy of the tree with one forbidden import breaks them (so the
check can fail)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint(project: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=project, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(project), "PATH": "/usr/bin:/bin"},
    )


def test_the_tree_keeps_every_contract():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_forbidden_import_breaks_a_contract(tmp_path):
    copy = tmp_path / "project"
    copy.mkdir()
    shutil.copy(ROOT / "pyproject.toml", copy)
    shutil.copytree(ROOT / "gpuwarden", copy / "gpuwarden", ignore=shutil.ignore_patterns("__pycache__"))
    # The exporter must stay light: pandas is forbidden there.
    target = copy / "gpuwarden" / "exporter" / "collector.py"
    target.write_text("import pandas  # forbidden\n" + target.read_text())
    # And the store must never reach up into analytics.
    (copy / "gpuwarden" / "store" / "upward.py").write_text("import gpuwarden.analytics\n")
    result = lint(copy)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout
    assert "gpuwarden.exporter.collector -> pandas" in result.stdout
    assert "gpuwarden.store.upward -> gpuwarden.analytics" in result.stdout
