"""The names gpuwarden uses on workload objects (labels, annotations, its scheduling gate): one
place, shared by the Kubernetes adapter (which reads and writes them), the live scheduling round,
the portal and the chart's docs. They are the seam's vocabulary: a cluster that is not Kubernetes
(the simulator) carries the same annotations on its workloads.

Admission by scheduling gate (Pod Scheduling Readiness, GA in Kubernetes 1.30): a pod in a
namespace labelled ``gpuwarden.io/queue=<team or queue>`` is created with the scheduling gate
``gpuwarden.io/admission`` (added by gpuwarden's mutating webhook, or written by the user). While a
pod is gated kube-scheduler ignores it; gpuwarden's scheduler decides when and where it runs, adds
a required node affinity to the planned node (a gated pod's node affinity may only be tightened)
and removes the gate (gates may only be removed), in one PATCH per pod. kube-scheduler then binds
it and enforces everything else. Kueue-managed pods are Kueue's (it has its own gate).
"""

from __future__ import annotations

ADMISSION_GATE = "gpuwarden.io/admission"
QUEUE_LABEL = "gpuwarden.io/queue"  # on a namespace: its pods queue in gpuwarden; the value names the team
GANG_LABEL = "gpuwarden.io/gang"  # on pods: the gang (workload) they belong to when no owner names one
GANG_SIZE_LABEL = "gpuwarden.io/gang-size"  # on pods of a gang: how many pods it has in all
KUEUE_GATE = "kueue.x-k8s.io/admission"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

# Annotations gpuwarden writes (on each pod of a workload; on the Job where there is one)
ADMITTED_NODE_ANNOTATION = "gpuwarden.io/admitted-node"  # the node the scheduler admitted the pod to
ADMITTED_AT_ANNOTATION = "gpuwarden.io/admitted-at"  # when (ISO-8601 UTC)
QUEUE_POSITION_ANNOTATION = "gpuwarden.io/queue-position"
QUEUE_REASON_ANNOTATION = "gpuwarden.io/queue-reason"
ESTIMATED_START_ANNOTATION = "gpuwarden.io/estimated-start"  # ISO-8601 UTC, absent when unknown
# Written with a resume: the node of each pod the plan placed it on (comma-separated, pod order) and
# when. Until those pods are admitted there (or RESERVATION lapses) the snapshot holds the GPUs for them.
RESERVED_NODES_ANNOTATION = "gpuwarden.io/reserved-nodes"
RESERVED_AT_ANNOTATION = "gpuwarden.io/reserved-at"
SUSPENDED_BY_ANNOTATION = "gpuwarden.io/suspended-by"  # "scheduler" or "idle-reclaim": who may resume it
RESUME_REQUESTED_ANNOTATION = "gpuwarden.io/resume-requested"  # the owner's notice: resume what idle reclaim held
REQUESTED_BY_ANNOTATION = "gpuwarden.io/requested-by"  # the portal user who submitted the Job
CHECKPOINT_ANNOTATION = "gpuwarden.io/checkpointable"  # "true": the workload saves and may be suspended and resumed
PRIORITY_CLASS_ANNOTATION = "gpuwarden.io/priority-class"  # a team lead's override of the queue priority class

# SUSPENDED_BY_ANNOTATION's value on what idle reclaim suspended: the scheduler never resumes it
# until its owner asks (RESUME_REQUESTED_ANNOTATION)
SUSPENDED_BY_IDLE_RECLAIM = "idle-reclaim"

# A drain's mode, on a node or namespace label (read by the Kubernetes adapter's drain; the plan
# states it): immediate, allow-completion or suspend-first
DRAIN_MODE_LABEL = "gpuwarden.io/drain-mode"

# The checkpoint-first drain (docs/remediation.md): before a drain evicts checkpointable work,
# gpuwarden writes a request on the workload's pods and Job; the trainer answers on its pod or Job;
# the drain goes ahead once every asked workload answered, or at the deadline.
CHECKPOINT_REQUEST_ANNOTATION = "gpuwarden.io/checkpoint-request"  # gpuwarden: the request id
CHECKPOINT_DEADLINE_ANNOTATION = "gpuwarden.io/checkpoint-deadline"  # gpuwarden: ISO-8601 UTC; it drains then
CHECKPOINT_DONE_ANNOTATION = "gpuwarden.io/checkpoint-done"  # the trainer: the request id it answers
CHECKPOINT_DONE_AT_ANNOTATION = "gpuwarden.io/checkpoint-done-at"  # the trainer: its checkpoint's time (ISO-8601)
# The trainer, after every checkpoint it saves (optional): what the plan's GPU-hours at risk count from
LAST_CHECKPOINT_ANNOTATION = "gpuwarden.io/last-checkpoint-at"
