"""The ``tether`` command line. Every command has ``--help`` and exits non-zero with a one-line reason."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from typing import Final

import trio

from protocol import OwnerAlreadyRunning, SchemaTooNew, StorageError, TetherError, collapse_group

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
        help="show the commit path surviving a SIGKILL of the owner, on ./tether.db",
        description=(
            "Start an owner on the database, run two writer processes appending entries, SIGKILL the owner "
            "mid-stream, start it again, and check that every acknowledged entry is stored exactly once."
        ),
    )
    demo.add_argument("--db", default="tether.db", help="database to use (default ./tether.db)")
    demo.add_argument("--entries", type=_positive, default=400, help="entries each writer appends (default 400)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "owner":
            return _run_owner(args)
        if args.command == "demo":
            from ._demo import run_demo

            return trio.run(run_demo, args.db, args.entries)
    except OwnerAlreadyRunning as exc:
        return _fail(exc, EXIT_ALREADY_RUNNING)
    except SchemaTooNew as exc:
        return _fail(exc, EXIT_SCHEMA_TOO_NEW)
    except TetherError as exc:
        return _fail(exc, EXIT_FAILED)
    except KeyboardInterrupt:
        return 130
    raise AssertionError(f"unhandled command {args.command}")


def _fail(exc: BaseException, status: int) -> int:
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
    )
    server = OwnerServer(config)

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                url = await nursery.start(server.run)
                print(f"tether owner: {server.db} on {url} (pid {os.getpid()})", flush=True)
                async for _ in signals:
                    nursery.cancel_scope.cancel(reason="SIGINT or SIGTERM")
                    break

    try:
        try:
            trio.run(serve)
        except BaseExceptionGroup as group:
            raise collapse_group(group) from None
    except OwnerFailed as exc:
        return _fail(StorageError(f"the owner failed closed: {exc}"), EXIT_FAILED)
    return EXIT_OK
