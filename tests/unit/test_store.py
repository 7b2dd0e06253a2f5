"""The SQLite store on a temp file: migrations, refusing a newer schema, ownership, uniqueness, reads, tasks."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import apsw
import attrs
import msgpack
import pytest

from protocol import (
    ConversationRecord,
    DocumentRecord,
    EntryRecord,
    JsonValue,
    OwnerAlreadyRunning,
    SchemaTooNew,
    StorageError,
    SubmissionRecord,
    TaskOutcome,
    TaskRecord,
    TaskStatus,
    new_id,
)
from storage_owner.core import NO_CHANGE, LoggedCommit, StoreConflict
from storage_owner.store import (
    MIGRATIONS,
    SCHEMA_VERSION,
    Ownership,
    SqliteStore,
    _sqlite,
    check_database,
    lock_path,
    read_schema_version,
)


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "t.db")


@pytest.fixture
def store(path: str) -> Iterator[SqliteStore]:
    opened = SqliteStore.open(path)
    yield opened
    opened.close()


def _conversation(conversation_id: str, seq: int = 1) -> ConversationRecord:
    return ConversationRecord(conversation_id=conversation_id, created_at_ms=10, seq=seq, entry_count=0)


def _entry(conversation_id: str, position: int, *, entry_id: str | None = None, seq: int = 1) -> EntryRecord:
    return EntryRecord(
        entry_id=entry_id or new_id(),
        conversation_id=conversation_id,
        position=position,
        seq=seq,
        kind="message",
        data=JsonValue({"n": position, "list": [1, 2.5, None, True]}),
        created_at_ms=20,
    )


def _submission(conversation_id: str, *, submission_id: str | None = None, request_id: str = "r") -> SubmissionRecord:
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


def _with_conversation(store: SqliteStore) -> str:
    conversation_id = new_id()
    store.insert_conversation(_conversation(conversation_id))
    return conversation_id


def _append(store: SqliteStore, conversation_id: str, count: int) -> list[EntryRecord]:
    added = []
    for _ in range(count):
        position = store.next_entry_position(conversation_id)
        assert position is not None
        entry = _entry(conversation_id, position)
        store.insert_entry(entry)
        added.append(entry)
    return added


def _digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ------------------------------------------------------------------------------------------------ migrations


def test_new_database_is_at_the_current_schema_version(store: SqliteStore, path: str) -> None:
    assert store.schema_version() == SCHEMA_VERSION
    assert read_schema_version(path) == SCHEMA_VERSION
    assert store.head_seq() == 0
    assert store.integrity_check() == "ok"


def test_new_database_uses_wal(store: SqliteStore, path: str) -> None:
    assert check_database(path)["schema_version"] == SCHEMA_VERSION
    db = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        db.close()


def test_reopening_keeps_data_and_does_not_migrate_again(path: str) -> None:
    store = SqliteStore.open(path)
    conversation_id = _with_conversation(store)
    store.close()
    # Migration 1 creates tables without IF NOT EXISTS: running it again would fail.
    store = SqliteStore.open(path)
    try:
        assert store.schema_version() == SCHEMA_VERSION
        assert store.conversation(conversation_id) == _conversation(conversation_id)
    finally:
        store.close()


def test_only_new_migrations_run_on_an_older_database(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SqliteStore.open(path)
    conversation_id = _with_conversation(store)
    store.close()
    migrations = (*MIGRATIONS, "CREATE TABLE added_later (x INTEGER)")
    monkeypatch.setattr(_sqlite, "MIGRATIONS", migrations)
    monkeypatch.setattr(_sqlite, "SCHEMA_VERSION", len(migrations))
    for _ in range(2):  # the second open finds nothing to do
        store = SqliteStore.open(path)
        try:
            assert store.schema_version() == len(migrations)
            assert store.conversation(conversation_id) is not None
        finally:
            store.close()


def test_newer_schema_is_refused_and_left_untouched(tmp_path: Path, path: str) -> None:
    db = apsw.Connection(path)
    db.execute("CREATE TABLE future (x INTEGER); INSERT INTO future VALUES (1);")
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.close()
    before = _digest(path)

    with pytest.raises(SchemaTooNew):
        SqliteStore.open(path)

    assert _digest(path) == before
    assert sorted(os.listdir(tmp_path)) == ["t.db"]  # no -wal or -shm: journal mode was never switched
    assert read_schema_version(path) == SCHEMA_VERSION + 1
    db = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    finally:
        db.close()


def test_read_schema_version_of_a_missing_file_is_none(tmp_path: Path) -> None:
    assert read_schema_version(str(tmp_path / "missing.db")) is None
    assert not (tmp_path / "missing.db").exists()


# ------------------------------------------------------------------------------------------------- ownership


def test_second_acquire_in_the_same_process_is_refused_naming_the_pid(path: str) -> None:
    first = Ownership.acquire(path, started_at_ms=1_700_000_000_000, instance="first")
    try:
        with pytest.raises(OwnerAlreadyRunning) as info:
            Ownership.acquire(path, started_at_ms=1_700_000_000_001, instance="second")
        assert f"pid {os.getpid()}" in str(info.value)
    finally:
        first.release()


def test_release_lets_a_new_acquire_succeed(path: str) -> None:
    first = Ownership.acquire(path, started_at_ms=1, instance="first")
    first.release()
    first.release()  # releasing twice is harmless
    second = Ownership.acquire(path, started_at_ms=2, instance="second")
    try:
        holder = json.loads(lock_path(path).read_text())
        assert holder["pid"] == os.getpid()
        assert holder["instance"] == "second"
        assert holder["started_at_ms"] == 2
    finally:
        second.release()


def test_lock_file_is_private(path: str) -> None:
    ownership = Ownership.acquire(path, started_at_ms=1, instance="i")
    try:
        assert ownership.path == lock_path(path) == Path(path + ".lock")
        assert stat.S_IMODE(os.stat(ownership.path).st_mode) == 0o600
    finally:
        ownership.release()


def test_refused_acquire_leaves_the_holders_record_intact(path: str) -> None:
    first = Ownership.acquire(path, started_at_ms=5, instance="first")
    try:
        with pytest.raises(OwnerAlreadyRunning):
            Ownership.acquire(path, started_at_ms=6, instance="second")
        assert json.loads(lock_path(path).read_text())["instance"] == "first"
    finally:
        first.release()


# ------------------------------------------------------------------------------------------------ uniqueness


def test_duplicate_conversation_id_is_a_store_conflict(store: SqliteStore) -> None:
    conversation_id = _with_conversation(store)
    with pytest.raises(StoreConflict) as info:
        store.insert_conversation(_conversation(conversation_id, seq=2))
    assert (info.value.record, info.value.key) == ("conversation", conversation_id)
    assert store.conversation_count() == 1


def test_duplicate_entry_id_is_a_store_conflict(store: SqliteStore) -> None:
    first, second = _with_conversation(store), _with_conversation(store)
    [entry] = _append(store, first, 1)
    with pytest.raises(StoreConflict) as info:
        store.insert_entry(_entry(second, 0, entry_id=entry.entry_id))
    assert (info.value.record, info.value.key) == ("entry", entry.entry_id)
    assert store.entry_count() == 1


def test_duplicate_submission_id_is_a_store_conflict(store: SqliteStore) -> None:
    conversation_id = _with_conversation(store)
    submission = _submission(conversation_id, request_id="a")
    store.insert_submission(submission)
    with pytest.raises(StoreConflict) as info:
        store.insert_submission(_submission(conversation_id, submission_id=submission.submission_id, request_id="b"))
    assert (info.value.record, info.value.key) == ("submission", submission.submission_id)
    assert store.submission(conversation_id, "b") is None


def test_duplicate_request_id_in_a_conversation_is_a_store_conflict(store: SqliteStore) -> None:
    conversation_id = _with_conversation(store)
    store.insert_submission(_submission(conversation_id, request_id="same"))
    with pytest.raises(StoreConflict):
        store.insert_submission(_submission(conversation_id, request_id="same"))


def test_same_request_id_in_another_conversation_is_allowed(store: SqliteStore) -> None:
    first, second = _with_conversation(store), _with_conversation(store)
    store.insert_submission(_submission(first, request_id="same"))
    store.insert_submission(_submission(second, request_id="same"))
    assert store.submission(first, "same") != store.submission(second, "same")


def test_conflict_inside_a_transaction_leaves_the_transaction_usable(store: SqliteStore) -> None:
    store.begin()
    conversation_id = _with_conversation(store)
    with pytest.raises(StoreConflict):
        store.insert_conversation(_conversation(conversation_id))
    other = _with_conversation(store)
    store.commit()
    assert store.conversation(conversation_id) is not None
    assert store.conversation(other) is not None


def test_rolled_back_savepoint_undoes_only_its_writes(store: SqliteStore) -> None:
    store.begin()
    kept = _with_conversation(store)
    store.savepoint()
    dropped = _with_conversation(store)
    store.rollback_savepoint()
    store.savepoint()
    released = _with_conversation(store)
    store.release_savepoint()
    store.commit()
    assert not store.in_transaction
    assert store.conversation(kept) is not None
    assert store.conversation(dropped) is None
    assert store.conversation(released) is not None


# --------------------------------------------------------------------------------------- records round trip


def test_next_entry_position_follows_the_stored_entries(store: SqliteStore) -> None:
    conversation_id = _with_conversation(store)
    assert store.next_entry_position(conversation_id) == 0
    assert store.next_entry_position(conversation_id) == 0  # asking does not claim
    _append(store, conversation_id, 3)
    assert store.next_entry_position(conversation_id) == 3
    assert store.next_entry_position(new_id()) is None
    record = store.conversation(conversation_id)
    assert record is not None and record.entry_count == 3


def test_entry_position_is_unique_within_a_conversation(store: SqliteStore) -> None:
    conversation_id = _with_conversation(store)
    _append(store, conversation_id, 1)
    with pytest.raises(StoreConflict):
        store.insert_entry(_entry(conversation_id, 0))
    assert store.entry_count() == 1


def test_documents_are_scoped_per_conversation_and_global(store: SqliteStore) -> None:
    conversation_id = _with_conversation(store)
    scoped = DocumentRecord(
        conversation_id=conversation_id, name="n", version=1, value=JsonValue([1]), seq=1, updated_at_ms=5
    )
    global_ = DocumentRecord(
        conversation_id=None, name="n", version=2, value=JsonValue({"g": 1.5}), seq=2, updated_at_ms=6
    )
    store.put_document(scoped)
    store.put_document(global_)
    assert store.document(conversation_id, "n") == scoped
    assert store.document(None, "n") == global_
    assert store.document(None, "other") is None
    replaced = DocumentRecord(conversation_id=None, name="n", version=3, value=JsonValue(None), seq=3, updated_at_ms=7)
    store.put_document(replaced)
    assert store.document(None, "n") == replaced


def test_submission_payload_keeps_its_types(store: SqliteStore) -> None:
    conversation_id = _with_conversation(store)
    payloads: tuple[tuple[str, object], ...] = (("int", 1), ("float", 1.0), ("bool", True))
    for request_id, payload in payloads:
        record = SubmissionRecord(
            submission_id=new_id(),
            conversation_id=conversation_id,
            request_id=request_id,
            kind="k",
            payload=JsonValue(payload),
            status="queued",
            seq=1,
            created_at_ms=1,
        )
        store.insert_submission(record)
        read = store.submission(conversation_id, request_id)
        assert read == record
        assert read is not None and type(read.payload) is type(payload)


def test_meta_values_round_trip(store: SqliteStore) -> None:
    assert store.get_meta("clock") is None
    store.set_meta("clock", 5)
    store.set_meta("clock", 7)
    assert store.get_meta("clock") == 7


# ---------------------------------------------------------------------------------------------------- reads


def test_entries_read_ascending_with_cursor(store: SqliteStore) -> None:
    conversation_id = _with_conversation(store)
    added = _append(store, conversation_id, 5)
    assert store.entries(conversation_id, "asc", None, 10) == added
    assert store.entries(conversation_id, "asc", None, 2) == added[:2]
    assert store.entries(conversation_id, "asc", 1, 2) == added[2:4]
    assert store.entries(conversation_id, "asc", 4, 2) == []


def test_entries_read_descending_with_cursor(store: SqliteStore) -> None:
    conversation_id = _with_conversation(store)
    added = _append(store, conversation_id, 5)
    newest_first = list(reversed(added))
    assert store.entries(conversation_id, "desc", None, 10) == newest_first
    assert store.entries(conversation_id, "desc", None, 2) == newest_first[:2]
    assert store.entries(conversation_id, "desc", 3, 2) == [added[2], added[1]]
    assert store.entries(conversation_id, "desc", 0, 2) == []


def test_entries_are_per_conversation(store: SqliteStore) -> None:
    first, second = _with_conversation(store), _with_conversation(store)
    in_first = _append(store, first, 2)
    in_second = _append(store, second, 3)
    assert store.entries(first, "asc", None, 10) == in_first
    assert store.entries(second, "asc", None, 10) == in_second
    assert [entry.position for entry in in_second] == [0, 1, 2]


def _seqs(commits: list[LoggedCommit]) -> list[int]:
    return [commit.seq for commit in commits]


def _logged_commits(store: SqliteStore) -> tuple[str, str, list[LoggedCommit]]:
    """Five commits: 1 creates A, 2 creates B, 3 touches both, 4 only a global document, 5 only A."""
    first, second = new_id(), new_id()
    global_document = DocumentRecord(
        conversation_id=None, name="g", version=1, value=JsonValue(1), seq=4, updated_at_ms=103
    )
    commits = [
        (LoggedCommit(seq=1, committed_at_ms=100, records=(_conversation(first),)), frozenset({first})),
        (LoggedCommit(seq=2, committed_at_ms=101, records=(_conversation(second, 2),)), frozenset({second})),
        (
            LoggedCommit(seq=3, committed_at_ms=102, records=(_entry(first, 0, seq=3), _entry(second, 0, seq=3))),
            frozenset({first, second}),
        ),
        (LoggedCommit(seq=4, committed_at_ms=103, records=(global_document,)), frozenset()),
        (LoggedCommit(seq=5, committed_at_ms=104, records=(_submission(first),)), frozenset({first})),
    ]
    for commit, touched in commits:
        store.log_commit(commit, touched)
    return first, second, [commit for commit, _ in commits]


def test_read_log_globally_returns_every_commit_in_order(store: SqliteStore) -> None:
    _, _, everything = _logged_commits(store)
    assert store.head_seq() == 5
    assert store.read_log(0, None, 100) == everything
    assert store.read_log(0, None, 2) == everything[:2]
    assert store.read_log(2, None, 2) == everything[2:4]
    assert store.read_log(5, None, 10) == []


def test_read_log_by_conversation_returns_every_commit_that_touched_it(store: SqliteStore) -> None:
    first, second, everything = _logged_commits(store)
    by_seq = {commit.seq: commit for commit in everything}
    # The store may return more commits than the conversation's own (the core filters records), but never
    # misses one, never returns a commit that touched only another conversation, and keeps seq order.
    for conversation_id, own, foreign in ((first, {1, 3, 5}, {2}), (second, {2, 3}, {1, 5})):
        read = store.read_log(0, conversation_id, 100)
        assert _seqs(read) == sorted(_seqs(read))
        assert own <= set(_seqs(read))
        assert not foreign & set(_seqs(read))
        assert all(commit == by_seq[commit.seq] for commit in read)  # whole commits, records unfiltered
    assert 5 in _seqs(store.read_log(3, first, 100))
    assert not {1, 2, 3} & set(_seqs(store.read_log(3, first, 100)))
    assert _seqs(store.read_log(0, first, 1)) == [1]


def test_read_log_stops_at_until_seq(store: SqliteStore) -> None:
    first, _, everything = _logged_commits(store)
    assert store.read_log(0, None, 100, until_seq=3) == everything[:3]
    assert store.read_log(3, None, 100, until_seq=3) == []
    read = _seqs(store.read_log(0, first, 100, until_seq=4))
    assert {1, 3} <= set(read) and max(read) <= 4
