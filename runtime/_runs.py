"""``tether submit``, ``runs``, ``resolve``, ``retry``, ``cancel``, ``respond`` and ``interactions``: agent runs
from the command line, each one client call (or a few) against the running owner of a database."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Final

import actors
from protocol import RUN_TERMINAL, PeerInfo, RunRecord, amount_text, converter

from ._connect import connect
from ._table import columns
from ._watch_view import SCHEMA_PREVIEW_CHARS as SCHEMA_CHARS
from ._watch_view import WatchView, one_line, preview, retry_commands

SETTLED: Final = ("completed", "failed", "cancelled", "needs_attention")
"""The statuses that end ``wait_for_run``."""


def record_json(record: Any) -> Any:
    """A record as the wire carries it (the one converter unstructures it)."""
    return converter.unstructure(record)


def describe_run(run: RunRecord, note: str | None = None) -> str:
    """One line: the run, its status and why (the reason, and for a failed run the error in words), what it is
    blocked on, and ``note`` (a run in ``retry_wait``: which attempt failed, and when the next is)."""
    line = f"run {run.run_id}: {run.status}"
    if run.reason is not None:
        line += f" ({run.reason})"
    if run.operation_id is not None:
        line += f", blocked on operation {run.operation_id}"
    note = run.error or note
    if note is not None:
        line += f": {one_line(note)}"
    return line


def failure(run: RunRecord) -> str:
    """The one line a failed run ends ``tether submit`` with (on stderr): its reason and its error."""
    line = f"run {run.run_id} failed ({run.reason or 'no reason given'})"
    return line if run.error is None else f"{line}: {one_line(run.error)}"


def tokens(run: RunRecord) -> str:
    usage = run.usage
    text = f"{usage.input_tokens}/{usage.output_tokens}"
    return text if usage.cost is None else f"{text} ${amount_text(usage.cost)}"


def format_runs(runs: list[RunRecord]) -> str:
    """The runs as a table, oldest first; a failed run's error last, whole, on its row."""
    if not runs:
        return "no runs"
    header = ("RUN", "CONVERSATION", "AGENT", "STATUS", "REASON", "BLOCKED ON", "TOKENS IN/OUT", "ERROR")
    rows = [
        (
            run.run_id,
            run.conversation_id,
            f"{run.agent}@{run.version}" if run.version else run.agent,
            run.status,
            run.reason or "-",
            run.operation_id or "-",
            tokens(run),
            "" if run.error is None else one_line(run.error),
        )
        for run in runs
    ]
    return "\n".join(columns(header, rows))


async def submit(
    db: str,
    text: str,
    *,
    conversation_id: str | None,
    agent: str | None,
    request_id: str | None,
    when_busy: actors.WhenBusy,
    wait: bool,
    when_idle: actors.WhenIdle = "start",
    write: dict[str, Any] | None = None,
    entry: dict[str, Any] | None = None,
    resume: bool = False,
    say: Callable[[str], None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> tuple[str, actors.SubmissionRecord, RunRecord | None]:
    """Submit ``text`` as an ``input`` (to a new conversation bound to ``agent`` when given); return the
    conversation, the submission and its run (with ``wait``, once it settled).

    ``say`` gets each line for a person as soon as it is known: the new conversation and the run before the wait
    starts (so an interrupted wait has shown them), the settled run and its answer after it. ``warn`` gets one line
    when no attached worker announces the run's agent (the run waits until one does; ``wait`` waits for it too), and
    with ``wait``, one when the owner stops answering and one when it answers again (the wait goes on meanwhile).
    """
    show = say or (lambda line: None)
    async with connect(db, "tether-submit", warn=warn if wait else None) as client:
        if agent is not None:
            conversation_id = await client.create_conversation(agent=agent)
            show(f"conversation {conversation_id} (agent {agent})")
        assert conversation_id is not None
        request_id = request_id or actors.new_id()
        if write is not None:
            submission = await client.submit(conversation_id, kind="write", payload=write, request_id=request_id)
            show(f"submission {submission.submission_id}: {describe_write(submission)}")
            return conversation_id, submission, None
        if resume:
            submission = await client.submit(conversation_id, kind="continue", request_id=request_id)
        else:
            submission = await client.submit(
                conversation_id,
                kind="input",
                payload=text,
                request_id=request_id,
                when_busy=when_busy,
                when_idle=when_idle,
                entry=entry,
            )
        if submission.run_id is None:
            show(f"submission {submission.submission_id} (request {submission.request_id})")
            return conversation_id, submission, None
        if submission.when_busy == "steer":
            show(describe_submission(submission))
            if not wait:
                return conversation_id, submission, None
            submission = await client.wait_for_submission(submission.submission_id)
            show(describe_submission(submission))
            if submission.answer is not None:
                show(submission.answer.text)
            return conversation_id, submission, None
        assert submission.run_id is not None
        run = await client.run(submission.run_id)
        if when_busy == "steer" and not resume:  # no run was going for it to join
            started = "queued" if run.status == "queued" else "started"
            show(f"submission {submission.submission_id}: nothing was running to join, so the steer {started} a run")
        show(f"{describe_run(run)}; request {submission.request_id}")
        if warn is not None and run.status not in RUN_TERMINAL and run.reason != "cancelling":
            missing = agent_missing(db, run.agent, await client.peers())
            if missing is not None:
                warn(missing + ("; waiting for it (Ctrl-C ends the wait, not the run)" if wait else ""))
        if wait and run.status not in SETTLED:
            run = await follow_run(client, db, run, show)
        if wait:
            for line in next_steps(db, run):
                show(line)
        if run.answer is not None:
            show(run.answer.text)
        return conversation_id, submission, run


def describe_submission(submission: actors.SubmissionRecord) -> str:
    """One line: the submission, what it is, where it stands, and the run that answers it."""
    what = "write" if submission.kind == "write" else "steer" if submission.when_busy == "steer" else submission.kind
    status = submission.status
    if status == "unanswered" and submission.reason:
        status = f"unanswered ({submission.reason})"
    elif status == "queued" and what == "steer":
        status = "queued (joins the run at its next boundary: a tool round's end, or its answer)"
    run = f", run {submission.run_id}" if submission.run_id else ""
    return f"submission {submission.submission_id}: {what}, {status}{run}"


async def list_submissions(db: str, conversation_id: str) -> list[actors.SubmissionRecord]:
    async with connect(db, "tether-submissions", role="reader") as client:
        return await client.submissions(conversation_id)


def format_submissions(submissions: Sequence[actors.SubmissionRecord]) -> str:
    """A table: each submission's id, kind, status (and why), run and text, oldest first."""
    if not submissions:
        return "no submissions"
    header = ("SUBMISSION", "KIND", "STATUS", "RUN", "TEXT")
    rows = []
    for one in submissions:
        what = "write" if one.kind == "write" else "steer" if one.when_busy == "steer" else one.kind
        status = f"{one.status} ({one.reason})" if one.reason else one.status
        payload = one.payload
        if one.kind == "write" and isinstance(payload, dict):
            text = str(payload.get("kind"))
        else:
            text = payload if isinstance(payload, str) else json.dumps(payload)
        text = " ".join(str(text).split())
        rows.append((one.submission_id, what, status, one.run_id or "-", text[:60] + ("…" if len(text) > 60 else "")))
    return "\n".join(columns(header, rows))


async def withdraw(db: str, submission_id: str) -> tuple[str, actors.SubmissionRecord | None]:
    async with connect(db, "tether-withdraw") as client:
        outcome = await client.withdraw(submission_id)
        found = None
        if outcome != "not_found":
            found = await client.wait_for_submission(submission_id) if outcome != "already_placed" else None
        return outcome, found


def describe_withdrawal(submission_id: str, outcome: str, record: actors.SubmissionRecord | None) -> str:
    if outcome == "withdrawn":
        return f"submission {submission_id}: withdrawn (unanswered); nothing of it reaches the model"
    if outcome == "already_placed":
        return f"submission {submission_id}: already placed in its run, so not withdrawn (cancel the run instead)"
    if outcome == "settled":
        assert record is not None
        return f"submission {submission_id}: already settled ({record.status}), so nothing was withdrawn"
    return f"submission {submission_id}: no such submission in this database; nothing was withdrawn"


def describe_write(submission: actors.SubmissionRecord) -> str:
    """What became of a write, for a person."""
    kind = submission.payload.get("kind") if isinstance(submission.payload, dict) else None
    request = f"(request {submission.request_id})"
    if submission.status == "done":
        return f"entry {kind} appended {request}"
    if submission.status == "queued":
        return f"entry {kind} waits for run {submission.run_id}'s next boundary, or behind a queued reset {request}"
    return (
        f"entry {kind} not placed: {submission.status} ({submission.reason}: its head is no longer in the model's "
        f"context) {request}"
    )


async def reset(db: str, conversation_id: str, handoff: str | None) -> actors.SubmissionRecord:
    async with connect(db, "tether-reset") as client:
        return await client.reset(conversation_id, handoff)


async def configure(db: str, conversation_id: str, *, clear: Sequence[str], force: bool = False, **fields: Any) -> Any:
    """Apply the fields given (``None``: left as is) and ``clear``; without any, read the configuration. ``force``
    stores a model or tool name no attached worker announces (``client.configure(force=True)``)."""
    async with connect(db, "tether-configure") as client:
        if clear or any(value is not None for value in fields.values()):
            return await client.configure(conversation_id, clear=clear, force=force, **fields)
        return await client.document(actors.CONFIG_DOCUMENT, conversation_id=conversation_id)


def describe_configuration(conversation_id: str, document: Any) -> str:
    if document is None or not document.value:
        return f"conversation {conversation_id}: its agent's definition (nothing configured)"
    fields = "; ".join(f"{name} {json.dumps(value)}" for name, value in sorted(document.value.items()))
    return f"conversation {conversation_id}, configuration version {document.version}: {fields}"


def agent_missing(db: str, agent: str, peers: Sequence[PeerInfo]) -> str | None:
    """What to tell a person whose run's agent no attached worker announces (``None``: one does)."""
    announced = sorted(
        {capability.name for peer in peers for capability in peer.capabilities if capability.kind == "agent"}
    )
    if agent in announced:
        return None
    if not any(peer.role == "worker" for peer in peers):
        return (
            f"tether submit: no worker is attached, so none announces agent {agent!r}; the run waits until one that "
            f"does attaches (tether up --db {db} --app MODULE:ATTR, or tether worker --db {db} --app MODULE:ATTR)"
        )
    they = ", ".join(announced) if announced else "no agent"
    return (
        f"tether submit: no attached worker announces agent {agent!r} (they announce: {they}); the run waits until "
        "one that does attaches"
    )


async def follow_run(client: actors.Client, db: str, run: RunRecord, show: Callable[[str], None]) -> RunRecord:
    """Watch ``run``'s conversation until the run is settled (as ``wait_for_run`` returns it), telling a person each
    new status as it is committed, and each approval it asks for with the command that answers it (the wait goes on
    while a person answers in another terminal). A run waiting to retry says which attempt failed and when the next
    is. Resumes by itself after an owner restart, as every watch does."""
    view = WatchView(db, run_id=run.run_id)  # what the run's journal and task say, for the retry notes
    view.follow(run)
    async with client.watch(conversation_id=run.conversation_id, from_seq=run.seq) as changes:
        async for change in changes:
            view.fold(change.seq, change.records)
            for record in change.records:
                if isinstance(record, actors.InteractionRecord) and record.run_id == run.run_id:
                    if record.status == "open":
                        show(format_interactions(db, [record]))
                elif isinstance(record, RunRecord) and record.run_id == run.run_id:
                    if (record.status, record.reason, record.operation_id) != (
                        run.status,
                        run.reason,
                        run.operation_id,
                    ):
                        show(describe_run(record, view.retry_note(record)))
                    run = record
                    if run.status in SETTLED:
                        return run
    raise AssertionError("a watch ends only with its client")  # pragma: no cover


def next_steps(db: str, run: RunRecord) -> list[str]:
    """What a person can do about a run that stopped for them."""
    if run.status == "needs_attention" and run.operation_id is not None:
        return [f"  check what the tool did, then: tether resolve --db {db} {run.operation_id} --output JSON"]
    if run.status == "waiting" and run.operation_id is not None:
        return [f"  it waits for a person's answer: tether interactions --db {db}"]
    if run.status == "failed":
        commands = retry_commands(db, run)
        if len(commands) == 1:
            return [f"  try it again: {commands[0]}"]
        return [f"  {command}" for command in commands]
    return []


async def list_runs(db: str, *, conversation_id: str | None, status: str | None) -> list[RunRecord]:
    """The runs (of ``conversation_id``, in ``status``); :class:`~protocol.NotFound` for a conversation that does
    not exist (which has no runs, but is not one without)."""
    async with connect(db, "tether-runs") as client:
        runs = await client.runs(conversation_id=conversation_id, status=status)
        if not runs and conversation_id is not None:
            await client.conversation(conversation_id)  # raises NotFound: "conversation ... does not exist"
        return runs


async def resolve(db: str, operation_id: str, output: Any, *, by: str = "tether resolve") -> actors.OperationRecord:
    """Resolve the interrupted manual call ``operation_id`` with ``output``, recording ``by`` as who resolved it."""
    async with connect(db, "tether-resolve") as client:
        return await client.resolve(operation_id, output, resolved_by=by)


async def retry(db: str, run_id: str) -> RunRecord:
    async with connect(db, "tether-retry") as client:
        return await client.retry(run_id)


async def cancel(db: str, run_id: str) -> RunRecord:
    async with connect(db, "tether-cancel") as client:
        await client.cancel_run(run_id)
        return await client.run(run_id)


async def respond(
    db: str, interaction_id: str, *, approve: bool | None = None, note: str | None = None, answer: Any = None
) -> actors.InteractionRecord:
    async with connect(db, "tether-respond") as client:
        try:
            return await client.respond(
                interaction_id, approve=approve, note=note, answer=answer, responded_by="tether respond"
            )
        except actors.InvalidRequest as exc:
            wrong = await _wrong_flag(client, interaction_id, answered=answer is not None)
            if wrong is None:
                raise
            raise actors.InvalidRequest(exc.code, wrong) from None


async def _wrong_flag(client: actors.Client, interaction_id: str, *, answered: bool) -> str | None:
    """What to say, in the command's own flags, when ``tether respond`` answered an open question with ``--approve``
    or ``--deny``, or an open approval with ``--answer`` (the owner refused it; nothing was written); ``None`` when
    the refusal was for something else."""
    for interaction in await client.interactions(status="open"):
        if interaction.interaction_id != interaction_id:
            continue
        if interaction.kind == "question" and not answered:
            schema = interaction.args.get("schema") if isinstance(interaction.args, dict) else None
            shape = (
                "any JSON value" if schema is None else f"a JSON value of the schema {preview(schema, SCHEMA_CHARS)}"
            )
            return (
                f"interaction {interaction_id} is a question, not an approval: answer it with --answer JSON "
                f"({shape}; a text is '\"yes\"'), not --approve, --deny or --note; nothing was written"
            )
        if interaction.kind == "approval" and answered:
            return (
                f"interaction {interaction_id} is an approval, not a question: answer it with --approve or --deny "
                "(and --note TEXT), not --answer; nothing was written"
            )
    return None


async def open_interactions(db: str) -> list[actors.InteractionRecord]:
    async with connect(db, "tether-interactions") as client:
        return await client.interactions(status="open")


def format_interactions(db: str, interactions: list[actors.InteractionRecord]) -> str:
    """Each open approval with the tool and its arguments, each open question with its text and the schema of its
    answer, and the commands that answer them."""
    if not interactions:
        return "no open interactions"
    lines: list[str] = []
    for interaction in interactions:
        head = f"{interaction.kind} {interaction.interaction_id} (run {interaction.run_id})"
        if interaction.kind == "question" and isinstance(interaction.args, dict):
            lines.append(f"{head}, asked by tool {interaction.tool}: {interaction.args.get('text')}")
            schema = interaction.args.get("schema")
            if schema is not None:
                lines.append(f"  the answer's schema: {json.dumps(schema, separators=(',', ':'))}")
            lines.append(f"  tether respond --db {db} {interaction.interaction_id} --answer JSON")
            continue
        args = json.dumps(interaction.args, separators=(",", ":"))
        call = f"{interaction.tool} {args}" if interaction.tool else args
        lines.append(f"{head}: {call}")
        lines.append(f"  tether respond --db {db} {interaction.interaction_id} --approve   (or --deny)")
    return "\n".join(lines)
