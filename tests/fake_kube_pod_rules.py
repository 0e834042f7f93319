"""The API server's validation of pods, as ``tests/fake_kube_api.py`` enforces it.

No kube-apiserver can run here, so these are the rules of ``ValidatePodCreate`` /
``ValidatePodUpdate`` and the binding subresource (Kubernetes 1.30+, Pod Scheduling Readiness GA),
rewritten over plain JSON, with the real messages:
- ``spec.schedulingGates`` may only be removed after creation, never added;
- while a pod is gated (and unbound) its required node affinity may only be tightened: set when it
  had none; else the same number of ``nodeSelectorTerms``, each keeping every requirement it had
  (``matchExpressions`` and ``matchFields``) and only gaining new ones; ``spec.nodeSelector`` may
  only gain keys. Preferred node affinity is free while gated (the real code swaps the whole
  ``nodeAffinity`` back after checking the required part);
- once ungated or bound, those fields are immutable like the rest of the spec, except container
  images and tolerations additions (the real exceptions gpuwarden's tests touch);
- ``spec.nodeName`` is set only by ``POST pods/NAME/binding`` (or at creation on an ungated pod);
  binding a gated or bound pod is a 409 Conflict on ``pods/binding``.
Created pods and Jobs also meet name and template validation (``job_create_causes``), and a Job's
update the rule of KEP-2926 (``job_update_refusal``: its template changes only in its scheduling
directives, only while suspended and never started).
Each rule answers a list of causes ``(field, reason, message)``; empty means allowed.
"""

from __future__ import annotations

import copy
import json
import re

Cause = tuple[str, str, str]  # (field path, StatusCause reason, message after the field path)

FORBIDDEN_UPDATE = ("pod updates may not change fields other than `spec.containers[*].image`,"
                    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` "
                    "(only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
                    "(allow it to be set to 1 if it was previously negative)")
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
AFFINITY_PATH = "spec.affinity.nodeAffinity"


def forbidden(path: str, detail: str) -> Cause:
    return path, "FieldValueForbidden", f"Forbidden: {detail}"


def invalid(path: str, value: object, detail: str) -> Cause:
    return path, "FieldValueInvalid", f"Invalid value: {json.dumps(value, sort_keys=True)}: {detail}"


def invalid_status(kind: str, name: str, causes: list[Cause]) -> dict:
    """The 422 Status the API server answers for a validation failure (one cause, or [a, b])."""
    errors = [f"{path}: {message}" for path, _, message in causes]
    text = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Invalid", "code": 422,
            "message": f'{kind} "{name}" is invalid: {text}',
            "details": {"name": name, "kind": kind.split(".")[0].lower() + "s",
                        "causes": [{"reason": r, "message": m, "field": p} for p, r, m in causes]}}


def _gate_names(spec: dict) -> list[str]:
    return [str((g or {}).get("name")) for g in spec.get("schedulingGates") or ()]


RFC1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
NAME_RULE = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
             "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
             "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")


def _name_causes(name: str, longest: int) -> list[Cause]:
    if not RFC1123_SUBDOMAIN.match(name) or len(name) > 253:
        return [invalid("metadata.name", name, NAME_RULE)]
    if len(name) > longest:
        return [invalid("metadata.name", name, f"must be no more than {longest} characters")]
    return []


def _template_causes(spec: dict, path: str) -> list[Cause]:
    if not spec.get("containers"):
        return [(f"{path}.containers", "FieldValueRequired", "Required value")]
    return []


def job_create_causes(job: dict) -> list[Cause]:
    """ValidateJob, the parts a submitted Job meets: its name (a label value, so at most 63) and its template."""
    template = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    causes = _name_causes(job["metadata"].get("name", ""), 63) + _template_causes(template, "spec.template.spec")
    if template.get("restartPolicy") not in ("Never", "OnFailure"):
        causes.append(("spec.template.spec.restartPolicy", "FieldValueRequired",
                       'Required value: valid values: "OnFailure", "Never"'))
    return causes


def node_field_selector_causes(affinity: dict | None, spec_path: str) -> list[Cause]:
    """Node field selectors (``matchFields``): only metadata.name, and one value for In / NotIn."""
    causes = []
    for i, term in enumerate(_terms(affinity) or ()):
        for j, req in enumerate(term.get("matchFields") or ()):
            where = f"{spec_path}.affinity.nodeAffinity.{REQUIRED}.nodeSelectorTerms[{i}].matchFields[{j}]"
            if req.get("key") != "metadata.name":
                causes.append((f"{where}.key", "FieldValueInvalid",
                               f"Invalid value: {req.get('key')!r}: not a valid field selector key"))
            elif req.get("operator") in ("In", "NotIn") and len(req.get("values") or ()) != 1:
                causes.append((f"{where}.values", "FieldValueRequired", "Required value: must be only one value when "
                               "`operator` is 'In' or 'NotIn' for node field selector"))
    return causes


def pod_create_causes(pod: dict) -> list[Cause]:
    spec = pod.get("spec") or {}
    causes: list[Cause] = (_name_causes(pod["metadata"].get("name", ""), 253) + _template_causes(spec, "spec")
                           + node_field_selector_causes(spec.get("affinity"), "spec"))
    names = _gate_names(spec)
    for i, name in enumerate(names):
        if name in names[:i]:
            causes.append((f"spec.schedulingGates[{i}].name", "FieldValueDuplicate", f'Duplicate value: "{name}"'))
    if names and spec.get("nodeName"):
        causes.append(forbidden("spec.nodeName", "cannot be set until all schedulingGates have been cleared"))
    return causes


def _only_deleted_gates(new: list[str], old: list[str]) -> list[Cause]:
    return [forbidden(f"spec.schedulingGates[{i}].name", f"only deletion is allowed, but found new scheduling gate '{name}'")
            for i, name in enumerate(new) if name not in old]


def _node_selector_causes(new: dict, old: dict) -> list[Cause]:
    if any(k not in new or new[k] != v for k, v in old.items()):
        return [invalid("spec.nodeSelector", new, "only additions to spec.nodeSelector are allowed (no mutations or deletions)")]
    return []


def _terms(affinity: dict | None) -> list[dict] | None:
    required = ((affinity or {}).get("nodeAffinity") or {}).get(REQUIRED)
    return None if required is None else list(required.get("nodeSelectorTerms") or ())


def _node_affinity_causes(new_affinity: dict | None, old_affinity: dict | None) -> list[Cause]:
    old_terms, new_terms = _terms(old_affinity), _terms(new_affinity) or []
    if not old_terms:  # nothing required before: anything may be set
        return []
    path = f"{AFFINITY_PATH}.{REQUIRED}.nodeSelectorTerms"
    if len(old_terms) != len(new_terms):
        return [invalid(path, new_terms, "no additions/deletions to non-empty NodeSelectorTerms list are allowed")]
    causes = []
    for i, (old, new) in enumerate(zip(old_terms, new_terms)):
        for part in ("matchExpressions", "matchFields"):
            kept = list(new.get(part) or ())
            if any(requirement not in kept for requirement in old.get(part) or ()):
                causes.append(invalid(f"{path}[{i}].{part}", new.get(part) or [],
                                      "only additions are allowed (no mutations or deletions)"))
    return causes


def _clean(value):
    """Empty and null fields are the same as absent ones (the server's defaulting makes them so)."""
    if isinstance(value, dict):
        kept = {k: _clean(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v not in (None, {}, [], "")}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def pod_update_causes(old_pod: dict, new_pod: dict) -> list[Cause]:
    old, new = old_pod.get("spec") or {}, copy.deepcopy(new_pod.get("spec") or {})
    old_gates = _gate_names(old)
    causes = _only_deleted_gates(_gate_names(new), old_gates) + node_field_selector_causes(new.get("affinity"), "spec")
    # What may change is checked above and below, then swapped back, so the remainder must be equal.
    new["schedulingGates"] = old.get("schedulingGates")
    if old_gates and not old.get("nodeName"):
        causes += _node_selector_causes(new.get("nodeSelector") or {}, old.get("nodeSelector") or {})
        causes += _node_affinity_causes(new.get("affinity"), old.get("affinity"))
        new["nodeSelector"] = old.get("nodeSelector")
        affinity = dict(new.get("affinity") or {})
        affinity["nodeAffinity"] = (old.get("affinity") or {}).get("nodeAffinity")
        new["affinity"] = affinity
    for part in ("containers", "initContainers"):
        for mine, before in zip(new.get(part) or (), old.get(part) or ()):
            if isinstance(mine, dict) and isinstance(before, dict):
                mine["image"] = before.get("image")
    tolerations = list(new.get("tolerations") or ())
    if all(t in tolerations for t in old.get("tolerations") or ()):
        new["tolerations"] = old.get("tolerations")
    if "activeDeadlineSeconds" in new or "activeDeadlineSeconds" in old:
        new["activeDeadlineSeconds"] = old.get("activeDeadlineSeconds")
    clean_old, clean_new = _clean(old), _clean(new)
    if clean_old != clean_new:
        changed = sorted(k for k in set(clean_old) | set(clean_new) if clean_old.get(k) != clean_new.get(k))
        causes.append(forbidden("spec", f"{FORBIDDEN_UPDATE}\n  changed: {', '.join(changed)}"))
    return causes


SYSTEM_PRIORITY_CLASSES = {"system-cluster-critical": 2000000000, "system-node-critical": 2000001000}


def priority_admission(pod: dict, classes: dict[str, dict]) -> str | None:
    """The Priority admission plugin on pod create: ``spec.priority`` (and ``preemptionPolicy``) from the
    PriorityClass named by ``spec.priorityClassName`` (else the global default, else 0); the 403 message, or None."""
    spec, name = pod.setdefault("spec", {}), pod["metadata"].get("name") or pod["metadata"].get("generateName", "")
    wanted = spec.get("priorityClassName")
    if wanted:
        chosen = classes.get(wanted) or ({"value": SYSTEM_PRIORITY_CLASSES[wanted]} if wanted in SYSTEM_PRIORITY_CLASSES else None)
        if chosen is None:
            return f'pods "{name}" is forbidden: no PriorityClass with name {wanted} was found'
    else:
        chosen = next((c for _, c in sorted(classes.items()) if c.get("globalDefault")), {"value": 0})
    value = int(chosen.get("value", 0))
    if spec.get("priority") is not None and int(spec["priority"]) != value:
        return (f'pods "{name}" is forbidden: the integer value of priority ({spec["priority"]}) must not be provided in '
                f"pod spec; priority admission controller computed {value} from the given PriorityClass name")
    policy = chosen.get("preemptionPolicy") or "PreemptLowerPriority"
    if spec.get("preemptionPolicy") and spec["preemptionPolicy"] != policy:
        return (f'pods "{name}" is forbidden: the string value of PreemptionPolicy ({spec["preemptionPolicy"]}) must not '
                f"be provided in pod spec; priority admission controller computed {policy} from the given PriorityClass name")
    spec["priority"], spec["preemptionPolicy"] = value, policy
    return None


def binding_refusal(pod: dict) -> str | None:
    """Why the binding subresource refuses (a 409 Conflict on pods/binding), or None."""
    name, spec = pod["metadata"]["name"], pod.get("spec") or {}
    if pod["metadata"].get("deletionTimestamp"):
        return f"pod {name} is being deleted, cannot be assigned to a host"
    if spec.get("nodeName"):
        return f'pod {name} is already assigned to node "{spec["nodeName"]}"'
    if spec.get("schedulingGates"):
        return f"pod {name} has non-empty .spec.schedulingGates"
    return None


def bind(pod: dict, node: str, now_iso: str) -> dict:
    """The pod after a successful binding: nodeName set and condition PodScheduled=True."""
    pod = copy.deepcopy(pod)
    pod.setdefault("spec", {})["nodeName"] = node
    status = pod.get("status") or {}
    pod["status"] = status
    status.pop("nominatedNodeName", None)
    conditions = [c for c in status.get("conditions") or () if c.get("type") != "PodScheduled"]
    status["conditions"] = [*conditions, {"type": "PodScheduled", "status": "True", "lastTransitionTime": now_iso}]
    return pod


# What KEP-2926 lets change in a Job's pod template, and only while the Job is suspended and has
# no status.startTime (it has not run, or, from Kubernetes 1.36, its controller cleared it once its pods ended).
JOB_TEMPLATE_SCHEDULING_FIELDS = {"metadata": ("labels", "annotations"),
                                  "spec": ("affinity", "nodeSelector", "tolerations", "schedulingGates")}


def job_update_refusal(current: dict, updated: dict) -> str | None:
    """The API server's validation of a Job update: None when allowed."""
    if not updated.get("spec", {}).get("suspend") and current.get("status", {}).get("startTime") \
            and not updated.get("status", {}).get("startTime"):
        return "status.startTime: Required value: startTime cannot be removed for unsuspended job"
    old, new = current.get("spec", {}).get("template", {}), updated.get("spec", {}).get("template", {})
    if old == new:
        return None
    def without_scheduling(template):
        return {part: {k: v for k, v in (template.get(part) or {}).items() if k not in fields}
                for part, fields in JOB_TEMPLATE_SCHEDULING_FIELDS.items()}
    mutable = current.get("spec", {}).get("suspend") and not current.get("status", {}).get("startTime")
    if not mutable or without_scheduling(old) != without_scheduling(new):
        return "spec.template: Invalid value: field is immutable"
    causes = node_field_selector_causes(new.get("spec", {}).get("affinity"), "spec.template.spec")
    return f"{causes[0][0]}: {causes[0][2]}" if causes else None

