"""The portal's submissions: team templates, a request checked against its team's template, the
``batch/v1`` Job it becomes, and a team lead's priority change.

Templates (helm values ``portal.teams``, rendered into a ConfigMap mounted where
``GPUWARDEN_PORTAL_TEMPLATES`` points; see :func:`load_templates`)::

    teams:
      research:                      # the team: the namespace's gpuwarden.io/queue value
        namespace: research
        images: ["nvcr.io/nvidia/pytorch:24.05-py3"]
        shapes: [{gpus: 1}, {gpus: 8, pods: 4}, {migProfile: 1g.10gb}, {sharedGpu: true}]
        priorityClasses: [low, normal, high]   # PriorityClass names the Job may use
        leads: ["alice@example.com"]          # may raise / lower this team's jobs within priorityClasses
        maxGpus: 32

A shape's ``gpus`` are per pod; ``pods`` > 1 is a gang (the Job's parallelism). A request is
refused, naming the field and the allowed values, when it leaves its template. The Job carries the
scheduling gate ``gpuwarden.io/admission`` itself, so it queues in gpuwarden even where the
admission webhook is off, and the requester's identity as an annotation. A team lead's priority
change is a merge PATCH of the Job's ``gpuwarden.io/priority-class`` annotation, which the cluster
snapshot reads as the workload's priority override (the scheduler plans a Kueue
WorkloadPriorityClass change where Kueue manages the Job).

Where a request goes (the Kubernetes API, or the demo's scheduler endpoint) is
:mod:`.submitters`. Which teams a signed-in identity may submit for (the file's ``groups``: the
identity provider's group -> team) and the submit path that enforces it are :mod:`.access`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuwarden.fleet import GpuRequest, PriorityClass, Workload, WorkloadKind
from gpuwarden.fleet.errors import UserError
from gpuwarden.fleet.mig_geometry import UnknownMigProfile, check_profile

from gpuwarden.fleet.object_names import ADMISSION_GATE, CHECKPOINT_ANNOTATION, REQUESTED_BY_ANNOTATION

TEMPLATES_ENV = "GPUWARDEN_PORTAL_TEMPLATES"
PORTAL_LABEL = "app.kubernetes.io/created-by"  # on the Job and its pods: which Jobs the portal made
PORTAL_LABEL_VALUE = "gpuwarden-portal"
SHARED_GPU_RESOURCE = "nvidia.com/gpu.shared"  # the device plugin's renamed time-sliced resource
NAME_MAX_CHARS = 52  # generateName adds 5 characters; a Job's name (and its pods' label) must stay <= 63
CHECKPOINT_INTERVAL_SECONDS = 600.0  # what the Kubernetes snapshot assumes of a checkpointable Job
NAME_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")

DOCUMENT_KEYS = ("teams", "groups", "groupsClaim")  # groups, groupsClaim: who submits for which team (.access)
TEMPLATE_KEYS = ("namespace", "images", "shapes", "priorityClasses", "leads", "maxGpus")
SHAPE_KEYS = ("gpus", "pods", "migProfile", "sharedGpu")
REQUEST_KEYS = ("team", "name", "image", "shape", "priorityClass", "checkpointable", "command")


class PortalError(UserError, ValueError):
    """A template file or a request the portal cannot use; one line naming the key and what is allowed."""


# -- shapes and templates ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """What each pod asks for (exactly one of whole GPUs, a MIG profile or a shared GPU) and how
    many pods the Job runs at once (a gang when more than one)."""

    gpus: int = 0
    pods: int = 1
    mig_profile: str | None = None
    shared_gpu: bool = False

    @classmethod
    def from_mapping(cls, raw: object, where: str) -> Shape:
        if not isinstance(raw, Mapping):
            raise PortalError(f"{where}: a shape is a mapping of {', '.join(SHAPE_KEYS)}; got {raw!r}")
        _known_keys(raw, SHAPE_KEYS, where)
        gpus, pods = raw.get("gpus", 0), raw.get("pods", 1)
        profile, shared = raw.get("migProfile"), raw.get("sharedGpu", False)
        if not _whole(gpus) or gpus < 0:
            raise PortalError(f"{where}: gpus {gpus!r}: a whole number of GPUs per pod, at least 1")
        if not _whole(pods) or pods < 1:
            raise PortalError(f"{where}: pods {pods!r}: a whole number of pods, at least 1")
        if not isinstance(shared, bool):
            raise PortalError(f"{where}: sharedGpu {shared!r}: true or false")
        if profile is not None:
            if not isinstance(profile, str):
                raise PortalError(f"{where}: migProfile {profile!r}: a MIG profile name such as 1g.10gb")
            try:
                check_profile(profile)
            except UnknownMigProfile as error:
                raise PortalError(f"{where}: {error}") from None
        if sum((gpus > 0, profile is not None, shared)) != 1:
            raise PortalError(f"{where}: a shape asks for exactly one of gpus (>= 1), migProfile or sharedGpu: true; "
                              f"got {dict(raw)!r}")
        return cls(int(gpus), int(pods), profile, shared)

    def to_mapping(self) -> dict[str, Any]:
        each: dict[str, Any] = ({"gpus": self.gpus} if self.gpus else {"migProfile": self.mig_profile}
                                if self.mig_profile else {"sharedGpu": True})
        return each | ({"pods": self.pods} if self.pods > 1 else {})

    @property
    def label(self) -> str:
        each = (f"{self.gpus} GPU{'s' * (self.gpus > 1)}" if self.gpus else f"MIG {self.mig_profile}"
                if self.mig_profile else "a shared GPU")
        return f"{self.pods} pods x {each}" if self.pods > 1 else each

    def gpu_request(self, shared_fraction_milli: int = 1000) -> GpuRequest:
        """Each pod's request in the fleet vocabulary (a shared GPU as ``shared_fraction_milli``)."""
        if self.mig_profile is not None:
            return GpuRequest(mig_profile=self.mig_profile)
        if self.shared_gpu:
            return GpuRequest(count=1, fraction_milli=shared_fraction_milli)
        return GpuRequest(count=self.gpus)

    @property
    def gpu_equivalents(self) -> float:
        """Whole GPUs the Job holds, counted against ``maxGpus``: a MIG instance by its compute
        share; a shared GPU as a whole one (its replicas are the node's, not the template's)."""
        return self.pods * self.gpu_request().gpu_equivalents

    def limits(self) -> dict[str, str]:
        """Each container's extended-resource limits (requests default to them)."""
        if self.mig_profile is not None:
            return {f"nvidia.com/mig-{self.mig_profile}": "1"}
        if self.shared_gpu:
            return {SHARED_GPU_RESOURCE: "1"}
        return {"nvidia.com/gpu": str(self.gpus)}


@dataclass(frozen=True)
class TeamTemplate:
    team: str
    namespace: str
    images: tuple[str, ...]
    shapes: tuple[Shape, ...]
    priority_classes: tuple[str, ...]
    leads: tuple[str, ...] = ()
    max_gpus: float | None = None

    def is_lead(self, identity: str) -> bool:
        return identity.strip().lower() in {lead.lower() for lead in self.leads}


def load_templates(path: str | os.PathLike[str]) -> dict[str, TeamTemplate]:
    """The teams' templates in the file at ``path`` (YAML or JSON), by team. PortalError names the
    file, the team and the key when the file is not the documented schema."""
    return parse_templates(read_document(path), str(path))


def read_document(path: str | os.PathLike[str]) -> object:
    """The portal file at ``path`` as parsed YAML; PortalError, one line, when it cannot be read."""
    try:
        return yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise PortalError(f"portal templates {path}: cannot read ({str(error).splitlines()[0]})") from None


def parse_templates(document: object, source: str = "portal templates") -> dict[str, TeamTemplate]:
    if not isinstance(document, Mapping) or not isinstance(document.get("teams"), Mapping):
        raise PortalError(f"{source}: expected a mapping with key 'teams' (team -> template)")
    _known_keys(document, DOCUMENT_KEYS, source)
    return {str(team): _template(str(team), raw, f"{source}, team {team!r}") for team, raw in document["teams"].items()}


def _template(team: str, raw: object, where: str) -> TeamTemplate:
    if not isinstance(raw, Mapping):
        raise PortalError(f"{where}: a template is a mapping of {', '.join(TEMPLATE_KEYS)}")
    _known_keys(raw, TEMPLATE_KEYS, where)
    namespace = raw.get("namespace", team)
    if not isinstance(namespace, str) or not NAME_PATTERN.match(namespace):
        raise PortalError(f"{where}: namespace {namespace!r}: a Kubernetes namespace name")
    images, classes, leads = (_strings(raw.get(key, ()), key, where) for key in ("images", "priorityClasses", "leads"))
    allowed_classes = [p.value for p in PriorityClass]
    for name in classes:
        if name not in allowed_classes:
            raise PortalError(f"{where}: priorityClasses {name!r}: allowed: {', '.join(allowed_classes)}")
    shapes = raw.get("shapes", ())
    if not isinstance(shapes, Sequence) or isinstance(shapes, str):
        raise PortalError(f"{where}: shapes: a list of shapes")
    max_gpus = raw.get("maxGpus")
    if max_gpus is not None and (isinstance(max_gpus, bool) or not isinstance(max_gpus, (int, float)) or max_gpus <= 0):
        raise PortalError(f"{where}: maxGpus {max_gpus!r}: a number of GPUs above 0")
    template = TeamTemplate(team, namespace, images, tuple(Shape.from_mapping(s, f"{where}, shapes[{i}]")
                                                           for i, s in enumerate(shapes)),
                            classes, leads, None if max_gpus is None else float(max_gpus))
    for key, value in (("images", images), ("shapes", template.shapes), ("priorityClasses", classes)):
        if not value:
            raise PortalError(f"{where}: {key}: at least one is needed (the form offers only these)")
    return template


def _known_keys(raw: Mapping[Any, Any], allowed: Sequence[str], where: str) -> None:
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        raise PortalError(f"{where}: unknown key {unknown[0]!r}; allowed keys: {', '.join(allowed)}")


def _strings(value: object, key: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence) or not all(isinstance(v, str) and v for v in value):
        raise PortalError(f"{where}: {key}: a list of non-empty strings; got {value!r}")
    return tuple(value)


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# -- a request --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PortalRequest:
    """What a team member asks for on the portal; ``to_mapping`` is the body ``POST /submit`` carries."""

    team: str
    name: str
    image: str
    shape: Shape
    priority_class: str
    checkpointable: bool = False
    command: tuple[str, ...] = field(default=())

    @classmethod
    def from_mapping(cls, raw: object) -> PortalRequest:
        if not isinstance(raw, Mapping):
            raise PortalError(f"request: a mapping of {', '.join(REQUEST_KEYS)}")
        _known_keys(raw, REQUEST_KEYS, "request")
        missing = [k for k in ("team", "name", "image", "shape", "priorityClass") if k not in raw]
        if missing:
            raise PortalError(f"request: {missing[0]} is missing; needed: team, name, image, shape, priorityClass")
        command = raw.get("command") or ()
        return cls(str(raw["team"]), str(raw["name"]), str(raw["image"]), Shape.from_mapping(raw["shape"], "request shape"),
                   str(raw["priorityClass"]), raw.get("checkpointable", False),
                   _strings(command, "command", "request") if command else ())

    def to_mapping(self) -> dict[str, Any]:
        return {"team": self.team, "name": self.name, "image": self.image, "shape": self.shape.to_mapping(),
                "priorityClass": self.priority_class, "checkpointable": self.checkpointable,
                "command": list(self.command)}


def validate(request: PortalRequest, template: TeamTemplate, held_gpus: float = 0.0) -> None:
    """Refuse (PortalError, naming the field and the allowed values) a request that leaves its
    team's template. ``held_gpus``: what the team already has queued or running (maxGpus counts it)."""
    if request.team != template.team:
        raise PortalError(f"team {request.team!r}: this template is team {template.team!r}'s")
    if len(request.name) > NAME_MAX_CHARS or not NAME_PATTERN.match(request.name):
        raise PortalError(f"name {request.name!r}: 1 to {NAME_MAX_CHARS} lower-case letters, digits and '-', "
                          "starting and ending with a letter or digit")
    if request.image not in template.images:
        raise PortalError(f"image {request.image!r}: allowed for team {template.team}: {', '.join(template.images)}")
    if request.shape not in template.shapes:
        raise PortalError(f"shape {request.shape.label!r}: allowed for team {template.team}: "
                          + ", ".join(s.label for s in template.shapes))
    if request.priority_class not in template.priority_classes:
        raise PortalError(f"priorityClass {request.priority_class!r}: allowed for team {template.team}: "
                          + ", ".join(template.priority_classes))
    if not isinstance(request.checkpointable, bool):
        raise PortalError(f"checkpointable {request.checkpointable!r}: true or false")
    wanted = request.shape.gpu_equivalents
    if template.max_gpus is not None and held_gpus + wanted > template.max_gpus:
        raise PortalError(f"shape {request.shape.label!r}: {wanted:g} GPUs with the {held_gpus:g} team "
                          f"{template.team} already has queued or running exceed its maxGpus {template.max_gpus:g}")


def job_manifest(request: PortalRequest, template: TeamTemplate, identity: str) -> dict[str, Any]:
    """The ``batch/v1`` Job a request becomes (validated first). Its pods carry gpuwarden's
    scheduling gate, so they wait for the scheduler's admission even without the webhook."""
    validate(request, template)
    marks = {REQUESTED_BY_ANNOTATION: identity, CHECKPOINT_ANNOTATION: str(request.checkpointable).lower()}
    labels = {PORTAL_LABEL: PORTAL_LABEL_VALUE}
    pods = request.shape.pods
    container: dict[str, Any] = {"name": "main", "image": request.image,
                                 "resources": {"limits": request.shape.limits()}}
    if request.command:
        container["command"] = list(request.command)
    spec: dict[str, Any] = {
        "parallelism": pods, "completions": pods, "suspend": False, "backoffLimit": 0,
        "template": {"metadata": {"labels": labels, "annotations": marks}, "spec": {
            "restartPolicy": "Never", "priorityClassName": request.priority_class,
            "schedulingGates": [{"name": ADMISSION_GATE}], "containers": [container]}}}
    if pods > 1:
        spec["completionMode"] = "Indexed"  # each pod of a gang knows its rank (JOB_COMPLETION_INDEX)
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"generateName": f"{request.name}-", "namespace": template.namespace,
                         "labels": labels, "annotations": marks},
            "spec": spec}


def workload_of(request: PortalRequest, template: TeamTemplate, name: str, shared_fraction_milli: int = 1000) -> Workload:
    """The fleet workload the Job ``name`` made from ``request`` is, as the cluster snapshot reads a
    Job (one workload; gang_size = its pods; a checkpointable one checkpoints every
    :data:`CHECKPOINT_INTERVAL_SECONDS`): what a simulated cluster (the demo's ``/submit``) adds."""
    validate(request, template)
    return Workload(name=name, namespace=template.namespace, kind=WorkloadKind.TRAINING, team=template.team,
                    project=template.team, priority_class=PriorityClass(request.priority_class),
                    gpus=request.shape.gpu_request(shared_fraction_milli), gang_size=request.shape.pods,
                    checkpointable=request.checkpointable,
                    checkpoint_interval_seconds=CHECKPOINT_INTERVAL_SECONDS if request.checkpointable else None)


def check_priority_change(template: TeamTemplate, workload: str, priority_class: str, identity: str) -> tuple[str, str]:
    """(namespace, Job name) of ``workload`` ("ns/name") once ``identity`` may move it to
    ``priority_class``: a lead of its team, a class of the team's template, a Job of its namespace."""
    if not template.is_lead(identity):
        raise PortalError(f"identity {identity!r}: only team {template.team}'s leads may change its priorities "
                          f"(leads: {', '.join(template.leads) or 'none listed'})")
    if priority_class not in template.priority_classes:
        raise PortalError(f"priorityClass {priority_class!r}: allowed for team {template.team}: "
                          + ", ".join(template.priority_classes))
    namespace, _, name = workload.partition("/")
    if namespace != template.namespace or not name:
        raise PortalError(f"workload {workload!r}: not a Job of team {template.team}'s namespace {template.namespace}")
    return namespace, name


DEMO_TEMPLATES_PATH = Path(__file__).with_name("portal_demo_templates.yaml")  # the simulated fleet's teams
