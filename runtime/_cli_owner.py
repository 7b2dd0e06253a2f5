"""``tether owner``, ``tether up``, ``tether status``, ``tether stop`` and ``tether check``: running a database's
owner (alone, or supervised with its workers), and seeing, stopping and checking what runs for it.

The owner's options are declared once, in ``runtime._cli_owner_options``; ``tether up`` takes most of them and
passes them on to its owners."""

from __future__ import annotations

import argparse
import json
import os
import sys
from functools import partial
from typing import TYPE_CHECKING, Any, Final

from protocol import DEFAULT_MAX_LEASES, StorageError, TetherError

from ._args import count, positive, seconds, seconds_or_zero
from ._cli_owner_options import add_owner_options, directory_problem, exposure_problem, owner_argv, owner_config
from ._cli_shared import fail, run_trio, serve_until_stopped
from ._cli_worker import AT_THE_DRAIN_DEADLINE, DEFAULT_DRAIN_TIMEOUT_S, add_manual_grace
from ._exits import EXIT_FAILED, EXIT_NOT_TETHER_DATABASE, EXIT_OK, EXIT_USAGE
from ._parent import DEFAULT_LIVENESS_TIMEOUT_S

if TYPE_CHECKING:
    from ._supervisor import SupervisorConfig

DEFAULT_APP: Final = "runtime.demo_app:app"
STOP_MARGIN_S: Final = 10.0
"""How much longer than the supervisor's own bound on its stop (``stop_within_s`` in its state file: the workers'
drain and the stop timeouts) ``tether stop`` waits by default; a lone owner gets that margin and a minute."""


def add_owner_command(commands: Any) -> None:
    """``tether owner``."""
    owner = commands.add_parser(
        "owner",
        help="run the storage owner of one database in the foreground",
        description=(
            "Own the database (an exclusive OS lock on DB.lock), listen for peers, and serialize every commit. "
            "Refuses, changing nothing, a file that is not a Tether database (exit 5: another application's, not "
            "SQLite, or empty) and a damaged one (exit 6, found by a quick check at start). Writes DB.runtime.json "
            "(URL and access token, mode 0600) once listening, so peers find it from the database path. Stops "
            "cleanly on SIGINT or SIGTERM."
        ),
    )
    owner.set_defaults(handler=run_owner)
    owner.add_argument(
        "--db", required=True, help="the SQLite database file (created if missing, mode 0600, and said so)"
    )
    add_owner_options(owner)
    owner.add_argument("--supervised", action="store_true", help=argparse.SUPPRESS)


def add_up_command(commands: Any) -> None:
    """``tether up``."""
    up = commands.add_parser(
        "up",
        help="run the whole runtime in the foreground: the owner and its workers, restarted when they die",
        description=(
            "Load the app once as a worker would (an app that cannot be loaded stops tether up with exit 2 and the "
            "error, before anything is created), then start the owner; once it listens, start the workers and a "
            "standby owner (it waits for the ownership lock and takes over within milliseconds when the owner dies). "
            "Restart a child that dies, at once if it ran well, else with back-off, each on its own, and give up "
            "past the restart intensity (more than --max-restarts restarts within --restart-window seconds), naming "
            "the child and its last output. Kill an owner that stops answering (--liveness-timeout) and a worker the "
            "owner dropped; both are replaced. An owner exit that retrying cannot change (3: another owner, 4: newer "
            "schema, 5: not a Tether database, 6: damaged), or a worker's exit 2 (its app failed to load), stops "
            "everything at once with that status. SIGINT or SIGTERM stop the workers first, then the standby, then "
            "the owner; a Ctrl-C in the terminal reaches the supervisor alone. Writes DB.supervisor.json so that "
            "`tether status` and `tether stop` work from any shell."
        ),
    )
    up.set_defaults(handler=run_up)
    up.add_argument("--db", default="tether.db", help="the database (default ./tether.db)")
    up.add_argument(
        "--app",
        default=DEFAULT_APP,
        metavar="MODULE:ATTR",
        help=f"the application the workers serve (default the built-in demo app, {DEFAULT_APP})",
    )
    up.add_argument("--workers", type=count, default=2, help="how many worker processes (default 2)")
    add_owner_options(up, up="first")
    up.add_argument(
        "--max-restarts",
        type=count,
        default=10,
        metavar="R",
        help="give up after more than R restarts ... (default 10)",
    )
    up.add_argument(
        "--restart-window", type=seconds, default=60.0, metavar="T", help="... within T seconds (default 60)"
    )
    up.add_argument(
        "--max-leases",
        type=positive,
        default=DEFAULT_MAX_LEASES,
        metavar="N",
        help=f"task phases each worker runs at once (default {DEFAULT_MAX_LEASES})",
    )
    up.add_argument(
        "--drain-timeout",
        type=seconds_or_zero,
        default=DEFAULT_DRAIN_TIMEOUT_S,
        metavar="S",
        help=f"on SIGINT, SIGTERM or tether stop, the workers take no new work and let what they run (phases, tool "
        f"calls, model requests) finish and commit for at most S seconds, {AT_THE_DRAIN_DEADLINE} (default "
        f"{DEFAULT_DRAIN_TIMEOUT_S:g})",
    )
    add_manual_grace(up, more="; a stopping worker is killed no sooner than its drain and this and 2 s more")
    up.add_argument(
        "--liveness-timeout",
        type=seconds,
        default=DEFAULT_LIVENESS_TIMEOUT_S,
        metavar="S",
        help="kill a hung owner: one that has not answered the supervisor's probe (a read of its peers through its "
        "commit loop, every S/2 seconds, or every quarter of --heartbeat-timeout if that is sooner) for S seconds, "
        "counted from the first probe; the standby takes over. Also kill "
        "a worker that attached once and has not been attached for S seconds while the owner answers (the owner "
        f"dropped it); it is restarted (default {DEFAULT_LIVENESS_TIMEOUT_S:g})",
    )
    add_owner_options(up, up="last")


def add_status_command(commands: Any) -> None:
    """``tether status``."""
    status = commands.add_parser(
        "status",
        help="show what runs for a database: supervisor, owner, standby, workers",
        description="Show whether the supervisor, the owner, its warm standby and each worker are alive and attached, "
        "their pids and restart counts, the database, its schema version and size.",
    )
    status.set_defaults(handler=run_status)
    status.add_argument("--db", default="tether.db", help="the database (default ./tether.db)")
    status.add_argument("--json", action="store_true", help="print one JSON object")


def add_stop_command(commands: Any) -> None:
    """``tether stop``."""
    stop = commands.add_parser(
        "stop",
        help="stop the runtime of a database (its supervisor, or its lone owner) and wait until it is gone",
        description=(
            "Send SIGTERM to the supervisor of DB (tether up), or to its lone owner, and wait until it is gone, saying "
            "what it waits for: the workers first finish what they run (for at most their --drain-timeout), then the "
            "owner closes the database. Exit 1 with a reason if nothing runs or it did not stop in time."
        ),
    )
    stop.set_defaults(handler=run_stop)
    stop.add_argument("--db", default="tether.db", help="the database (default ./tether.db)")
    stop.add_argument(
        "--timeout",
        type=seconds,
        default=None,
        metavar="S",
        help="wait at most S seconds (default: as long as the supervisor may take, its workers' --drain-timeout "
        f"and the stop timeouts of its children, plus {STOP_MARGIN_S:g} s; 70 s for tether up's defaults)",
    )


def add_check_command(commands: Any) -> None:
    """``tether check``."""
    check = commands.add_parser(
        "check",
        help="run SQLite's full integrity check on a database, read-only (also while its owner runs)",
        description=(
            "Check the database at DB: that it is a Tether database, and every page of it (PRAGMA integrity_check). "
            "Reads only: nothing is written, and it runs beside a live owner. Prints ok, or the problems found and "
            "what to do. Exit 0 if the database is sound, 1 if it has problems (or cannot be read), 5 if it is not a "
            "Tether database."
        ),
    )
    check.set_defaults(handler=run_check)
    check.add_argument("--db", default="tether.db", help="the database (default ./tether.db)")
    check.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object, whatever the outcome (the exit status is the same): db, ok, problems, "
        "schema_version, application_id, pages (null when the file is missing, unreadable or not a Tether database)",
    )


def _start_problem(args: argparse.Namespace) -> int | None:
    """``tether owner``'s and ``tether up``'s checks before anything starts: the exit status of the first that
    fails (having said why), or ``None``."""
    missing = directory_problem(args.db)
    if missing is not None:  # as any other error of the system's at start (a port in use): status 1
        return fail(f"{args.command}: {missing}", EXIT_FAILED)
    problem = exposure_problem(args)
    if problem is not None:
        return fail(f"{args.command}: {problem}", EXIT_USAGE)
    return None


def run_owner(args: argparse.Namespace) -> int:
    refused = _start_problem(args)
    if refused is not None:
        return refused
    from storage_owner.io import OwnerConfig, OwnerFailed, OwnerServer

    config = OwnerConfig(db=args.db, **owner_config(args))
    try:
        server = OwnerServer(config, otel=args.otel or None)
    except TetherError as exc:  # telemetry asked for, without OpenTelemetry installed
        return fail(exc, EXIT_USAGE)
    try:
        run_trio(
            partial(
                serve_until_stopped,
                server.run,
                supervised=args.supervised,
                started=lambda url: f"tether owner: {server.db} on {url} (pid {os.getpid()})",
            )
        )
    except OwnerFailed as exc:
        return fail(StorageError(f"the owner failed closed: {exc}"), EXIT_FAILED)
    return EXIT_OK


def run_up(args: argparse.Namespace) -> int:
    refused = _start_problem(args)
    if refused is not None:
        return refused
    from ._supervisor import AppRefused, OwnerRefused, Supervisor

    supervisor = Supervisor(supervisor_config(args))
    try:
        run_trio(supervisor.run)
    except (OwnerRefused, AppRefused) as exc:
        return fail(exc, exc.exit_status)
    print("tether up: stopped", flush=True)
    return EXIT_OK


def supervisor_config(args: argparse.Namespace) -> SupervisorConfig:
    """What ``tether up``'s ``args`` ask of the supervisor: its own options, its workers', and its owners' (derived
    from the owner's options, ``runtime._cli_owner_options``)."""
    from ._supervisor import SupervisorConfig

    return SupervisorConfig(
        db=args.db,
        app=args.app,
        workers=args.workers,
        max_restarts=args.max_restarts,
        restart_window_s=args.restart_window,
        max_leases=args.max_leases,
        drain_timeout_s=args.drain_timeout,
        manual_grace_s=args.manual_grace,
        owner_args=owner_argv(args),
        liveness_timeout_s=args.liveness_timeout,
    )


def run_status(args: argparse.Namespace) -> int:
    from ._status import collect_status, format_status

    status = collect_status(args.db)
    print(json.dumps(status) if args.json else format_status(status), flush=True)
    return EXIT_OK


def run_stop(args: argparse.Namespace) -> int:
    from ._status import stop

    print(stop(args.db, timeout_s=args.timeout, margin_s=STOP_MARGIN_S, say=partial(print, flush=True)), flush=True)
    return EXIT_OK


def run_check(args: argparse.Namespace) -> int:
    from protocol import NotATetherDatabase
    from storage_owner.store import MIGRATIONS, damaged_message, full_check

    db = os.path.abspath(args.db)
    try:
        report = full_check(db, MIGRATIONS)
    except (TetherError, OSError) as exc:  # missing, unreadable, or not a Tether database: the check did not run
        if not args.json:
            raise
        problem = str(exc) if isinstance(exc, TetherError) else f"cannot check {db}: {exc.strerror or exc}"
        unread = {"schema_version": None, "application_id": None, "pages": None}
        print(json.dumps({"db": db, "ok": False, "problems": [problem], **unread}), flush=True)
        return EXIT_NOT_TETHER_DATABASE if isinstance(exc, NotATetherDatabase) else EXIT_FAILED
    if args.json:
        print(json.dumps(report), flush=True)
    elif report["ok"]:
        print(f"{db}: ok (schema version {report['schema_version']}, {report['pages']} pages checked)", flush=True)
    else:
        for problem in report["problems"]:
            print(f"{db}: {problem}", flush=True)
        print(f"tether: {damaged_message(db, report['problems'])}", file=sys.stderr, flush=True)
    return EXIT_OK if report["ok"] else EXIT_FAILED
