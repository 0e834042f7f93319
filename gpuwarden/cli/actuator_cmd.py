"""``gpuwarden actuator``: the remediation loop against a Kubernetes cluster, and the people's side of it.

    gpuwarden actuator run  --mode observe|approve|auto --source local|file|prometheus ... \\
                            [--kubeconfig PATH | --in-cluster] [--interval 60] [--leader-elect]
                            [--maintenance-window "tue,thu 02:00-05:00"]
    gpuwarden actuator plan [same options]       one dry round, printed; nothing applied or recorded
    gpuwarden actuator list [--audit PATH]       actions waiting for approval, and applied ones (undo ids)
    gpuwarden actuator approve ID --by NAME      the running actuator applies it at its next round
    gpuwarden actuator reject ID --by NAME
    gpuwarden actuator undo ID --by NAME [--kubeconfig PATH | --in-cluster]   uncordon, untaint, resume
    gpuwarden actuator reset --by NAME           close the circuit breaker after a person has looked

Given an --audit path with no log there, these commands create nothing and say "no audit log at
PATH": list and reset exit 0 (nothing waits, nothing to reset), approve, reject and undo exit 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import sys
from typing import TYPE_CHECKING
from pathlib import Path

from gpuwarden.remediation import Actuator, AuditLog, Mode, Outcome, PlanningPolicy, Reconciler, SafetyLimits
from gpuwarden.remediation.approvals import decide, pending_from
from gpuwarden.remediation.audit import DEFAULT_AUDIT_PATH, audit_at, read_audit
from gpuwarden.remediation.breaker import breaker_verdict, record_breaker_reset
from gpuwarden.analytics.findings import failure_domains, findings_from_frame
from gpuwarden.analytics.health.device_taint_rules import findings_from_device_health
from gpuwarden.remediation.maintenance import MaintenanceWindow
from gpuwarden.remediation.domains import DomainPolicy
from gpuwarden.remediation.pacing import PacingPolicy
from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock
from gpuwarden.fleet.errors import UserError
from gpuwarden.fleet.vocabulary import Severity

if TYPE_CHECKING:
    from gpuwarden.kube import KubeCluster, LeaderElector
    from gpuwarden.fleet.runner import Runner

from .args import host_port, non_negative_float, non_negative_int, positive_float, positive_int, ratio
from .loops import failed_rounds, run_until_stopped
from .source_notes import rejected_rows_note
from .sources import add_source_options, open_window

DEFAULT_AUDIT = DEFAULT_AUDIT_PATH
log = logging.getLogger("gpuwarden.actuator")


def cluster_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Kubernetes")
    where = group.add_mutually_exclusive_group()
    where.add_argument("--kubeconfig", type=Path, help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    where.add_argument("--in-cluster", action="store_true", help="use the pod's service account")
    group.add_argument("--context", help="kubeconfig context (default: the current one)")
    group.add_argument("--page-size", type=positive_int, default=500, help="items per list page (default 500)")
    group.add_argument("--request-timeout", type=positive_float, default=10.0, help="seconds per API request (default 10)")
    group.add_argument("--namespace", default="gpuwarden", help="the actuator's namespace: its Events and Lease (default gpuwarden)")
    group.add_argument("--leaf-switch-label", default="gpuwarden.io/leaf-switch",
                       help="node label naming a node's leaf switch (gangs stay under one; default gpuwarden.io/leaf-switch, "
                            "else topology.kubernetes.io/zone)")
    group.add_argument("--nvlink-domain-label", default="nvidia.com/gpu.clique",
                       help="node label naming a node's NVLink domain (default nvidia.com/gpu.clique, GPU feature discovery's)")
    group.add_argument("--pool-label", default="gpuwarden.io/pool", help="node label naming a node's pool (default gpuwarden.io/pool)")


def _audit_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--audit", type=Path, default=DEFAULT_AUDIT, help=f"audit log, JSON lines (default {DEFAULT_AUDIT})")


def _round_options(parser: argparse.ArgumentParser) -> None:
    add_source_options(parser, since_default="1h")
    cluster_options(parser)
    _audit_option(parser)
    parser.add_argument("--mode", choices=[m.value for m in Mode], default="observe", help="default observe")
    parser.add_argument("--max-actions-per-hour", type=non_negative_int, default=10, help="default 10")
    parser.add_argument("--max-cordoned-node-ratio", type=ratio, default=0.1,
                        help="largest share of GPU nodes cordoned or tainted at once, 0..1 (default 0.1)")
    parser.add_argument("--taint", default="gpuwarden.io/unhealthy=true:NoSchedule", help="taint for unhealthy nodes")
    parser.add_argument("--notify-grace", type=positive_float, default=3600.0,
                        help="seconds a GPU idles before its owner is told (default 3600)")
    parser.add_argument("--reclaim-grace", type=positive_float, default=3600.0,
                        help="seconds after the notice before the GPU is taken back (default 3600)")
    parser.add_argument("--scheduling", default="none",
                        help="removed: scheduling runs in its own loop, 'gpuwarden scheduler run' (default none)")
    parser.add_argument("--no-hoarding", action="store_true", help="act on health findings only")
    parser.add_argument("--maintenance-window", type=_window, metavar="'DAYS HH:MM-HH:MM'",
                        help="apply cordon, taint, drain, evict, suspend and preempt only inside this UTC window, "
                             "e.g. 'tue,thu 02:00-05:00' (default: any time)")
    parser.add_argument("--protect-node", action="append", default=[], metavar="NODE",
                        help="never act on this node (repeatable; a node label gpuwarden.io/protect=true does the same)")
    parser.add_argument("--pace-proven-after", type=positive_float, default=300.0, metavar="SECONDS",
                        help="a cordon, drain, taint or evict is proven once its node is Ready with no open finding "
                             "this long; each proven one doubles its pool and detector's pace (default 300)")
    parser.add_argument("--pace-cooldown", type=positive_float, default=60.0, metavar="SECONDS",
                        help="between two rounds that start actions of one pool and detector, +0-50%% jitter (default 60)")
    parser.add_argument("--max-unhealthy-ratio-per-domain", type=ratio, default=0.2, metavar="RATIO",
                        help="largest share of a pool's, rack's or NVLink domain's nodes out of scheduling or not Ready "
                             "before its breaker holds disruptive actions there, 0..1, at least one node; 1 turns it "
                             "off (default 0.2, Karpenter's per NodePool)")
    parser.add_argument("--domain-cooldown", type=positive_float, default=1800.0, metavar="SECONDS",
                        help="an open failure-domain breaker lets one probe action through after this long (default 1800)")
    parser.add_argument("--checkpoint-timeout-critical", type=non_negative_float, default=300.0, metavar="SECONDS",
                        help="a drain for a critical finding asks checkpointable work to save first and waits this "
                             "long at most; 0 drains without asking (default 300)")
    parser.add_argument("--checkpoint-timeout-warning", type=non_negative_float, default=900.0, metavar="SECONDS",
                        help="the same for a drain for a warning (default 900)")
    parser.add_argument("--repair-after", type=positive_float, metavar="SECONDS",
                        help="lift gpuwarden's own cordons and taints once the node is healthy this long "
                             "(default: never)")


def _window(text: str) -> MaintenanceWindow:
    try:
        return MaintenanceWindow.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("actuator", help="remediation on a Kubernetes cluster (observe by default)",
                                   description="Findings + a cluster snapshot -> a plan -> actions, under a mode, "
                                               "safety limits, a circuit breaker and an audit log.")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=type(parser))

    run = commands.add_parser("run", help="reconcile every --interval seconds")
    _round_options(run)
    run.add_argument("--interval", type=positive_float, default=60.0, help="seconds between rounds (default 60)")
    run.add_argument("--rounds", type=positive_int, help="stop after this many rounds (default: run until stopped)")
    run.add_argument("--leader-elect", action="store_true", help="act only while holding the Lease")
    run.add_argument("--lease-name", default="gpuwarden-actuator", help="Lease name (default gpuwarden-actuator)")
    run.add_argument("--lease-duration", type=positive_int, default=15, help="Lease seconds (default 15)")
    run.add_argument("--identity", default=socket.gethostname(), help="this replica's name in the Lease (default: hostname)")
    run.add_argument("--metrics-listen", type=host_port, help="serve the actuator's metrics on HOST:PORT")
    run.set_defaults(run=run_loop)

    plan = commands.add_parser("plan", help="one dry round, printed (nothing applied, nothing recorded)")
    _round_options(plan)
    plan.add_argument("--format", choices=["table", "json"], default="table", help="output format (default table)")
    plan.set_defaults(run=run_plan)

    listing = commands.add_parser("list", help="actions waiting for approval, and recent applied ones")
    _audit_option(listing)
    listing.add_argument("--limit", type=positive_int, default=20, help="applied actions shown (default 20)")
    listing.set_defaults(run=run_list)

    for name, approve in (("approve", True), ("reject", False)):
        decision = commands.add_parser(name, help=f"{name} an action waiting for approval")
        decision.add_argument("id", help="approval id (gpuwarden actuator list)")
        decision.add_argument("--by", required=True, help="your name, kept in the audit log")
        decision.add_argument("--comment", default="", help="why, kept in the audit log beside the decision")
        _audit_option(decision)
        decision.set_defaults(run=lambda args, approve=approve: run_decide(args, approve))

    undo = commands.add_parser("undo", help="apply the inverse of an applied action (uncordon, untaint, resume)")
    undo.add_argument("id", help="entry id of an applied action (gpuwarden actuator list)")
    undo.add_argument("--by", required=True, help="your name, kept in the audit log")
    cluster_options(undo)
    _audit_option(undo)
    undo.set_defaults(run=run_undo)

    reset = commands.add_parser("reset", help="close the circuit breaker after a person has looked")
    reset.add_argument("--by", required=True, help="your name, kept in the audit log")
    reset.add_argument("--comment", default="", help="what was looked at, kept in the audit log")
    _audit_option(reset)
    reset.set_defaults(run=run_reset)
    parser.set_defaults(run=lambda args: parser.print_help() or 2)


def _fail(message: str, code: int = 2) -> int:
    print(f"gpuwarden: error: {message}", file=sys.stderr)
    return code


def kube_cluster(args: argparse.Namespace, clock: Clock = SYSTEM_CLOCK) -> KubeCluster:
    # Imported here: the kubernetes client takes a second to import, and other commands never need it.
    from gpuwarden.kube import KubeApi, KubeCluster, load_client
    from gpuwarden.kube.inventory_nodes import NodeLabels

    client = load_client(str(args.kubeconfig) if args.kubeconfig else None, args.in_cluster, args.context,
                         args.request_timeout)
    labels = NodeLabels(leaf_switch=args.leaf_switch_label, nvlink_domain=args.nvlink_domain_label, pool=args.pool_label)
    return KubeCluster(KubeApi(client, clock=clock), namespace=args.namespace, page_size=args.page_size, clock=clock,
                       labels=labels)


def _actuator(args: argparse.Namespace, cluster: KubeCluster, audit: AuditLog, leader=None,
              clock: Clock = SYSTEM_CLOCK, node_conditions: bool = False) -> Actuator:
    limits = SafetyLimits(args.max_actions_per_hour, args.max_cordoned_node_ratio)
    return Actuator(cluster, Mode(args.mode), limits, audit, clock=clock, leader=leader, window=args.maintenance_window,
                    pacing=PacingPolicy(proven_after_seconds=args.pace_proven_after, cooldown_seconds=args.pace_cooldown),
                    repair_after_healthy_seconds=args.repair_after, node_conditions=node_conditions,  # issue 24
                    domains=DomainPolicy(args.max_unhealthy_ratio_per_domain, args.domain_cooldown))


def _policy(args: argparse.Namespace) -> PlanningPolicy:
    return PlanningPolicy(taint=args.taint, notify_grace_seconds=args.notify_grace, reclaim_grace_seconds=args.reclaim_grace,
                          protected_nodes=frozenset(args.protect_node),
                          checkpoint_timeout_seconds_by_severity={
                              Severity.CRITICAL.value: args.checkpoint_timeout_critical,
                              Severity.WARNING.value: args.checkpoint_timeout_warning})


def _finder(args: argparse.Namespace):
    def find(snapshot):
        window = open_window(args)
        frame = window.source.read(window.start, window.end)
        for note in rejected_rows_note(window.source):  # rows the source dropped are said, every round
            log.warning("%s", note)
        found = findings_from_frame(frame, window.end.to_pydatetime(), hoarding=not args.no_hoarding,
                                    domains=failure_domains(snapshot.nodes))
        # and what the cluster reports itself (DRA device taints), where the samples did not find it
        seen = {f.key for f in found}
        return found + [f for f in findings_from_device_health(snapshot.device_health, window.end.to_pydatetime())
                        if f.key not in seen]
    return find


class SchedulingMoved(UserError, ValueError):
    """``--scheduling`` names a policy: scheduling has its own loop now."""


def _no_scheduling(args: argparse.Namespace) -> None:
    if args.scheduling != "none":
        raise SchedulingMoved(f"--scheduling {args.scheduling}: the actuator no longer schedules; run "
                              f"'gpuwarden scheduler run --policy {args.scheduling}' (its own loop: admission, "
                              "preemption, resume and the live queue)")


def _reconciler(args: argparse.Namespace, actuator: Actuator, interval: float = 60.0) -> Reconciler:
    _no_scheduling(args)
    return Reconciler(actuator, _finder(args), _policy(args), interval, on_round=_summary)


def run_plan(args: argparse.Namespace) -> int:
    from gpuwarden.kube import KubeFailure

    try:
        cluster = kube_cluster(args)
        audit = AuditLog()  # a dry round records nothing; it counts what the real log holds
        if args.audit.exists():
            for record in AuditLog.read(args.audit):
                audit.append_record(record)
        args.mode = Mode.OBSERVE.value
        report = _reconciler(args, _actuator(args, cluster, audit)).reconcile_once()
    except (ValueError, KubeFailure) as error:
        return _fail(str(error), 1 if isinstance(error, KubeFailure) else 2)
    if args.format == "json":
        json.dump([e.as_dict() for e in report.entries], sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return 0
    print(f"{report.findings} finding(s) -> {len(report.plan.actions)} action(s); limits evaluated as auto mode would")
    for entry in report.entries:
        evidence = ", ".join(f"{f['kind']} on {f.get('gpu_uuid') or f.get('node') or '?'}" for f in entry.findings)
        print(f"  {entry.outcome.value:<17} {entry.kind:<12} {entry.target:<40} {entry.message or entry.reason}"
              + (f"  [{evidence}]" if evidence else ""))
    for finding, why in report.plan.skipped[:20]:
        print(f"  skipped           {finding.kind:<12} {finding.node or finding.evidence.get('pod', ''):<40} {why}")
    return 0


def run_loop(args: argparse.Namespace, clock: Clock = SYSTEM_CLOCK) -> int:
    """The actuator process: one runner (on ``clock``) owns its jobs, the reconcile round every
    --interval (the first at once) and, with --leader-elect, the Lease renewal every third of its
    duration; --rounds stops it after that many rounds."""
    from gpuwarden.fleet.runner import Runner

    try:
        _no_scheduling(args)
        cluster = kube_cluster(args, clock)
    except ValueError as error:
        return _fail(str(error))
    runner = Runner(clock, name="gpuwarden-actuator")
    elector = leader_elector(args, cluster, runner, clock)
    actuator = _actuator(args, cluster, AuditLog(args.audit), elector.is_leader if elector else None, clock,
                         node_conditions=True)  # GPUHealthy on each GPU node in every mode (issue 24)
    if args.metrics_listen:
        from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, start_http_server
        registry = actuator.metrics.registry  # its own gauges, and the process's as the default registry has them
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            registry.register(collector)
        start_http_server(args.metrics_listen[1], addr=args.metrics_listen[0], registry=registry)
    reconciler = _reconciler(args, actuator, args.interval)
    print(f"actuator: {args.mode} mode every {args.interval:g} s; audit {args.audit}"
          + (f"; maintenance window {args.maintenance_window} UTC" if args.maintenance_window else "")
          + (f"; leader election as {args.identity} on Lease {args.namespace}/{args.lease_name}" if elector else ""),
          flush=True)
    done, succeeded = run_until_stopped(runner, "reconcile", reconciler.run_round, args.interval, args.rounds,
                                        on_stop=cluster.api.abort)
    failed = failed_rounds(done, succeeded, args.rounds, "reconcile round")
    return _fail(failed, 1) if failed else 0  # e.g. --rounds 1 on an unreadable source: not a success


def leader_elector(args: argparse.Namespace, cluster: KubeCluster, runner: Runner, clock: Clock) -> LeaderElector | None:
    """With --leader-elect: the Lease, acquired before the first round (which acts only as the
    leader) and renewed on ``runner`` every third of its duration; else None."""
    if not args.leader_elect:
        return None
    from gpuwarden.kube import LeaderElector
    from gpuwarden.fleet.triggers import every

    elector = LeaderElector(cluster.api, args.namespace, args.lease_name, args.identity, args.lease_duration, clock)
    elector.try_acquire_or_renew()
    runner.add("lease", elector.try_acquire_or_renew, every(elector.renew_interval_seconds, clock))
    return elector


def _summary(report) -> None:
    counts: dict[str, int] = {}
    for entry in report.entries:
        counts[entry.outcome.value] = counts.get(entry.outcome.value, 0) + 1
    print(f"actuator: {report.findings} finding(s), {len(report.plan.actions)} planned; "
          + (", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "nothing new"), flush=True)


def run_list(args: argparse.Namespace) -> int:
    if audit_at(args.audit) is None:
        print(f"no audit log at {args.audit}: nothing waits for approval, nothing was applied")
        return 0
    read = read_audit(args.audit)
    if read.notes:  # lines skipped or read without their bad fields: said, never silent
        print(f"gpuwarden: warning: {args.audit}: {read.summary()}", file=sys.stderr)
    records = read.records
    waiting = pending_from(records)
    print(f"waiting for approval: {len(waiting)}")
    for p in waiting:
        evidence = ", ".join(f"{f.get('kind')} on {f.get('gpu_uuid') or f.get('node') or '?'}" for f in p.findings)
        print(f"  {p.approval_id}  {p.kind:<12} {p.target:<40} {p.reason}  (planned {p.planned_at}) [{evidence}]")
    undone = {r.get("undo_of") for r in records if r.get("outcome") == Outcome.UNDONE.value}
    applied = [r for r in records if r.get("outcome") == Outcome.APPLIED.value][-args.limit:]
    print(f"applied (newest last, undo with 'gpuwarden actuator undo ID'): {len(applied)}")
    for r in applied:
        state = "undone" if r.get("entry_id") in undone else ("undo: " + r["undo"]["kind"] if r.get("undo") else "no undo")
        print(f"  {r.get('entry_id')}  {r.get('at')}  {r.get('kind'):<12} {r.get('target'):<40} {state}  by {r.get('by')}")
    breaker = [r for r in records if r.get("outcome") in (Outcome.BREAKER_OPEN.value, Outcome.BREAKER_RESET.value)]
    if breaker and breaker[-1]["outcome"] == Outcome.BREAKER_OPEN.value:
        print(f"circuit breaker OPEN since {breaker[-1].get('at')}: {breaker[-1].get('message')}")
    return 0


def run_decide(args: argparse.Namespace, approve: bool) -> int:
    if audit_at(args.audit) is None:  # nothing created: no folder, no lock file
        return _fail(f"no audit log at {args.audit}: no action awaits approval with id {args.id} there")
    try:
        decide(args.audit, args.id, approve, args.by, args.comment)
    except ValueError as error:
        return _fail(str(error))
    print(f"{'approved' if approve else 'rejected'} {args.id}"
          + ("; the running actuator applies it at its next round" if approve else ""))
    return 0


def run_undo(args: argparse.Namespace) -> int:
    if audit_at(args.audit) is None:
        return _fail(f"no audit log at {args.audit}: no applied action {args.id} to undo")
    try:
        audit = AuditLog(args.audit)  # checked before the cluster is reached: a wrong path says so at once
        actuator = Actuator(kube_cluster(args), Mode.AUTO, audit=audit)
        entry = actuator.undo(args.id, by=args.by)
    except ValueError as error:
        return _fail(str(error))
    print(f"{entry.outcome.value}: {entry.kind} {entry.target}: {entry.message}")
    return 0 if entry.outcome == Outcome.UNDONE else 1


def run_reset(args: argparse.Namespace) -> int:
    if audit_at(args.audit) is None:
        print(f"no audit log at {args.audit}: no breaker was opened there; nothing to reset")
        return 0
    audit = AuditLog(args.audit)  # resetting the breaker touches only the audit log: no cluster is reached
    if breaker_verdict(audit.records()).allowed:
        print("the circuit breaker is closed; nothing to reset")
        return 0
    # Recorded as the running actuator's reset has always been: auto mode, target "actuator".
    record_breaker_reset(audit, args.by, args.comment, at=SYSTEM_CLOCK.now(), mode=Mode.AUTO)
    print(f"circuit breaker reset by {args.by}")
    return 0
