"""What ``tether watch`` shows, as pure state fed with committed records (no I/O, no trio, no terminal).

:class:`WatchView` folds every record of a watch into what a person wants to see (the transcript with its tool
calls, the text streaming now, the runs, what waits for a person and the command that answers it, the task tree)
and says in plain lines what each record changed; the streamed text of model requests is assembled from its
:class:`~protocol.PartialRecord` pieces by an :class:`actors.PartialText`. :mod:`runtime._watch_render` draws it with
rich; ``runtime._watch`` feeds it from a watch.

Everything held is bounded (docs/operations.md lists the bounds): the transcript keeps its last
``MAX_ENTRIES_PER_CONVERSATION`` entries per conversation, a streamed text its last ``MAX_PARTIAL_CHARS``
characters, and each table its most recently changed ``MAX_*`` items.
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final, Generic, TypeVar

import attrs

import actors
from protocol import (
    ABORTED_ANSWER_ENTRY,
    ASSISTANT_ENTRY,
    RESET_ENTRY,
    TOOL_RESULT_ENTRY,
    USER_ENTRY,
    ConversationRecord,
    EntryRecord,
    InteractionRecord,
    OperationRecord,
    PartialRecord,
    Record,
    Retry,
    RunRecord,
    SubmissionRecord,
    TaskRecord,
)

MAX_PARTIAL_CHARS: Final = 20_000
"""The characters of one streamed text kept (its tail; the view shows ``…`` before a text it cut)."""
MAX_STREAMS: Final = 64
"""Streamed texts held at once (those of model requests without a result yet, and cut-off ones): past it, the least
recently changed is dropped."""
MAX_ENTRIES_PER_CONVERSATION: Final = 200
MAX_CONVERSATIONS: Final = 500
MAX_RUNS: Final = 500
MAX_OPERATIONS: Final = 2_000
MAX_INTERACTIONS: Final = 500
MAX_TASKS: Final = 2_000
PREVIEW_CHARS: Final = 200
"""A tool result or argument list longer than this is shown cut, with ``…``."""
SCHEMA_PREVIEW_CHARS: Final = 160
"""A question's answer schema longer than this is shown cut, with ``…``, in the command that answers it."""
ANSWER_PREVIEW_CHARS: Final = 80
"""A question's answer longer than this is shown cut, with ``…``."""

ACTIVE_RUN: Final = frozenset({"queued", "retry_wait", "pending", "running", "waiting", "needs_attention"})

_K = TypeVar("_K")
_V = TypeVar("_V")


class Bounded(Generic[_K, _V]):
    """A map that keeps its ``limit`` most recently put items (a put moves an item to the end)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: OrderedDict[_K, _V] = OrderedDict()

    def put(self, key: _K, value: _V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.limit:
            self._items.popitem(last=False)

    def get(self, key: _K) -> _V | None:
        return self._items.get(key)

    def pop(self, key: _K) -> _V | None:
        return self._items.pop(key, None)

    def __iter__(self) -> Iterator[_K]:
        return iter(list(self._items))

    def values(self) -> list[_V]:
        return list(self._items.values())

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)


# ---------------------------------------------------------------------------------------------- the view


@attrs.frozen
class ToolCallView:
    """A tool call of an assistant entry, with what became of it."""

    call_id: str
    name: str
    arguments: Any
    operation_id: str | None
    status: str
    """``waiting for approval``, ``denied``, ``running``, ``needs attention``, ``done``, ``error``, or ``requested``
    (no worker has taken it up yet)."""
    result: str | None
    is_error: bool


@attrs.frozen
class Attention:
    """Something that waits for a person, and the commands that answer it."""

    run_id: str
    conversation_id: str
    what: str
    commands: tuple[str, ...]


class WatchView:
    """Everything ``tether watch`` shows, folded from the records of a watch in seq order.

    ``conversation_id`` or ``run_id`` narrows it to one conversation or one run (the run's conversation is learnt
    from its record); without either it holds every conversation. ``db`` is the database as the person named it,
    used in the commands it suggests.
    """

    def __init__(self, db: str, *, conversation_id: str | None = None, run_id: str | None = None) -> None:
        self.db = db
        self.conversation_id = conversation_id
        self.run_id = run_id
        self.seq = 0
        self.partials = actors.PartialText(max_outputs=MAX_STREAMS, max_chars=MAX_PARTIAL_CHARS)
        """The streamed texts, streaming or cut off: a text whose operation has its result is forgotten (the answer
        is then the assistant entry)."""
        self.conversations: Bounded[str, ConversationRecord] = Bounded(MAX_CONVERSATIONS)
        self._entries: Bounded[str, deque[EntryRecord]] = Bounded(MAX_CONVERSATIONS)
        self._results: Bounded[tuple[str, str], EntryRecord] = Bounded(MAX_OPERATIONS)
        self.runs: Bounded[str, RunRecord] = Bounded(MAX_RUNS)
        self.operations: Bounded[str, OperationRecord] = Bounded(MAX_OPERATIONS)
        self.interactions: Bounded[str, InteractionRecord] = Bounded(MAX_INTERACTIONS)
        self.tasks: Bounded[str, TaskRecord] = Bounded(MAX_TASKS)
        self._run_tasks: Bounded[str, str] = Bounded(MAX_TASKS)
        """Task id -> the run whose tree it is in (the run's task, and every task owned by one in the tree)."""
        self._run_conversation_id: str | None = None

    def follow(self, run: RunRecord) -> None:
        """Narrowed to ``run``: learn its conversation and its task from its record as read now (a watch from a
        later seq than its creation would not show them)."""
        self._run_conversation_id = run.conversation_id
        if run.task_id is not None:
            self._run_tasks.put(run.task_id, run.run_id)

    # ------------------------------------------------------------------------------------------ folding

    def apply(self, seq: int, records: Iterable[Record]) -> list[str]:
        """Fold the records of the commit ``seq``; return a plain line for each thing a person would notice."""
        return self.fold(seq, records)[0]

    def fold(self, seq: int, records: Iterable[Record]) -> tuple[list[str], list[Record]]:
        """Fold the records of the commit ``seq``; return the plain lines, and the records that belong to this view
        in their commit order. A run's records are folded first: a run names its task, which may come before it in
        the commit (a retried run's new task)."""
        records = list(records)
        ordered = sorted(range(len(records)), key=lambda index: not isinstance(records[index], RunRecord))
        last = {
            record.operation_id: index for index, record in enumerate(records) if isinstance(record, OperationRecord)
        }
        lines: list[str] = []
        matched: list[int] = []
        for index in ordered:
            record = records[index]
            if self.matches(record):
                matched.append(index)
                if isinstance(record, OperationRecord) and last[record.operation_id] != index:
                    # An operation's earlier record in the commit that also ends it (a call that ran nothing is
                    # journaled, intent and failure, with its result): a state no one saw, never shown as running.
                    continue
                lines.extend(self._apply(record))
        self.seq = max(self.seq, seq)
        return lines, [records[index] for index in sorted(matched)]

    def matches(self, record: Record) -> bool:
        """Whether ``record`` belongs to what this view shows."""
        conversation_id = getattr(record, "conversation_id", None)
        if self.conversation_id is not None and conversation_id != self.conversation_id:
            return False
        if self.run_id is None:
            return True
        if isinstance(record, RunRecord | OperationRecord | InteractionRecord | PartialRecord | SubmissionRecord):
            return record.run_id == self.run_id
        if isinstance(record, EntryRecord):
            return isinstance(record.data, dict) and record.data.get("run_id") == self.run_id
        if isinstance(record, TaskRecord):
            return self._run_of_task(record) == self.run_id
        return isinstance(record, ConversationRecord) and self.shown_conversation() == record.conversation_id

    def shown_conversation(self) -> str | None:
        """The one conversation shown: the one named, or the run's; ``None`` for every conversation."""
        if self.conversation_id is not None or self.run_id is None:
            return self.conversation_id
        run = self.runs.get(self.run_id)
        return self._run_conversation_id if run is None else run.conversation_id

    def _run_of_task(self, task: TaskRecord) -> str | None:
        run_id = self._run_tasks.get(task.task_id)
        if run_id is None and task.owner_task_id is not None:
            run_id = self._run_tasks.get(task.owner_task_id)
        if run_id is not None:
            self._run_tasks.put(task.task_id, run_id)
        return run_id

    def _apply(self, record: Record) -> list[str]:
        if isinstance(record, EntryRecord):
            return self._entry(record)
        if isinstance(record, PartialRecord):
            return self._partial(record)
        if isinstance(record, OperationRecord):
            return self._operation(record)
        if isinstance(record, RunRecord):
            return self._run(record)
        if isinstance(record, InteractionRecord):
            return self._interaction(record)
        if isinstance(record, TaskRecord):
            self._run_of_task(record)
            self.tasks.put(record.task_id, record)
            return []
        if isinstance(record, ConversationRecord):
            self.conversations.put(record.conversation_id, record)
            return []
        if isinstance(record, SubmissionRecord):
            return self._submission(record)
        return []

    def _submission(self, submission: SubmissionRecord) -> list[str]:
        """What a person follows of the inbox: what waits in it (a steer, a follow-up joining a queued run, a reset
        for the working run's boundary, a write behind a reset) and an input that went unanswered (withdrawn, its run
        ended without an answer). Placement shows as its entry, an answer as the run's; a follow-up with a run of its
        own shows as that run."""
        text = preview(submission.payload)
        queued = submission.status == "queued"
        if queued and submission.kind == "input" and submission.when_busy == "steer":
            return [f"steer queued for run {submission.run_id}: {text}"]
        if queued and submission.kind == "input" and submission.run_id != submission.submission_id:
            return [f"follow-up queued to join run {submission.run_id}: {text}"]
        if queued and submission.kind == "reset":
            return [f"reset queued for run {submission.run_id}'s next boundary"]
        if queued and submission.kind == "write":
            return [f"write {text} waits behind a queued reset"]
        if submission.status == "unanswered" and submission.kind == "input":
            return [f"input {text} unanswered ({submission.reason})"]
        if submission.status == "unanswered" and submission.kind == "continue":
            return [f"continue unanswered ({submission.reason})"]
        return []

    def _entry(self, entry: EntryRecord) -> list[str]:
        held = self._entries.get(entry.conversation_id)
        if held is None:
            held = deque(maxlen=MAX_ENTRIES_PER_CONVERSATION)
        held.append(entry)
        self._entries.put(entry.conversation_id, held)
        data = entry.data if isinstance(entry.data, dict) else {}
        if entry.kind == USER_ENTRY:
            steer = data.get("submission_id") not in (None, data.get("run_id"))
            return [f"user{' (steer)' if steer else ''}: {data.get('text', '')}"]
        if entry.kind == ASSISTANT_ENTRY:
            lines = [f"assistant: {data['text']}"] if data.get("text") else []
            for call in data.get("tool_calls") or ():
                lines.append(f"assistant calls {call.get('name')} {preview(call.get('arguments'))}")
            return lines
        if entry.kind == RESET_ENTRY:
            handoff = data.get("handoff")
            if data.get("run_id") is not None:  # a tool's handoff (``ToolResult(handoff=...)``), placed by its run
                return [f"tool {data.get('name')} handoff: the context starts again from: {preview(handoff)}"]
            return ["reset: the context starts again" + (f" from: {preview(handoff)}" if handoff else "")]
        if entry.kind == ABORTED_ANSWER_ENTRY:
            return [aborted_answer_line(data)]
        if entry.kind == TOOL_RESULT_ENTRY:
            self._results.put((str(data.get("run_id")), str(data.get("call_id"))), entry)
            failed = " (error)" if data.get("is_error") else ""
            return [f"tool {data.get('name')} result{failed}: {preview(data.get('content'))}"]
        return [f"{entry.kind}: {preview(entry.data)}"]

    def _partial(self, piece: PartialRecord) -> list[str]:
        held = self.partials.outputs.get(piece.operation_id)
        replaces = self.partials.replaces(piece)
        was_cut = held is not None and held.status == "aborted" and not replaces
        lines = (
            [f"(attempt {held.attempt} replaced by attempt {piece.attempt})"] if held and held.text and replaces else []
        )
        changed = self.partials.feed(piece)
        if not changed:
            return lines
        [now] = changed
        if now.status == "done":  # the answer is the assistant entry
            self.partials.forget(piece.operation_id)
            return lines
        if now.added:
            label = self.stream_label(now)
            lines.append(f"streaming: {now.added}" if label == "assistant" else f"{label} progress: {now.added}")
        if now.status == "aborted" and not was_cut:
            lines.append(f"(cut off: attempt {now.attempt} stopped here; this is not an answer)")
        return lines

    def _operation(self, operation: OperationRecord) -> list[str]:
        self.operations.put(operation.operation_id, operation)
        settled = self.partials.settle(operation)
        if settled is not None and settled.status == "done":  # the result is committed: the entry answers
            self.partials.forget(operation.operation_id)
        elif settled is not None:
            return [f"(cut off: attempt {operation.attempt} {operation.status}; this is not an answer)"]
        if operation.kind == "tool" and operation.status == "started":
            return [f"tool {operation.name} running"]
        if operation.kind == "tool" and operation.status == "interrupted":
            return [f"tool {operation.name} interrupted: its effect is unknown"]
        return []

    def _run(self, run: RunRecord) -> list[str]:
        previous = self.runs.get(run.run_id)
        self.runs.put(run.run_id, run)
        if run.task_id is not None:
            self._run_tasks.put(run.task_id, run.run_id)
        if previous is not None and (previous.status, previous.reason) == (run.status, run.reason):
            return []
        line = f"run {run.run_id}: {run.status}" + (f" ({run.reason})" if run.reason else "")
        note = run.error or self.retry_note(run)
        lines = [line + (f": {one_line(note)}" if note else "")]
        if run.status == "completed" and run.answer is not None and previous is not None:
            lines[0] += " with its answer"
        lines.extend(f"  {command}" for command in self.attention_commands(run))
        return lines

    def retry_note(self, run: RunRecord) -> str | None:
        """For a run in ``retry_wait``: which model attempt failed, why, and when the next one is (from its journal
        and its task as this view holds them); ``None`` otherwise."""
        if run.status != "retry_wait":
            return None
        failed = [
            operation
            for operation in self.operations.values()
            if operation.run_id == run.run_id and operation.kind == "model" and operation.status != "completed"
        ]
        if not failed:
            return None
        operation = max(failed, key=lambda candidate: candidate.seq)
        attempts = (operation.retry or Retry()).attempts
        note = f"attempt {operation.attempt} of {attempts} failed ({operation.error or operation.status})"
        task = self.tasks.get(run.task_id) if run.task_id is not None else None
        if task is not None and task.status == "sleeping" and task.until_ms is not None:
            note += f"; the next in {max(0, task.until_ms - task.updated_at_ms)} ms"
        return note

    def _interaction(self, interaction: InteractionRecord) -> list[str]:
        self.interactions.put(interaction.interaction_id, interaction)
        if interaction.status == "open":
            what = f"{interaction.kind} {interaction.interaction_id} waits: {self._asked(interaction)}"
            return [what, *(f"  {command}" for command in respond_commands(self.db, interaction))]
        return [f"{interaction.kind} {interaction.interaction_id} {verdict(interaction)}"]

    def _asked(self, interaction: InteractionRecord) -> str:
        """What an interaction asks: the tool and the arguments an approval lets run, or the tool and a question's
        text."""
        if interaction.kind == "question" and isinstance(interaction.args, dict):
            return f"{self._call_name(interaction)} asks: {preview(interaction.args.get('text'))}"
        return f"{self._call_name(interaction)} {preview(interaction.args)}"

    def _call_name(self, interaction: InteractionRecord) -> str:
        if interaction.tool:
            return interaction.tool
        operation = self.operations.get(interaction.operation_id)  # a record of an engine before protocol 5
        if operation is not None:
            return operation.name
        for entry in self.entries(interaction.conversation_id):
            for call in self._calls_of(entry):
                if call.operation_id == interaction.operation_id:
                    return call.name
        return "a tool"

    # ------------------------------------------------------------------------------------------ reading

    def entries(self, conversation_id: str) -> list[EntryRecord]:
        """The transcript held for the conversation, oldest first."""
        held = self._entries.get(conversation_id)
        return [] if held is None else list(held)

    def conversation_ids(self) -> list[str]:
        """Every conversation seen, the most recently active last."""
        seen: dict[str, int] = {}
        for conversation in self.conversations.values():
            seen[conversation.conversation_id] = conversation.seq
        for run in self.runs.values():
            seen[run.conversation_id] = max(seen.get(run.conversation_id, 0), run.seq)
        for conversation_id in self._entries:
            entries = self.entries(conversation_id)
            if entries:
                seen[conversation_id] = max(seen.get(conversation_id, 0), entries[-1].seq)
        for stream in self.streams():
            seen[stream.conversation_id] = max(seen.get(stream.conversation_id, 0), stream.seq)
        return sorted(seen, key=lambda conversation_id: seen[conversation_id])

    def stream_label(self, stream: actors.PartialOutput) -> str:
        """Whose text a stream is: ``assistant`` (a model request's), or ``tool NAME`` (a tool call's progress)."""
        operation = self.operations.get(stream.operation_id)
        return f"tool {operation.name}" if operation is not None and operation.kind == "tool" else "assistant"

    def streams(self, *, conversation_id: str | None = None) -> list[actors.PartialOutput]:
        """The streamed texts held (streaming, or cut off), oldest piece first (of one conversation when given)."""
        found = [s for s in self.partials.outputs.values() if conversation_id in (None, s.conversation_id)]
        return sorted(found, key=lambda stream: stream.seq)

    def runs_of(self, conversation_id: str | None = None) -> list[RunRecord]:
        """The runs held (of one conversation when given), in id order: the order they were submitted."""
        runs = [run for run in self.runs.values() if conversation_id in (None, run.conversation_id)]
        return sorted(runs, key=lambda run: run.run_id)

    def tool_calls(self, entry: EntryRecord) -> list[ToolCallView]:
        """The tool calls an assistant entry made, with their status and result."""
        return self._calls_of(entry)

    def _calls_of(self, entry: EntryRecord) -> list[ToolCallView]:
        data = entry.data if isinstance(entry.data, dict) else {}
        if entry.kind != ASSISTANT_ENTRY:
            return []
        run_id = str(data.get("run_id"))
        views: list[ToolCallView] = []
        for call in data.get("tool_calls") or ():
            call_id = str(call.get("call_id"))
            operation_id = tool_operation_id(run_id, data.get("turn"), call_id)
            result = self._results.get((run_id, call_id))
            result_data = result.data if result is not None and isinstance(result.data, dict) else None
            views.append(
                ToolCallView(
                    call_id=call_id,
                    name=str(call.get("name")),
                    arguments=call.get("arguments"),
                    operation_id=operation_id,
                    status=self._call_status(operation_id, result_data),
                    result=None if result_data is None else str(result_data.get("content", "")),
                    is_error=bool(result_data and result_data.get("is_error")),
                )
            )
        return views

    def _call_status(self, operation_id: str | None, result: dict[str, Any] | None) -> str:
        if result is not None:
            return "error" if result.get("is_error") else "done"
        operation = self.operations.get(operation_id) if operation_id is not None else None
        if operation is not None:
            if operation.status == "interrupted":
                return "needs attention"
            if operation.status == "started":
                return "running"
            return "error" if operation.status == "failed" or operation.is_error else "done"
        for interaction in self.interactions.values():
            if interaction.operation_id == operation_id:
                return waiting_status(interaction) if interaction.status == "open" else verdict(interaction)
        return "requested"

    def attention(self) -> list[Attention]:
        """What waits for a person, with the command that answers it: open approvals, runs that need attention, a
        run whose agent no attached worker announces, and the latest failed run of a conversation."""
        found: list[Attention] = []
        for interaction in sorted(self.interactions.values(), key=lambda i: i.interaction_id):
            if interaction.status != "open":
                continue
            found.append(
                Attention(
                    run_id=interaction.run_id,
                    conversation_id=interaction.conversation_id,
                    what=f"{interaction.kind} {interaction.interaction_id}: {self._asked(interaction)}",
                    commands=respond_commands(self.db, interaction),
                )
            )
        for run in self.runs_of():
            if run.status in ("needs_attention", "failed") or run.reason == "agent_missing":
                why = f"run {run.run_id} {run.status}" + (f" ({run.reason})" if run.reason else "")
                why += f": {one_line(run.error)}" if run.error else ""
                commands = tuple(self.attention_commands(run))
                if commands and (run.status != "failed" or self._latest_of_conversation(run)):
                    found.append(Attention(run.run_id, run.conversation_id, why, commands))
        return found

    def _latest_of_conversation(self, run: RunRecord) -> bool:
        return self.runs_of(run.conversation_id)[-1].run_id == run.run_id

    def attention_commands(self, run: RunRecord) -> list[str]:
        """The commands that settle a run stopped for a person."""
        db = self.db
        if run.status == "needs_attention" and run.reason == "tool_interrupted" and run.operation_id is not None:
            return [
                f"tether resolve --db {db} {run.operation_id} --output JSON   (check what the tool did first)",
                f"tether cancel --db {db} {run.run_id}",
            ]
        if run.status == "needs_attention":
            return [
                f"start a worker that has {run.agent}@{run.version}: tether worker --db {db} --app MODULE:ATTR",
                f"tether cancel --db {db} {run.run_id}",
            ]
        if run.status == "pending" and run.reason == "agent_missing":
            return [
                f"start a worker whose app defines agent {run.agent}: tether worker --db {db} --app MODULE:ATTR",
                f"tether cancel --db {db} {run.run_id}",
            ]
        if run.status == "failed":
            return retry_commands(db, run)
        return []

    def task_tree(self, run: RunRecord) -> list[tuple[int, TaskRecord]]:
        """The run's task and the tasks below it (tool tasks, approval tasks, ...) as (depth, record), depth first."""
        if run.task_id is None:
            return []
        children: dict[str, list[TaskRecord]] = {}
        for task in self.tasks.values():
            if task.owner_task_id is not None:
                children.setdefault(task.owner_task_id, []).append(task)
        root = self.tasks.get(run.task_id)
        if root is None:
            return []
        tree: list[tuple[int, TaskRecord]] = []
        stack = [(0, root)]
        while stack:
            depth, task = stack.pop()
            tree.append((depth, task))
            below = sorted(children.get(task.task_id, ()), key=lambda t: t.task_id, reverse=True)
            stack.extend((depth + 1, child) for child in below)
        return tree

    def unseen_waits(self, task: TaskRecord) -> list[tuple[str, InteractionRecord | None]]:
        """What a waiting task waits on that has no record of its own here: the ``tether.approval`` task of an
        interaction (the owner creates it with the interaction), or a task committed outside this view."""
        if task.status != "waiting":
            return []
        by_task = {interaction.task_id: interaction for interaction in self.interactions.values()}
        return [(task_id, by_task.get(task_id)) for task_id in task.on if task_id not in self.tasks]


def tool_operation_id(run_id: str, turn: Any, call_id: str) -> str | None:
    """The operation of a tool call of an assistant entry (as the run loop derives it), or ``None`` without a turn."""
    if not isinstance(turn, int):
        return None
    return actors.tool_operation_id(run_id, turn, call_id)


def retry_commands(db: str, run: RunRecord) -> list[str]:
    """What retries a failed run. After ``budget_exceeded``, raising the budget first (the run's error names which:
    its conversation's, or its task tree's), since a retry alone would meet the same budget again."""
    retry = f"tether retry --db {db} {run.run_id}"
    if run.reason != "budget_exceeded":
        return [retry]
    scopes = f"--conversation {run.conversation_id}" + (f" | --task {run.task_id}" if run.task_id else "")
    return [
        f"raise the budget its error names first: tether budget --db {db} ({scopes}) --max-tokens N | --max-cost X | "
        "--clear",
        f"then: {retry}",
    ]


def respond_commands(db: str, interaction: InteractionRecord) -> tuple[str, ...]:
    """The commands that answer an open interaction: ``--approve`` or ``--deny`` for an approval; ``--answer JSON``
    for a question, with its answer's schema (compact, cut past :data:`SCHEMA_PREVIEW_CHARS`)."""
    respond = f"tether respond --db {db} {interaction.interaction_id}"
    if interaction.kind != "question":
        return (f"{respond} --approve", f"{respond} --deny")
    schema = interaction.args.get("schema") if isinstance(interaction.args, dict) else None
    accepts = (
        "any JSON value; a text is '\"yes\"'"
        if schema is None
        else f"a JSON value of the schema {preview(schema, SCHEMA_PREVIEW_CHARS)}"
    )
    return (f"{respond} --answer JSON   ({accepts})",)


def waiting_status(interaction: InteractionRecord) -> str:
    """How a call waiting on an open interaction is shown."""
    return "waiting for an answer" if interaction.kind == "question" else "waiting for approval"


def verdict(interaction: InteractionRecord) -> str:
    """How an interaction no longer open ended: an approval ``approved`` or ``denied``, a question ``answered`` with
    its answer (cut past :data:`ANSWER_PREVIEW_CHARS`), or ``cancelled``."""
    answer = interaction.answer
    if answer is None:
        return "cancelled" if interaction.status == "cancelled" else "answered"
    if interaction.kind == "question":
        value = json.dumps(answer.value, separators=(",", ":"), ensure_ascii=False)
        return f"answered {preview(value, ANSWER_PREVIEW_CHARS)}"
    return "approved" if answer.approve else "denied"


def aborted_answer_line(data: Mapping[str, Any]) -> str:
    """How a ``tether.aborted_answer`` entry reads: what a cut-off or failed attempt had said, marked never an
    answer."""
    more = "…" if data.get("truncated") else ""
    return (
        f"assistant (attempt {data.get('attempt')}, {data.get('ended')}; not an answer, never sent to the model): "
        f"{data.get('text', '')}{more}"
    )


def one_line(text: str) -> str:
    """``text`` on one line (an error text may hold several)."""
    return " ".join(text.splitlines())


def preview(value: Any, limit: int = PREVIEW_CHARS) -> str:
    """A value on one line: a string as is, anything else as compact JSON; cut with ``…`` past ``limit``."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
