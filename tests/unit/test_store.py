"""The SQLite store on a temp file: migrations, refusing a newer schema, ownership, uniqueness, reads, tasks."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import stat
import threading
import time
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
    RunUsage,
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
    APPLICATION_ID,
    MIGRATIONS,
    SCHEMA_VERSION,
    Ownership,
    OwnershipWait,
    SqliteStore,
    StoredTasks,
    _sqlite,
    check_database,
    lock_path,
    read_live_tasks,
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
    db.execute(f"PRAGMA application_id={APPLICATION_ID}")  # a newer Tether marks its databases too
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


def _version_1_database(path: str, conversation_id: str) -> None:
    """A database as an engine without tasks left it: migration 1 only, one conversation with one entry, logged."""
    logged = {"conversation_id": conversation_id, "created_at_ms": 10, "seq": 1, "entry_count": 0}
    db = apsw.Connection(path)
    try:
        with db:
            db.execute(MIGRATIONS[0])
            db.execute(
                "INSERT INTO conversations (conversation_id, created_at_ms, seq) VALUES (?, 10, 1)", (conversation_id,)
            )
            db.execute(
                "INSERT INTO entries (conversation_id, position, entry_id, seq, kind, data, created_at_ms) "
                "VALUES (?, 0, ?, 2, 'message', ?, 20)",
                (conversation_id, conversation_id + "-entry", msgpack.packb({"text": "hi", "n": 1.0})),
            )
            db.execute(
                "INSERT INTO commits (seq, conversation_id, committed_at_ms, records) VALUES (1, ?, 10, ?)",
                (conversation_id, msgpack.packb([{**logged, "record": "conversation"}])),
            )
            db.execute("PRAGMA user_version=1")
    finally:
        db.close()


def _columns(path: str, table: str) -> list[str]:
    db = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return [str(row[1]) for row in db.execute(f"PRAGMA table_info({table})")]
    finally:
        db.close()


def test_version_1_database_migrates_to_the_current_version_and_keeps_its_data(path: str) -> None:
    conversation_id = new_id()
    _version_1_database(path, conversation_id)
    assert read_schema_version(path) == 1
    assert "owner_task_id" not in _columns(path, "conversations")

    store = SqliteStore.open(path)
    try:
        assert store.schema_version() == SCHEMA_VERSION == 6
        assert "char_offset" in _columns(path, "partial_pieces")
        assert "error" in _columns(path, "runs")
        assert store.integrity_check() == "ok"
        assert store.conversation(conversation_id) == ConversationRecord(
            conversation_id=conversation_id, created_at_ms=10, seq=1, entry_count=1, owner_task_id=None
        )
        assert store.entries(conversation_id, "asc", None, 10) == [
            EntryRecord(
                entry_id=conversation_id + "-entry",
                conversation_id=conversation_id,
                position=0,
                seq=2,
                kind="message",
                data=JsonValue({"text": "hi", "n": 1.0}),
                created_at_ms=20,
            )
        ]
        # A commit logged before owner_task_id existed still reads, with the field's default.
        assert store.read_log(0, None, 10) == [
            LoggedCommit(seq=1, committed_at_ms=10, records=(_conversation(conversation_id),))
        ]
        assert store.head_seq() == 1
        assert (store.task_count(), list(store.live_tasks()), store.task_owned_conversations()) == (0, [], [])

        # The migrated schema takes tasks and conversations owned by them.
        task = _task(conversation_id)
        store.insert_task(task, JsonValue({"cart": 1}), None)
        owned = attrs.evolve(_conversation(new_id(), seq=2), owner_task_id=task.task_id)
        store.insert_conversation(owned)
        assert store.task(task.task_id) == task
        assert store.conversation(owned.conversation_id) == owned
        assert store.task_owned_conversations() == [(owned.conversation_id, task.task_id)]
    finally:
        store.close()
    assert read_schema_version(path) == SCHEMA_VERSION


def test_failed_migration_leaves_the_database_at_its_version(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    conversation_id = new_id()
    _version_1_database(path, conversation_id)
    # Migration 2 failing at its very end: its ALTER TABLE must be undone with the rest of it.
    monkeypatch.setattr(_sqlite, "MIGRATIONS", (MIGRATIONS[0], MIGRATIONS[1] + "CREATE TABLE tasks (x INTEGER);"))
    with pytest.raises(StorageError):
        SqliteStore.open(path)
    assert read_schema_version(path) == 1
    assert "owner_task_id" not in _columns(path, "conversations")
    assert _columns(path, "tasks") == []

    monkeypatch.undo()
    store = SqliteStore.open(path)
    try:
        assert store.schema_version() == SCHEMA_VERSION
        record = store.conversation(conversation_id)
        assert record is not None and record.owner_task_id is None and record.entry_count == 1
    finally:
        store.close()


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


def _waiting_on(lock: Path) -> bool:
    """Whether some thread is blocked in ``flock`` on ``lock`` (a ``->`` line of ``/proc/locks``)."""
    status = os.stat(lock)
    key = f"{os.major(status.st_dev):02x}:{os.minor(status.st_dev):02x}:{status.st_ino}"
    with open("/proc/locks", encoding="ascii") as table:
        return any(line.split()[1:3] == ["->", "FLOCK"] and key in line.split() for line in table)


def _blocked_wait(path: str) -> tuple[OwnershipWait, threading.Thread, list[BaseException]]:
    """An :class:`OwnershipWait` on ``path`` blocked on its thread (seen in /proc/locks), and what it raised."""
    wait = OwnershipWait(path)
    raised: list[BaseException] = []

    def block() -> None:
        try:
            wait.block()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=block, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not _waiting_on(wait.path):
        assert time.monotonic() < deadline, "the wait never blocked on the lock"
        assert thread.is_alive(), f"the wait returned without blocking: {raised}"
        time.sleep(0.001)
    return wait, thread, raised


def test_a_lock_wait_blocks_until_the_holder_lets_go_then_records_the_new_holder(path: str) -> None:
    first = Ownership.acquire(path, started_at_ms=1, instance="first")
    wait, thread, raised = _blocked_wait(path)
    assert not wait.finished.is_set()
    first.release()  # as the kernel does when the holder dies
    assert wait.finished.wait(10) and not raised
    thread.join(10)
    ownership = wait.claim(started_at_ms=2, instance="standby")
    try:
        assert json.loads(lock_path(path).read_text())["instance"] == "standby"
        with pytest.raises(OwnerAlreadyRunning):
            Ownership.acquire(path, started_at_ms=3, instance="third")
    finally:
        ownership.release()


def test_an_abandoned_lock_wait_lets_go_of_the_lock_the_moment_it_is_granted(path: str) -> None:
    first = Ownership.acquire(path, started_at_ms=1, instance="first")
    wait, thread, raised = _blocked_wait(path)
    wait.abandon()  # the standby was told to stop while its thread is blocked in flock
    first.release()
    assert wait.finished.wait(10) and not raised
    thread.join(10)
    # The thread had the lock for an instant and closed it: the next owner gets it, with its own record.
    after = Ownership.acquire(path, started_at_ms=3, instance="next")
    try:
        assert json.loads(lock_path(path).read_text())["instance"] == "next"
    finally:
        after.release()


def test_a_lock_wait_abandoned_after_the_grant_or_before_its_thread_ran_holds_nothing(path: str) -> None:
    granted = OwnershipWait(path)
    granted.block()  # nobody holds the lock: granted at once
    granted.abandon()  # the cancellation won the race with the thread's return
    Ownership.acquire(path, started_at_ms=1, instance="after-grant").release()

    first = Ownership.acquire(path, started_at_ms=2, instance="first")
    never = OwnershipWait(path)
    fd = never._fd
    assert fd is not None
    never.abandon()  # cancelled before its thread started
    never.block()  # the thread starts late: it returns at once, without waiting or locking
    assert never.finished.is_set()
    with pytest.raises(OSError):
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # its descriptor was closed
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


# ---------------------------------------------------------------------------------------------------- tasks


def _task(
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


def _full_task(conversation_id: str, result: object) -> TaskRecord:
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


def _typed(value: object) -> object:
    """``value`` with every scalar paired with its type, so that ``1``, ``1.0`` and ``True`` compare unequal."""
    if isinstance(value, dict):
        return {key: _typed(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [type(value), *(_typed(item) for item in value)]
    return (type(value), value)


@pytest.mark.parametrize(
    "result",
    [
        None,
        True,
        False,
        0,
        -(2**63),
        2**64 - 1,
        1.0,
        -2.5,
        "",
        "ü",
        [],
        {},
        [1, 1.0, True, None, "s"],
        {"refund": {"amount": 12.5, "items": [{"sku": "a", "qty": 2}], "ok": True, "note": None}},
    ],
    ids=repr,
)
def test_task_round_trips_every_field(store: SqliteStore, result: object) -> None:
    conversation_id = _with_conversation(store)
    record = _full_task(conversation_id, result)
    task_input = {"cart": [1, 2.0, "three"], "paid": False}
    checkpoint = {"phase": "charge", "attempt": 2}
    store.insert_task(record, task_input, checkpoint)
    read = store.task(record.task_id)
    assert read == record
    assert read is not None and read.held is not None and read.outcome is not None
    assert _typed(read.held.result) == _typed(read.outcome.result) == _typed(result)
    assert store.task_data(record.task_id) == (task_input, checkpoint)
    assert _typed(store.task_data(record.task_id)) == _typed((task_input, checkpoint))


def test_task_with_only_required_fields_round_trips(store: SqliteStore) -> None:
    conversation_id = _with_conversation(store)
    record = _task(conversation_id)
    store.insert_task(record, None, None)
    assert store.task(record.task_id) == record
    assert store.task_data(record.task_id) == (None, None)
    assert store.task(new_id()) is None
    assert store.task_count() == 1


def test_duplicate_task_id_is_a_store_conflict(store: SqliteStore) -> None:
    conversation_id = _with_conversation(store)
    record = _task(conversation_id)
    store.insert_task(record, {"first": 1}, None)
    store.begin()
    with pytest.raises(StoreConflict) as info:
        store.insert_task(attrs.evolve(record, kind="other", status="running"), {"second": 2}, {"phase": "x"})
    assert (info.value.record, info.value.key) == ("task", record.task_id)
    other = _task(conversation_id)
    store.insert_task(other, None, None)  # the transaction is still usable
    store.commit()
    assert store.task(record.task_id) == record
    assert store.task_data(record.task_id) == ({"first": 1}, None)
    assert store.task(other.task_id) == other
    assert store.task_count() == 2


def test_update_task_without_a_checkpoint_keeps_the_stored_one(store: SqliteStore) -> None:
    conversation_id = _with_conversation(store)
    record = _task(conversation_id)
    store.insert_task(record, {"in": 1}, {"phase": "a"})
    waiting = attrs.evolve(
        record, status="waiting", phase="a", on=(new_id(),), policy="all_settled", epoch=1, seq=2, updated_at_ms=50
    )
    store.update_task(waiting)
    assert store.task(record.task_id) == waiting
    assert store.task_data(record.task_id) == ({"in": 1}, {"phase": "a"})
    sleeping = attrs.evolve(waiting, status="sleeping", on=(), policy=None, until_ms=99, seq=3)
    store.update_task(sleeping, checkpoint=NO_CHANGE)
    assert store.task(record.task_id) == sleeping
    assert store.task_data(record.task_id) == ({"in": 1}, {"phase": "a"})


def test_update_task_with_a_checkpoint_replaces_it_and_keeps_the_input(store: SqliteStore) -> None:
    conversation_id = _with_conversation(store)
    record = _task(conversation_id)
    store.insert_task(record, {"in": 1}, None)
    running = attrs.evolve(record, status="running", phase="b", epoch=1, seq=2)
    store.update_task(running, checkpoint={"phase": "b", "n": 1.0})
    assert store.task(record.task_id) == running
    assert _typed(store.task_data(record.task_id)) == _typed(({"in": 1}, {"phase": "b", "n": 1.0}))
    # None is a checkpoint like any other, not "no change".
    store.update_task(running, checkpoint=None)
    assert store.task_data(record.task_id) == ({"in": 1}, None)


def test_update_task_stores_every_column_both_ways(store: SqliteStore) -> None:
    conversation_id = _with_conversation(store)
    full = _full_task(conversation_id, {"x": [1, 2]})
    store.insert_task(full, None, None)
    bare = _task(conversation_id, task_id=full.task_id)
    store.update_task(bare)  # clears on, policy, until_ms, abort, held, outcome; resets counters
    assert store.task(full.task_id) == bare
    store.update_task(full)
    assert store.task(full.task_id) == full


def test_update_task_touches_only_its_task(store: SqliteStore) -> None:
    conversation_id = _with_conversation(store)
    first, second = _task(conversation_id), _task(conversation_id)
    store.insert_task(first, {"n": 1}, {"c": 1})
    store.insert_task(second, {"n": 2}, {"c": 2})
    store.update_task(attrs.evolve(first, status="terminal", outcome=TaskOutcome(status="completed")), checkpoint=3)
    assert store.task(second.task_id) == second
    assert store.task_data(second.task_id) == ({"n": 2}, {"c": 2})


def test_live_tasks_are_the_tasks_not_terminal_in_task_id_order(store: SqliteStore) -> None:
    conversation_id = _with_conversation(store)
    statuses: list[TaskStatus] = ["pending", "terminal", "running", "waiting", "sleeping", "completing", "terminal"]
    task_ids = sorted(new_id() for _ in statuses)
    records = [
        _task(conversation_id, task_id=task_id, status=status)
        for task_id, status in zip(task_ids, statuses, strict=True)
    ]
    for index in (3, 0, 6, 5, 1, 4, 2):  # not in id order
        store.insert_task(records[index], None, None)
    assert list(store.live_tasks()) == [record for record in records if record.status != "terminal"]

    ended = attrs.evolve(records[2], status="terminal", outcome=TaskOutcome(status="failed", error="e"))
    store.update_task(ended)
    assert [record.task_id for record in store.live_tasks()] == [task_ids[index] for index in (0, 3, 4, 5)]


def test_task_owned_conversations_are_those_whose_owner_is_not_terminal(store: SqliteStore) -> None:
    conversation_id = _with_conversation(store)
    running = _task(conversation_id, status="running")
    completing = _task(conversation_id, status="completing")
    ended = _task(conversation_id, status="terminal")
    for record in (running, completing, ended):
        store.insert_task(record, None, None)
    owned: dict[str, str] = {}
    for owner in (running.task_id, running.task_id, completing.task_id, ended.task_id, new_id()):
        conversation = attrs.evolve(_conversation(new_id()), owner_task_id=owner)
        store.insert_conversation(conversation)
        assert store.conversation(conversation.conversation_id) == conversation
        owned[conversation.conversation_id] = owner
    _with_conversation(store)  # owned by nobody

    expected = [
        (conversation, owner) for conversation, owner in owned.items() if owner in (running.task_id, completing.task_id)
    ]
    assert len(expected) == 3
    assert sorted(store.task_owned_conversations()) == sorted(expected)

    store.update_task(attrs.evolve(running, status="terminal", outcome=TaskOutcome(status="aborted")))
    assert store.task_owned_conversations() == [
        (conversation, owner) for conversation, owner in owned.items() if owner == completing.task_id
    ]


# ------------------------------------------------------------------------------------------ WAL checkpoints


def _append_commits(store: SqliteStore, conversation_id: str, count: int, first_position: int) -> None:
    for position in range(first_position, first_position + count):
        store.begin()
        store.insert_entry(_entry(conversation_id, position))
        store.commit()


def test_a_background_checkpoint_copies_the_wal_into_the_database(store: SqliteStore, path: str) -> None:
    checkpointer = store.use_background_checkpoints()
    try:
        _append_commits(store, _with_conversation(store), 200, 0)
        size_before = os.path.getsize(path)
        frames, copied = checkpointer.checkpoint()
        assert frames == store.wal_pages > 0
        assert copied == frames
        assert os.path.getsize(path) > size_before
    finally:
        checkpointer.close()


def test_the_wal_starts_over_once_its_tail_is_copied_under_sustained_writes(store: SqliteStore) -> None:
    checkpointer = store.use_background_checkpoints()
    conversation_id = _with_conversation(store)
    try:
        _append_commits(store, conversation_id, 200, 0)
        checkpointer.checkpoint()
        _append_commits(store, conversation_id, 50, 200)  # the commit loop went on while the checkpoint ran
        grown = store.wal_pages
        store.finish_checkpoint()
        _append_commits(store, conversation_id, 1, 250)
        assert store.wal_pages < 10 < grown  # the next transaction wrote at the start of the WAL again
    finally:
        checkpointer.close()


class _Busy:
    """A connection whose checkpoints meet another connection's checkpoint (SQLite answers SQLITE_BUSY at once)."""

    def wal_checkpoint(self, **kwargs: object) -> tuple[int, int]:
        raise apsw.BusyError("database is locked (another checkpoint runs)")

    def close(self) -> None:
        pass


def test_a_checkpoint_that_meets_another_one_is_skipped_not_a_storage_error(store: SqliteStore) -> None:
    checkpointer = store.use_background_checkpoints()
    real, checkpointer._db = checkpointer._db, _Busy()  # type: ignore[assignment]
    try:
        assert checkpointer.checkpoint() is None
    finally:
        real.close()


class _NotRun:
    """A connection whose checkpoints SQLite did not run (it answers (-1, -1), as on a connection not in WAL mode)."""

    def wal_checkpoint(self, **kwargs: object) -> tuple[int, int]:
        return (-1, -1)

    def close(self) -> None:
        pass


def test_a_checkpoint_sqlite_did_not_run_is_a_storage_error(store: SqliteStore) -> None:
    checkpointer = store.use_background_checkpoints()
    real, checkpointer._db = checkpointer._db, _NotRun()  # type: ignore[assignment]
    try:
        with pytest.raises(StorageError, match="did not run the checkpoint"):
            checkpointer.checkpoint()
    finally:
        real.close()


def test_usage_totals_of_a_version_3_database_migrate_with_no_unpriced_tokens(path: str) -> None:
    db = apsw.Connection(path)
    for number in range(3):
        db.execute(MIGRATIONS[number])
    db.execute(
        "INSERT INTO usage (scope, key, input_tokens, output_tokens, cached_tokens, reasoning_tokens, cost) "
        "VALUES ('model', 'm', 10, 5, 0, 0, 0.5)"
    )
    db.execute("PRAGMA user_version=3")
    db.close()
    store = SqliteStore.open(path)
    try:
        assert "unpriced_tokens" in [str(row[1]) for row in store._db.execute("PRAGMA table_info(usage)")]
        assert store.usage("model", "m") == [("m", RunUsage(input_tokens=10, output_tokens=5, cost=0.5))]
        with store._db:
            store.add_usage("model", "m", RunUsage(input_tokens=3, output_tokens=1, unpriced_tokens=4))
        assert store.usage("model", "m") == [
            ("m", RunUsage(input_tokens=13, output_tokens=6, cost=0.5, unpriced_tokens=4))
        ]
        assert store.usage_count("model") == 1 and store.usage_count("tree") == 0
    finally:
        store.close()


# ------------------------------------------------------------------------ reading without the owner (tether tasks)


def _database_with_tasks(store: SqliteStore) -> list[TaskRecord]:
    conversation_id = _with_conversation(store)
    live = [_task(conversation_id), attrs.evolve(_task(conversation_id), status="sleeping", phase="wait", until_ms=99)]
    for record in (*live, _task(conversation_id, status="terminal")):
        store.insert_task(record, None, None)
    store.log_commit(LoggedCommit(seq=1, committed_at_ms=10, records=()), frozenset())
    store.log_commit(LoggedCommit(seq=2, committed_at_ms=11, records=()), frozenset())
    return live


def test_read_live_tasks_reads_them_as_of_the_head_of_the_log(store: SqliteStore, path: str) -> None:
    live = _database_with_tasks(store)
    assert read_live_tasks(path) == StoredTasks(seq=2, tasks=tuple(sorted(live, key=lambda task: task.task_id)))


def test_read_live_tasks_runs_beside_a_writer_and_sees_what_it_committed(store: SqliteStore, path: str) -> None:
    live = _database_with_tasks(store)
    store.begin()
    store.insert_task(_task(live[0].conversation_id), None, None)  # not committed: not seen
    try:
        assert {task.task_id for task in read_live_tasks(path).tasks} == {task.task_id for task in live}
    finally:
        store.commit()
    assert len(read_live_tasks(path).tasks) == len(live) + 1


def test_read_live_tasks_of_a_database_from_before_tasks_finds_none(path: str) -> None:
    db = apsw.Connection(path)
    db.execute("PRAGMA user_version=1")
    db.close()
    assert read_live_tasks(path) == StoredTasks(seq=0, tasks=())


def test_read_live_tasks_refuses_a_newer_schema_and_leaves_it_untouched(path: str) -> None:
    db = apsw.Connection(path)
    db.execute(f"CREATE TABLE t (x); PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.close()
    before = Path(path).read_bytes()
    with pytest.raises(SchemaTooNew, match=f"schema version {SCHEMA_VERSION + 1}, newer than"):
        read_live_tasks(path)
    assert Path(path).read_bytes() == before


@pytest.mark.parametrize("content", ["not-sqlite", "another-app"])
def test_read_live_tasks_of_a_file_that_is_not_a_tether_database_is_a_storage_error(path: str, content: str) -> None:
    if content == "not-sqlite":
        Path(path).write_bytes(b"a text file, not a database\n" * 64)
    else:
        db = apsw.Connection(path)
        db.execute(f"CREATE TABLE other (x); PRAGMA user_version={SCHEMA_VERSION}")
        db.close()
    before = Path(path).read_bytes()
    with pytest.raises(StorageError, match="it is not a Tether database") as info:
        read_live_tasks(path)
    assert "left untouched" in str(info.value)
    assert isinstance(info.value.__cause__, apsw.Error)
    assert Path(path).read_bytes() == before
    assert not Path(path + "-wal").exists()
