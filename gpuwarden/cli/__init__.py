"""The ``gpuwarden`` command line. Each subcommand lives in its own module with ``add_parser``.

Errors a user can cause (a wrong flag, a config key that does not exist, a broken trace or
samples file: every :class:`~gpuwarden.fleet.errors.UserError`) print one line naming the problem
and exit 2, without a traceback; anything else
that escapes a command is one line and exit 1 (``--log-level DEBUG`` shows the traceback). A
closed pipe (``gpuwarden ... | head``) ends the command quietly.

Commands are registered by name in ``COMMANDS``; a command's module is imported only when that
command runs (or for ``--help`` of that command), so ``gpuwarden --help`` and ``gpuwarden
exporter`` do not pay for pandas, Streamlit or the simulator. To add a command, add one line:
``"name": ("gpuwarden.cli.name_cmd", "one-line help")``; the module's ``add_parser(subparsers)``
adds a parser called ``name`` and sets ``run``.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

from gpuwarden import __version__

from .args import Parser

# name: (module, one-line help shown by `gpuwarden --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("gpuwarden.cli.demo", "run the whole pipeline on the embedded simulated fleet"),
    "sim": ("gpuwarden.cli.sim_cmd", "simulated fleet tools"),
    "store": ("gpuwarden.cli.store_cmd", "embedded store tools: info, load, read, check, repair, schema"),
    "exporter": ("gpuwarden.cli.exporter_cmd", "serve GPU metrics for Prometheus"),
    "report": ("gpuwarden.cli.report_cmd", "idle, efficiency, cost and chargeback reports"),
    "health": ("gpuwarden.cli.health_cmd", "GPU health findings, evaluation and fleet risk"),
    "simulate": ("gpuwarden.cli.simulate_cmd", "replay traces through the scheduling policies"),
    "actuator": ("gpuwarden.cli.actuator_cmd", "plan and apply remediation on a cluster; approvals and undo"),
    "scheduler": ("gpuwarden.cli.scheduler_cmd", "gpuwarden's scheduling loop on a cluster: admission, preemption, /queue"),
    "queue": ("gpuwarden.cli.queue_cmd", "the live queue of the running scheduler"),
    "metrics": ("gpuwarden.cli.metrics_cmd", "serve analytics results (idle, cost, health, actuator, queue) as Prometheus metrics"),
}

log = logging.getLogger("gpuwarden.cli")


def _selected(argv: list[str]) -> str | None:
    """The command named in ``argv`` (the first word that is one), skipping --log-level's value."""
    skip = False
    for word in argv:
        if skip:
            skip = False
            continue
        if word == "--log-level":
            skip = True
        elif word in COMMANDS:
            return word
        elif not word.startswith("-"):
            return None
    return None


def build_parser(argv: list[str] | None = None, full: bool = True) -> Parser:
    """The parser; with ``full`` off only the command ``argv`` names is built in detail."""
    parser = Parser(prog="gpuwarden", description="Observability-first GPU fleet platform for Kubernetes.")
    parser.add_argument("--version", action="version", version=f"gpuwarden {__version__}")
    parser.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="log level (default WARNING; DEBUG also shows tracebacks)")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=Parser)
    wanted = None if full else _selected(argv or [])
    for name, (module_name, help_text) in COMMANDS.items():
        if full or name == wanted:
            importlib.import_module(module_name).add_parser(subparsers)
        else:
            subparsers.add_parser(name, help=help_text)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "DEBUG" in argv
    try:
        return _main(argv)
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except KeyboardInterrupt:
        print("gpuwarden: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        if debug:
            log.exception("unexpected error")
        print(f"gpuwarden: error: {type(error).__name__}: {one_line(str(error), 200) or 'no detail'} "
              "(this is a bug; run with --log-level DEBUG for the traceback)", file=sys.stderr)
        return 1


def _main(argv: list[str]) -> int:
    parser = build_parser(argv, full=False)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    from gpuwarden.fleet.errors import UserError  # imported here: `gpuwarden --help` loads no room

    try:
        code = int(args.run(args) or 0)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        raise
    except OSError as error:  # a file or folder the user named, a port, a full disk: theirs to fix
        where = f"{error.filename}: " if error.filename is not None else ""
        print(f"gpuwarden: error: {where}{one_line(error.strerror or str(error))}", file=sys.stderr)
        return 2
    except UserError as error:  # every room's user-caused errors subclass it (gpuwarden.fleet.errors)
        print(f"gpuwarden: error: {one_line(str(error))}", file=sys.stderr)
        return 2


def one_line(text: str, limit: int = 400) -> str:
    """A message on one line (a YAML or parser error quotes the input over several)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _quiet_broken_pipe() -> int:
    """The reader went away (``| head``): say nothing, and keep Python from complaining at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 141  # as a shell reports a process killed by SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
