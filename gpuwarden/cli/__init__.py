"""The ``gpuwarden`` command line. Each subcommand lives in its own module with ``add_parser``.

Errors a user can cause (a wrong flag, a config key that does not exist, a broken trace or
samples file) print one line naming the problem and exit 2, without a traceback.
"""

from __future__ import annotations

import logging
import sys

from gpuwarden import __version__
from gpuwarden.fleet import FleetValueError
from gpuwarden.sim import ConfigError, TraceError
from gpuwarden.store import SamplesError

from . import demo, exporter_cmd, sim_cmd, store_cmd, report_cmd, health_cmd, simulate_cmd
from .args import Parser

# Each command module has ``add_parser(subparsers)``; a new command adds its module here.
COMMAND_MODULES = (demo, sim_cmd, store_cmd, exporter_cmd, report_cmd, health_cmd, simulate_cmd)
from . import actuator_cmd  # noqa: E402  (kube engineer: the actuator command)
COMMAND_MODULES += (actuator_cmd,)

USER_ERRORS = (ConfigError, TraceError, SamplesError, FleetValueError)


def build_parser() -> Parser:
    parser = Parser(prog="gpuwarden", description="Observability-first GPU fleet platform for Kubernetes.")
    parser.add_argument("--version", action="version", version=f"gpuwarden {__version__}")
    parser.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="log level (default WARNING)")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=Parser)
    for module in COMMAND_MODULES:
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except USER_ERRORS as error:
        print(f"gpuwarden: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
