"""``gpuwarden scheduler run``: gpuwarden's scheduling loop on a Kubernetes cluster.

    gpuwarden scheduler run [--kubeconfig PATH | --in-cluster] [--leader-elect] [--interval-seconds 10]
                            [--policy gpuwarden] [--listen 0.0.0.0] [--port 8083]
                            [--source prometheus --prometheus-url URL | --source local --store DIR]

Every interval the leader reads the cluster (gated pods grouped into workloads), runs the
scheduling policy and carries its decisions out: admits gated pods onto the planned nodes,
suspends or preempts for guarantees and priority, resumes what it suspended. It serves the live
queue on ``/queue``, its metrics on ``/metrics`` and ``/healthz`` on ``--port``. Attained service
(the LAS order) is measured from the fleet-samples source over ``--since`` (default 7d): the chart
passes its Prometheus; a source that cannot be read at start is an error (exit 2), and with
``--no-attained-service`` every workload counts as unserved.
A pod created between rounds is admitted at the next one: admission takes up to one interval.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys

from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock

from .args import number, plain, port, positive_int
from .sources import add_source_options

log = logging.getLogger("gpuwarden.scheduler")


def add_parser(subparsers) -> None:
    from gpuwarden.scheduling import POLICIES

    from .actuator_cmd import cluster_options

    parser = subparsers.add_parser("scheduler", help="gpuwarden's scheduling loop on a Kubernetes cluster",
                                   description=plain(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", dest="command", required=True,
                                     parser_class=type(parser))
    run = commands.add_parser("run", help="admit, place and preempt every --interval-seconds; serve /queue")
    cluster_options(run)
    add_source_options(run, since_default="7d")
    run.add_argument("--no-attained-service", action="store_true",
                     help="do not measure attained service (LAS then sees every workload as unserved)")
    run.add_argument("--interval-seconds", type=number(float, 0.1, 3600), default=10.0,
                     help="seconds between rounds, 0.1..3600 (default 10): the bound on admission latency")
    run.add_argument("--policy", choices=sorted(POLICIES), default="gpuwarden", help="scheduling policy (default gpuwarden)")
    run.add_argument("--listen", default="0.0.0.0", help="address for /queue, /metrics, /healthz (default 0.0.0.0)")
    run.add_argument("--port", type=number(int, 0, 65535), default=8083,
                     help="port for /queue, /metrics, /healthz, 0..65535 (0 picks a free one; default 8083)")
    run.add_argument("--webhook-port", type=port,
                     help="serve the admission webhook (HTTPS, /mutate-pods) on this port on every replica")
    run.add_argument("--webhook-cert-dir", default="/tmp/gpuwarden-webhook",
                     help="folder of the webhook's tls.crt and tls.key (cert-manager's mounted Secret, or where the "
                          "scheduler writes its own; default /tmp/gpuwarden-webhook)")
    run.add_argument("--webhook-secret", help="keep the webhook's CA and serving pair in this Secret (in --namespace) "
                                              "and rotate them; omit when cert-manager issues the certificate")
    run.add_argument("--webhook-service", help="the Service the API server calls the webhook through (the certificate's name)")
    run.add_argument("--webhook-configuration", help="the MutatingWebhookConfiguration whose caBundle the scheduler keeps")
    run.add_argument("--mig-manager", action="store_true",
                     help="opt-in: set a drained MIG node's nvidia.com/mig.config label (a named layout the GPU operator's "
                          "MIG manager applies) for the MIG work that waits; needs nodes patch")
    run.add_argument("--rounds", type=positive_int, help="stop after this many rounds (default: run until stopped)")
    run.add_argument("--leader-elect", action="store_true", help="schedule only while holding the Lease")
    run.add_argument("--lease-name", default="gpuwarden-scheduler", help="Lease name (default gpuwarden-scheduler)")
    run.add_argument("--lease-duration", type=positive_int, default=15, help="Lease seconds (default 15)")
    run.add_argument("--identity", default=socket.gethostname(), help="this replica's name in the Lease (default: hostname)")
    run.set_defaults(run=run_scheduler)


def _attained(args: argparse.Namespace):
    """The attained-service source the options name, checked at start: a store that is not there or
    a Prometheus that does not answer is a UserError (exit 2), never a silent empty read all along
    (every workload would then count as unserved). None with ``--no-attained-service``."""
    if args.no_attained_service:
        return None
    from gpuwarden.scheduler.scheduler_service import attained_from_samples
    from gpuwarden.fleet.errors import UserError

    from .sources import open_source

    where = {"local": f"the embedded store {args.store}", "file": f"the samples file {args.file}",
             "prometheus": f"Prometheus at {args.prometheus_url}"}[args.source]
    try:
        source = open_source(args)
        if args.source == "prometheus":
            source.query("vector(1)")  # answers: the rounds' reads will too (a passing fault is then logged)
    except (UserError, OSError, ValueError) as error:
        # the way out first: the reason (a store's path, a URL) can be long, and the line is cut at 400
        raise UserError(f"attained service (the LAS order): give --source prometheus --prometheus-url URL (the "
                        f"chart's default) or --no-attained-service; {where} cannot be read: {error}") from None
    return attained_from_samples(source.read, args.since.total_seconds())


def webhook_server(args: argparse.Namespace, cluster, clock: Clock, namespaces=None, claims=None):
    """The admission webhook's HTTPS service on ``--webhook-port`` (every replica serves it, the
    leader or not), or None. Without cert-manager (``--webhook-secret`` given) the scheduler keeps
    the CA and serving pair in that Secret and the webhook configuration's caBundle current."""
    if args.webhook_port is None:
        return None
    import functools

    from gpuwarden.kube.certs import CertPolicy, WebhookCertificates
    from gpuwarden.kube.webhook import WebhookService

    refresh = None
    if args.webhook_secret:
        if not (args.webhook_service and args.webhook_configuration):
            raise SystemExit("gpuwarden scheduler: error: --webhook-secret needs --webhook-service and "
                             "--webhook-configuration (the Service the API server calls, the configuration to give the CA)")
        certificates = WebhookCertificates(cluster.api, CertPolicy(args.webhook_service, args.namespace),
                                           args.webhook_secret, args.webhook_configuration, clock=clock)
        refresh = functools.partial(certificates.ensure, args.webhook_cert_dir)
    return WebhookService(args.webhook_cert_dir, args.webhook_port, refresh=refresh, clock=clock,
                          namespaces=namespaces, claims_ask_gpu=claims.asks_gpu if claims is not None else None)


def run_scheduler(args: argparse.Namespace, clock: Clock = SYSTEM_CLOCK) -> int:
    from gpuwarden.kube.dra_notices import SkippedClaimEvents, skipped_by_kind
    from gpuwarden.kube.queue_namespaces import QueueNamespaces
    from gpuwarden.kube.webhook_claims import GpuClaims
    from gpuwarden.scheduler.queue_server import QueueServer
    from gpuwarden.scheduler.scheduler_metrics import SchedulerMetrics
    from gpuwarden.scheduler.scheduler_service import SchedulerService
    from gpuwarden.scheduler.scheduling_round import SchedulingRound
    from gpuwarden.fleet.runner import Runner

    from .actuator_cmd import kube_cluster, leader_elector
    from .loops import failed_rounds, run_until_stopped

    try:
        cluster = kube_cluster(args, clock)
    except ValueError as error:
        print(f"gpuwarden: error: {error}", file=sys.stderr)
        return 2
    attained = _attained(args)  # checked before anything starts
    queue = QueueNamespaces(cluster.api, clock=clock)  # the webhook gates only there, whatever it is sent
    claims = GpuClaims(cluster.api, clock=clock)  # pods whose GPUs come only through DRA claims are gated too
    webhook = webhook_server(args, cluster, clock, queue, claims)
    runner = Runner(clock, name="gpuwarden-scheduler")
    elector = leader_elector(args, cluster, runner, clock)
    # DRA objects the snapshot skipped (a wrong-typed field, an unknown class): counted, and each claim told once
    notices = SkippedClaimEvents(cluster.api, "gpuwarden-scheduler", clock)
    metrics = SchedulerMetrics(dra_skipped=lambda: skipped_by_kind(cluster.inventory.dra.skipped))
    scheduling = SchedulingRound(cluster, args.policy, attained=attained,
                                 on_round=[metrics, lambda _outcome: notices.tell(cluster.inventory.dra.skipped)],
                                 mig_manager=args.mig_manager)
    service = SchedulerService(scheduling, args.interval_seconds, elector.is_leader if elector else None)
    server = QueueServer(lambda: scheduling.queue, metrics.registry, host=args.listen, port=args.port).start()
    print(f"scheduler: policy {args.policy} every {args.interval_seconds:g} s; queue {server.url}/queue"
          + (f"; leader election as {args.identity} on Lease {args.namespace}/{args.lease_name}" if elector else ""),
          flush=True)
    try:
        if webhook is not None:  # inside: a webhook refused (no usable certificate, exit 2) stops what started
            queue.start()
            claims.start()
            webhook.start()
        done, succeeded = run_until_stopped(runner, "schedule", service.run_once, args.interval_seconds, args.rounds,
                                            on_stop=cluster.api.abort)
    finally:
        server.stop()
        if webhook is not None:
            webhook.stop()
            claims.stop()
            queue.stop()
    failed = failed_rounds(done, succeeded, args.rounds, "round")
    if failed:  # e.g. --rounds 1 against an API server that does not answer
        print(f"gpuwarden scheduler: error: {failed}", file=sys.stderr)
        return 1
    return 0
