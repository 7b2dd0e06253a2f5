"""The ``tether`` command line. Every command has ``--help`` and exits non-zero with a one-line reason."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Final

import trio

from protocol import (
    DEFAULT_MAX_LEASES,
    MAX_LEASES_PER_WORKER,
    OwnerAlreadyRunning,
    SchemaTooNew,
    StorageError,
    TetherError,
    collapse_group,
)

from ._parent import watch_parent

DEFAULT_APP: Final = "runtime.demo_app:app"
EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_ALREADY_RUNNING: Final = 3
EXIT_SCHEMA_TOO_NEW: Final = 4


def _listen_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (such as 127.0.0.1:0), not {text!r}")
    return host.strip("[]"), int(port)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number of 0 or more, not {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, not {text!r}")
    return value


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of 1 or more, not {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tether",
        description="Tether: a durable runtime for AI agents and long-running tasks.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    owner = commands.add_parser(
        "owner",
        help="run the storage owner of one database in the foreground",
        description=(
            "Own the database (an exclusive OS lock on DB.lock), listen for peers, and serialize every commit. "
            "Writes DB.runtime.json (URL and access token, mode 0600) once listening, so peers find it from the "
            "database path. Stops cleanly on SIGINT or SIGTERM."
        ),
    )
    owner.add_argument("--db", required=True, help="the SQLite database file (created if missing)")
    owner.add_argument(
        "--listen",
        type=_listen_address,
        default=("127.0.0.1", 0),
        metavar="HOST:PORT",
        help="address to listen on (default 127.0.0.1:0, a free loopback port)",
    )
    owner.add_argument(
        "--sync",
        choices=("normal", "full"),
        default="normal",
        help="normal (default): survives process crashes; full: fsync every commit, survives power loss",
    )
    owner.add_argument(
        "--clock",
        choices=("wall", "manual"),
        default="wall",
        help="wall (default), or manual: time moves only when a client advances it (for tests)",
    )
    owner.add_argument(
        "--fault-kill-before-commit",
        type=_positive,
        metavar="K",
        help="fault injection: SIGKILL this owner right before its K-th writing COMMIT",
    )
    owner.add_argument(
        "--fault-kill-after-commit",
        type=_positive,
        metavar="K",
        help="fault injection: SIGKILL this owner right after its K-th writing COMMIT",
    )
    owner.add_argument(
        "--fault-storage-error-at-commit",
        type=_positive,
        metavar="K",
        help="fault injection: fail the K-th writing COMMIT with a storage error (the owner fails closed)",
    )

    demo = commands.add_parser(
        "demo",
        help="the main job: durable checkouts under tether up, then the commit path surviving a SIGKILL",
        description=(
            "Part 1 (tasks): run tether up with two workers serving the demo app and three checkouts of four "
            "payments each, shown live: a declined card (fail_fast aborts the other payments bottom-up, each "
            "refunding its charge), a cancelled checkout (the payments' abort handlers end before the "
            "checkout's), and a worker killed with SIGKILL mid-payment; then check the fake bank's ledger: every "
            "card charged at most once. Part 2 (commits): two writer processes append entries, the owner is "
            "SIGKILLed mid-stream and started again, and every acknowledged entry is stored exactly once."
        ),
    )
    demo.add_argument("--db", default="tether.db", help="database to use (default ./tether.db)")
    demo.add_argument(
        "--part", choices=("all", "tasks", "commits"), default="all", help="which part to run (default all)"
    )
    demo.add_argument(
        "--entries", type=_positive, default=400, help="part 2: entries each writer appends (default 400)"
    )

    up = commands.add_parser(
        "up",
        help="run the whole runtime in the foreground: the owner and its workers, restarted when they die",
        description=(
            "Start the owner, wait until it listens, then start the workers; restart a child that dies, with "
            "back-off, and give up past the restart intensity (more than --max-restarts restarts within "
            "--restart-window seconds), naming the child and its last output. SIGINT or SIGTERM stop the "
            "workers first, then the owner. Writes DB.supervisor.json so that `tether status` and `tether stop` "
            "work from any shell."
        ),
    )
    up.add_argument("--db", default="tether.db", help="the database (default ./tether.db)")
    up.add_argument(
        "--app",
        default=DEFAULT_APP,
        metavar="MODULE:ATTR",
        help=f"the application the workers serve (default the built-in demo app, {DEFAULT_APP})",
    )
    up.add_argument("--workers", type=_count, default=2, help="how many worker processes (default 2)")
    up.add_argument(
        "--listen",
        type=_listen_address,
        default=("127.0.0.1", 0),
        metavar="HOST:PORT",
        help="the owner's address (default 127.0.0.1:0)",
    )
    up.add_argument("--sync", choices=("normal", "full"), default="normal", help="as for tether owner")
    up.add_argument("--clock", choices=("wall", "manual"), default="wall", help="as for tether owner")
    up.add_argument(
        "--heartbeat-timeout",
        type=_seconds,
        default=10.0,
        metavar="S",
        help="the owner drops a peer silent for S seconds (default 10)",
    )
    up.add_argument(
        "--max-restarts",
        type=_count,
        default=10,
        metavar="R",
        help="give up after more than R restarts ... (default 10)",
    )
    up.add_argument(
        "--restart-window", type=_seconds, default=60.0, metavar="T", help="... within T seconds (default 60)"
    )
    up.add_argument(
        "--max-leases",
        type=_positive,
        default=DEFAULT_MAX_LEASES,
        metavar="N",
        help=f"task phases each worker runs at once (default {DEFAULT_MAX_LEASES})",
    )

    worker = commands.add_parser(
        "worker",
        help="run one worker: attach to the owner of DB and serve an application",
        description=(
            "Load the application (MODULE:ATTR naming an actors.App; a bad path fails before anything attaches), "
            "attach to the owner of DB as a worker, announce what the app runs, and keep a heartbeat. Waits for "
            "the owner if it is not up yet, and reconnects after losing it."
        ),
    )
    where = worker.add_mutually_exclusive_group(required=True)
    where.add_argument("--db", help="the database whose owner to attach to (found through DB.runtime.json)")
    where.add_argument("--url", help="the owner's URL, for a worker on another host (needs --token or TETHER_TOKEN)")
    worker.add_argument(
        "--token",
        default=os.environ.get("TETHER_TOKEN"),
        help="the owner's access token, with --url (default $TETHER_TOKEN)",
    )
    worker.add_argument("--app", required=True, metavar="MODULE:ATTR", help="the application to serve")
    worker.add_argument("--name", default="", help="the worker's name as status shows it (default worker-PID)")
    worker.add_argument(
        "--max-leases",
        type=_positive,
        default=DEFAULT_MAX_LEASES,
        metavar="N",
        help=f"run at most N task phases at once (default {DEFAULT_MAX_LEASES})",
    )

    status = commands.add_parser(
        "status",
        help="show what runs for a database: supervisor, owner, workers",
        description="Show whether the supervisor, the owner and each worker are alive and attached, their pids and "
        "restart counts, the database, its schema version and size.",
    )
    status.add_argument("--db", default="tether.db", help="the database (default ./tether.db)")
    status.add_argument("--json", action="store_true", help="print one JSON object")

    stop = commands.add_parser(
        "stop",
        help="stop the runtime of a database (its supervisor, or its lone owner) and wait until it is gone",
    )
    stop.add_argument("--db", default="tether.db", help="the database (default ./tether.db)")
    stop.add_argument("--timeout", type=_seconds, default=30.0, metavar="S", help="wait at most S seconds (default 30)")

    tasks = commands.add_parser(
        "tasks",
        help="show the live task tree of a database",
        description=(
            "Print every live task as a tree under the task or conversation that owns it: kind, state, what it "
            "waits on, abort marks, restarts, the worker running it, and why a task is blocked (missing_task, "
            "task_too_old, migration_failed). Asks the running owner; with none, reads the database."
        ),
    )
    tasks.add_argument("--db", default="tether.db", help="the database (default ./tether.db)")
    tasks.add_argument("--json", action="store_true", help="print one JSON object with a list of task records")

    abort = commands.add_parser(
        "abort",
        help="abort one task (its owned work first, then its abort handler)",
        description=(
            "Commit an abort mark on the task. Its owned work is aborted first, bottom-up; its abort handler runs "
            "once that work is terminal. A task whose code no worker can run ends orphaned."
        ),
    )
    abort.add_argument("task_id", metavar="TASK_ID", help="the task to abort")
    abort.add_argument("--db", default="tether.db", help="the database (default ./tether.db)")
    abort.add_argument(
        "--wait",
        type=_seconds,
        metavar="S",
        help="also wait up to S seconds for the task to end, and print its outcome",
    )

    for command in (owner, worker):
        command.add_argument("--supervised", action="store_true", help=argparse.SUPPRESS)
    owner.add_argument(
        "--heartbeat-timeout",
        type=_seconds,
        default=10.0,
        metavar="S",
        help="drop a peer silent for S seconds (default 10)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "owner":
            return _run_owner(args)
        if args.command == "demo":
            from ._demo import run_demo

            return trio.run(run_demo, args.db, args.entries, args.part)
        if args.command == "up":
            return _run_up(args)
        if args.command == "worker":
            return _run_worker(args)
        if args.command == "status":
            return _status(args)
        if args.command == "tasks":
            return _tasks(args)
        if args.command == "abort":
            return _abort(args)
        if args.command == "stop":
            from ._status import stop

            print(stop(args.db, timeout_s=args.timeout), flush=True)
            return EXIT_OK
    except OwnerAlreadyRunning as exc:
        return _fail(exc, EXIT_ALREADY_RUNNING)
    except SchemaTooNew as exc:
        return _fail(exc, EXIT_SCHEMA_TOO_NEW)
    except TetherError as exc:
        return _fail(exc, EXIT_FAILED)
    except OSError as exc:  # a missing directory, a port in use, a permission: the system said no
        where = f" ({exc.filename})" if exc.filename else ""
        return _fail(f"{exc.strerror or exc}{where}", EXIT_FAILED)
    except KeyboardInterrupt:
        return 130
    raise AssertionError(f"unhandled command {args.command}")


def _run_up(args: argparse.Namespace) -> int:
    from ._supervisor import Supervisor, SupervisorConfig

    host, port = args.listen
    config = SupervisorConfig(
        db=args.db,
        app=args.app,
        workers=args.workers,
        listen=f"{host}:{port}" if ":" not in host else f"[{host}]:{port}",
        sync=args.sync,
        clock=args.clock,
        heartbeat_timeout_s=args.heartbeat_timeout,
        max_restarts=args.max_restarts,
        restart_window_s=args.restart_window,
        max_leases=args.max_leases,
    )
    supervisor = Supervisor(config)
    print(f"tether up: {supervisor.db}, {args.workers} workers serving {args.app} (pid {os.getpid()})", flush=True)
    _run_trio(supervisor.run)
    print("tether up: stopped", flush=True)
    return EXIT_OK


def _run_worker(args: argparse.Namespace) -> int:
    import actors

    if args.url is not None and not args.token:
        raise TetherError("tether worker --url needs the owner's access token: --token TOKEN or TETHER_TOKEN")
    if args.max_leases > MAX_LEASES_PER_WORKER:
        raise TetherError(f"--max-leases is at most {MAX_LEASES_PER_WORKER}, not {args.max_leases}")
    app = actors.load_app(args.app)
    target = args.db or args.url
    serve = partial(
        actors.serve, app, db=args.db, url=args.url, token=args.token, name=args.name, max_leases=args.max_leases
    )
    _run_trio(
        partial(
            _serve_until_stopped,
            serve,
            supervised=args.supervised,
            started=lambda _: f"tether worker: {args.name or os.getpid()} serving {app.name} on {target}",
        )
    )
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    from ._status import collect_status, format_status

    status = collect_status(args.db)
    print(json.dumps(status) if args.json else format_status(status), flush=True)
    return EXIT_OK


def _tasks(args: argparse.Namespace) -> int:
    from ._tasks import format_tasks, read_graph, tasks_json

    graph, source = read_graph(args.db)
    text = json.dumps(tasks_json(args.db, graph, source)) if args.json else format_tasks(args.db, graph, source)
    print(text, flush=True)
    return EXIT_OK


def _abort(args: argparse.Namespace) -> int:
    from ._tasks import abort

    marked, record = trio.run(partial(abort, os.path.abspath(args.db), args.task_id, wait_s=args.wait))
    print(f"task {args.task_id}: {'marked for abort' if marked else 'already marked for abort, or terminal'}")
    if record is not None and record.outcome is not None:
        outcome = record.outcome
        detail = outcome.reason or outcome.error or ""
        print(f"task {args.task_id}: {outcome.status}{f' ({detail})' if detail else ''}", flush=True)
    return EXIT_OK


async def _serve_until_stopped(
    serve: Callable[..., Awaitable[object]], *, supervised: bool, started: Callable[[Any], str]
) -> None:
    """Start ``serve`` (a function for ``nursery.start``), print ``started(its value)``, and serve until SIGINT or
    SIGTERM, or, for a ``--supervised`` child, until the supervisor is gone (see ``runtime._parent``)."""
    async with trio.open_nursery() as nursery:
        if supervised:
            nursery.start_soon(watch_parent, nursery.cancel_scope)
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            value = await nursery.start(serve)
            print(started(value), flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel(reason="SIGINT or SIGTERM")
                break


def _run_trio(function: Callable[[], Awaitable[object]]) -> None:
    """``trio.run`` with the single-exception groups of the public boundary collapsed."""
    try:
        trio.run(function)
    except BaseExceptionGroup as group:
        raise collapse_group(group) from None


def _fail(exc: BaseException | str, status: int) -> int:
    print(f"tether: {exc}", file=sys.stderr, flush=True)
    return status


def _run_owner(args: argparse.Namespace) -> int:
    from storage_owner.io import OwnerConfig, OwnerFailed, OwnerServer

    host, port = args.listen
    config = OwnerConfig(
        db=args.db,
        host=host,
        port=port,
        sync=args.sync,
        clock=args.clock,
        kill_before_commit=args.fault_kill_before_commit,
        kill_after_commit=args.fault_kill_after_commit,
        storage_error_at_commit=args.fault_storage_error_at_commit,
        heartbeat_timeout_s=args.heartbeat_timeout,
    )
    server = OwnerServer(config)
    try:
        _run_trio(
            partial(
                _serve_until_stopped,
                server.run,
                supervised=args.supervised,
                started=lambda url: f"tether owner: {server.db} on {url} (pid {os.getpid()})",
            )
        )
    except OwnerFailed as exc:
        return _fail(StorageError(f"the owner failed closed: {exc}"), EXIT_FAILED)
    return EXIT_OK
