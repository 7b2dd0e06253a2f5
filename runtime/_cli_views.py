"""``tether watch`` and ``tether ui``: following a database's runs live, in the terminal (``runtime._watch``) and
on a web page (``runtime._ui``)."""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from typing import Any

from ._args import add_db, count, identifier, listen_address
from ._cli_owner_options import exposure_problem
from ._cli_shared import fail, run_trio, serve_until_stopped
from ._exits import EXIT_OK, EXIT_USAGE


def add_view_commands(commands: Any) -> None:
    """``tether ui`` and ``tether watch``."""
    ui = commands.add_parser(
        "ui",
        help="a web page to operate the database's agents: runs, transcripts live, approvals, questions, resolve",
        description=(
            "Serve a web page for the database's owner (tether up or tether owner), which need not be running: "
            "until one answers, the page says so and reconnects by itself. It shows runs by state "
            "and what waits for a person (approvals, questions, tool calls to resolve) with the buttons that answer "
            "them, each conversation's transcript updating live (a model's text while it streams), each run's "
            "journal with retry and cancel, the task tree and usage. The first line printed is the URL to open: it "
            "carries the login token, without which every page and action is refused. By default it listens on "
            "loopback only. Ctrl-C (SIGINT) or SIGTERM stop it."
        ),
    )
    ui.set_defaults(handler=run_ui)
    add_db(ui)
    ui.add_argument(
        "--listen",
        type=listen_address,
        default=("127.0.0.1", 8765),
        metavar="HOST:PORT",
        help="where to serve the page (default 127.0.0.1:8765; port 0: a free one); another address than loopback "
        "needs --tls-cert and --tls-key, or --insecure-listen",
    )
    ui.add_argument("--tls-cert", metavar="FILE", help="serve https with this certificate (PEM), with --tls-key")
    ui.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (PEM)")
    ui.add_argument(
        "--insecure-listen",
        action="store_true",
        help="serve plain http beyond loopback (the login token crosses the network in clear)",
    )

    watch = commands.add_parser(
        "watch",
        help="follow runs live: the transcript as it streams, tool calls, approvals, the task tree",
        description=(
            "Show what a database's runs do as it is committed: the transcript (user, assistant text, tool calls with "
            "their arguments, status and result), a model's text while it streams (a cut-off attempt marked as such, "
            "never as an answer), the runs and their states, each open approval and each run that needs attention "
            "with the command that answers it, and the task tree below the run. Without --conversation or --run, "
            "one line per conversation. Reads what exists first (from --from-seq), then follows new commits; after "
            "an owner restart it goes on from the last seq it showed. On a terminal the view is redrawn in place; "
            "otherwise (or with --plain) it prints one line per event; --json prints one JSON object per record. "
            "Ctrl-C (SIGINT) or SIGTERM end it with exit status 0."
        ),
    )
    watch.set_defaults(handler=run_watch)
    add_db(watch)
    scope = watch.add_mutually_exclusive_group()
    scope.add_argument("--conversation", type=identifier, metavar="ID", help="only this conversation")
    scope.add_argument("--run", type=identifier, metavar="RUN_ID", help="only this run (in its conversation)")
    watch.add_argument(
        "--from-seq",
        type=count,
        default=0,
        metavar="N",
        help="start after commit N (default 0: everything the database holds); a --json reader resumes with the "
        "last seq it printed",
    )
    output = watch.add_mutually_exclusive_group()
    output.add_argument(
        "--json",
        action="store_true",
        help="print each record as one JSON object per line (its fields, plus record: its kind, and seq: its "
        "commit), flushed line by line",
    )
    output.add_argument("--plain", action="store_true", help="print one line per event even on a terminal")


def run_watch(args: argparse.Namespace) -> int:
    from ._watch import Mode, watch

    mode: Mode = "json" if args.json else "plain" if args.plain or not sys.stdout.isatty() else "live"
    function = partial(
        watch, args.db, conversation_id=args.conversation, run_id=args.run, from_seq=args.from_seq, mode=mode
    )
    try:
        run_trio(function)
    except BrokenPipeError:  # the reader of our output went away (``tether watch --json | head``): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
    return EXIT_OK


def run_ui(args: argparse.Namespace) -> int:
    from ._ui import serve_ui

    problem = exposure_problem(args)
    if problem is not None:
        return fail(f"ui: {problem}", EXIT_USAGE)
    host, port = args.listen
    function = partial(
        serve_ui,
        os.path.abspath(args.db),
        host,
        port,
        say=lambda _url: None,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
    )
    run_trio(partial(serve_until_stopped, function, supervised=False, started=lambda url: str(url)))
    return EXIT_OK
