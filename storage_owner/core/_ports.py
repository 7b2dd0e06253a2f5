"""What the core needs from storage, as typing protocols (one per room, :class:`Store` all of them), so the core never
imports the store (or apsw)."""

from __future__ import annotations

from collections.abc import Iterable
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
    Record,
    RunRecord,
    RunUsage,
    SubmissionRecord,
    TaskRecord,
    TaskStatus,
)

from ._partial_ports import PartialStore

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

    def head_seq(self) -> int: ...

    def savepoint(self) -> None: ...

    def release_savepoint(self) -> None: ...

    def rollback_savepoint(self) -> None: ...

    def log_commit(self, commit: LoggedCommit, conversation_ids: frozenset[str]) -> None: ...

    def read_log(
        self, after_seq: int, conversation_id: str | None, limit: int, *, until_seq: int | None = None
    ) -> list[LoggedCommit]:
        """Logged commits after ``after_seq`` up to ``until_seq``, oldest first, at most ``limit``; filtered to
        those that may touch ``conversation_id`` when it is given (records still need filtering)."""
        ...

    def get_meta(self, key: str) -> int | None: ...

    def set_meta(self, key: str, value: int) -> None: ...


class ConversationStore(Protocol):
    """Conversations, their entries and documents, and submissions (``_conversations``; ``conversation`` is read by
    other rooms too)."""

    def insert_conversation(self, record: ConversationRecord) -> None: ...

    def conversation(self, conversation_id: str) -> ConversationRecord | None: ...

    def next_entry_position(self, conversation_id: str) -> int | None:
        """The position the conversation's next entry takes; ``None`` if the conversation is unknown."""
        ...

    def insert_entry(self, record: EntryRecord) -> None: ...

    def entry_page(
        self, conversation_id: str, order: Order, cursor: int | None, limit: int, *, max_data_bytes: int | None = None
    ) -> tuple[list[EntryRecord], bool]:
        """A page of entries and whether more follow; see ``SqliteStore.entry_page``."""
        ...

    def document(self, conversation_id: str | None, name: str) -> DocumentRecord | None: ...

    def put_document(self, record: DocumentRecord) -> None: ...

    def submission(self, conversation_id: str, request_id: str) -> SubmissionRecord | None: ...

    def insert_submission(self, record: SubmissionRecord) -> None: ...


class RunStore(Protocol):
    """Runs (``_runs``)."""

    def insert_run(self, record: RunRecord, input: object) -> None: ...

    def update_run(self, record: RunRecord) -> None: ...

    def run(self, run_id: str) -> RunRecord | None: ...

    def run_input(self, run_id: str) -> Any:
        """The stored input (the submitted text) of a run."""
        ...

    def live_runs(self) -> list[RunRecord]:
        """Every run that is not terminal, in creation order."""
        ...

    def later_run_started(self, run_id: str) -> bool:
        """Whether a run created after this one in its conversation has been admitted."""
        ...

    def run_page(
        self, conversation_id: str | None, status: str | None, after_run_id: str | None, limit: int
    ) -> tuple[list[RunRecord], bool]:
        """A page of runs in run id order after ``after_run_id``, and whether more follow."""
        ...


class OperationStore(Protocol):
    """The operation journal and interactions (``_operations``)."""

    def insert_operation(self, record: OperationRecord) -> None: ...

    def update_operation(self, record: OperationRecord) -> None: ...

    def operation(self, operation_id: str) -> OperationRecord | None: ...

    def open_operations(self, task_id: str) -> list[OperationRecord]:
        """The operations a task's lease started that have no result yet."""
        ...

    def operation_page(self, run_id: str, cursor: int, limit: int) -> tuple[list[OperationRecord], bool]: ...

    def insert_interaction(self, record: InteractionRecord) -> None: ...

    def update_interaction(self, record: InteractionRecord) -> None: ...

    def interaction(self, interaction_id: str) -> InteractionRecord | None: ...

    def operation_interaction(self, operation_id: str) -> InteractionRecord | None:
        """The interaction bound to a tool call's operation, if one was asked."""
        ...

    def interaction_page(
        self, status: str | None, run_id: str | None, after_interaction_id: str | None, limit: int
    ) -> tuple[list[InteractionRecord], bool]: ...


class TaskStore(Protocol):
    """Tasks (``_tasks``, ``_task_records``, ``_task_settle``; ``task_data`` is read by other rooms too)."""

    def insert_task(self, record: TaskRecord, input: object, checkpoint: object) -> None: ...

    def update_task(self, record: TaskRecord, *, checkpoint: object = NO_CHANGE) -> None:
        """Store ``record`` (every column but the input); the checkpoint too unless it is ``NO_CHANGE``."""
        ...

    def task(self, task_id: str) -> TaskRecord | None: ...

    def task_data(self, task_id: str) -> tuple[Any, Any]:
        """A stored task's ``(input, checkpoint)``."""
        ...

    def live_task_rows(self) -> Iterable[TaskRow]:
        """The facts (see :data:`TaskRow`) of every task that is not terminal, oldest first."""
        ...

    def live_tasks(self, *, unsettled_only: bool = False) -> Iterable[TaskRecord]:
        """Every task that is not terminal, oldest first; with ``unsettled_only`` only those that are not plain
        pending tasks (pending without an abort mark)."""
        ...

    def task_owned_conversations(self) -> list[tuple[str, str]]:
        """``(conversation_id, owner_task_id)`` of every conversation owned by a task that is not terminal."""
        ...


class UsageStore(Protocol):
    """Usage totals, prices and budgets (``_usage``)."""

    def add_usage(self, scope: str, key: str, usage: RunUsage) -> None: ...

    def usage(self, scope: str, key: str | None) -> list[tuple[str, RunUsage]]: ...

    def usage_count(self, scope: str) -> int: ...

    def usage_page(self, scope: str, after_key: str | None, limit: int) -> tuple[list[tuple[str, RunUsage]], bool]:
        """Usage totals of ``scope`` in key order after ``after_key``, at most ``limit``; whether more follow."""
        ...

    def prices(self) -> list[ModelPrice]:
        """The price table, by model."""
        ...

    def put_price(self, price: ModelPrice) -> None: ...

    def delete_price(self, model: str) -> None: ...

    def budget(self, scope: str, key: str) -> Budget | None: ...

    def put_budget(self, budget: Budget) -> None: ...

    def delete_budget(self, scope: str, key: str) -> None: ...

    def budget_count(self) -> int: ...


class Store(LogStore, ConversationStore, RunStore, OperationStore, TaskStore, UsageStore, PartialStore, Protocol):
    """The storage operations the core calls, grouped above by the room whose records they hold (docs/architecture.md
    lists which room calls which). Every method runs synchronously on the committed-or-pending state of the one open
    transaction; the shell begins and commits that transaction, the core only uses savepoints."""
