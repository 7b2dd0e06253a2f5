"""``tether tasks`` and ``tether abort``: the live task tree of a database, and aborting one task
(``runtime._tasks``)."""

from __future__ import annotations

import argparse
import json
import os
from functools import partial
from typing import Any

import trio

from ._args import identifier, seconds
from ._exits import EXIT_OK


def add_tasks_commands(commands: Any) -> None:
    """``tether tasks`` and ``tether abort``."""
    tasks = commands.add_parser(
        "tasks",
        help="show the live task tree of a database",
        description=(
            "Print every live task as a tree under the task or conversation that owns it: kind, state, what it "
            "waits on, abort marks, restarts, the worker running it, and why a task is blocked (missing_task, "
            "task_too_old, migration_failed). Asks the running owner; with none, reads the database."
        ),
    )
    tasks.set_defaults(handler=run_tasks)
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
    abort.set_defaults(handler=run_abort)
    abort.add_argument("task_id", type=identifier, metavar="TASK_ID", help="the task to abort")
    abort.add_argument("--db", default="tether.db", help="the database (default ./tether.db)")
    abort.add_argument(
        "--wait",
        type=seconds,
        metavar="S",
        help="also wait up to S seconds for the task to end, and print its outcome",
    )


def run_tasks(args: argparse.Namespace) -> int:
    from ._tasks import format_tasks, read_graph, tasks_json

    graph, source = read_graph(args.db)
    text = json.dumps(tasks_json(args.db, graph, source)) if args.json else format_tasks(args.db, graph, source)
    print(text, flush=True)
    return EXIT_OK


def run_abort(args: argparse.Namespace) -> int:
    from ._tasks import abort

    marked, record = trio.run(partial(abort, os.path.abspath(args.db), args.task_id, wait_s=args.wait))
    print(f"task {args.task_id}: {'marked for abort' if marked else 'already marked for abort, or terminal'}")
    if record is not None and record.outcome is not None:
        outcome = record.outcome
        detail = outcome.reason or outcome.error or ""
        print(f"task {args.task_id}: {outcome.status}{f' ({detail})' if detail else ''}", flush=True)
    return EXIT_OK
