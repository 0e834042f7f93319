#!/usr/bin/env python3
"""Install gpuwarden into /opt/gpuwarden of an image and slim it; add the image's non-root user.

Runs INSIDE the image's file system, as root, with only the standard library: the Containerfile's
build stages run it, and scripts/build_rootfs.py runs it in a chroot of the Debian root file
system CI builds, so both hold the same /opt/gpuwarden and the same user.

    python3 install.py --variant full|exporter --wheels DIR [--venv /opt/gpuwarden] [--offline]
    python3 install.py --add-user            # the gpuwarden user and group (UID/GID 10001)

``--wheels DIR`` holds gpuwarden's wheel (and, with ``--offline``, every dependency's wheel: pip
then reads nothing else). Variants:

- ``full``: gpuwarden with every dependency (exporter, CLI, analytics, actuator, dashboards);
- ``exporter``: gpuwarden with only what ``python -m gpuwarden.exporter`` imports
  (:data:`EXPORTER_DISTRIBUTIONS`): the DaemonSet's image, on every GPU node.

Nothing is byte-compiled into the image: the root file system is read-only at run time, and the
image's ``PYTHONPYCACHEPREFIX`` points Python's bytecode cache at the writable ``/tmp``.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

USER_NAME = "gpuwarden"
USER_ID = 10001
# What the exporter imports (pyproject's import-linter contract keeps it to these).
EXPORTER_DISTRIBUTIONS = ("prometheus-client", "nvidia-ml-py", "grpcio", "protobuf")
# Parts of wheels nothing imports at run time: test suites, C/Cython sources and headers.
UNUSED_DIRS = ("tests", "__pycache__")
UNUSED_SUFFIXES = (".pyx", ".pxd", ".pxi", ".h", ".hpp", ".c", ".cc", ".cpp")
# pyarrow's Flight RPC and S3 libraries (~50 MB) and its C++ test module: the store reads and
# writes local Parquet only, and pyarrow imports these lazily (pyarrow.flight, pyarrow.fs's S3).
# (libarrow_substrait stays: pyarrow.lib links it.)
PYARROW_UNUSED = ("libarrow_flight.so*", "libarrow_python_flight.so*", "_flight*.so", "libarrow_s3.so*",
                  "_s3fs*.so", "_pyarrow_cpp_tests*.so", "include", "src")


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def gpuwarden_wheel(wheels: Path) -> Path:
    found = sorted(wheels.glob("gpuwarden-*.whl"))
    if len(found) != 1:
        raise SystemExit(f"install.py: expected one gpuwarden-*.whl in {wheels}, found {len(found)}")
    return found[0]


def requirements(wheel: Path, variant: str) -> list[str]:
    """The pip requirements of ``variant``: the wheel itself, plus (exporter) the exporter's own
    dependencies with the version ranges the wheel declares."""
    if variant == "full":
        return [str(wheel)]
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        lines = archive.read(metadata).decode().splitlines()
    declared = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]
    wanted = {_normalise(name) for name in EXPORTER_DISTRIBUTIONS}
    keep = [req for req in declared if ";" not in req and _normalise(re.split(r"[<>=!~ \[(]", req, 1)[0]) in wanted]
    missing = wanted - {_normalise(re.split(r"[<>=!~ \[(]", req, 1)[0]) for req in keep}
    if missing:
        raise SystemExit(f"install.py: {wheel.name} does not declare {sorted(missing)}")
    return keep


def install(venv: Path, wheels: Path, variant: str, offline: bool) -> None:
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-cache-dir", "--no-compile",
           "--disable-pip-version-check", "--find-links", str(wheels)] + (["--no-index"] if offline else [])
    wheel = gpuwarden_wheel(wheels)
    if variant == "full":
        subprocess.run(pip + [str(wheel)], check=True)
    else:
        subprocess.run(pip + ["--no-deps", str(wheel)], check=True)
        subprocess.run(pip + requirements(wheel, variant), check=True)
    # The image never installs at run time: drop the installers.
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "--quiet", "--yes", "pip", "setuptools"],
                   check=True)


def slim(venv: Path) -> None:
    (site,) = glob.glob(str(venv / "lib" / "python3*" / "site-packages"))
    for root, dirs, files in os.walk(site, topdown=True):
        for name in [d for d in dirs if d in UNUSED_DIRS]:
            shutil.rmtree(os.path.join(root, name))
            dirs.remove(name)
        for name in files:
            if name.endswith(UNUSED_SUFFIXES):
                os.remove(os.path.join(root, name))
    for pattern in PYARROW_UNUSED:
        for path in glob.glob(os.path.join(site, "pyarrow", pattern)):
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    _dedupe_shared_libraries(Path(site))


def _dedupe_shared_libraries(site: Path) -> None:
    """Wheels cannot hold symlinks, so ``libx.so``, ``libx.so.1`` and ``libx.so.1.0`` arrive as
    three copies; make the shorter names symlinks to the longest."""
    by_content: dict[tuple[Path, int], list[Path]] = {}
    for path in site.rglob("*.so*"):
        if path.is_file() and not path.is_symlink():
            by_content.setdefault((path.parent, path.stat().st_size), []).append(path)
    for paths in by_content.values():
        if len(paths) < 2:
            continue
        paths.sort(key=lambda p: len(p.name))
        target = paths[-1]
        data = target.read_bytes()
        for path in paths[:-1]:
            if target.name.startswith(path.name) and path.read_bytes() == data:
                path.unlink()
                path.symlink_to(target.name)


def add_user() -> None:
    """The image's non-root user and group; no home folder (HOME is /tmp, the writable mount)."""
    subprocess.run(["groupadd", "--gid", str(USER_ID), USER_NAME], check=True)
    subprocess.run(["useradd", "--uid", str(USER_ID), "--gid", str(USER_ID), "--no-create-home",
                    "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", USER_NAME], check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="install.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", choices=("full", "exporter"))
    parser.add_argument("--wheels", type=Path)
    parser.add_argument("--venv", type=Path, default=Path("/opt/gpuwarden"))
    parser.add_argument("--offline", action="store_true", help="read only --wheels, never an index")
    parser.add_argument("--add-user", action="store_true", help=f"add the {USER_NAME} user (UID/GID {USER_ID}) and exit")
    args = parser.parse_args(argv)
    if args.add_user:
        add_user()
        return 0
    if not args.variant or not args.wheels:
        parser.error("--variant and --wheels are required (or --add-user)")
    install(args.venv, args.wheels, args.variant, args.offline)
    slim(args.venv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
