"""``tether runs``, ``journal``, ``resolve``, ``retry``, ``cancel``, ``respond`` and ``interactions``: a database's
agent runs, their journals and what waits for a person, against its running owner (``runtime._runs``; docs/runs.md)."""

from __future__ import annotations

import argparse
import json
from functools import partial
from typing import Any

import trio

from protocol import UsageError

from ._args import add_db, add_json, identifier, json_text
from ._cli_shared import fail
from ._exits import EXIT_OK, EXIT_USAGE


def add_runs_commands(commands: Any) -> None:
    """``tether runs``, ``journal``, ``resolve``, ``retry``, ``cancel``, ``respond`` and ``interactions``."""
    runs = commands.add_parser(
        "runs",
        help="list the agent runs of a database",
        description="Print every run, oldest first: its conversation, agent@version, status and reason, the "
        "operation it is blocked on, its tokens, and why a failed run failed (its error). Asks the running owner.",
    )
    runs.set_defaults(handler=run_runs)
    add_db(runs)
    runs.add_argument("--conversation", type=identifier, metavar="ID", help="only this conversation's runs")
    runs.add_argument(
        "--status",
        choices=(
            "queued",
            "retry_wait",
            "pending",
            "running",
            "waiting",
            "needs_attention",
            "completed",
            "failed",
            "cancelled",
        ),
        help="only runs in this status",
    )
    add_json(runs, "print one JSON object with a list of run records")

    journal = commands.add_parser(
        "journal",
        help="show a run's operation journal: its model requests and tool calls",
        description="Print a run's operation journal, oldest first, one line per operation: its turn, kind (model or "
        "tool; a nested call names its caller), name@version, attempt, status (started, completed, failed, "
        "interrupted, resolved), recovery policy, when it started and ended (UTC), who resolved it, and its error "
        "(code and text). Read from the running owner a page at a time. A run that does not exist exits 1.",
    )
    journal.set_defaults(handler=run_journal)
    journal.add_argument("run_id", type=identifier, metavar="RUN_ID", help="the run")
    add_db(journal)
    add_json(
        journal,
        "print one JSON object: db, run_id, operations (a list of operation records, as the wire carries them)",
    )

    resolve = commands.add_parser(
        "resolve",
        help="settle an interrupted manual tool call with its output",
        description="Give an interrupted tool call (a run needs_attention with reason tool_interrupted) the output "
        "the model sees, after checking by hand what the tool did. The run then resumes.",
    )
    resolve.set_defaults(handler=run_resolve)
    resolve.add_argument(
        "operation_id", type=identifier, metavar="OPERATION_ID", help="the operation the run is blocked on"
    )
    add_db(resolve)
    resolve.add_argument("--output", required=True, type=json_text, metavar="JSON", help="the tool's output, JSON")
    resolve.add_argument(
        "--by",
        default="tether resolve",
        metavar="NAME",
        help="who resolved it, kept in the run's journal (tether journal; default 'tether resolve')",
    )
    add_json(resolve, "print the operation record")

    for name, text, description in (
        ("retry", "re-attempt a failed run", "Re-attempt a failed run (a new task, the same run)."),
        (
            "cancel",
            "cancel a run",
            "Cancel a run: a queued one ends cancelled at once; an active one is aborted (its work first) and ends "
            "cancelled once that is done.",
        ),
    ):
        command = commands.add_parser(name, help=text, description=description)
        command.set_defaults(handler=run_retry if name == "retry" else run_cancel)
        command.add_argument("run_id", type=identifier, metavar="RUN_ID", help="the run")
        add_db(command)
        add_json(command, "print the run record")

    respond = commands.add_parser(
        "respond",
        help="answer an open approval or question",
        description="Answer an open interaction (see tether interactions): approve or deny an approval, or give a "
        "question its answer. It is answered once.",
    )
    respond.set_defaults(handler=run_respond)
    respond.add_argument("interaction_id", type=identifier, metavar="INTERACTION_ID", help="the interaction")
    add_db(respond)
    answer = respond.add_mutually_exclusive_group(required=True)
    answer.add_argument("--approve", action="store_true", help="let the tool call run")
    answer.add_argument("--deny", action="store_true", help="refuse it (the model is told)")
    answer.add_argument(
        "--answer",
        type=json_text,
        metavar="JSON",
        help="answer a question with a JSON value its schema accepts (a text is '\"yes\"')",
    )
    respond.add_argument("--note", metavar="TEXT", help="a note kept with an approval's answer")
    add_json(respond, "print the interaction record")

    interactions = commands.add_parser(
        "interactions",
        help="list the open approvals and questions, and how to answer each",
        description="Print every open interaction: its run, the tool and its arguments, and the command that answers "
        "it.",
    )
    interactions.set_defaults(handler=run_interactions)
    add_db(interactions)
    add_json(interactions, "print one JSON object with the interactions")


def run_runs(args: argparse.Namespace) -> int:
    from . import _runs
    from ._connect import check_db

    db = check_db(args.db)
    runs = trio.run(partial(_runs.list_runs, db, conversation_id=args.conversation, status=args.status))
    if args.json:
        print(json.dumps({"db": db, "runs": [_runs.record_json(run) for run in runs]}), flush=True)
    else:
        print(_runs.format_runs(runs), flush=True)
    return EXIT_OK


def run_journal(args: argparse.Namespace) -> int:
    from . import _runs
    from ._connect import check_db
    from ._journal import format_journal, read_journal

    db = check_db(args.db)
    operations = trio.run(read_journal, db, args.run_id)
    if args.json:
        document = {"db": db, "run_id": args.run_id, "operations": [_runs.record_json(op) for op in operations]}
        print(json.dumps(document), flush=True)
    else:
        print(format_journal(args.run_id, operations), flush=True)
    return EXIT_OK


def run_interactions(args: argparse.Namespace) -> int:
    from . import _runs
    from ._connect import check_db

    db = check_db(args.db)
    found = trio.run(_runs.open_interactions, db)
    if args.json:
        print(json.dumps({"db": db, "interactions": [_runs.record_json(i) for i in found]}), flush=True)
    else:
        print(_runs.format_interactions(args.db, found), flush=True)
    return EXIT_OK


def run_resolve(args: argparse.Namespace) -> int:
    from . import _runs
    from ._connect import check_db

    if not args.by.strip():
        return fail("resolve: --by names who resolved the call: not an empty name; nothing was resolved", EXIT_USAGE)
    record = trio.run(partial(_runs.resolve, check_db(args.db), args.operation_id, args.output, by=args.by))
    line = f"operation {record.operation_id}: {record.status} (resolved by {record.resolved_by})"
    return _said(args, record, line)


def run_respond(args: argparse.Namespace) -> int:
    from . import _runs
    from ._connect import check_db

    db = check_db(args.db)
    if args.answer is not None:
        if args.note is not None:
            raise UsageError("--note goes with --approve or --deny; a question's answer is the --answer JSON")
        respond = partial(_runs.respond, db, args.interaction_id, answer=args.answer)
    else:
        respond = partial(_runs.respond, db, args.interaction_id, approve=args.approve, note=args.note)
    record = trio.run(respond)
    assert record.answer is not None
    if record.kind == "question":
        verdict = "answered " + json.dumps(record.answer.value, ensure_ascii=False)
    else:
        verdict = "approved" if record.answer.approve else "denied"
    return _said(args, record, f"interaction {record.interaction_id}: {verdict} (run {record.run_id})")


def run_retry(args: argparse.Namespace) -> int:
    from . import _runs
    from ._connect import check_db

    record = trio.run(_runs.retry, check_db(args.db), args.run_id)
    return _said(args, record, _runs.describe_run(record))


def run_cancel(args: argparse.Namespace) -> int:
    from . import _runs
    from ._connect import check_db

    record = trio.run(_runs.cancel, check_db(args.db), args.run_id)
    return _said(args, record, _runs.describe_run(record))


def _said(args: argparse.Namespace, record: Any, line: str) -> int:
    """Print ``record`` as JSON with ``--json``, else ``line``."""
    from . import _runs

    print(json.dumps(_runs.record_json(record)) if args.json else line, flush=True)
    return EXIT_OK
