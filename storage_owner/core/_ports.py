"""What the core needs of storage: one port per room, each a typing protocol of the store methods that room calls, so
a room is built with (and can reach) only its own records; :class:`Store` is all of them. The core never imports the
store (or apsw): ``storage_owner.store`` implements these ports twice, importing them from the core's public surface:
over SQLite (``SqliteStore``, what the shell runs) and in memory (``MemoryStore``, what the core's unit tests run on).

A room reads another room's records only through that room's read port (:class:`ConversationReads`,
:class:`TaskReads`, :class:`RunReads`, :class:`OperationReads`), handed to it where ``OwnerCore`` builds it:
docs/architecture.md lists which room calls which methods.

Every store keeps these rules (the conformance suite, ``tests/unit/test_store_conformance.py``, runs against both):

1. Every method runs synchronously on the committed-or-pending state of the one open transaction: a write is seen
   by every read after it. The shell begins and commits that transaction; the core only uses savepoints, which nest
   (a rolled-back savepoint undoes every write since it was opened, takes no seq, and leaves no position or ordinal
   consumed).
2. A uniqueness rule refuses an insert with :class:`StoreConflict` and changes nothing; the transaction stays usable.
3. A record or value read is the caller's own (a detached copy: changing it changes nothing stored), and so is one
   written (changing it after the write changes nothing stored).
4. Names, keys and JSON values are data: any string (``""``, ``__proto__``) is stored and read back as it is.
5. Pages are in the order each method names, at most ``limit`` long, and say whether more follow.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final, Protocol

import attrs

from protocol import (
    Budget,
    ConversationRecord,
    DocumentRecord,
    EntryRecord,
    InteractionRecord,
    ModelPrice,
    OperationRecord,
    Order,
    PartialStatus,
    Record,
    RunRecord,
    RunUsage,
    SubmissionRecord,
    TaskRecord,
    TaskStatus,
)

NO_CHANGE: Final = object()
"""Passed as a checkpoint: keep the stored one."""


TASK_ROW_FIELDS: Final = (
    "task_id",
    "kind",
    "conversation_id",
    "owner_task_id",
    "status",
    "abort",
    "abandon_on_restart",
)
"""The :class:`TaskRecord` fields of a :data:`TaskRow`, in its order."""
TaskRow = tuple[str, str, str, str | None, TaskStatus, str | None, bool]
"""The facts of a live task an owner needs to index it: the fields :data:`TASK_ROW_FIELDS` names, as stored (a flag
may read as 0 or 1). Building a :class:`TaskRecord` costs more than reading these, so an owner loading many live
tasks reads whole records only for the tasks it must settle and reads the others' when it first needs them."""


class StoreConflict(Exception):
    """A uniqueness rule of the database refused a write; ``record`` names the kind, ``key`` the clashing id."""

    def __init__(self, record: str, key: str) -> None:
        super().__init__(f"{record} {key} already exists")
        self.record = record
        self.key = key


@attrs.frozen(kw_only=True)
class LoggedCommit:
    """One row of the commit log, as watches replay it."""

    seq: int
    committed_at_ms: int
    records: tuple[Record, ...]


class LogStore(Protocol):
    """The commit log, the savepoints of a request's unit of work, and the owner's own settings (``_unit``,
    ``_watches``, ``_owner``)."""

    def head_seq(self) -> int:
        """The newest logged commit's ``seq``; 0 before the first."""
        ...

    def savepoint(self) -> None:
        """Open a savepoint (inside the one open one, if any)."""
        ...

    def release_savepoint(self) -> None:
        """Keep what was written since the newest open savepoint, and close it."""
        ...

    def rollback_savepoint(self) -> None:
        """Undo what was written since the newest open savepoint, and close it."""
        ...

    def log_commit(self, commit: LoggedCommit, conversation_ids: frozenset[str]) -> bytes:
        """Append a commit to the log; ``conversation_ids``: the conversations its records touch. Returns its records
        as stored: msgpack of their plain structure, the very bytes of a ``Change`` frame's ``records`` (a watch fed
        the whole commit sends them as they are)."""
        ...

    def read_log(
        self, after_seq: int, conversation_id: str | None, limit: int, *, until_seq: int | None = None
    ) -> list[LoggedCommit]:
        """Logged commits after ``after_seq`` up to ``until_seq``, oldest first, at most ``limit``; filtered to
        those that may touch ``conversation_id`` when it is given (its own and those that touched several or none;
        records still need filtering)."""
        ...

    def get_meta(self, key: str) -> int | None: ...

    def set_meta(self, key: str, value: int) -> None: ...


class ConversationReads(Protocol):
    """What the other rooms read of conversations (``_watches``, ``_tasks``, ``_usage``)."""

    def conversation(self, conversation_id: str) -> ConversationRecord | None:
        """A conversation, its ``entry_count`` as stored now."""
        ...


class ConversationStore(ConversationReads, Protocol):
    """Conversations, their entries and documents, and submissions (``_conversations``)."""

    def insert_conversation(self, record: ConversationRecord) -> None: ...

    def next_entry_position(self, conversation_id: str) -> int | None:
        """The position the conversation's next entry takes; ``None`` if the conversation is unknown."""
        ...

    def insert_entry(self, record: EntryRecord) -> None:
        """Store an entry; its id, and its position in its conversation, are unique."""
        ...

    def entry_page(
        self, conversation_id: str, order: Order, cursor: int | None, limit: int, *, max_data_bytes: int | None = None
    ) -> tuple[list[EntryRecord], bool]:
        """Up to ``limit`` entries after (``asc``) or before (``desc``) the exclusive ``cursor`` position, and whether
        more follow. With ``max_data_bytes`` the page also ends before the entry that would take its stored data
        (msgpack) past that many bytes; it always holds at least one entry."""
        ...

    def entry_position(self, conversation_id: str, entry_id: str) -> int | None:
        """The position of the conversation's entry ``entry_id``; ``None`` if it has none by that id."""
        ...

    def context_start(self, conversation_id: str) -> int:
        """The position the model's context of the conversation starts at: just after its last ``tether.reset`` entry
        or at the head its last entry naming one names, whichever is later (0: its first entry). Reads the
        conversation's entries: for the rare write naming a head, not the hot path."""
        ...

    def document(self, conversation_id: str | None, name: str) -> DocumentRecord | None: ...

    def put_document(self, record: DocumentRecord) -> None:
        """Insert or replace a document (the core checks its version)."""
        ...

    def submission(self, conversation_id: str, request_id: str) -> SubmissionRecord | None: ...

    def submission_by_id(self, submission_id: str) -> SubmissionRecord | None: ...

    def open_submissions(self) -> list[SubmissionRecord]:
        """The ``queued`` and ``placed`` submissions, oldest first (what an owner reads at start)."""
        ...

    def unanswered_of_run(self, conversation_id: str, run_id: str) -> list[SubmissionRecord]:
        """The conversation's ``unanswered`` submissions naming ``run_id``, oldest first (a retried run's inputs)."""
        ...

    def submission_page(
        self, conversation_id: str, after_submission_id: str | None, limit: int
    ) -> tuple[list[SubmissionRecord], bool]:
        """Up to ``limit`` of the conversation's submissions in creation order after ``after_submission_id`` (one of
        its own; another id: from the start), and whether more follow."""
        ...

    def insert_submission(self, record: SubmissionRecord) -> None:
        """Store a submission; its id, and its ``(conversation_id, request_id)``, are unique."""
        ...

    def update_submission(self, record: SubmissionRecord) -> None:
        """Store a stored submission's new status, ``seq``, ``run_id``, ``reason`` and ``answer``."""
        ...


class RunReads(Protocol):
    """What the other rooms read of runs (``_operations``, ``_partials``)."""

    def run(self, run_id: str) -> RunRecord | None: ...


class RunStore(RunReads, Protocol):
    """Runs (``_runs``)."""

    def insert_run(self, record: RunRecord, input: object) -> None: ...

    def update_run(self, record: RunRecord) -> None: ...

    def run_input(self, run_id: str) -> Any:
        """The stored input (the submitted text) of a run."""
        ...

    def live_runs(self) -> list[RunRecord]:
        """Every run that is not terminal, in creation order (of ``seq``, then of run id)."""
        ...

    def later_run_started(self, run_id: str) -> bool:
        """Whether a run created after this one in its conversation has been admitted (has a task)."""
        ...

    def run_page(
        self, conversation_id: str | None, status: str | None, after_run_id: str | None, limit: int
    ) -> tuple[list[RunRecord], bool]:
        """A page of runs in creation order (the commit that created each, then run id: a retried run keeps its
        place) after the run ``after_run_id`` (which exists), and whether more follow."""
        ...


class OperationReads(Protocol):
    """What the other rooms read of operations (``_partials``)."""

    def operation(self, operation_id: str) -> OperationRecord | None: ...


class OperationStore(OperationReads, Protocol):
    """The operation journal and interactions (``_operations``)."""

    def insert_operation(self, record: OperationRecord) -> None:
        """Journal a new operation after its run's others."""
        ...

    def update_operation(self, record: OperationRecord) -> None: ...

    def open_operations(self, task_id: str) -> list[OperationRecord]:
        """The operations a task's lease started that have no result yet (``started``), in journal order."""
        ...

    def operation_page(self, run_id: str, cursor: int, limit: int) -> tuple[list[OperationRecord], bool]:
        """A run's operations from the ``cursor``-th (0: its first), in journal order, and whether more follow."""
        ...

    def insert_interaction(self, record: InteractionRecord) -> None:
        """Store an interaction; its id is unique, and its operation among approvals."""
        ...

    def update_interaction(self, record: InteractionRecord) -> None: ...

    def interaction(self, interaction_id: str) -> InteractionRecord | None: ...

    def operation_interaction(self, operation_id: str) -> InteractionRecord | None:
        """The approval of a tool call's operation, if one was asked (questions are read by their ids)."""
        ...

    def interaction_page(
        self, status: str | None, run_id: str | None, after_interaction_id: str | None, limit: int
    ) -> tuple[list[InteractionRecord], bool]:
        """A page of interactions in id order after ``after_interaction_id``, filtered, and whether more follow."""
        ...


class TaskReads(Protocol):
    """What the other rooms read of tasks (``_runs``, ``_run_status``, ``_operations``, ``_usage``)."""

    def task_data(self, task_id: str) -> tuple[Any, Any]:
        """A stored task's ``(input, checkpoint)``."""
        ...


class TaskStore(TaskReads, Protocol):
    """Tasks (``_tasks``, ``_task_records``, ``_task_settle``)."""

    def insert_task(self, record: TaskRecord, input: object, checkpoint: object) -> int:
        """Store a new task; the stored size of its input, in bytes."""
        ...

    def update_task(self, record: TaskRecord, *, checkpoint: object = NO_CHANGE) -> int:
        """Store ``record`` (every column but the input); the checkpoint too unless it is ``NO_CHANGE``. The stored
        size of the checkpoint written, in bytes (0 if none)."""
        ...

    def task(self, task_id: str) -> TaskRecord | None: ...

    def live_task_rows(self) -> Iterable[TaskRow]:
        """The facts (see :data:`TaskRow`) of every task that is not terminal, in task id order (oldest first)."""
        ...

    def live_tasks(self, *, unsettled_only: bool = False) -> Iterable[TaskRecord]:
        """Every task that is not terminal, in task id order; with ``unsettled_only`` only those that are not plain
        pending tasks (pending without an abort mark)."""
        ...

    def task_owned_conversations(self) -> list[tuple[str, str]]:
        """``(conversation_id, owner_task_id)`` of every conversation owned by a task that is not terminal."""
        ...


class UsageStore(Protocol):
    """Usage totals, prices and budgets (``_usage``)."""

    def add_usage(self, scope: str, key: str, usage: RunUsage) -> None:
        """Add ``usage`` to a total (a new one starts at zero); a cost of ``None`` leaves the total's cost as is."""
        ...

    def add_usages(self, totals: Sequence[tuple[str, str]], usage: RunUsage) -> None:
        """:meth:`add_usage` to each of ``totals``, distinct ``(scope, key)`` pairs (one statement in SQLite)."""
        ...

    def usage(self, scope: str, key: str | None) -> list[tuple[str, RunUsage]]:
        """Usage totals of ``scope``, of one ``key`` or all, in key order."""
        ...

    def usage_count(self, scope: str) -> int: ...

    def usage_page(self, scope: str, after_key: str | None, limit: int) -> tuple[list[tuple[str, RunUsage]], bool]:
        """Usage totals of ``scope`` in key order after ``after_key``, at most ``limit``; whether more follow."""
        ...

    def prices(self) -> list[ModelPrice]:
        """The price table, by model."""
        ...

    def put_price(self, price: ModelPrice) -> None:
        """Insert or replace a model's price."""
        ...

    def delete_price(self, model: str) -> None: ...

    def budget(self, scope: str, key: str) -> Budget | None: ...

    def put_budget(self, budget: Budget) -> None:
        """Insert or replace a budget."""
        ...

    def delete_budget(self, scope: str, key: str) -> None: ...

    def budget_count(self) -> int: ...


@attrs.frozen(kw_only=True)
class PartialHead:
    """The stored state of one operation's partial output: its current attempt, where that attempt's intent was
    committed (``intent_seq``, which tells a new attempt from the same one after ``retry_run`` restarts the
    numbering), its status, its size so far and how many pieces are stored."""

    operation_id: str
    run_id: str
    conversation_id: str
    attempt: int
    intent_seq: int
    status: PartialStatus
    chars: int
    size_bytes: int
    pieces: int
    seq: int
    created_at_ms: int
    updated_at_ms: int


class PartialStore(Protocol):
    """Partial output: one head per operation and its pieces (``_partials``)."""

    def partial(self, operation_id: str) -> PartialHead | None: ...

    def held_partials(self) -> list[PartialHead]:
        """Heads whose pieces are stored or that still stream (read once, at start)."""
        ...

    def put_partial(self, head: PartialHead) -> None:
        """Insert or update a head (an update keeps its place in :meth:`run_partials_from`)."""
        ...

    def insert_partial_piece(self, operation_id: str, offset: int, text: str) -> None:
        """Store a piece of an operation's text at a character ``offset``, unique per operation."""
        ...

    def delete_partial_pieces(self, operation_id: str) -> None: ...

    def partial_text(self, operation_id: str) -> str:
        """The stored pieces joined, in offset order."""
        ...

    def run_partials_from(self, run_id: str, from_operation_id: str | None, limit: int) -> list[PartialHead]:
        """Up to ``limit`` of a run's heads, in the order their operations first streamed, from
        ``from_operation_id`` (included; ``None``: the first; an unknown one: none)."""
        ...


class Store(LogStore, ConversationStore, RunStore, OperationStore, TaskStore, UsageStore, PartialStore, Protocol):
    """Every port: what ``OwnerCore`` is built with (it hands each room its own); ``SqliteStore`` and ``MemoryStore``
    implement it."""
