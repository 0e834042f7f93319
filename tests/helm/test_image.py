"""The container image's file system, built from Debian and PyPI only, running the exporter.

CI cannot pull the Containerfile's base image, so ``scripts/build_rootfs.py`` builds the same file
system: ``mmdebstrap --variant=minbase`` + python3 (Debian), the project's wheel and its
dependencies' wheels (PyPI), installed by the same ``scripts/image/install.py`` the Containerfile
runs, and the same non-root user. The tree is cached in ``build/image/`` by the hash of the wheel
and the build files, so a second run only starts it.

Runtime: no container runtime works in this sandbox (``podman run`` fails on setrlimit / cgroups),
so the tree runs with ``unshare --mount`` + ``chroot --userspec=10001:10001``, as root sets it
up and as the image's non-root UID it runs: a private mount namespace where the root file system
is bind-mounted READ-ONLY, a tmpfs on ``/tmp`` (the pod's emptyDir) and on ``/dev/shm`` (as a
container runtime mounts it), a tmpfs store volume, the recorded H200 data bound
read-only under ``/tmp/data``, the environment taken from the Containerfile's ENV (parsed). The
network namespace is the host's, so the test reads ``/metrics`` over 127.0.0.1. The whole-stack tree
runs the CLI, a simulation, a report, every module's import and the dashboard, which is how the
slimming in ``scripts/image/install.py`` proves it removed nothing gpuwarden uses. Sizes (MB and
MiB) and build times are printed.

Needs root (mmdebstrap in root mode, mount, chroot), ``mmdebstrap`` and ``unshare``: without them
the tests skip with the reason, and fail under ``CI=true``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import tomllib
import urllib.request
import zipfile
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from polling import wait_for
from system_needs import load_script, unavailable

from gpuwarden.fleet.processes import stop_process

ROOT = Path(__file__).resolve().parents[2]
# A cold build downloads ~150 MB of Debian packages and wheels and installs them (1-3 min on 2 idle
# cores, 8 min measured on a shared, loaded machine): more than the suite's 300 s per test.
pytestmark = pytest.mark.timeout(900)
SIZE_TARGET_BYTES = 400 * 10**6  # the "< 400 MB", met by the exporter image
FULL_IMAGE_BOUND_BYTES = 545 * 10**6  # ~501 MB measured; room for new releases of the dependencies
IMAGE_UID = 10001
# The chart's /tmp emptyDir sizeLimit (bytecode, HOME and caches live there): dashboard, exporter.
FULL_TMP_BYTES = 256 * 2**20
EXPORTER_TMP_BYTES = 16 * 2**20


def _report(request, line: str) -> None:
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"test_image: {line}")


def _rootfs(request, variant: str) -> dict:
    if os.geteuid() != 0:
        unavailable("building and entering the image's root file system needs root (mmdebstrap --mode=root, mount, chroot)")
    for tool in ("mmdebstrap", "unshare", "chroot"):
        if shutil.which(tool) is None:
            unavailable(f"{tool} is not installed (Debian: apt-get install mmdebstrap util-linux coreutils)")
    build = load_script("scripts/build_rootfs.py")
    try:
        manifest = build.build(variant)
    except build.BuildError as error:
        pytest.fail(f"build_rootfs.py --variant {variant}: {error}", pytrace=False)
    how = "reused from build/image (cached)" if manifest["cached"] else \
        f"built in {manifest['build_seconds']} s {manifest['step_seconds']}"
    _report(request, f"{variant} rootfs {build.size_text(manifest['rootfs_bytes'])}: /opt/gpuwarden "
                     f"{build.size_text(manifest['venv_bytes'])}, Debian + Python "
                     f"{build.size_text(manifest['rootfs_bytes'] - manifest['venv_bytes'])}; {how}; "
                     f"runtime: unshare --mount + chroot --userspec={manifest['user']}")
    return manifest


@pytest.fixture(scope="module")
def exporter_image(request) -> dict:
    return _rootfs(request, "exporter")


@pytest.fixture(scope="module")
def full_image(request) -> dict:
    return _rootfs(request, "full")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def run_in_image(manifest: dict, argv: list[str], data: Path | None = None, tmp_bytes: int = FULL_TMP_BYTES,
                 **popen):
    """Start ``argv`` in the image's tree as the image would: read-only root, tmpfs /tmp, the
    Containerfile's ENV and USER. Yields the Popen (its pid is the image's process: unshare,
    sh and chroot all exec)."""
    rootfs = shlex.quote(manifest["rootfs"])
    env = " ".join(shlex.quote(f"{k}={v}") for k, v in {**manifest["env"], "GPUWARDEN_DATA": "/tmp/data"}.items())
    setup = [
        f"mount --bind {rootfs} {rootfs}",
        f"mount -t tmpfs -o size={tmp_bytes},mode=1777 tmpfs {rootfs}/tmp",
        f"mount -t tmpfs -o size=16m,mode=1777 tmpfs {rootfs}/dev/shm",  # as every container runtime gives
        f"mount -t tmpfs -o size=16m,mode=0755,uid={IMAGE_UID},gid={IMAGE_UID} tmpfs {rootfs}/var/lib/gpuwarden",
    ]
    if data is not None:
        setup += [f"mkdir {rootfs}/tmp/data", f"mount --bind -o ro {shlex.quote(str(data))} {rootfs}/tmp/data"]
    setup += [f"mount -o remount,bind,ro {rootfs}", f"mount -t proc proc {rootfs}/proc",
              f"exec chroot --userspec={manifest['user']} {rootfs} env -i {env} {shlex.join(argv)}"]
    process = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--", "sh", "-ec", " && ".join(setup)],
                               **popen)
    try:
        yield process
    finally:
        stop_process(process)


def _run_in_image(manifest: dict, argv: list[str], data: Path | None = None,
                  timeout: float = 120) -> subprocess.CompletedProcess:
    with run_in_image(manifest, argv, data, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        stdout, stderr = process.communicate(timeout=timeout)
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read().decode()


def _uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for pid {pid}")


# --- no build needed -------------------------------------------------------------------------------

def test_containerfile_targets_share_the_non_root_read_only_runtime():
    stages = load_script("scripts/build_rootfs.py").parse_containerfile()
    for target, entrypoint in (("gpuwarden", ["gpuwarden"]), ("exporter", ["python", "-m", "gpuwarden.exporter"])):
        stage = stages[target]
        assert stage["from"] == "runtime" and stage["entrypoint"] == entrypoint
        assert stage["user"] == f"{IMAGE_UID}:{IMAGE_UID}"
        env = stage["env"]
        assert env["PATH"].startswith("/opt/gpuwarden/bin:")
        # Everything Python, pip and Streamlit write goes under the writable /tmp mount.
        for name in ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "PYTHONPYCACHEPREFIX"):
            assert env[name] == "/tmp" or env[name].startswith("/tmp/"), name


def test_exporter_variant_requires_only_what_the_exporter_imports(tmp_path):
    install = load_script("scripts/image/install.py")
    wheel = tmp_path / "gpuwarden-0.1.0-py3-none-any.whl"
    pyproject = (ROOT / "pyproject.toml").read_text()
    declared = tomllib.loads(pyproject)["project"]["dependencies"]
    metadata = "Metadata-Version: 2.1\nName: gpuwarden\n" + "".join(f"Requires-Dist: {d.split('#')[0].strip()}\n" for d in declared)
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("gpuwarden-0.1.0.dist-info/METADATA", metadata)
    names = sorted(r.split(">")[0].split("=")[0].split("<")[0] for r in install.requirements(wheel, "exporter"))
    assert names == sorted(["prometheus-client", "nvidia-ml-py", "grpcio", "protobuf"])
    assert install.requirements(wheel, "full") == [str(wheel)]


# --- the Debian-built root file system ----------------------------------------------------------------

def test_exporter_serves_metrics_from_the_debian_rootfs(exporter_image, data_dir):
    """The DaemonSet's image, started as UID 10001 on a read-only root, serves the replayed H200."""
    assert exporter_image["rootfs_bytes"] < SIZE_TARGET_BYTES, exporter_image["rootfs_bytes"]
    port = _free_port()
    argv = [*exporter_image["entrypoint"], "--backend", "replay", "--listen", f"127.0.0.1:{port}",
            "--kubelet-socket", "none", "--interval", "1", "--node-name", "image-test"]
    with run_in_image(exporter_image, argv, data_dir, EXPORTER_TMP_BYTES, stdout=subprocess.PIPE,
                      stderr=subprocess.STDOUT, text=True) as process:
        def metrics():
            if process.poll() is not None:
                raise AssertionError(f"the exporter exited {process.returncode}: {process.stdout.read()}")
            status, body = _get(f"http://127.0.0.1:{port}/metrics")
            return body if status == 200 and "DCGM_FI_DEV_GPU_UTIL{" in body else None

        body = wait_for(metrics, timeout=60, what="/metrics from the exporter in the image", interval=0.2,
                        tolerate_errors=True)
        assert _uid_of(process.pid) == IMAGE_UID
        assert _get(f"http://127.0.0.1:{port}/healthz")[0] == 200
    samples = [line for line in body.splitlines() if line.startswith("DCGM_FI_DEV_GPU_UTIL{")]
    assert len(samples) == 1 and 'modelName="NVIDIA H200"' in samples[0] and 'node="image-test"' in samples[0]


def test_the_image_root_is_read_only_and_tmp_is_not(exporter_image):
    probe = ("import os, errno\n"
             "try:\n    open('/opt/gpuwarden/x', 'w')\nexcept OSError as e:\n    print('root', errno.errorcode[e.errno])\n"
             "open(os.path.join(os.environ['HOME'], 'ok'), 'w').write('1')\n"
             "print('uid', os.getuid(), 'root_ro', bool(os.statvfs('/').f_flag & os.ST_RDONLY))\n")
    result = _run_in_image(exporter_image, ["python", "-c", probe])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["root EROFS", f"uid {IMAGE_UID} root_ro True"]


# Run in the full image after a CLI simulation and report: every gpuwarden module imports (the
# dashboard's page scripts run under Streamlit below), and the dashboard renders its first page over
# the simulated store (Streamlit's AppTest: the app's script run headless, no browser).
FULL_IMAGE_PROBE = """
import importlib, json, pkgutil, sys
import gpuwarden
names = [m.name for m in pkgutil.walk_packages(gpuwarden.__path__, "gpuwarden.")
         if not m.name.endswith("__main__") and not m.name.startswith("gpuwarden.dashboards.views.")]
for name in names:
    importlib.import_module(name)
print("imported", len(names), "gpuwarden modules")
print("idle report gpus", json.load(open("/tmp/idle.json"))["summary"]["gpus"])
from streamlit.testing.v1 import AppTest
app = AppTest.from_file(sys.argv[1], default_timeout=120)
app.run()
assert not app.exception, app.exception
print("dashboard GPUs reporting", {m.label: m.value for m in app.metric}["GPUs reporting"])
import os
cached = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.environ["PYTHONPYCACHEPREFIX"]) for f in fs)
print(f"bytecode cached under /tmp: {cached / 2**20:.0f} MiB")
"""


def test_full_image_runs_the_whole_stack_from_its_entrypoint(full_image, data_dir, request):
    """The default target after slimming: ``gpuwarden --help``, a simulation into a store, a report
    over it, every module imported and the dashboard rendered, as UID 10001 on a read-only root."""
    # The chart's dashboard Deployment runs this file with `streamlit run`.
    app = yaml.safe_load((ROOT / "helm" / "gpuwarden" / "values.yaml").read_text())["dashboard"]["app"]
    assert (Path(full_image["rootfs"]) / app.lstrip("/")).is_file(), app
    gpuwarden = shlex.join(full_image["entrypoint"])
    # One session, so each command reuses the bytecode the ones before it cached under /tmp.
    script = " && ".join([
        f"{gpuwarden} --help",
        f"{gpuwarden} sim generate --days 1 --nodes 2 --gpus-per-node 2 --step-seconds 600 --store /tmp/store",
        f"{gpuwarden} report idle --store /tmp/store --since 7d --format json > /tmp/idle.json",
        f"GPUWARDEN_STORE=/tmp/store python -c {shlex.quote(FULL_IMAGE_PROBE)} {shlex.quote(app)}",
    ])
    result = _run_in_image(full_image, ["sh", "-c", script], data_dir, timeout=600)  # the simulator's traces
    assert result.returncode == 0, result.stderr[-3000:]
    assert "usage: gpuwarden" in result.stdout and "576 samples for 4 GPUs" in result.stdout, result.stdout[-2000:]
    assert "idle report gpus 4" in result.stdout and "dashboard GPUs reporting 4 of 4" in result.stdout, result.stdout[-2000:]
    # The target is < 400 MB, which the exporter image meets; the whole stack measures ~501 MB
    # after slimming (docs/helm.md). This bound fails when a slimming step silently stops working.
    assert full_image["rootfs_bytes"] < FULL_IMAGE_BOUND_BYTES, full_image["rootfs_bytes"]
    build = load_script("scripts/build_rootfs.py")
    _report(request, f"full image: {build.size_text(full_image['rootfs_bytes'])} (target < 400 MB); "
                     f"{result.stdout.splitlines()[-1]}")


# --- make image: engine detection (stub engines on PATH: no engine can build here) ---------------------

def _stub_engines(directory: Path, working: str | None) -> None:
    """podman, buildah and docker stubs: ``info`` fails except for ``working``, whose ``build`` logs its
    arguments. They stand in for real engines, which cannot pull a base image in this sandbox."""
    for engine in ("podman", "buildah", "docker"):
        ok = engine == working
        script = directory / engine
        script.write_text("#!/bin/sh\n"
                          f'if [ "$1" = info ]; then {"exit 0" if ok else "echo cannot connect to the daemon >&2; exit 1"}; fi\n'
                          f'echo "$@" >> "{directory}/calls"\n')
        script.chmod(0o755)


def _make_image(directory: Path, **env: str) -> subprocess.CompletedProcess:
    inherited = {k: v for k, v in os.environ.items() if k != "PYTHON_IMAGE"}
    return subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "image"], capture_output=True, text=True,
                          timeout=60, env={**inherited, "PATH": f"{directory}:{os.environ['PATH']}", **env}, check=False)


def test_make_image_says_clearly_when_no_engine_works(tmp_path):
    _stub_engines(tmp_path, working=None)
    result = _make_image(tmp_path)
    assert result.returncode != 0
    assert "no working container engine" in result.stderr
    for engine in ("podman", "buildah", "docker"):
        assert f"{engine} (installed, but '{engine} info' fails" in result.stderr
    assert "scripts/build_rootfs.py" in result.stderr  # the way without a registry
    assert not (tmp_path / "calls").exists()


@pytest.mark.parametrize("engine", ["podman", "docker"])
def test_make_image_builds_both_targets_with_the_first_working_engine(tmp_path, engine):
    _stub_engines(tmp_path, working=engine)
    result = _make_image(tmp_path, IMAGE="registry.example/team/gw")
    assert result.returncode == 0, result.stderr
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[:2] == [f"build -f Containerfile --target gpuwarden -t registry.example/team/gw:{version} .",
                         f"build -f Containerfile --target exporter -t registry.example/team/gw:{version}-exporter ."]
    # The chart's defaults are what a plain `make image` names.
    values = yaml.safe_load((ROOT / "helm" / "gpuwarden" / "values.yaml").read_text())
    chart = yaml.safe_load((ROOT / "helm" / "gpuwarden" / "Chart.yaml").read_text())
    env = {k: v for k, v in os.environ.items() if k not in {"IMAGE", "TAG", "ENGINE", "PYTHON_IMAGE"}}
    dry_run = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "-n", "image"], env=env,
                             capture_output=True, text=True, timeout=60, check=False).stdout
    assert f"IMAGE={values['image']['repository']} TAG={version} " in dry_run
    assert chart["appVersion"] == version and values["exporter"]["image"]["tagSuffix"] == "-exporter"


def test_make_image_takes_the_base_from_python_image(tmp_path):
    """A registry mirror's copy of the base (air-gapped clusters) goes to every stage as a build arg."""
    _stub_engines(tmp_path, working="buildah")
    result = _make_image(tmp_path, IMAGE="gw", TAG="dev", PYTHON_IMAGE="mirror.example/python:3.11-slim-bookworm")
    assert result.returncode == 0, result.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[:2] == [
        f"build --layers --build-arg=PYTHON_IMAGE=mirror.example/python:3.11-slim-bookworm -f Containerfile "
        f"--target {target} -t gw:{tag} ." for target, tag in (("gpuwarden", "dev"), ("exporter", "dev-exporter"))]
    assert "from mirror.example/python:3.11-slim-bookworm" in result.stderr
