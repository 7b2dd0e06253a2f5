"""The two stores of the core's ports, for tests: how to open a fresh one and open one again (as a new owner process
opens its database), and records to fill them with."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from protocol import (
    ConversationRecord,
    EntryRecord,
    JsonValue,
    SubmissionRecord,
    TaskOutcome,
    TaskRecord,
    TaskStatus,
    new_id,
)
from storage_owner.store import MemoryStore, SqliteStore

StoreUnderTest = SqliteStore | MemoryStore
StoreKind = Literal["sqlite", "memory"]
STORE_KINDS: tuple[StoreKind, ...] = ("sqlite", "memory")


def open_store(kind: StoreKind, directory: Path) -> StoreUnderTest:
    """A fresh, empty store: a new database file in ``directory``, or a new memory store."""
    return SqliteStore.open(str(directory / "store.db")) if kind == "sqlite" else MemoryStore()


def reopened(store: StoreUnderTest) -> StoreUnderTest:
    """``store``, closed, opened again: what was committed, as a new owner process finds it."""
    return SqliteStore.open(store.path) if isinstance(store, SqliteStore) else store.reopen()


# -------------------------------------------------------------------------------------------------- records


def conversation_record(conversation_id: str, seq: int = 1) -> ConversationRecord:
    return ConversationRecord(conversation_id=conversation_id, created_at_ms=10, seq=seq, entry_count=0)


def entry_record(conversation_id: str, position: int, *, entry_id: str | None = None, seq: int = 1) -> EntryRecord:
    return EntryRecord(
        entry_id=entry_id or new_id(),
        conversation_id=conversation_id,
        position=position,
        seq=seq,
        kind="message",
        data=JsonValue({"n": position, "list": [1, 2.5, None, True]}),
        created_at_ms=20,
    )


def submission_record(
    conversation_id: str, *, submission_id: str | None = None, request_id: str = "r"
) -> SubmissionRecord:
    return SubmissionRecord(
        submission_id=submission_id or new_id(),
        conversation_id=conversation_id,
        request_id=request_id,
        kind="prompt",
        payload=JsonValue({"q": 1.0}),
        status="queued",
        seq=1,
        created_at_ms=30,
    )


def task_record(
    conversation_id: str,
    *,
    task_id: str | None = None,
    status: TaskStatus = "pending",
    owner_task_id: str | None = None,
) -> TaskRecord:
    """A task with only its required fields set."""
    return TaskRecord(
        task_id=task_id or new_id(),
        kind="shop.checkout",
        version=0,
        conversation_id=conversation_id,
        owner_task_id=owner_task_id,
        background=False,
        abandon_on_restart=False,
        status=status,
        phase=None,
        seq=1,
        created_at_ms=40,
        updated_at_ms=40,
    )


def full_task_record(conversation_id: str, result: object) -> TaskRecord:
    """A task with every field set away from its default; ``held`` and ``outcome`` carry ``result``."""
    return TaskRecord(
        task_id=new_id(),
        kind="shop.payment",
        version=3,
        conversation_id=conversation_id,
        owner_task_id=new_id(),
        background=True,
        abandon_on_restart=True,
        status="completing",
        phase="charge",
        on=(new_id(), new_id()),
        policy="fail_fast",
        until_ms=1_700_000_060_000,
        abort="restart",
        restarts=2,
        restart_limit=7,
        epoch=(1 << 63) - 1,
        held=TaskOutcome(status="failed", reason="phase_error", result=JsonValue(result), error="card declined"),
        outcome=TaskOutcome(status="aborted", reason="restart", result=JsonValue(result), error="ü"),
        seq=9,
        created_at_ms=41,
        updated_at_ms=42,
    )


def with_conversation(store: StoreUnderTest) -> str:
    """A new conversation's id, stored."""
    conversation_id = new_id()
    store.insert_conversation(conversation_record(conversation_id))
    return conversation_id


def typed(value: object) -> object:
    """``value`` with every scalar paired with its type, so that ``1``, ``1.0`` and ``True`` compare unequal."""
    if isinstance(value, dict):
        return {key: typed(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [type(value), *(typed(item) for item in value)]
    return (type(value), value)
