"""Per-pod memory on time-sliced GPUs: NVML's compute processes mapped to pods through cgroups.

The kubelet's pod-resources API says which pods hold a GPU, but when the device plugin
time-slices it (``<uuid>::<n>`` replicas) every holder would otherwise carry the whole GPU's
values. NVML lists the compute processes on the GPU with the memory each one uses (read by the
backend in the same collection: ``GpuReading.processes``); this module maps each PID to its pod:

1. ``<proc_root>/<pid>/cgroup`` -> pod UID and container id. cgroup v2 (``0::/...``) and v1
   lines, systemd and cgroupfs drivers, containerd, CRI-O and docker scopes, e.g.
   ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope``
   or ``/kubepods/burstable/pod<uid>/<id>``. A process outside ``kubepods`` belongs to no pod.
2. The pod-resources API gives names but no UIDs, so the pod's name comes from, in order:
   a. the container runtime's OCI spec of that container id (``config.json`` annotations
      ``io.kubernetes.cri.sandbox-{namespace,name}`` for containerd,
      ``io.kubernetes.pod.{namespace,name}`` for CRI-O);
   b. the kubelet's pod folder ``<kubelet_root>/pods/<uid>/``: the pod's hostname from its
      ``etc-hosts`` (the pod name unless ``spec.hostname`` overrides it) and its namespace from the
      service-account volume ``volumes/kubernetes.io~projected/*/namespace`` when mounted. The
      name must match exactly one of the pods the kubelet says hold the GPU (with
      ``spec.hostname`` set, only the runtime spec names the pod).
   A UID neither source names counts as unresolved.

The exporter's DaemonSet needs ``hostPID: true`` (NVML lists host PIDs) and the host's
``/proc``, ``/run/containerd`` (or ``/run/containers``) and ``/var/lib/kubelet/pods`` readable at
the roots given here.

Semantics (:meth:`PodMemory.split`) for a GPU held by several pods:

- a pod's memory is the sum of ``usedGpuMemory`` of its processes on that GPU (0 when it has none
  and every process on the GPU was accounted for);
- it falls back to the GPU-wide value (``None`` here) when NVML cannot list processes on the GPU,
  when one of its processes reports no memory figure, or — for pods with no process of their own
  found — when some PID on the GPU vanished between the NVML read and the ``/proc`` read or could
  not be resolved (it may have been theirs). Each cause is logged once per GPU; nothing raises.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
from collections.abc import Sequence

from gpuwarden.fleet import GpuReading

log = logging.getLogger("gpuwarden.exporter.pods")

DEFAULT_PROC_ROOT = "/proc"
DEFAULT_KUBELET_ROOT = "/var/lib/kubelet"
# OCI specs of running containers, by container id: containerd's CRI namespace, then CRI-O.
DEFAULT_RUNTIME_CONFIGS = (
    "/run/containerd/io.containerd.runtime.v2.task/k8s.io/{id}/config.json",
    "/run/containers/storage/overlay-containers/{id}/userdata/config.json",
)
_NAMESPACE_KEYS = ("io.kubernetes.cri.sandbox-namespace", "io.kubernetes.pod.namespace")
_POD_KEYS = ("io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name")

_POD_UID = re.compile(r"kubepods.*?pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}|[0-9a-fA-F]{32})(?![0-9a-fA-F])")
_CONTAINER_ID = re.compile(r"/(?:[a-z-]+-)?([0-9a-f]{64})(?:\.scope)?/?$")
_CACHE_LIMIT = 4096

PodKey = tuple[str, str]  # (namespace, pod)


def parse_cgroup(text: str) -> tuple[str, str | None] | None:
    """The text of ``/proc/<pid>/cgroup`` -> (pod UID, container id or None); None outside kubepods.

    The cgroup v2 line (``0::``) is preferred; otherwise the first v1 line under kubepods."""
    lines = text.splitlines()
    lines.sort(key=lambda line: not line.startswith("0::"))
    for line in lines:
        path = line.split(":", 2)[-1].strip()
        match = _POD_UID.search(path)
        if match is None:
            continue
        uid = match.group(1).replace("_", "-").lower()
        container = _CONTAINER_ID.search(path[match.end():])
        return uid, container.group(1) if container else None
    return None


class _Vanished(Exception):
    """The PID exited between the NVML read and the /proc read."""


class PodMemory:
    """Split a shared GPU's memory among the pods holding it (see the module docstring).

    ``proc_root``, ``kubelet_root`` and ``runtime_configs`` (templates with ``{id}``) are where the
    host's files are; tests point them at fixture trees.
    """

    def __init__(self, proc_root: str = DEFAULT_PROC_ROOT, kubelet_root: str = DEFAULT_KUBELET_ROOT,
                 runtime_configs: Sequence[str] = DEFAULT_RUNTIME_CONFIGS):
        self.proc_root = proc_root
        self.kubelet_root = kubelet_root
        self.runtime_configs = tuple(runtime_configs)
        self._by_container: dict[str, PodKey | None] = {}
        self._by_uid: dict[str, tuple[str | None, str | None]] = {}
        self._said: set[tuple[str, str]] = set()

    def _say_once(self, gpu: str, reason: str, message: str, *args: object) -> None:
        if (gpu, reason) in self._said:
            return
        self._said.add((gpu, reason))
        log.warning(message, *args)

    # -- lookups --------------------------------------------------------------------------------
    def cgroup_of(self, pid: int) -> tuple[str, str | None] | None:
        """(pod UID, container id) of a PID; None outside kubepods; raises _Vanished or OSError."""
        try:
            with open(os.path.join(self.proc_root, str(pid), "cgroup"), encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except (FileNotFoundError, ProcessLookupError):
            raise _Vanished(pid) from None
        return parse_cgroup(text)

    def _from_runtime(self, container: str) -> PodKey | None:
        if container in self._by_container:
            return self._by_container[container]
        found: PodKey | None = None
        for template in self.runtime_configs:
            try:
                with open(template.format(id=container), encoding="utf-8") as handle:
                    annotations = json.load(handle).get("annotations") or {}
            except (OSError, ValueError, AttributeError):
                continue
            namespace = next((annotations[k] for k in _NAMESPACE_KEYS if annotations.get(k)), None)
            pod = next((annotations[k] for k in _POD_KEYS if annotations.get(k)), None)
            if namespace and pod:
                found = (str(namespace), str(pod))
                break
        if found is not None:  # a container not found yet may be found later: cache hits only
            if len(self._by_container) >= _CACHE_LIMIT:
                self._by_container.clear()
            self._by_container[container] = found
        return found

    def _from_kubelet(self, uid: str) -> tuple[str | None, str | None]:
        """(namespace or None, hostname or None) from the kubelet's folder of the pod."""
        cached = self._by_uid.get(uid)
        if cached is not None:
            return cached
        folder = os.path.join(self.kubelet_root, "pods", uid)
        hostname = namespace = None
        try:
            with open(os.path.join(folder, "etc-hosts"), encoding="utf-8", errors="replace") as handle:
                entries = [line.split() for line in handle if line.strip() and not line.lstrip().startswith("#")]
            if entries and len(entries[-1]) >= 2:
                hostname = entries[-1][-1]  # "<ip> [<fqdn>] <hostname>": the kubelet writes the pod last
        except OSError:
            pass
        for path in sorted(glob.glob(os.path.join(glob.escape(folder), "volumes", "kubernetes.io~projected", "*", "namespace"))):
            try:
                with open(path, encoding="utf-8") as handle:
                    namespace = handle.read().strip() or None
            except OSError:
                continue
            if namespace:
                break
        found = (namespace, hostname)
        if hostname is not None:
            if len(self._by_uid) >= _CACHE_LIMIT:
                self._by_uid.clear()
            self._by_uid[uid] = found
        return found

    def pod_of(self, uid: str, container: str | None, holders: Sequence[PodKey]) -> PodKey | None:
        """The pod (namespace, name) a pod UID / container id is, or None when unresolved."""
        if container is not None:
            found = self._from_runtime(container)
            if found is not None:
                return found
        namespace, hostname = self._from_kubelet(uid)
        if hostname is None:
            return None
        matches = [h for h in holders if h[1] == hostname and (namespace is None or h[0] == namespace)]
        # No unique match: a hostname override (spec.hostname) or a pod not holding the GPU; the two
        # cannot be told apart here, so it counts as unresolved rather than as nobody's memory.
        return matches[0] if len(matches) == 1 else None

    # -- the split ------------------------------------------------------------------------------
    def split(self, reading: GpuReading, holders: Sequence[PodKey]) -> dict[PodKey, float | None]:
        """Each holder's own memory on the GPU in bytes; None where it falls back to the GPU's."""
        gpu = reading.gpu_uuid
        if reading.processes is None:
            self._say_once(gpu, "unsupported", "gpu %s is shared by %d pods but NVML lists no processes on it: "
                           "each pod's DCGM_FI_DEV_FB_USED is the whole GPU's", gpu, len(holders))
            return {pod: None for pod in holders}
        own: dict[PodKey, float | None] = {pod: 0.0 for pod in holders}
        found: set[PodKey] = set()
        uncertain = 0
        for pid, used in reading.processes:
            try:
                where = self.cgroup_of(pid)
            except _Vanished:
                self._say_once(gpu, "vanished", "gpu %s: pid %d exited between the NVML and /proc reads; pods with no "
                               "process found on it keep the GPU's memory this collection (logged once)", gpu, pid)
                uncertain += 1
                continue
            except OSError as error:
                self._say_once(gpu, "unreadable", "gpu %s: cannot read the cgroup of pid %d (%s); is the host /proc "
                               "at %s with hostPID? (logged once)", gpu, pid, error, self.proc_root)
                uncertain += 1
                continue
            if where is None:
                continue  # not in a pod (a host process): nobody's series
            pod = self.pod_of(where[0], where[1], holders)
            if pod is None:
                self._say_once(gpu, "unresolved", "gpu %s: pod uid %s of pid %d names none of the pods holding the GPU "
                               "(no runtime spec or kubelet pod folder under %s) (logged once)",
                               gpu, where[0], pid, self.kubelet_root)
                uncertain += 1
                continue
            if pod not in own:
                continue  # a pod that does not hold this GPU (e.g. privileged with all GPUs visible)
            found.add(pod)
            if used is None or own[pod] is None:
                if used is None:
                    self._say_once(gpu, "no-memory", "gpu %s: NVML gives no memory figure for pid %d of pod %s/%s; "
                                   "that pod keeps the GPU's memory (logged once)", gpu, pid, *pod)
                own[pod] = None
            else:
                own[pod] = float(own[pod] or 0.0) + float(used)
        if uncertain:
            for pod in holders:
                if pod not in found:
                    own[pod] = None
        return own


def split_values(reading: GpuReading, own: float | None) -> dict[str, float]:
    """A shared GPU's values as one holder's series carries them: its own memory when known
    (``pod_memory_attributed`` 1), the GPU's otherwise (0); FB_FREE and the rest stay GPU-wide."""
    values: dict[str, float] = dict(reading.values)
    used, total = values.get("mem_used_bytes"), values.get("mem_total_bytes")
    if used is not None and total is not None and "mem_free_bytes" not in values:  # v2 memory gives free itself
        values["mem_free_bytes"] = float(total) - float(used)
    if own is None:
        values["pod_memory_attributed"] = 0.0
    else:
        values["mem_used_bytes"] = own
        values["pod_memory_attributed"] = 1.0
    return values

