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
    DEFAULT_HEARTBEAT_TIMEOUT_S,
    DEFAULT_MAX_LEASES,
    MAX_LEASES_PER_WORKER,
    DatabaseDamaged,
    NotATetherDatabase,
    OwnerAlreadyRunning,
    SchemaTooNew,
    StorageError,
    TetherError,
    UsageError,
    raise_collapsed,
)

from ._args import count, positive
from ._exits import (
    EXIT_ALREADY_RUNNING,
    EXIT_DATABASE_DAMAGED,
    EXIT_FAILED,
    EXIT_NOT_TETHER_DATABASE,
    EXIT_OK,
    EXIT_SCHEMA_TOO_NEW,
    EXIT_USAGE,
)
from ._parent import DEFAULT_LIVENESS_TIMEOUT_S, watch_parent
from ._signals import replay_early_signals, restore_default_signals

DEFAULT_MAX_CONCURRENT_RUNS: Final = 64
"""As ``storage_owner.core.DEFAULT_MAX_CONCURRENT_RUNS`` (not imported: the CLI loads the owner only to run it)."""
RUNS_COMMANDS: Final = frozenset(
    {
        "submit",
        "submissions",
        "withdraw",
        "reset",
        "configure",
        "runs",
        "resolve",
        "retry",
        "cancel",
        "respond",
        "interactions",
    }
)
USAGE_COMMANDS: Final = frozenset({"usage", "prices", "budget"})
SIGNAL_LISTENING_COMMANDS: Final = frozenset({"owner", "worker", "up"})
"""Commands that stop cleanly on SIGINT or SIGTERM, including one sent while they start (``runtime._signals``)."""

DEFAULT_HANDSHAKE_TIMEOUT_S: Final = 10.0
DEFAULT_MAX_UNAUTHENTICATED: Final = 64
"""As ``storage_owner.io``'s (not imported: the CLI loads the owner only to run it)."""
DEFAULT_MAX_PEER_OUTPUT_MIB: Final = 16
DEFAULT_MAX_QUEUED_OUTPUT_MIB: Final = 256
"""As ``storage_owner.core``'s output budgets, in MiB (not imported, as above)."""
DEFAULT_APP: Final = "runtime.demo_app:app"
DEFAULT_DRAIN_TIMEOUT_S: Final = 30.0
"""As ``actors``' (not imported: the CLI loads the client only to run it)."""
STOP_MARGIN_S: Final = 10.0
"""How much longer than the supervisor's own bound on its stop (``stop_within_s`` in its state file: the workers'
drain and the stop timeouts) ``tether stop`` waits by default; a lone owner gets that margin and a minute."""


def _listen_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (such as 127.0.0.1:0), not {text!r}")
    return host.strip("[]"), int(port)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, not {text!r}")
    return value


def _seconds_or_zero(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds, 0 or more, not {text!r}")
    return value


def _json_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected a JSON value (such as '{{\"ok\": true}}'), not {text!r}: {exc}"
        ) from None


def _add_db(command: argparse.ArgumentParser) -> None:
    """The ``--db`` option of a command that reaches a database's owner (default ``./tether.db``)."""
    command.add_argument("--db", default="tether.db", help="the database (default ./tether.db)")


def _add_json(command: argparse.ArgumentParser, what: str) -> None:
    """The ``--json`` flag of a command that prints records; ``what`` says what the JSON holds."""
    command.add_argument("--json", action="store_true", help=what)


def _add_runs_commands(commands: Any) -> None:
    """``tether submit``, ``runs``, ``resolve``, ``retry``, ``cancel``, ``respond`` and ``interactions``."""
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
    submit.add_argument("text", metavar="TEXT", nargs="?", help="what to say (not with --write)")
    _add_db(submit)
    to = submit.add_mutually_exclusive_group(required=True)
    to.add_argument("--conversation", metavar="ID", help="an existing conversation bound to an agent")
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
        "--data", type=_json_text, metavar="JSON", help="the data of the --write or --entry entry (default null)"
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
    _add_json(submit, "print one JSON object: conversation_id, submission, run")

    submissions = commands.add_parser(
        "submissions",
        help="list what was submitted to a conversation and what became of it",
        description="Print every submission to a conversation in the order it was admitted: its kind (input, steer, "
        "write), its status (queued, placed, done, unanswered and why), the run that answers it, and its text.",
    )
    _add_db(submissions)
    submissions.add_argument("--conversation", required=True, metavar="ID", help="the conversation")
    _add_json(submissions, "print one JSON object with the submission records")

    withdraw = commands.add_parser(
        "withdraw",
        help="take back a queued submission",
        description="Take back a submission that is still queued (a steer not yet placed, a follow-up whose run has "
        "not started): it settles unanswered (withdrawn), and a follow-up's run is cancelled. One already placed in "
        "a run, or settled, is left as it is (exit 1, saying so).",
    )
    withdraw.add_argument("submission_id", metavar="SUBMISSION_ID", help="the submission")
    _add_db(withdraw)
    _add_json(withdraw, "print one JSON object: outcome, submission")

    reset = commands.add_parser(
        "reset",
        help="start a conversation's model context again (optionally from a handoff note)",
        description="Place a reset in the conversation: the model no longer sees older entries (they stay stored), "
        "and starts from the --handoff text when given. Idle: placed at once. While a run works: placed at its next "
        "boundary; at the end of a tool round it ends that run there (its inputs unanswered, reason reset), and what "
        "is queued behind it runs in the new context.",
    )
    reset.add_argument("conversation_id", metavar="CONVERSATION_ID", help="the conversation")
    _add_db(reset)
    reset.add_argument("--handoff", metavar="TEXT", help="what the new context starts from (its first user message)")
    _add_json(reset, "print the submission record")

    configure = commands.add_parser(
        "configure",
        help="show or change what one conversation runs with (model, tools, instructions, turn limit, inbox modes)",
        description="Change a conversation's configuration in one commit, or print it without options. --model (a "
        "name the app gives a model with app.define_model), --tools, --instructions and --max-turns replace its "
        "agent's from the run's next model request (only workers whose app names the model run its runs; with none "
        "attached, the run needs attention: no_model); --steering all places every queued steer at a boundary "
        "(first: one per boundary), --follow-ups all queues follow-ups together in one run; --after-failed-run says "
        "what becomes of the runs queued behind one that fails (wait, the default: held until the next input; "
        "continue; withdraw); --clear FIELD puts a field back to the agent's definition (or the default). A bad "
        "value exits 1 with the owner's reason and changes nothing.",
    )
    configure.add_argument("conversation_id", metavar="CONVERSATION_ID", help="the conversation")
    _add_db(configure)
    configure.add_argument("--model", metavar="NAME", help="a model the app names (app.define_model)")
    configure.add_argument("--tools", metavar="A,B", help="exactly these of the app's tools (comma separated)")
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
    _add_json(configure, "print the configuration document")

    runs = commands.add_parser(
        "runs",
        help="list the agent runs of a database",
        description="Print every run, oldest first: its conversation, agent@version, status and reason, the "
        "operation it is blocked on, its tokens, and why a failed run failed (its error). Asks the running owner.",
    )
    _add_db(runs)
    runs.add_argument("--conversation", metavar="ID", help="only this conversation's runs")
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
    _add_json(runs, "print one JSON object with a list of run records")

    resolve = commands.add_parser(
        "resolve",
        help="settle an interrupted manual tool call with its output",
        description="Give an interrupted tool call (a run needs_attention with reason tool_interrupted) the output "
        "the model sees, after checking by hand what the tool did. The run then resumes.",
    )
    resolve.add_argument("operation_id", metavar="OPERATION_ID", help="the operation the run is blocked on")
    _add_db(resolve)
    resolve.add_argument("--output", required=True, type=_json_text, metavar="JSON", help="the tool's output, JSON")
    _add_json(resolve, "print the operation record")

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
        command.add_argument("run_id", metavar="RUN_ID", help="the run")
        _add_db(command)
        _add_json(command, "print the run record")

    respond = commands.add_parser(
        "respond",
        help="answer an open approval or question",
        description="Answer an open interaction (see tether interactions): approve or deny an approval, or give a "
        "question its answer. It is answered once.",
    )
    respond.add_argument("interaction_id", metavar="INTERACTION_ID", help="the interaction")
    _add_db(respond)
    answer = respond.add_mutually_exclusive_group(required=True)
    answer.add_argument("--approve", action="store_true", help="let the tool call run")
    answer.add_argument("--deny", action="store_true", help="refuse it (the model is told)")
    answer.add_argument(
        "--answer",
        type=_json_text,
        metavar="JSON",
        help="answer a question with a JSON value its schema accepts (a text is '\"yes\"')",
    )
    respond.add_argument("--note", metavar="TEXT", help="a note kept with an approval's answer")
    _add_json(respond, "print the interaction record")

    interactions = commands.add_parser(
        "interactions",
        help="list the open approvals and questions, and how to answer each",
        description="Print every open interaction: its run, the tool and its arguments, and the command that answers "
        "it.",
    )
    _add_db(interactions)
    _add_json(interactions, "print one JSON object with the interactions")

    ui = commands.add_parser(
        "ui",
        help="a web page to operate the database's agents: runs, transcripts live, approvals, questions, resolve",
        description=(
            "Serve a web page for the database's owner (which must run: tether up or tether owner): runs by state "
            "and what waits for a person (approvals, questions, tool calls to resolve) with the buttons that answer "
            "them, each conversation's transcript updating live (a model's text while it streams), each run's "
            "journal with retry and cancel, the task tree and usage. The first line printed is the URL to open: it "
            "carries the login token, without which every page and action is refused. It listens on loopback only. "
            "Ctrl-C (SIGINT) or SIGTERM stop it."
        ),
    )
    _add_db(ui)
    ui.add_argument(
        "--listen",
        type=_listen_address,
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
    _add_db(watch)
    scope = watch.add_mutually_exclusive_group()
    scope.add_argument("--conversation", metavar="ID", help="only this conversation")
    scope.add_argument("--run", metavar="RUN_ID", help="only this run (in its conversation)")
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
            "Refuses, changing nothing, a file that is not a Tether database (exit 5: another application's, not "
            "SQLite, or empty) and a damaged one (exit 6, found by a quick check at start). Writes DB.runtime.json "
            "(URL and access token, mode 0600) once listening, so peers find it from the database path. Stops "
            "cleanly on SIGINT or SIGTERM."
        ),
    )
    owner.add_argument(
        "--db", required=True, help="the SQLite database file (created if missing, mode 0600, and said so)"
    )
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
        type=positive,
        metavar="K",
        help="fault injection: SIGKILL this owner right before its K-th writing COMMIT",
    )
    owner.add_argument(
        "--fault-kill-after-commit",
        type=positive,
        metavar="K",
        help="fault injection: SIGKILL this owner right after its K-th writing COMMIT",
    )
    owner.add_argument(
        "--fault-kill-before-result",
        type=positive,
        metavar="K",
        help="fault injection: SIGKILL this owner right before committing the K-th operation result it receives",
    )
    owner.add_argument(
        "--fault-kill-after-result",
        type=positive,
        metavar="K",
        help="fault injection: SIGKILL this owner right after committing the K-th operation result it receives",
    )
    owner.add_argument(
        "--fault-storage-error-at-commit",
        type=positive,
        metavar="K",
        help="fault injection: fail the K-th writing COMMIT with a storage error (the owner fails closed)",
    )

    demo = commands.add_parser(
        "demo",
        help=(
            "the main job: durable checkouts and a durable agent under tether up, an agent's answer streaming, "
            "the commit path surviving a SIGKILL, then an agent asking a subagent and a person"
        ),
        description=(
            "Part 1 (tasks): run tether up with two workers serving the demo app and three checkouts of four "
            "payments each, shown live: a declined card (fail_fast aborts the other payments bottom-up, each "
            "refunding its charge), a cancelled checkout (the payments' abort handlers end before the "
            "checkout's), and a worker killed with SIGKILL mid-payment; then check the fake bank's ledger: every "
            "card charged at most once. Part 2 (agents): under tether up, the demo app's support agent (a "
            "scripted model) calls a safe, an idempotent and a manual tool, one behind an approval, shown live: "
            "the approval is answered (tether respond), the worker is SIGKILLed while the tools run, the safe "
            "tool runs again, the idempotent one runs again under the same operation id (the fake desk answers "
            "the repeat from its key), the manual one stops the run as needs_attention and is resolved (tether "
            "resolve); the answer arrives, and the desk's ledger shows no effect done twice. Part 3 (agent): the "
            "demo app's agent tracker (a scripted model) looks an order up and streams its answer, shown as "
            "tether watch --plain shows it, piece by piece before the answer is committed; with --model NAME it "
            "runs on a real model (OPENAI_API_KEY or OPENAI_BASE_URL). Part 4 (commits): "
            "two writer processes append entries, the owner is SIGKILLed mid-stream and started again, and every "
            "acknowledged entry is stored exactly once. Part 5 (research): the demo app's agent analyst asks the "
            "agent researcher (a subagent), then a tool of it asks a person how much to refund and pays it through "
            "a nested call; the worker is SIGKILLed while the question is open, the question is answered (tether "
            "respond --answer), and nothing is asked, run or paid twice."
        ),
    )
    demo.add_argument("--db", default="tether.db", help="database to use (default ./tether.db)")
    demo.add_argument(
        "--part",
        choices=("all", "tasks", "agents", "agent", "commits", "research"),
        default="all",
        help="which part to run (default all)",
    )
    demo.add_argument(
        "--model",
        metavar="NAME",
        help="part agent: run the agent on this real model (such as gpt-4o-mini) through the Chat Completions API "
        "at OPENAI_BASE_URL (default api.openai.com) with OPENAI_API_KEY; one of the two must be set",
    )
    demo.add_argument(
        "--entries", type=positive, default=400, help="part commits: entries each writer appends (default 400)"
    )

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
    up.add_argument("--db", default="tether.db", help="the database (default ./tether.db)")
    up.add_argument(
        "--app",
        default=DEFAULT_APP,
        metavar="MODULE:ATTR",
        help=f"the application the workers serve (default the built-in demo app, {DEFAULT_APP})",
    )
    up.add_argument("--workers", type=count, default=2, help="how many worker processes (default 2)")
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
        default=DEFAULT_HEARTBEAT_TIMEOUT_S,
        metavar="S",
        help=f"the owner drops a peer silent for S seconds (default {DEFAULT_HEARTBEAT_TIMEOUT_S:g})",
    )
    up.add_argument(
        "--max-restarts",
        type=count,
        default=10,
        metavar="R",
        help="give up after more than R restarts ... (default 10)",
    )
    up.add_argument(
        "--restart-window", type=_seconds, default=60.0, metavar="T", help="... within T seconds (default 60)"
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
        type=_seconds_or_zero,
        default=DEFAULT_DRAIN_TIMEOUT_S,
        metavar="S",
        help=f"on SIGINT, SIGTERM or tether stop, the workers take no new work and let what they run (phases, tool "
        f"calls, model requests) finish and commit for at most S seconds, then cut off what still runs (it follows "
        f"its recovery policy); a second signal stops at once (default {DEFAULT_DRAIN_TIMEOUT_S:g})",
    )
    up.add_argument(
        "--liveness-timeout",
        type=_seconds,
        default=DEFAULT_LIVENESS_TIMEOUT_S,
        metavar="S",
        help="kill a hung owner: one that has not answered the supervisor's probe (a read of its peers through its "
        "commit loop, every S/2 seconds, or every quarter of --heartbeat-timeout if that is sooner) for S seconds, "
        "counted from the first probe; the standby takes over. Also kill "
        "a worker that attached once and has not been attached for S seconds while the owner answers (the owner "
        f"dropped it); it is restarted (default {DEFAULT_LIVENESS_TIMEOUT_S:g})",
    )

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
        type=_seconds_or_zero,
        default=DEFAULT_DRAIN_TIMEOUT_S,
        metavar="S",
        help=f"on SIGINT or SIGTERM, take no new work and let what runs (phases, tool calls, model requests) finish "
        f"and commit for at most S seconds, then cut off what still runs (it follows its recovery policy); a second "
        f"signal stops at once (default {DEFAULT_DRAIN_TIMEOUT_S:g})",
    )
    worker.add_argument(
        "--fault-kill",
        metavar="POINT:N[:KIND[:NAME]]",
        help="fault injection: SIGKILL this worker at the N-th POINT of the commits of its phases: before_commit, "
        "after_commit, after_intent, before_result or after_result, counting only KIND (model or tool) operations "
        "named NAME if given (such as after_intent:1:tool:refund; docs/operations.md, Fault injection)",
    )
    worker.add_argument(
        "--otel",
        action="store_true",
        help="OpenTelemetry spans of phases, model requests and tool calls on the global tracer provider (the "
        "tether[otel] extra; same as TETHER_OTEL=1; see docs/telemetry.md)",
    )

    status = commands.add_parser(
        "status",
        help="show what runs for a database: supervisor, owner, standby, workers",
        description="Show whether the supervisor, the owner, its warm standby and each worker are alive and attached, "
        "their pids and restart counts, the database, its schema version and size.",
    )
    status.add_argument("--db", default="tether.db", help="the database (default ./tether.db)")
    status.add_argument("--json", action="store_true", help="print one JSON object")

    stop = commands.add_parser(
        "stop",
        help="stop the runtime of a database (its supervisor, or its lone owner) and wait until it is gone",
        description=(
            "Send SIGTERM to the supervisor of DB (tether up), or to its lone owner, and wait until it is gone, saying "
            "what it waits for: the workers first finish what they run (for at most their --drain-timeout), then the "
            "owner closes the database. Exit 1 with a reason if nothing runs or it did not stop in time."
        ),
    )
    stop.add_argument("--db", default="tether.db", help="the database (default ./tether.db)")
    stop.add_argument(
        "--timeout",
        type=_seconds,
        default=None,
        metavar="S",
        help="wait at most S seconds (default: as long as the supervisor may take, its workers' --drain-timeout "
        f"and the stop timeouts of its children, plus {STOP_MARGIN_S:g} s; 70 s for tether up's defaults)",
    )

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
    check.add_argument("--db", default="tether.db", help="the database (default ./tether.db)")
    check.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object, whatever the outcome (the exit status is the same): db, ok, problems, "
        "schema_version, application_id, pages (null when the file is missing, unreadable or not a Tether database)",
    )

    _add_runs_commands(commands)
    from ._usage import add_usage_commands

    add_usage_commands(commands)
    for command in (owner, up):
        command.add_argument(
            "--start-check",
            type=_seconds_or_zero,
            default=1.0,
            metavar="S",
            help="check an existing database with PRAGMA quick_check for at most S seconds before serving it, and "
            "refuse it if damaged (default 1; a larger database is served and said to be not checked fully; 0 skips "
            "the check; `tether check` runs the full one)",
        )
        command.add_argument(
            "--group-readable",
            action="store_true",
            help="create a new database (and its -wal, -shm) readable by the owner's group, mode 0640 (default 0600)",
        )
    for command in (owner, up):
        command.add_argument(
            "--max-concurrent-runs",
            type=positive,
            default=DEFAULT_MAX_CONCURRENT_RUNS,
            metavar="N",
            help=f"agent runs busy at once across conversations; later ones wait queued (default "
            f"{DEFAULT_MAX_CONCURRENT_RUNS})",
        )
    for command in (owner, worker):
        command.add_argument("--supervised", action="store_true", help=argparse.SUPPRESS)
    # tether up's check before it starts workers: load the app as a worker would, then exit 0 (or 2, saying why).
    worker.add_argument("--check-app", action="store_true", help=argparse.SUPPRESS)
    owner.add_argument(
        "--otel",
        action="store_true",
        help="OpenTelemetry metrics and run spans on the global providers (the tether[otel] extra; same as "
        "TETHER_OTEL=1; see docs/telemetry.md)",
    )
    owner.add_argument("--standby", action="store_true", help=argparse.SUPPRESS)  # tether up's warm standby
    owner.add_argument(
        "--heartbeat-timeout",
        type=_seconds,
        default=DEFAULT_HEARTBEAT_TIMEOUT_S,
        metavar="S",
        help=f"drop a peer silent for S seconds; peers send something every quarter of it (default "
        f"{DEFAULT_HEARTBEAT_TIMEOUT_S:g})",
    )
    for command in (owner, up):
        _add_exposure_arguments(command)
    return parser


def _add_exposure_arguments(owner: argparse.ArgumentParser) -> None:
    """``tether owner``'s listener: TLS, the handshake's bounds, and the consent to listen without TLS."""
    owner.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="serve wss:// with this PEM certificate (chain); needs --tls-key. Required (or --insecure-listen) "
        "to listen on an address other than loopback",
    )
    owner.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (PEM, unencrypted)")
    owner.add_argument(
        "--tls-ca",
        metavar="FILE",
        help="the CA certificate peers on this host verify the owner with, named in DB.runtime.json (default "
        "--tls-cert itself, right for a self-signed certificate)",
    )
    owner.add_argument(
        "--insecure-listen",
        action="store_true",
        help="allow --listen on an address other than loopback without TLS: the access token and every frame "
        "cross the network in clear",
    )
    owner.add_argument(
        "--handshake-timeout",
        type=_seconds,
        default=DEFAULT_HANDSHAKE_TIMEOUT_S,
        metavar="S",
        help=f"close a connection that has not finished TLS, the WebSocket upgrade and its hello within S seconds "
        f"(default {DEFAULT_HANDSHAKE_TIMEOUT_S:g})",
    )
    owner.add_argument(
        "--max-unauthenticated",
        type=positive,
        default=DEFAULT_MAX_UNAUTHENTICATED,
        metavar="N",
        help=f"connections in their handshake at once; past N a new one is closed at once (default "
        f"{DEFAULT_MAX_UNAUTHENTICATED})",
    )
    owner.add_argument(
        "--max-peer-output",
        type=positive,
        default=DEFAULT_MAX_PEER_OUTPUT_MIB,
        metavar="MIB",
        help="unread replies and events one peer may have in the owner; past it its requests are refused "
        f"'overloaded' (retried by the client) and its watches read the log later (default "
        f"{DEFAULT_MAX_PEER_OUTPUT_MIB})",
    )
    owner.add_argument(
        "--max-queued-output",
        type=positive,
        default=DEFAULT_MAX_QUEUED_OUTPUT_MIB,
        metavar="MIB",
        help="unread output across every peer; past it requests are refused 'overloaded' and the peers holding "
        f"the most are dropped (default {DEFAULT_MAX_QUEUED_OUTPUT_MIB})",
    )


def _exposure_problem(args: argparse.Namespace) -> str | None:
    """Why ``tether owner``, ``tether up`` or ``tether ui`` must not start (exit 2, nothing started): a non-loopback
    --listen without TLS or --insecure-listen, half a TLS pair, TLS files that cannot be used; ``None`` if none."""
    from storage_owner.io import check_exposure, server_ssl_context

    host, _ = args.listen
    if (args.tls_cert is None) != (args.tls_key is None):
        return "--tls-cert and --tls-key go together: give both, or neither; nothing was started"
    if getattr(args, "tls_ca", None) is not None and args.tls_cert is None:
        return "--tls-ca needs --tls-cert and --tls-key; nothing was started"
    try:
        check_exposure(host, tls=args.tls_cert is not None, insecure_listen=args.insecure_listen)
        if args.tls_cert is not None:
            server_ssl_context(args.tls_cert, args.tls_key)
    except TetherError as exc:
        return str(exc)
    return None


def _directory_problem(db: str) -> str | None:
    """Why ``tether owner`` or ``tether up`` cannot use ``--db DB`` at all (its directory is missing), or ``None``."""
    directory = os.path.dirname(os.path.abspath(db))
    if os.path.isdir(directory):
        return None
    return (
        f"the directory of the database does not exist: {directory} (--db {db}); create it, or give another --db; "
        "nothing was started"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command not in SIGNAL_LISTENING_COMMANDS:
        restore_default_signals()
    if args.command in ("owner", "up"):
        missing = _directory_problem(args.db)
        if missing is not None:  # as any other error of the system's at start (a port in use): status 1
            return _fail(f"{args.command}: {missing}", EXIT_FAILED)
        problem = _exposure_problem(args)
        if problem is not None:
            return _fail(f"{args.command}: {problem}", EXIT_USAGE)
    try:
        if args.command == "owner":
            return _run_owner(args)
        if args.command == "demo":
            from ._demo import run_demo
            from ._demo_stream import real_model_problem

            if args.model is not None:
                if args.part != "agent":
                    return _fail(
                        f"demo: --model runs part agent only (--part agent), not --part {args.part}", EXIT_USAGE
                    )
                problem = real_model_problem(os.environ)
                if problem is not None:
                    return _fail(f"demo: {problem}", EXIT_USAGE)
            return trio.run(run_demo, args.db, args.entries, args.part, args.model)
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
        if args.command in RUNS_COMMANDS:
            return _runs_command(args)
        if args.command == "watch":
            return _watch(args)
        if args.command == "ui":
            return _ui(args)
        if args.command in USAGE_COMMANDS:
            from ._usage import run_usage_command

            run_usage_command(args, partial(print, flush=True))
            return EXIT_OK

        if args.command == "check":
            return _check(args)
        if args.command == "stop":
            from ._status import stop

            print(
                stop(args.db, timeout_s=args.timeout, margin_s=STOP_MARGIN_S, say=partial(print, flush=True)),
                flush=True,
            )
            return EXIT_OK
    except OwnerAlreadyRunning as exc:
        return _fail(exc, EXIT_ALREADY_RUNNING)
    except SchemaTooNew as exc:
        return _fail(exc, EXIT_SCHEMA_TOO_NEW)
    except NotATetherDatabase as exc:
        return _fail(exc, EXIT_NOT_TETHER_DATABASE)
    except DatabaseDamaged as exc:
        return _fail(exc, EXIT_DATABASE_DAMAGED)
    except TetherError as exc:
        return _fail(exc, EXIT_FAILED)
    except OSError as exc:  # a missing directory, a port in use, a permission: the system said no
        where = f" ({exc.filename})" if exc.filename else ""
        return _fail(f"{exc.strerror or exc}{where}", EXIT_FAILED)
    except KeyboardInterrupt:
        return 130
    raise AssertionError(f"unhandled command {args.command}")


def _check(args: argparse.Namespace) -> int:
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


def _run_up(args: argparse.Namespace) -> int:
    from ._supervisor import AppRefused, OwnerRefused, Supervisor, SupervisorConfig

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
        drain_timeout_s=args.drain_timeout,
        max_concurrent_runs=args.max_concurrent_runs,
        owner_args=_exposure_owner_args(args),
        group_readable=args.group_readable,
        start_check_s=args.start_check,
        liveness_timeout_s=args.liveness_timeout,
    )
    supervisor = Supervisor(config)
    try:
        _run_trio(supervisor.run)
    except (OwnerRefused, AppRefused) as exc:
        return _fail(exc, exc.exit_status)
    print("tether up: stopped", flush=True)
    return EXIT_OK


def _exposure_owner_args(args: argparse.Namespace) -> tuple[str, ...]:
    """``tether up``'s listener options, as its owner's command line takes them."""
    owner_args = [
        "--handshake-timeout",
        f"{args.handshake_timeout:g}",
        "--max-unauthenticated",
        str(args.max_unauthenticated),
        "--max-peer-output",
        str(args.max_peer_output),
        "--max-queued-output",
        str(args.max_queued_output),
    ]
    for flag, value in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key), ("--tls-ca", args.tls_ca)):
        if value is not None:
            owner_args += [flag, os.path.abspath(value)]
    if args.insecure_listen:
        owner_args.append("--insecure-listen")
    return tuple(owner_args)


def _run_worker(args: argparse.Namespace) -> int:
    import actors

    if args.url is not None and not args.token:
        return _fail("worker: --url needs the owner's access token: --token TOKEN or TETHER_TOKEN", EXIT_USAGE)
    if args.max_leases > MAX_LEASES_PER_WORKER:
        return _fail(f"worker: --max-leases is at most {MAX_LEASES_PER_WORKER}, not {args.max_leases}", EXIT_USAGE)
    try:  # what no retry can mend fails now, not in a loop of attempts
        actors.check_target(db=args.db, url=args.url, token=args.token, ca=args.ca)
    except UsageError as exc:
        return _fail(f"worker: {exc}", EXIT_USAGE)
    try:
        fault_kill = None if args.fault_kill is None else actors.WorkerKill.parse(args.fault_kill)
    except UsageError as exc:
        return _fail(f"worker: --fault-kill: {exc}", EXIT_USAGE)
    try:
        app = actors.load_app(args.app)
    except actors.AppLoadError as exc:  # retrying cannot change it: tether up stops on this status
        return _fail(exc, EXIT_USAGE)
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
                otel=args.otel or None,
                stop=stop,
                fault_kill=fault_kill,
                task_status=_Said(f"tether worker: {name} serving {app.name} on {target}"),
            )
            nursery.cancel_scope.cancel(reason="the worker stopped")

    _run_trio(serve)
    print(f"tether worker: {name} stopped", flush=True)
    return EXIT_OK


class _Said:
    """A ``task_status`` that prints ``line`` once its task has started (a task that stops before starting says
    nothing, where ``nursery.start`` would raise)."""

    def __init__(self, line: str) -> None:
        self._line = line

    def started(self, value: object = None) -> None:
        print(self._line, flush=True)


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


def _runs_command(args: argparse.Namespace) -> int:
    from . import _runs
    from ._connect import check_db

    db = check_db(args.db)
    if args.command == "submit":
        if (args.text is not None) + (args.write is not None) + args.resume != 1:
            message = (
                "give TEXT to say, --write KIND (with --data JSON) to append an entry, or --continue: one of the three"
            )
            return _fail(message, EXIT_USAGE)
        if args.data is not None and args.write is None and args.entry is None:
            return _fail("--data is the data of a --write or --entry entry; an input's text is TEXT", EXIT_USAGE)
        if (args.seen is not None or args.head is not None) and args.write is None:
            return _fail("--seen and --head are a --write entry's (what the model sees of it)", EXIT_USAGE)
        if args.entry is not None and args.text is None:
            return _fail("--entry KIND places TEXT as an entry of KIND: give TEXT", EXIT_USAGE)
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
            return _fail(_runs.failure(run), EXIT_FAILED)
        if submission.status == "unanswered":  # a write whose head left the model's context
            return EXIT_FAILED
        return EXIT_OK
    if args.command == "submissions":
        submitted = trio.run(_runs.list_submissions, db, args.conversation)
        if args.json:
            document = {"conversation_id": args.conversation, "submissions": [_runs.record_json(s) for s in submitted]}
            print(json.dumps(document), flush=True)
        else:
            print(_runs.format_submissions(submitted), flush=True)
        return EXIT_OK
    if args.command == "reset":
        submission = trio.run(_runs.reset, db, args.conversation_id, args.handoff)
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
    if args.command == "configure":
        document = trio.run(
            partial(
                _runs.configure,
                db,
                args.conversation_id,
                model=args.model,
                tools=None if args.tools is None else [name for name in args.tools.split(",") if name],
                instructions=args.instructions,
                max_turns=args.max_turns,
                steering=args.steering,
                follow_ups=args.follow_ups,
                after_failed_run=args.after_failed_run,
                clear=args.clear,
            )
        )
        if args.json:
            print(json.dumps(None if document is None else _runs.record_json(document)), flush=True)
        else:
            print(_runs.describe_configuration(args.conversation_id, document), flush=True)
        return EXIT_OK
    if args.command == "withdraw":
        outcome, withdrawn = trio.run(_runs.withdraw, db, args.submission_id)
        if args.json:
            document = {"outcome": outcome, "submission": None if withdrawn is None else _runs.record_json(withdrawn)}
            print(json.dumps(document), flush=True)
        else:
            print(_runs.describe_withdrawal(args.submission_id, outcome, withdrawn), flush=True)
        return EXIT_OK if outcome == "withdrawn" else EXIT_FAILED
    if args.command == "runs":
        runs = trio.run(partial(_runs.list_runs, db, conversation_id=args.conversation, status=args.status))
        if args.json:
            print(json.dumps({"db": db, "runs": [_runs.record_json(run) for run in runs]}), flush=True)
        else:
            print(_runs.format_runs(runs), flush=True)
        return EXIT_OK
    if args.command == "interactions":
        found = trio.run(_runs.open_interactions, db)
        if args.json:
            print(json.dumps({"db": db, "interactions": [_runs.record_json(i) for i in found]}), flush=True)
        else:
            print(_runs.format_interactions(args.db, found), flush=True)
        return EXIT_OK
    record: Any
    if args.command == "resolve":
        record = trio.run(_runs.resolve, db, args.operation_id, args.output)
        line = f"operation {record.operation_id}: {record.status} (resolved by {record.resolved_by})"
    elif args.command == "respond":
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
        line = f"interaction {record.interaction_id}: {verdict} (run {record.run_id})"
    else:
        record = trio.run(_runs.retry if args.command == "retry" else _runs.cancel, db, args.run_id)
        line = _runs.describe_run(record)
    print(json.dumps(_runs.record_json(record)) if args.json else line, flush=True)
    return EXIT_OK


def _watch(args: argparse.Namespace) -> int:
    from ._watch import Mode, watch

    mode: Mode = "json" if args.json else "plain" if args.plain or not sys.stdout.isatty() else "live"
    function = partial(
        watch, args.db, conversation_id=args.conversation, run_id=args.run, from_seq=args.from_seq, mode=mode
    )
    try:
        _run_trio(function)
    except BrokenPipeError:  # the reader of our output went away (``tether watch --json | head``): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
    return EXIT_OK


def _ui(args: argparse.Namespace) -> int:
    from ._ui import serve_ui

    problem = _exposure_problem(args)
    if problem is not None:
        return _fail(f"ui: {problem}", EXIT_USAGE)
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
    _run_trio(partial(_serve_until_stopped, function, supervised=False, started=lambda url: str(url)))
    return EXIT_OK


async def _serve_until_stopped(
    serve: Callable[..., Awaitable[object]], *, supervised: bool, started: Callable[[Any], str]
) -> None:
    """Start ``serve`` (a function for ``nursery.start``), print ``started(its value)``, and serve until SIGINT or
    SIGTERM, or, for a ``--supervised`` child, until the supervisor is gone (see ``runtime._parent``)."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        replay_early_signals()  # one that came while Python imported what the command needs stops it now
        async with trio.open_nursery() as nursery:
            if supervised:
                nursery.start_soon(watch_parent, partial(nursery.cancel_scope.cancel, reason="the supervisor is gone"))
            # Listening from the start: a worker still waiting for its owner stops on SIGTERM too.
            nursery.start_soon(_cancel_on_signal, signals, nursery.cancel_scope)
            value = await nursery.start(serve)
            print(started(value), flush=True)


async def _cancel_on_signal(signals: Any, cancel: trio.CancelScope) -> None:
    async for _ in signals:
        cancel.cancel(reason="SIGINT or SIGTERM")
        return


def _run_trio(function: Callable[[], Awaitable[object]]) -> None:
    """``trio.run`` with the single-exception groups of the public boundary collapsed."""
    try:
        trio.run(function)
    except BaseExceptionGroup as group:
        raise_collapsed(group)


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
        kill_before_result=args.fault_kill_before_result,
        kill_after_result=args.fault_kill_after_result,
        storage_error_at_commit=args.fault_storage_error_at_commit,
        heartbeat_timeout_s=args.heartbeat_timeout,
        max_concurrent_runs=args.max_concurrent_runs,
        handshake_timeout_s=args.handshake_timeout,
        max_unauthenticated=args.max_unauthenticated,
        max_peer_output=args.max_peer_output << 20,
        max_queued_output=args.max_queued_output << 20,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_ca=args.tls_ca,
        insecure_listen=args.insecure_listen,
        group_readable=args.group_readable,
        start_check_s=args.start_check,
        standby=args.standby,
    )
    try:
        server = OwnerServer(config, otel=args.otel or None)
    except TetherError as exc:  # telemetry asked for, without OpenTelemetry installed
        return _fail(exc, EXIT_USAGE)
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
