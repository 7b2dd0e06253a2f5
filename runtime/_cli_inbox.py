"""``tether submit``, ``submissions``, ``withdraw``, ``reset`` and ``configure``: what goes into a conversation
(inputs, steers, writes, resets) and what it runs with, against the running owner of a database (``runtime._runs``;
docs/runs.md)."""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from typing import Any

import trio

from ._args import add_db, add_json, identifier, json_text, positive
from ._cli_shared import fail
from ._exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE


def add_inbox_commands(commands: Any) -> None:
    """``tether submit``, ``submissions``, ``withdraw``, ``reset`` and ``configure``."""
    submit = commands.add_parser(
        "submit",
        help="submit TEXT to an agent's conversation (a run, a steer), or write an entry beside it",
        description=(
            "Submit TEXT as an input to a conversation bound to an agent, which starts a run; while the conversation "
            "has a run going, --when-busy says what it does: queue a run of its own behind it (follow_up, the "
            "default), join it (steer: placed after its current tool round, or after its answer with one more model "
            "request, and answered by that run), or be refused (reject). --when-idle reject refuses it when no run is"
            " going; --entry KIND (and --data JSON) places it as an entry of that kind instead of tether.user (the "
            "model still sees TEXT). With --write KIND (and --data JSON) instead of TEXT, append that entry at once: "
            "it never starts a run; with --seen TEXT the model sees it as that user message, and with --head ENTRY_ID"
            " its context starts at that entry from then on (a summary): such a write waits for the working run's "
            "next boundary. With --agent, first create a conversation bound to that agent and print its id. Prints "
            "the run as read back once the submission is committed (a steer: the run it will join), and says on "
            "stderr when no attached worker announces its agent (the run waits for one); with --wait, follows it "
            "(each new status, each approval it waits for with the command that answers it) until it settles, then "
            "prints its answer, or its status, reason and error (exit 1 if it failed)."
        ),
    )
    submit.set_defaults(handler=run_submit)
    submit.add_argument("text", metavar="TEXT", nargs="?", help="what to say (not with --write)")
    add_db(submit)
    to = submit.add_mutually_exclusive_group(required=True)
    to.add_argument("--conversation", type=identifier, metavar="ID", help="an existing conversation bound to an agent")
    to.add_argument("--agent", metavar="NAME", help="a new conversation bound to agent NAME")
    submit.add_argument(
        "--request-id",
        metavar="R",
        help="makes the submission safe to repeat: the same R in the same conversation returns the same run "
        "(default a new id)",
    )
    submit.add_argument(
        "--when-busy",
        choices=("follow_up", "steer", "reject"),
        default="follow_up",
        help="while the conversation has a run going: queue a run behind it (follow_up, default), join it (steer) "
        "or refuse (reject)",
    )
    submit.add_argument(
        "--when-idle",
        choices=("start", "reject"),
        default="start",
        help="while no run is going: start one (start, default) or refuse (reject: it may only join or follow one)",
    )
    submit.add_argument(
        "--write",
        metavar="KIND",
        help="append an entry of this kind (yours, not under tether.) at once instead of an input; never a run",
    )
    submit.add_argument(
        "--data", type=json_text, metavar="JSON", help="the data of the --write or --entry entry (default null)"
    )
    submit.add_argument(
        "--entry", metavar="KIND", help="place TEXT as an entry of this kind (yours) instead of tether.user"
    )
    submit.add_argument(
        "--seen", metavar="TEXT", help="with --write: what the model sees of the entry (a user message)"
    )
    submit.add_argument(
        "--head",
        metavar="ENTRY_ID",
        help="with --write: the model's context starts at this entry from the write on, the write's --seen first",
    )
    submit.add_argument(
        "--continue",
        dest="resume",
        action="store_true",
        help="instead of TEXT: a run on the context as it is (the model answers what a stopped run left); refused "
        "while a run is going",
    )
    submit.add_argument("--wait", action="store_true", help="follow the run until it settles, then print its answer")
    add_json(submit, "print one JSON object: conversation_id, submission, run")

    submissions = commands.add_parser(
        "submissions",
        help="list what was submitted to a conversation and what became of it",
        description="Print every submission to a conversation in the order it was admitted: its kind (input, steer, "
        "write), its status (queued, placed, done, unanswered and why), the run that answers it, and its text.",
    )
    submissions.set_defaults(handler=run_submissions)
    add_db(submissions)
    submissions.add_argument("--conversation", required=True, type=identifier, metavar="ID", help="the conversation")
    add_json(submissions, "print one JSON object with the submission records")

    withdraw = commands.add_parser(
        "withdraw",
        help="take back a queued submission",
        description="Take back a submission that is still queued (a steer not yet placed, a follow-up whose run has "
        "not started): it settles unanswered (withdrawn), and a follow-up's run is cancelled. One already placed in "
        "a run, or settled, is left as it is (exit 1, saying so).",
    )
    withdraw.set_defaults(handler=run_withdraw)
    withdraw.add_argument("submission_id", type=identifier, metavar="SUBMISSION_ID", help="the submission")
    add_db(withdraw)
    add_json(withdraw, "print one JSON object: outcome, submission")

    reset = commands.add_parser(
        "reset",
        help="start a conversation's model context again (optionally from a handoff note)",
        description="Place a reset in the conversation: the model no longer sees older entries (they stay stored), "
        "and starts from the --handoff text when given. Idle: placed at once. While a run works: placed at its next "
        "boundary; at the end of a tool round it ends that run there (its inputs unanswered, reason reset), and what "
        "is queued behind it runs in the new context.",
    )
    reset.set_defaults(handler=run_reset)
    reset.add_argument("conversation_id", type=identifier, metavar="CONVERSATION_ID", help="the conversation")
    add_db(reset)
    reset.add_argument("--handoff", metavar="TEXT", help="what the new context starts from (its first user message)")
    add_json(reset, "print the submission record")

    configure = commands.add_parser(
        "configure",
        help="show or change what one conversation runs with (model, tools, instructions, turn limit, inbox modes)",
        description="Change a conversation's configuration in one commit, or print it without options. --model (a "
        "name the app gives a model with app.define_model), --tools, --instructions and --max-turns replace its "
        "agent's from the run's next model request (only workers whose app names the model run its runs; with none "
        "attached, the run waits for one for the owner's --model-grace, then fails no_model). A --model or --tools "
        "name that no attached worker announces is refused, naming the unknown and the known names (--force stores "
        "it anyway). --steering all places every queued steer at a boundary (first: one per boundary), --follow-ups "
        "all queues follow-ups together in one run; --after-failed-run says what becomes of the runs queued behind "
        "one that fails (wait, the default: held until the next input; continue; withdraw); --clear FIELD puts a "
        "field back to the agent's definition (or the default). A bad value exits 1 with the owner's reason (a bad "
        "--tools list, 2) and changes nothing.",
    )
    configure.set_defaults(handler=run_configure)
    configure.add_argument("conversation_id", type=identifier, metavar="CONVERSATION_ID", help="the conversation")
    add_db(configure)
    configure.add_argument("--model", metavar="NAME", help="a model the app names (app.define_model)")
    configure.add_argument(
        "--tools",
        metavar="A,B",
        help="exactly these of the app's tools (comma separated, spaces around a name ignored; '' for none)",
    )
    configure.add_argument("--instructions", metavar="TEXT", help="the instructions (system prompt)")
    configure.add_argument("--max-turns", type=positive, metavar="N", help="model turns a run takes at most")
    configure.add_argument("--steering", choices=("first", "all"), help="steers placed per boundary")
    configure.add_argument("--follow-ups", choices=("first", "all"), help="follow-ups per run")
    configure.add_argument(
        "--after-failed-run",
        choices=("wait", "continue", "withdraw"),
        help="what becomes of the runs queued behind one that fails",
    )
    configure.add_argument(
        "--clear",
        action="append",
        default=[],
        choices=("model", "tools", "instructions", "max_turns", "steering", "follow_ups", "after_failed_run"),
        metavar="FIELD",
        help="put FIELD back to the agent's definition (repeat for several)",
    )
    configure.add_argument(
        "--force",
        action="store_true",
        help="store a --model or --tools name that no attached worker announces (refused otherwise, naming the "
        "unknown and the known names): a deploy that brings it later",
    )
    add_json(configure, "print the configuration document")


def run_submit(args: argparse.Namespace) -> int:
    from . import _runs
    from ._connect import check_db

    db = check_db(args.db)
    if (args.text is not None) + (args.write is not None) + args.resume != 1:
        message = (
            "give TEXT to say, --write KIND (with --data JSON) to append an entry, or --continue: one of the three"
        )
        return fail(message, EXIT_USAGE)
    if args.data is not None and args.write is None and args.entry is None:
        return fail("--data is the data of a --write or --entry entry; an input's text is TEXT", EXIT_USAGE)
    if (args.seen is not None or args.head is not None) and args.write is None:
        return fail("--seen and --head are a --write entry's (what the model sees of it)", EXIT_USAGE)
    if args.entry is not None and args.text is None:
        return fail("--entry KIND places TEXT as an entry of KIND: give TEXT", EXIT_USAGE)
    write = None
    if args.write is not None:
        write = {"kind": args.write, "data": args.data}
        if args.seen is not None:
            write["model"] = [{"role": "user", "text": args.seen}]
        if args.head is not None:
            write["head"] = args.head
    conversation_id, submission, run = trio.run(
        partial(
            _runs.submit,
            db,
            args.text,
            conversation_id=args.conversation,
            agent=args.agent,
            request_id=args.request_id,
            when_busy=args.when_busy,
            when_idle=args.when_idle,
            write=write,
            entry=None if args.entry is None else {"kind": args.entry, "data": args.data},
            resume=args.resume,
            wait=args.wait,
            say=None if args.json else partial(print, flush=True),
            warn=partial(print, file=sys.stderr, flush=True),
        )
    )
    if args.json:
        document = {
            "conversation_id": conversation_id,
            "submission": _runs.record_json(submission),
            "run": None if run is None else _runs.record_json(run),
        }
        print(json.dumps(document), flush=True)
    if run is not None and run.status == "failed":
        return fail(_runs.failure(run), EXIT_FAILED)
    if submission.status == "unanswered":  # a write whose head left the model's context
        return EXIT_FAILED
    return EXIT_OK


def run_submissions(args: argparse.Namespace) -> int:
    from . import _runs
    from ._connect import check_db

    submitted = trio.run(_runs.list_submissions, check_db(args.db), args.conversation)
    if args.json:
        document = {"conversation_id": args.conversation, "submissions": [_runs.record_json(s) for s in submitted]}
        print(json.dumps(document), flush=True)
    else:
        print(_runs.format_submissions(submitted), flush=True)
    return EXIT_OK


def run_reset(args: argparse.Namespace) -> int:
    from . import _runs
    from ._connect import check_db

    submission = trio.run(_runs.reset, check_db(args.db), args.conversation_id, args.handoff)
    if args.json:
        print(json.dumps(_runs.record_json(submission)), flush=True)
    elif submission.status == "done":
        print(f"conversation {args.conversation_id}: reset placed at once (the next run starts there)", flush=True)
    else:
        print(
            f"conversation {args.conversation_id}: reset queued (submission {submission.submission_id}); placed "
            f"at run {submission.run_id}'s next boundary",
            flush=True,
        )
    return EXIT_OK


def run_configure(args: argparse.Namespace) -> int:
    from . import _runs
    from ._connect import check_db

    tools = None if args.tools is None else tool_names(args.tools)
    if isinstance(tools, str):
        return fail(f"configure: --tools {args.tools!r}: {tools}; nothing was changed", EXIT_USAGE)
    document = trio.run(
        partial(
            _runs.configure,
            check_db(args.db),
            args.conversation_id,
            model=args.model,
            tools=tools,
            instructions=args.instructions,
            max_turns=args.max_turns,
            steering=args.steering,
            follow_ups=args.follow_ups,
            after_failed_run=args.after_failed_run,
            clear=args.clear,
            force=args.force,
        )
    )
    if args.json:
        print(json.dumps(None if document is None else _runs.record_json(document)), flush=True)
    else:
        print(_runs.describe_configuration(args.conversation_id, document), flush=True)
    return EXIT_OK


def run_withdraw(args: argparse.Namespace) -> int:
    from . import _runs
    from ._connect import check_db

    outcome, withdrawn = trio.run(_runs.withdraw, check_db(args.db), args.submission_id)
    if args.json:
        document = {"outcome": outcome, "submission": None if withdrawn is None else _runs.record_json(withdrawn)}
        print(json.dumps(document), flush=True)
    else:
        print(_runs.describe_withdrawal(args.submission_id, outcome, withdrawn), flush=True)
    return EXIT_OK if outcome == "withdrawn" else EXIT_FAILED


def tool_names(text: str) -> list[str] | str:
    """``--tools A,B`` as its names, each stripped (``''``: none); or what is wrong with it (an empty name)."""
    if not text.strip():
        return []
    names = [name.strip() for name in text.split(",")]
    if "" in names:
        return "a tool's name is empty (names are separated by single commas; give '' for no tools)"
    return names
