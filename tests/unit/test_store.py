"""The SQLite store on a temp file: migrations, refusing a newer schema, ownership, WAL checkpoints. What every store
keeps (uniqueness, transactions, reads, tasks...) is the conformance suite's (``test_store_conformance.py``), which runs
against this store too."""

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
    EntryRecord,
    InteractionRecord,
    JsonValue,
    OwnerAlreadyRunning,
    RunAnswer,
    RunUsage,
    SchemaTooNew,
    StorageError,
    TaskRecord,
    new_id,
)
from storage_owner.core import LoggedCommit, StoreConflict
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
from storage_owner.store._blobs import pack_interaction
from storage_owner.store._operations import (
    MAX_KEPT_OPERATION_BYTES,
    MAX_KEPT_OPERATION_RECORD_BYTES,
    MAX_KEPT_OPERATIONS,
)
from tests.unit._records import operation_record
from tests.unit._stores import conversation_record, entry_record, task_record, with_conversation


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "t.db")


@pytest.fixture
def store(path: str) -> Iterator[SqliteStore]:
    opened = SqliteStore.open(path)
    yield opened
    opened.close()


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
    conversation_id = with_conversation(store)
    store.close()
    # Migration 1 creates tables without IF NOT EXISTS: running it again would fail.
    store = SqliteStore.open(path)
    try:
        assert store.schema_version() == SCHEMA_VERSION
        assert store.conversation(conversation_id) == conversation_record(conversation_id)
    finally:
        store.close()


def test_only_new_migrations_run_on_an_older_database(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SqliteStore.open(path)
    conversation_id = with_conversation(store)
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


def test_submissions_stored_before_the_inbox_get_the_status_their_run_says(path: str) -> None:
    """Migration 7: a submission stored by an engine without the inbox stayed ``queued``; it takes its run's
    outcome (done with the answer, unanswered with why, placed while the run goes on, queued while it is queued), and
    one of the application's own kinds is ``done``. Only the queued and placed ones are read at start."""
    db = apsw.Connection(path)
    try:
        with db:
            for migration in MIGRATIONS[:6]:
                db.execute(migration)
            answer = msgpack.packb({"seq": 9, "text": "4"})
            usage = msgpack.packb({})
            for n, (status, reason) in enumerate(
                [
                    ("completed", None),
                    ("failed", "model_error"),
                    ("cancelled", None),
                    ("running", None),
                    ("queued", None),
                ]
            ):
                run_id = f"run-{n}"
                db.execute(
                    "INSERT INTO runs (run_id, conversation_id, agent, version, status, reason, answer, usage, "
                    "submission_id, seq, created_at_ms, updated_at_ms, input, created_seq) "
                    "VALUES (?, 'c', 'a', 1, ?, ?, ?, ?, ?, ?, 0, 0, ?, ?)",
                    (run_id, status, reason, answer if status == "completed" else None, usage, run_id, n, b"", n),
                )
                db.execute(
                    "INSERT INTO submissions (submission_id, conversation_id, request_id, kind, payload, status, seq, "
                    "created_at_ms, run_id) VALUES (?, 'c', ?, 'input', ?, 'queued', ?, 0, ?)",
                    (run_id, run_id, msgpack.packb("hi"), n, run_id),
                )
            db.execute(
                "INSERT INTO submissions (submission_id, conversation_id, request_id, kind, payload, status, seq, "
                "created_at_ms) VALUES ('app', 'c', 'app', 'app.task', ?, 'queued', 7, 0)",
                (msgpack.packb(None),),
            )
            db.execute("PRAGMA user_version=6")
    finally:
        db.close()
    store = SqliteStore.open(path)
    try:
        got = {
            record.submission_id: (record.status, record.reason, record.answer)
            for record in (store.submission("c", request_id) for request_id in [*(f"run-{n}" for n in range(5)), "app"])
            if record is not None
        }
        assert got == {
            "run-0": ("done", None, RunAnswer(seq=9, text="4")),
            "run-1": ("unanswered", "model_error", None),
            "run-2": ("unanswered", "aborted", None),
            "run-3": ("placed", None, None),
            "run-4": ("queued", None, None),
            "app": ("done", None, None),
        }
        assert [record.submission_id for record in store.open_submissions()] == ["run-3", "run-4"]
    finally:
        store.close()


def test_migration_9_keeps_approvals_one_per_operation_and_lets_an_operation_ask_questions(path: str) -> None:
    """Migration 9: the interactions table is rebuilt without its unique operation; an approval stored before reads
    as it was, is still the operation's approval, and is still its only one; questions of the same operation join."""
    op, approval_id = new_id(), new_id()
    approval = InteractionRecord(
        interaction_id=approval_id,
        run_id="r",
        conversation_id="c",
        operation_id=op,
        tool="refund",
        task_id="t",
        kind="approval",
        status="open",
        args=JsonValue({"amount": 5}),
        digest="d",
        seq=1,
        created_at_ms=0,
        updated_at_ms=0,
    )
    db = apsw.Connection(path)
    try:
        with db:
            for migration in MIGRATIONS[:8]:
                db.execute(migration)
            db.execute(
                "INSERT INTO interactions (interaction_id, operation_id, run_id, status, record) "
                "VALUES (?, ?, ?, ?, ?)",
                (approval_id, op, "r", "open", pack_interaction(approval)),
            )
            db.execute("PRAGMA user_version=8")
    finally:
        db.close()
    store = SqliteStore.open(path)
    try:
        assert store.operation_interaction(op) == store.interaction(approval_id) == approval
        questions = [
            attrs.evolve(
                approval, interaction_id=new_id(), kind="question", args=JsonValue({"text": q, "schema": None})
            )
            for q in ("Full?", "Why?")
        ]
        store.begin()
        for question in questions:
            store.insert_interaction(question)
        with pytest.raises(StoreConflict):
            store.insert_interaction(attrs.evolve(approval, interaction_id=new_id()))  # a second approval
        store.commit()
        assert store.operation_interaction(op) == approval  # the approval, never a question
        assert [store.interaction(q.interaction_id) for q in questions] == questions
        assert store.integrity_check() == "ok"
    finally:
        store.close()


def _indexes(path: str, table: str) -> set[str]:
    db = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return {
            row[0]
            for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?", (table,))
        }
    finally:
        db.close()


def test_version_1_database_migrates_to_the_current_version_and_keeps_its_data(path: str) -> None:
    conversation_id = new_id()
    _version_1_database(path, conversation_id)
    assert read_schema_version(path) == 1
    assert "owner_task_id" not in _columns(path, "conversations")

    store = SqliteStore.open(path)
    try:
        assert store.schema_version() == SCHEMA_VERSION == 10
        assert {"runs_by_creation", "runs_by_conversation"} <= _indexes(path, "runs")  # 10: runs in creation order
        assert "created_seq" in _columns(path, "submissions") and "entry" in _columns(path, "submissions")
        assert {"model", "head"} <= set(_columns(path, "entries"))
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
            LoggedCommit(seq=1, committed_at_ms=10, records=(conversation_record(conversation_id),))
        ]
        assert store.head_seq() == 1
        assert (store.task_count(), list(store.live_tasks()), store.task_owned_conversations()) == (0, [], [])

        # The migrated schema takes tasks and conversations owned by them.
        task = task_record(conversation_id)
        store.insert_task(task, JsonValue({"cart": 1}), None)
        owned = attrs.evolve(conversation_record(new_id(), seq=2), owner_task_id=task.task_id)
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


# ------------------------------------------------------------------------------------------ WAL checkpoints


def _append_commits(store: SqliteStore, conversation_id: str, count: int, first_position: int) -> None:
    for position in range(first_position, first_position + count):
        store.begin()
        store.insert_entry(entry_record(conversation_id, position))
        store.commit()


def test_a_background_checkpoint_copies_the_wal_into_the_database(store: SqliteStore, path: str) -> None:
    checkpointer = store.use_background_checkpoints()
    try:
        _append_commits(store, with_conversation(store), 200, 0)
        size_before = os.path.getsize(path)
        frames, copied = checkpointer.checkpoint()
        assert frames == store.wal_pages > 0
        assert copied == frames
        assert os.path.getsize(path) > size_before
    finally:
        checkpointer.close()


def test_the_wal_starts_over_once_a_pass_of_the_checkpointer_ends_between_two_transactions(
    store: SqliteStore,
) -> None:
    checkpointer = store.use_background_checkpoints()
    conversation_id = with_conversation(store)
    try:
        _append_commits(store, conversation_id, 200, 0)
        store.begin()  # the commit loop went on while the checkpoint ran
        checkpointer.checkpoint()
        store.insert_entry(entry_record(conversation_id, 200))
        store.commit()
        _append_commits(store, conversation_id, 50, 201)
        grown = store.wal_pages
        assert store.wal_restarts == 0
        frames, copied = checkpointer.checkpoint()  # the next pass copies the tail, on its own connection
        assert copied == frames == grown
        _append_commits(store, conversation_id, 1, 251)
        assert store.wal_pages < 10 < grown  # the next transaction wrote at the start of the WAL again
        assert store.wal_restarts == 1
    finally:
        checkpointer.close()


def test_a_pass_that_ends_inside_a_transaction_does_not_start_the_wal_over(store: SqliteStore) -> None:
    """SQLite's rule the owner's copy-back is built on: the WAL starts over only in a transaction that began after
    every frame was copied; one that was open during the pass appends, and so does the next after it."""
    checkpointer = store.use_background_checkpoints()
    conversation_id = with_conversation(store)
    try:
        _append_commits(store, conversation_id, 200, 0)
        store.begin()
        frames, copied = checkpointer.checkpoint()  # every committed frame, though the writer's transaction is open
        assert copied == frames == store.wal_pages
        store.insert_entry(entry_record(conversation_id, 200))
        store.commit()
        assert store.wal_pages > frames  # appended
        _append_commits(store, conversation_id, 1, 201)
        assert store.wal_restarts == 0  # the frames of that transaction were never copied
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
    conversation_id = with_conversation(store)
    live = [
        task_record(conversation_id),
        attrs.evolve(task_record(conversation_id), status="sleeping", phase="wait", until_ms=99),
    ]
    for record in (*live, task_record(conversation_id, status="terminal")):
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
    store.insert_task(task_record(live[0].conversation_id), None, None)  # not committed: not seen
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


def test_open_waits_for_a_lock_another_connection_holds_a_moment(path: str) -> None:
    """A standby taking over opens the database while a reader (``tether status``) may hold its lock: it waits."""
    SqliteStore.open(path).close()
    other = apsw.Connection(path)
    other.execute("PRAGMA locking_mode=EXCLUSIVE")
    other.execute("BEGIN EXCLUSIVE")
    release = threading.Timer(0.3, lambda: (other.execute("COMMIT"), other.close()))
    release.start()
    try:
        store = SqliteStore.open(path)  # raised StorageError (BusyError) before the busy timeout was set first
    finally:
        release.join()
    store.close()


def test_operations_written_lately_are_kept_within_their_bound_and_forgotten_by_a_rollback(store: SqliteStore) -> None:
    """The store answers ``operation`` from the records it wrote lately (an intent read back by its result): never
    more than its bound, and after any rollback only what the database holds."""
    store.begin()
    ops = [operation_record("started", seq=1, op=f"op-{number:04d}") for number in range(MAX_KEPT_OPERATIONS + 10)]
    for op in ops:
        store.insert_operation(op)
    large = operation_record("started", seq=1, op="op-large", name="x" * MAX_KEPT_OPERATION_RECORD_BYTES)
    store.insert_operation(large)
    count, size = store.kept_operations
    assert count == MAX_KEPT_OPERATIONS and size <= MAX_KEPT_OPERATION_BYTES
    assert [store.operation(op.operation_id) for op in ops] == ops
    assert store.operation(large.operation_id) == large
    store.commit()

    store.begin()
    store.savepoint()
    finished = attrs.evolve(ops[-1], status="completed", result=JsonValue(1), seq=2)
    store.update_operation(finished)
    assert store.operation(finished.operation_id) == finished
    store.rollback_savepoint()
    assert store.kept_operations == (0, 0)
    assert store.operation(finished.operation_id) == ops[-1]
    store.update_operation(finished)
    store.rollback()
    assert store.operation(finished.operation_id) == ops[-1]
