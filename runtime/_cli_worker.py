"""``tether worker``: one worker process, attached to the owner of a database, serving an application."""

from __future__ import annotations

import argparse
import os
from typing import Any, Final

import trio

from protocol import DEFAULT_MAX_LEASES, MAX_LEASES_PER_WORKER, UsageError

from ._args import positive, seconds_or_zero
from ._cli_shared import fail, run_trio
from ._exits import EXIT_OK, EXIT_USAGE
from ._parent import watch_parent
from ._signals import replay_early_signals

DEFAULT_DRAIN_TIMEOUT_S: Final = 30.0
DEFAULT_MANUAL_GRACE_S: Final = 8.0
"""As ``actors``' (not imported: the CLI loads the client only to run it)."""
AT_THE_DRAIN_DEADLINE: Final = (
    "then give back what still runs (no restart counted; a model request is sent again as the same attempt; manual "
    "and report tool calls get --manual-grace more first); a second signal stops at once"
)
"""What ``--drain-timeout`` says of its deadline, on ``tether worker`` and ``tether up``."""


def add_manual_grace(parser: argparse.ArgumentParser, *, more: str = "") -> None:
    """The ``--manual-grace`` option of ``tether worker`` and ``tether up`` (``more``: what ``tether up`` adds)."""
    parser.add_argument(
        "--manual-grace",
        type=seconds_or_zero,
        default=DEFAULT_MANUAL_GRACE_S,
        metavar="SECONDS",
        help=f"at the --drain-timeout deadline, manual and report tool calls (whose cut-off needs a person, or ends "
        f"in an error result) get SECONDS more to finish before they are cut off too{more} (default "
        f"{DEFAULT_MANUAL_GRACE_S:g})",
    )


def add_worker_command(commands: Any) -> None:
    """``tether worker``."""
    worker = commands.add_parser(
        "worker",
        help="run one worker: attach to the owner of DB and serve an application",
        description=(
            "Load the application (MODULE:ATTR naming an actors.App, MODULE looked up in the working directory "
            "first; one that cannot be loaded fails with exit 2 before anything attaches), "
            "attach to the owner of DB as a worker, announce what the app runs, and keep a heartbeat. Waits for "
            "the owner if it is not up yet, and reconnects after losing it."
        ),
    )
    worker.set_defaults(handler=run_worker)
    where = worker.add_mutually_exclusive_group(required=True)
    where.add_argument("--db", help="the database whose owner to attach to (found through DB.runtime.json)")
    where.add_argument("--url", help="the owner's URL, for a worker on another host (needs --token or TETHER_TOKEN)")
    worker.add_argument(
        "--token",
        default=os.environ.get("TETHER_TOKEN"),
        help="the owner's access token, with --url (default $TETHER_TOKEN)",
    )
    worker.add_argument(
        "--ca",
        metavar="FILE",
        help="with a wss:// --url: the CA certificate (PEM) to verify the owner with (default the system's CAs; "
        "with --db, the one the runtime file names)",
    )
    worker.add_argument("--app", required=True, metavar="MODULE:ATTR", help="the application to serve")
    worker.add_argument("--name", default="", help="the worker's name as status shows it (default worker-PID)")
    worker.add_argument(
        "--max-leases",
        type=positive,
        default=DEFAULT_MAX_LEASES,
        metavar="N",
        help=f"run at most N task phases at once (default {DEFAULT_MAX_LEASES})",
    )
    worker.add_argument(
        "--drain-timeout",
        type=seconds_or_zero,
        default=DEFAULT_DRAIN_TIMEOUT_S,
        metavar="S",
        help=f"on SIGINT or SIGTERM, take no new work and let what runs (phases, tool calls, model requests) finish "
        f"and commit for at most S seconds, {AT_THE_DRAIN_DEADLINE} (default {DEFAULT_DRAIN_TIMEOUT_S:g})",
    )
    add_manual_grace(worker)
    worker.add_argument(
        "--fault-kill",
        metavar="[SIGSTOP:]POINT:N[:KIND[:NAME]]",
        help="fault injection: SIGKILL this worker at the N-th POINT of the commits of its phases: before_commit, "
        "after_commit, intent_sent (the intent's commit sent, its acknowledgement not read), after_intent, "
        "before_result or after_result, counting only KIND (model or tool) operations named NAME if given (such as "
        "after_intent:1:tool:refund); with the SIGSTOP: prefix, stop it there instead, for the test to continue with "
        "SIGCONT (SIGSTOP:intent_sent:1:tool:refund; docs/operations.md, Fault injection)",
    )
    worker.add_argument(
        "--otel",
        action="store_true",
        help="OpenTelemetry spans of phases, model requests and tool calls on the global tracer provider (the "
        "tether[otel] extra; same as TETHER_OTEL=1; see docs/telemetry.md)",
    )
    worker.add_argument("--supervised", action="store_true", help=argparse.SUPPRESS)
    # tether up's check before it starts workers: load the app as a worker would, then exit 0 (or 2, saying why).
    worker.add_argument("--check-app", action="store_true", help=argparse.SUPPRESS)


def run_worker(args: argparse.Namespace) -> int:
    import actors

    if args.url is not None and not args.token:
        return fail("worker: --url needs the owner's access token: --token TOKEN or TETHER_TOKEN", EXIT_USAGE)
    if args.max_leases > MAX_LEASES_PER_WORKER:
        return fail(f"worker: --max-leases is at most {MAX_LEASES_PER_WORKER}, not {args.max_leases}", EXIT_USAGE)
    try:  # what no retry can mend fails now, not in a loop of attempts
        actors.check_target(db=args.db, url=args.url, token=args.token, ca=args.ca)
    except UsageError as exc:
        return fail(f"worker: {exc}", EXIT_USAGE)
    try:
        fault_kill = None if args.fault_kill is None else actors.WorkerKill.parse(args.fault_kill)
    except UsageError as exc:
        return fail(f"worker: --fault-kill: {exc}", EXIT_USAGE)
    try:
        app = actors.load_app(args.app)
    except actors.AppLoadError as exc:  # retrying cannot change it: tether up stops on this status
        return fail(exc, EXIT_USAGE)
    if args.check_app:
        return EXIT_OK
    target = args.db or args.url
    name = args.name or f"worker-{os.getpid()}"

    async def serve() -> None:
        """Serve until SIGINT/SIGTERM or, for a ``--supervised`` child, the supervisor's end: each drains first
        (``actors.serve`` handles the signals: a second one stops at once)."""
        async with trio.open_nursery() as nursery:
            parent_gone = trio.Event()
            if args.supervised:
                nursery.start_soon(watch_parent, parent_gone.set)

            async def stop() -> None:
                # actors.serve starts this once its own signal receiver is in place: a signal remembered while
                # Python imported the command (runtime._signals) stops the worker now, as if it came now.
                replay_early_signals()
                await parent_gone.wait()

            await actors.serve(
                app,
                db=args.db,
                url=args.url,
                token=args.token,
                name=name,
                max_leases=args.max_leases,
                ca=args.ca,
                drain_timeout_s=args.drain_timeout,
                manual_grace_s=args.manual_grace,
                otel=args.otel or None,
                stop=stop,
                fault_kill=fault_kill,
                task_status=_Said(f"tether worker: {name} serving {app.name} on {target}"),
            )
            nursery.cancel_scope.cancel(reason="the worker stopped")

    run_trio(serve)
    print(f"tether worker: {name} stopped", flush=True)
    return EXIT_OK


class _Said:
    """A ``task_status`` that prints ``line`` once its task has started (a task that stops before starting says
    nothing, where ``nursery.start`` would raise)."""

    def __init__(self, line: str) -> None:
        self._line = line

    def started(self, value: object = None) -> None:
        print(self._line, flush=True)
