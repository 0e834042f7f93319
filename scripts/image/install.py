#!/usr/bin/env python3
"""Install gpuwarden into /opt/gpuwarden of an image and slim it; add the image's non-root user.

Runs INSIDE the image's file system, as root, with only the standard library: the Containerfile's
build stages run it, and scripts/build_rootfs.py runs it in a chroot of the Debian root file
system CI builds, so both hold the same /opt/gpuwarden and the same user.

    python3 install.py --variant full|exporter --wheels DIR [--venv /opt/gpuwarden] [--offline]
    python3 install.py --add-user [--slim-system]   # the gpuwarden user (UID/GID 10001); drop build-only parts

``--wheels DIR`` holds gpuwarden's wheel (and, with ``--offline``, every dependency's wheel: pip
then reads nothing else). Variants:

- ``full``: gpuwarden with every dependency (exporter, CLI, analytics, actuator, dashboards);
- ``exporter``: gpuwarden with only what ``python -m gpuwarden.exporter`` imports
  (:data:`EXPORTER_DISTRIBUTIONS`): the DaemonSet's image, on every GPU node.

Nothing is byte-compiled into the image: the root file system is read-only at run time, and the
image's ``PYTHONPYCACHEPREFIX`` points Python's bytecode cache at the writable ``/tmp``. With that
prefix set Python never reads a ``__pycache__`` folder beside a source, so the standard library's
are dead weight too and ``--slim-system`` removes them.

What slimming removes, and why nothing gpuwarden runs needs it (tests/helm/test_image.py runs the CLI,
a simulation, a report, the exporter and the dashboard's modules in the slimmed tree):

- from the venv: test suites, C sources and headers, source maps, the parts listed in
  :data:`UNUSED_PARTS`, :data:`UNUSED_VENV_PARTS` and :data:`PYARROW_UNUSED`; shared objects lose
  their symbol tables (``strip --strip-unneeded``: wheels ship them unstripped) and identical copies
  become symlinks;
- from the system (``--slim-system``): the base's own pip, setuptools and wheel, the build-time
  Debian packages of :data:`BUILD_ONLY_PACKAGES` (installers, binutils, Perl that only ``usrmerge``
  needed, apt), apt's lists and caches, logs, documentation, manual pages and message catalogues.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import re
import shutil
import struct
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
UNUSED_SUFFIXES = (".pyx", ".pxd", ".pxi", ".h", ".hpp", ".c", ".cc", ".cpp", ".js.map")
PAGE_BYTES = 4096  # x86_64
# Whole subpackages nothing imports: path under site-packages -> why.
UNUSED_PARTS = {
    "kubernetes/aio": "the asyncio client (41 MB); gpuwarden and kubernetes' own modules use the synchronous one",
    "pydeck/nbextension": "the Jupyter notebook widget (24 MB); Streamlit serves deck.gl from its own frontend",
}
# The same kind, outside site-packages: data files wheels install under the venv's root.
UNUSED_VENV_PARTS = {
    "share/jupyter": "pydeck's notebook widget a second time, as a Jupyter data file (23 MB); no Jupyter runs here",
}
# pyarrow's Flight RPC and S3 libraries (~50 MB) and its C++ test module: the store reads and
# writes local Parquet only, and pyarrow imports these lazily (pyarrow.flight, pyarrow.fs's S3).
# (libarrow_substrait stays: pyarrow.lib links it.)
PYARROW_UNUSED = ("libarrow_flight.so*", "libarrow_python_flight.so*", "_flight*.so", "libarrow_s3.so*",
                  "_s3fs*.so", "_pyarrow_cpp_tests*.so", "include", "src")


# Debian packages present in the build's base but needed by nothing at run time (the image never
# installs packages: the root file system is read-only). Purged where installed, in this order.
BUILD_ONLY_PACKAGES = (
    # the venv installer (scripts/build_rootfs.py's Debian base; python:*-slim has none of these)
    "python3-venv", "python3.11-venv", "python3-pip-whl", "python3-setuptools-whl", "python3-distutils",
    "python3-lib2to3",
    # strip, for the venv's shared objects
    "binutils", "binutils-x86-64-linux-gnu", "libbinutils", "libctf0", "libctf-nobfd0", "libgprofng0",
    "libjansson4", "binutils-common",
    # mmdebstrap's /usr merge; Perl came only for it (dpkg and debconf use perl-base, which stays)
    "usrmerge", "libfile-find-rule-perl", "libnumber-compare-perl", "libtext-glob-perl", "perl",
    "perl-modules-5.36", "libperl5.36", "libgdbm-compat4",
    # apt: no package is installed at run time
    "apt", "libapt-pkg6.0", "gpgv", "debian-archive-keyring", "libgnutls30", "libxxhash0",
)
# Files and folders nothing reads at run time (glob patterns; documentation keeps its copyright files).
SYSTEM_UNUSED = (
    "/usr/lib/python3*/**/__pycache__", "/usr/local/lib/python3*/**/__pycache__",  # see PYTHONPYCACHEPREFIX
    "/var/lib/apt/lists/*", "/var/cache/apt/*", "/var/cache/debconf/*-old", "/var/log/*",
    "/usr/share/doc/*/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*/", "/usr/share/lintian/*",
)


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
    keep = [req for req in declared if ";" not in req and _normalise(re.split(r"[<>=!~ \[(]", req, maxsplit=1)[0]) in wanted]
    missing = wanted - {_normalise(re.split(r"[<>=!~ \[(]", req, maxsplit=1)[0]) for req in keep}
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
    for part in UNUSED_PARTS:
        shutil.rmtree(os.path.join(site, part), ignore_errors=True)
    for part in UNUSED_VENV_PARTS:
        shutil.rmtree(venv / part, ignore_errors=True)
    unstripped = _strip_shared_objects(Path(site))
    print(f"install.py: stripped the venv's shared objects ({unstripped} kept whole: strip would misalign them)")
    _dedupe_shared_libraries(Path(site))


def _shared_objects(site: Path) -> list[Path]:
    """Regular ELF files named ``*.so*`` (not symlinks)."""
    found = []
    for path in sorted(site.rglob("*.so*")):
        if path.is_file() and not path.is_symlink():
            with path.open("rb") as handle:
                if handle.read(4) == b"\x7fELF":
                    found.append(path)
    return found


def _loadable(path: Path) -> bool:
    """Whether the dynamic loader accepts ``path``'s segments: each PT_LOAD's address and file offset
    agree modulo the page size (glibc: "ELF load command address/offset not page-aligned")."""
    with path.open("rb") as handle:
        header = handle.read(64)
        if header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:  # not 64-bit little-endian
            return False
        (table_offset,) = struct.unpack_from("<Q", header, 0x20)
        entry_size, entries = struct.unpack_from("<HH", header, 0x36)
        handle.seek(table_offset)
        table = handle.read(entry_size * entries)
    for index in range(entries):
        kind, _flags, offset, address = struct.unpack_from("<IIQQ", table, index * entry_size)
        if kind == 1 and (address - offset) % PAGE_BYTES:
            return False
    return True


def _strip_shared_objects(site: Path) -> int:
    """Drop the symbol tables wheels ship (~50 MB over the full variant); the dynamic symbols the
    loader needs stay (``--strip-unneeded``). A library auditwheel renamed with patchelf (numpy.libs'
    and scipy.libs' OpenBLAS and gfortran) comes out of strip with misaligned segments the loader
    refuses, so each stripped copy replaces the original only when :func:`_loadable` accepts it.
    Returns how many were kept unstripped."""
    if shutil.which("strip") is None:
        raise SystemExit("install.py: strip is not installed (Debian: apt-get install binutils); "
                         "the image's shared objects are stripped in both build paths")
    kept = 0
    for path in _shared_objects(site):
        stripped = path.with_name(path.name + ".stripped")
        subprocess.run(["strip", "--strip-unneeded", "-o", str(stripped), str(path)], check=True)
        if _loadable(stripped):
            shutil.copymode(path, stripped)
            os.replace(stripped, path)
        else:
            stripped.unlink()
            kept += 1
    return kept


def _dedupe_shared_libraries(site: Path) -> None:
    """Wheels cannot hold symlinks, so ``libx.so``, ``libx.so.1`` and ``libx.so.1.0`` arrive as
    three copies, and two wheels may vendor the same library (numpy.libs and scipy.libs both hold
    one libgfortran); keep one copy and make the others relative symlinks to it."""
    by_size: dict[int, list[Path]] = {}
    for path in _shared_objects(site):
        by_size.setdefault(path.stat().st_size, []).append(path)
    for paths in by_size.values():
        kept: dict[bytes, Path] = {}
        for path in paths:
            data = path.read_bytes()
            target = kept.setdefault(data, path)
            if target != path:
                path.unlink()
                path.symlink_to(os.path.relpath(target, path.parent))


def slim_system() -> None:
    """Purge the Debian packages only a build needs, and what no program in the image reads."""
    present = subprocess.run(["dpkg-query", "--show", "--showformat", "${Package} ${db:Status-Abbrev}\n"],
                             check=True, capture_output=True, text=True).stdout.split("\n")
    installed = {line.split()[0] for line in present if line.split()[1:2] == ["ii"]}
    purge = [name for name in BUILD_ONLY_PACKAGES if name in installed]
    if purge:
        subprocess.run(["dpkg", "--purge", *purge], check=True, stdout=subprocess.DEVNULL)
    _uninstall_base_installers()
    for pattern in SYSTEM_UNUSED:
        for path in glob.glob(pattern, recursive=True):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            elif os.path.basename(path) != "copyright":  # licences stay
                os.remove(path)


def _uninstall_base_installers() -> None:
    """python:*-slim's own pip, setuptools and wheel, installed under /usr/local (about 15 MB): the
    image never installs at run time, and the venv has its own copy removed already. Debian's
    python3 (scripts/build_rootfs.py) has none: its installer is a package, purged above."""
    spec = importlib.util.find_spec("pip")
    if spec is None or not (spec.origin or "").startswith("/usr/local/"):
        return
    subprocess.run([sys.executable, "-m", "pip", "uninstall", "--quiet", "--yes", "--root-user-action=ignore",
                    "pip", "setuptools", "wheel"], check=True)


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
    parser.add_argument("--slim-system", action="store_true",
                        help="with --add-user: also purge build-only packages and unread files")
    args = parser.parse_args(argv)
    if args.add_user:
        add_user()
        if args.slim_system:
            slim_system()
        return 0
    if not args.variant or not args.wheels:
        parser.error("--variant and --wheels are required (or --add-user)")
    install(args.venv, args.wheels, args.variant, args.offline)
    slim(args.venv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
