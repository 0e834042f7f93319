#!/usr/bin/env python3
"""Build the container image's root file system from Debian packages and PyPI wheels only.

CI reaches PyPI and Debian but no container registry, so it cannot pull the Containerfile's
``python:3.11-slim-bookworm`` base. This script builds the same file system without it:

1. the project's wheel: ``pip wheel . --no-deps`` (``SOURCE_DATE_EPOCH`` fixed, so the same
   sources give the same bytes);
2. the wheels of the variant's dependencies, for CPython 3.11 on manylinux x86_64: ``pip download``
   from PyPI (pip's HTTP cache makes a second download cheap);
3. a Debian bookworm base: ``mmdebstrap --variant=minbase`` with python3, python3-venv (the venv
   installer), binutils (``strip``) and ca-certificates, no recommended packages, documentation,
   manual pages or locales; cached by its options;
4. a copy of the base where ``scripts/image/install.py`` runs in a ``chroot``, exactly as the
   Containerfile's build stages run it (``--offline``: pip reads only the wheels of steps 1-2),
   then adds the image's non-root user and slims the system (``--add-user --slim-system``, as the
   Containerfile's runtime stage): the build-only packages (venv installer, binutils, Perl, apt)
   are purged.

The result lives in ``build/image/<variant>-<key>/rootfs`` (ignored by git), ``key`` hashing the
wheel, the Containerfile, install.py, this script and the base, so repeated runs reuse it.
``image.json`` beside it holds the Containerfile target's ENV, USER, ENTRYPOINT and CMD (parsed
from the Containerfile, so a runner can start the tree as the image would), the size and the build
time. Needs root (``mmdebstrap`` in root mode, ``chroot``) and ``mmdebstrap``.

    python scripts/build_rootfs.py [--variant full|exporter] [--rebuild]   # prints image.json
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTAINERFILE = ROOT / "Containerfile"
INSTALL_SCRIPT = ROOT / "scripts" / "image" / "install.py"
CACHE = ROOT / "build" / "image"
SUITE = "bookworm"
# python3-venv (ensurepip's bundled pip) and binutils (strip) serve the install step only:
# install.py --slim-system purges them, and usrmerge (usr-is-merged stands in for it) with the Perl it needs.
BASE_PACKAGES = ("python3", "python3-venv", "binutils", "ca-certificates", "usr-is-merged")
DPKG_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*",
                 "/usr/share/lintian/*")
TARGETS = {"full": "gpuwarden", "exporter": "exporter"}  # variant -> Containerfile stage
PYTHON_TAGS = ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--only-binary", ":all:"]
PLATFORMS = ["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64",
             *(f"manylinux_2_{minor}_x86_64" for minor in range(5, 37))]  # bookworm: glibc 2.36


class BuildError(Exception):
    """A step failed or a tool is missing; the message says which and what to do."""


def _log(message: str) -> None:
    print(f"build_rootfs: {message}", file=sys.stderr, flush=True)


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    try:
        result = subprocess.run(command, check=False, capture_output=True, text=True, **kwargs)
    except FileNotFoundError:
        raise BuildError(f"{command[0]} is not installed") from None
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise BuildError(f"{shlex.join(command)} exited {result.returncode}:\n{tail}")
    return result


def _sha256(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:16]


def _load_install_module():
    spec = importlib.util.spec_from_file_location("gpuwarden_image_install", INSTALL_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the Containerfile ------------------------------------------------------------------------------

def parse_containerfile(path: Path = CONTAINERFILE) -> dict[str, dict]:
    """Each stage's ``from``, ``env`` (inherited through ``FROM <stage>``), ``user``, ``entrypoint``
    and ``cmd``, for the instructions this project's Containerfile uses."""
    text = path.read_text().replace("\\\n", " ")
    stages: dict[str, dict] = {}
    current: dict | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = rest.split()
            parent = stages.get(words[0])
            current = {"from": words[0], "env": dict(parent["env"]) if parent else {},
                       "user": parent["user"] if parent else None,
                       "entrypoint": parent["entrypoint"] if parent else None,
                       "cmd": parent["cmd"] if parent else None}
            if len(words) == 3 and words[1].upper() == "AS":
                stages[words[2]] = current
        elif current is None:
            continue
        elif keyword == "ENV":
            for item in shlex.split(rest):
                name, _, value = item.partition("=")
                current["env"][name] = value
        elif keyword == "USER":
            current["user"] = rest.strip()
        elif keyword in ("ENTRYPOINT", "CMD"):
            current[keyword.lower()] = json.loads(rest)
    return stages


# --- steps --------------------------------------------------------------------------------------------

def _has_setuptools(newer_than_major: int) -> bool:
    try:
        from importlib.metadata import version

        return int(version("setuptools").split(".")[0]) > newer_than_major
    except Exception:  # noqa: BLE001 (absent or unparsable: build in isolation)
        return False


def sources_digest() -> str:
    """A hash of what the wheel is built from (the files the Containerfile copies)."""
    paths = [ROOT / "pyproject.toml", ROOT / "README.md"]
    paths += sorted(p for p in (ROOT / "gpuwarden").rglob("*")
                    if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    return _sha256(*(str(p.relative_to(ROOT)).encode() + b"\0" + p.read_bytes() for p in paths))


def build_wheel(out: Path) -> Path:
    """The project's wheel, rebuilt only when its sources changed (building one costs ~20-30 s)."""
    cached = out / sources_digest()
    found = sorted(cached.glob("gpuwarden-*.whl"))
    if len(found) == 1:
        return found[0]
    shutil.rmtree(out, ignore_errors=True)
    cached.mkdir(parents=True)
    env = {**os.environ, "SOURCE_DATE_EPOCH": "315532800", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    with tempfile.TemporaryDirectory() as tmp:  # setuptools' build/ may hold stale modules: build from a copy
        src = Path(tmp) / "src"  # what the Containerfile copies, nothing else
        src.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(ROOT / name, src / name)
        shutil.copytree(ROOT / "gpuwarden", src / "gpuwarden", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        # An isolated build environment costs a download of setuptools: skip it when this Python has one
        # new enough for pyproject.toml's build-system.
        no_isolation = ["--no-build-isolation"] if _has_setuptools(70) else []  # 70.1+ builds wheels alone
        _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", *no_isolation, "--wheel-dir", str(cached),
              str(src)], env=env, timeout=300)
    (wheel,) = cached.glob("gpuwarden-*.whl")
    return wheel


def download_wheels(wheel: Path, variant: str, dest: Path) -> None:
    """Every dependency's wheel, for the rootfs's CPython 3.11 (whatever Python runs this script)."""
    install = _load_install_module()
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(wheel, dest / wheel.name)
    requirements = install.requirements(wheel, variant)
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    _run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--dest", str(dest),
          *PYTHON_TAGS, *platforms, *requirements], timeout=900)


def base_key() -> str:
    options = [SUITE, *BASE_PACKAGES, *DPKG_EXCLUDES, "no-recommends"]
    return _sha256(*(o.encode() for o in options))


def build_base(dest: Path) -> None:
    if shutil.which("mmdebstrap") is None:
        raise BuildError("mmdebstrap is not installed (Debian: apt-get install mmdebstrap)")
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    command = ["mmdebstrap", "--mode=root", "--variant=minbase", "--quiet", f"--include={','.join(BASE_PACKAGES)}",
               "--aptopt=APT::Install-Recommends \"false\"",
               *(f"--dpkgopt=path-exclude={pattern}" for pattern in DPKG_EXCLUDES),
               "--dpkgopt=path-include=/usr/share/doc/*/copyright", SUITE, str(tmp)]
    _run(command, timeout=900)
    tmp.rename(dest)


def install_into(rootfs: Path, wheels: Path, variant: str) -> None:
    staged = rootfs / "tmp" / "gpuwarden-install"
    shutil.copytree(wheels, staged / "wheels")
    shutil.copy2(INSTALL_SCRIPT, staged / "install.py")
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
    inside = "/tmp/gpuwarden-install"
    _run(["chroot", str(rootfs), "python3", f"{inside}/install.py", "--variant", variant, "--wheels", f"{inside}/wheels",
          "--offline"], env=env, timeout=900)
    _run(["chroot", str(rootfs), "python3", f"{inside}/install.py", "--add-user", "--slim-system"], env=env,
         timeout=300)
    shutil.rmtree(staged)
    (rootfs / "var" / "lib" / "gpuwarden").mkdir(mode=0o755, exist_ok=True)  # the store volume's mount point


def size_text(size_bytes: int) -> str:
    """``676 MB (645 MiB)``: registries and engines print one or the other."""
    return f"{size_bytes / 1e6:.0f} MB ({size_bytes / 2**20:.0f} MiB)"


def tree_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path``, each inode once (what an image layer holds)."""
    seen: set[int] = set()
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            stat = os.lstat(os.path.join(root, name))
            if stat.st_ino not in seen:
                seen.add(stat.st_ino)
                total += stat.st_size
    return total


def build(variant: str = "exporter", *, rebuild: bool = False) -> dict:
    """Build (or reuse) the root file system of ``variant``; return its ``image.json``. One build at a
    time per cache (a lock file): two test runs would otherwise remove each other's trees."""
    if variant not in TARGETS:
        raise BuildError(f"--variant {variant}: expected one of {sorted(TARGETS)}")
    if os.geteuid() != 0:
        raise BuildError("building the root file system needs root (mmdebstrap --mode=root, chroot)")
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_locked(variant, rebuild)


def _build_locked(variant: str, rebuild: bool) -> dict:
    started = time.monotonic()
    wheel = build_wheel(CACHE / "dist")
    key = _sha256(wheel.read_bytes(), CONTAINERFILE.read_bytes(), INSTALL_SCRIPT.read_bytes(),
                  Path(__file__).read_bytes(), base_key().encode(), variant.encode())
    out = CACHE / f"{variant}-{key}"
    manifest_path = out / "image.json"
    if manifest_path.is_file() and not rebuild:
        manifest = json.loads(manifest_path.read_text())
        manifest["cached"] = True
        return manifest
    for old in CACHE.glob(f"{variant}-*"):
        shutil.rmtree(old)
    seconds: dict[str, float] = {}

    step = time.monotonic()
    base = CACHE / f"base-{base_key()}"
    if not base.is_dir():
        for old in CACHE.glob("base-*"):
            shutil.rmtree(old)
        _log(f"mmdebstrap {SUITE} minbase + {', '.join(BASE_PACKAGES)} -> {base}")
        build_base(base)
    seconds["base"] = time.monotonic() - step

    step = time.monotonic()
    wheels = CACHE / f"wheels-{variant}"
    shutil.rmtree(wheels, ignore_errors=True)
    _log(f"pip download: the {variant} variant's wheels")
    download_wheels(wheel, variant, wheels)
    seconds["wheels"] = time.monotonic() - step

    step = time.monotonic()
    work = CACHE / f"{variant}-{key}.tmp"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    _log(f"install.py --variant {variant} in a chroot of a copy of the base")
    _run(["cp", "-a", str(base), str(work / "rootfs")])
    install_into(work / "rootfs", wheels, variant)
    seconds["install"] = time.monotonic() - step

    stage = parse_containerfile()[TARGETS[variant]]
    manifest = {
        "variant": variant,
        "containerfile_target": TARGETS[variant],
        "rootfs": str(out / "rootfs"),
        "wheel": wheel.name,
        "key": key,
        "env": stage["env"],
        "user": stage["user"],
        "entrypoint": stage["entrypoint"],
        "cmd": stage["cmd"],
        "rootfs_bytes": tree_bytes(work / "rootfs"),
        "base_bytes": tree_bytes(base),
        "venv_bytes": tree_bytes(work / "rootfs" / "opt" / "gpuwarden"),
        "build_seconds": round(time.monotonic() - started, 1),
        "step_seconds": {name: round(value, 1) for name, value in seconds.items()},
        "cached": False,
    }
    (work / "image.json").write_text(json.dumps(manifest, indent=2) + "\n")
    work.rename(out)
    shutil.rmtree(wheels, ignore_errors=True)
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="build_rootfs.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", choices=sorted(TARGETS), default="exporter",
                        help="exporter (the DaemonSet's image) or full (the whole stack); default exporter")
    parser.add_argument("--rebuild", action="store_true", help="ignore the cached root file system")
    args = parser.parse_args(argv)
    try:
        manifest = build(args.variant, rebuild=args.rebuild)
    except BuildError as error:
        print(f"build_rootfs.py: error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(manifest, indent=2))
    how = "cached" if manifest["cached"] else f"built in {manifest['build_seconds']} s"
    _log(f"{args.variant}: {size_text(manifest['rootfs_bytes'])} in {manifest['rootfs']} ({how})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
