"""Reading a database without its owner (``storage_owner.store.read_live_tasks``, what ``tether tasks`` shows when no
owner answers): read-only, through the store's own SQL, its errors mapped there."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import apsw
import attrs
import pytest

from protocol import ConversationRecord, SchemaTooNew, StorageError, TaskRecord, new_id
from storage_owner.core import LoggedCommit
from storage_owner.store import SCHEMA_VERSION, SqliteStore, StoredTasks, read_live_tasks


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "t.db")


@pytest.fixture
def store(path: str) -> Iterator[SqliteStore]:
    opened = SqliteStore.open(path)
    yield opened
    opened.close()


def _task(conversation_id: str, **fields: object) -> TaskRecord:
    record = TaskRecord(
        task_id=new_id(),
        kind="shop.checkout",
        version=1,
        conversation_id=conversation_id,
        owner_task_id=None,
        background=False,
        abandon_on_restart=False,
        status="pending",
        phase=None,
        seq=1,
        created_at_ms=10,
        updated_at_ms=10,
    )
    return attrs.evolve(record, **fields)


def _database_with_tasks(store: SqliteStore) -> list[TaskRecord]:
    conversation_id = new_id()
    store.insert_conversation(
        ConversationRecord(conversation_id=conversation_id, created_at_ms=10, seq=1, entry_count=0)
    )
    live = [_task(conversation_id), _task(conversation_id, status="sleeping", phase="wait", until_ms=99)]
    ended = _task(conversation_id, status="terminal")
    for record in (*live, ended):
        store.insert_task(record, None, None)
    store.log_commit(LoggedCommit(seq=1, committed_at_ms=10, records=()), frozenset())
    store.log_commit(LoggedCommit(seq=2, committed_at_ms=11, records=()), frozenset())
    return live


def test_the_live_tasks_are_read_as_of_the_head_of_the_log(store: SqliteStore, path: str) -> None:
    live = _database_with_tasks(store)
    assert read_live_tasks(path) == StoredTasks(seq=2, tasks=tuple(sorted(live, key=lambda task: task.task_id)))


def test_the_read_runs_beside_a_writer_and_sees_what_it_committed(store: SqliteStore, path: str) -> None:
    live = _database_with_tasks(store)
    store.begin()
    store.insert_task(_task(live[0].conversation_id), None, None)  # not committed: not seen
    try:
        assert {task.task_id for task in read_live_tasks(path).tasks} == {task.task_id for task in live}
    finally:
        store.commit()
    assert len(read_live_tasks(path).tasks) == len(live) + 1


def test_a_database_from_before_tasks_has_none(path: str) -> None:
    connection = apsw.Connection(path)
    connection.execute("PRAGMA user_version=1")
    connection.close()
    assert read_live_tasks(path) == StoredTasks(seq=0, tasks=())


def test_a_newer_schema_is_refused_and_left_untouched(path: str) -> None:
    connection = apsw.Connection(path)
    connection.execute(f"CREATE TABLE t (x); PRAGMA user_version={SCHEMA_VERSION + 1}")
    connection.close()
    before = Path(path).read_bytes()
    with pytest.raises(SchemaTooNew, match=f"schema version {SCHEMA_VERSION + 1}, newer than"):
        read_live_tasks(path)
    assert Path(path).read_bytes() == before


@pytest.mark.parametrize("content", ["not-sqlite", "another-app"])
def test_a_file_that_is_not_a_tether_database_is_a_storage_error_and_left_untouched(path: str, content: str) -> None:
    if content == "not-sqlite":
        Path(path).write_bytes(b"a text file, not a database\n" * 64)
    else:
        connection = apsw.Connection(path)
        connection.execute(f"CREATE TABLE other (x); PRAGMA user_version={SCHEMA_VERSION}")
        connection.close()
    before = Path(path).read_bytes()
    with pytest.raises(StorageError, match="it is not a Tether database") as info:
        read_live_tasks(path)
    assert "left untouched" in str(info.value)
    assert isinstance(info.value.__cause__, apsw.Error)
    assert Path(path).read_bytes() == before
    assert not Path(path + "-wal").exists()
