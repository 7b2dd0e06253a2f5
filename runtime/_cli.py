"""The ``tether`` command line. Every command has ``--help`` and exits non-zero with a one-line reason.

Each command group has a module that owns its parsers and handlers (``runtime._cli_owner``: owner, up, status,
stop, check; ``_cli_worker``; ``_cli_demo``; ``_cli_tasks``: tasks, abort; ``_cli_inbox``: submit, submissions,
withdraw, reset, configure; ``_cli_runs``: runs, journal, resolve, retry, cancel, respond, interactions;
``_cli_views``: ui, watch; ``_usage``: usage, prices, budget). Each command's parser names its handler
(``set_defaults(handler=...)``); :func:`main` parses, calls it, and turns the errors every command shares into exit
statuses."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import Final

from protocol import (
    DatabaseDamaged,
    NotATetherDatabase,
    OwnerAlreadyRunning,
    SchemaTooNew,
    TetherError,
)

from ._cli_demo import add_demo_command
from ._cli_inbox import add_inbox_commands
from ._cli_owner import (
    add_check_command,
    add_owner_command,
    add_status_command,
    add_stop_command,
    add_up_command,
)
from ._cli_runs import add_runs_commands
from ._cli_shared import Handler, fail
from ._cli_tasks import add_tasks_commands
from ._cli_views import add_view_commands
from ._cli_worker import add_worker_command
from ._exits import (
    EXIT_ALREADY_RUNNING,
    EXIT_DATABASE_DAMAGED,
    EXIT_FAILED,
    EXIT_NOT_TETHER_DATABASE,
    EXIT_SCHEMA_TOO_NEW,
)
from ._signals import restore_default_signals
from ._usage import add_usage_commands

SIGNAL_LISTENING_COMMANDS: Final = frozenset({"owner", "worker", "up"})
"""Commands that stop cleanly on SIGINT or SIGTERM, including one sent while they start (``runtime._signals``)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tether",
        description="Tether: a durable runtime for AI agents and long-running tasks.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_owner_command(commands)
    add_demo_command(commands)
    add_up_command(commands)
    add_worker_command(commands)
    add_status_command(commands)
    add_stop_command(commands)
    add_tasks_commands(commands)
    add_check_command(commands)
    add_inbox_commands(commands)
    add_runs_commands(commands)
    add_view_commands(commands)
    add_usage_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command not in SIGNAL_LISTENING_COMMANDS:
        restore_default_signals()
    handler: Handler = args.handler
    try:
        return handler(args)
    except OwnerAlreadyRunning as exc:
        return fail(exc, EXIT_ALREADY_RUNNING)
    except SchemaTooNew as exc:
        return fail(exc, EXIT_SCHEMA_TOO_NEW)
    except NotATetherDatabase as exc:
        return fail(exc, EXIT_NOT_TETHER_DATABASE)
    except DatabaseDamaged as exc:
        return fail(exc, EXIT_DATABASE_DAMAGED)
    except TetherError as exc:
        return fail(exc, EXIT_FAILED)
    except BrokenPipeError:  # the reader of our output went away (``tether status | head -1``): say nothing more
        return _reader_gone()
    except OSError as exc:  # a missing directory, a port in use, a permission: the system said no
        where = f" ({exc.filename})" if exc.filename else ""
        return fail(f"{exc.strerror or exc}{where}", EXIT_FAILED)
    except KeyboardInterrupt:
        return 130


def _reader_gone() -> int:
    """What a command whose output's reader went away exits with: as one killed by SIGPIPE (128 + 13, what the shell
    expects of a writer cut off by ``head``), quietly: its standard output now goes nowhere, so that nothing left
    to flush at exit fails again."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 128 + signal.SIGPIPE
