"""Knowing a Tether database before writing to it: the application_id mark, refusing foreign, empty and damaged
files untouched, private file modes, atomic creation, the bounded start check and ``full_check``."""

from __future__ import annotations

import hashlib
import os
import random
import stat
from pathlib import Path

import apsw
import pytest

from protocol import DatabaseDamaged, EntryRecord, JsonValue, NotATetherDatabase, SchemaTooNew, new_id
from storage_owner.store import (
    APPLICATION_ID,
    GROUP_READABLE_FILE_MODE,
    MIGRATIONS,
    SCHEMA_VERSION,
    SqliteStore,
    full_check,
    refuse_foreign,
)
from storage_owner.store._identity import CREATING_SUFFIX
from tests.unit._stores import conversation_record, entry_record

PAGE_BYTES = 4096


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "t.db")


def _digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _header(path: str) -> tuple[int, int]:
    """(application_id, user_version) read from a closed database file's header, through a read-only connection."""
    db = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        application_id = db.execute("PRAGMA application_id").fetchone()[0]  # type: ignore[index]
        version = db.execute("PRAGMA user_version").fetchone()[0]  # type: ignore[index]
        return int(application_id), int(version)
    finally:
        db.close()


def _filled(path: str, entries: int = 600) -> str:
    """A real Tether database holding ``entries`` entries in one conversation, closed; its conversation id."""
    store = SqliteStore.open(path)
    try:
        conversation_id = new_id()
        store.begin()
        store.insert_conversation(conversation_record(conversation_id))
        for position in range(entries):
            entry = entry_record(conversation_id, position)
            store.insert_entry(
                EntryRecord(
                    entry_id=entry.entry_id,
                    conversation_id=conversation_id,
                    position=position,
                    seq=1,
                    kind="message",
                    data=JsonValue({"n": position, "text": "x" * 200}),
                    created_at_ms=1,
                )
            )
        store.commit()
    finally:
        store.close()
    return conversation_id


def _refused_untouched(path: str, error: type[Exception]) -> str:
    """Open ``path``: it is refused with ``error`` and neither it nor its directory changed. The message."""
    directory = os.path.dirname(path)
    before = (_digest(path), sorted(os.listdir(directory)))
    with pytest.raises(error) as caught:
        SqliteStore.open(path, start_check_s=10.0)
    assert (_digest(path), sorted(os.listdir(directory))) == before
    return str(caught.value)


def test_a_new_database_is_marked_and_private_with_its_wal_and_shm(path: str) -> None:
    store = SqliteStore.open(path)
    try:
        assert store.created
        store.begin()
        store.insert_conversation(conversation_record(new_id()))
        store.commit()
        modes = {suffix: stat.S_IMODE(os.stat(path + suffix).st_mode) for suffix in ("", "-wal", "-shm")}
    finally:
        store.close()
    assert modes == {"": 0o600, "-wal": 0o600, "-shm": 0o600}
    assert _header(path) == (APPLICATION_ID, SCHEMA_VERSION)
    assert not os.path.exists(path + CREATING_SUFFIX)


def test_group_readable_creates_0640_whatever_the_umask(path: str) -> None:
    old_umask = os.umask(0o077)
    try:
        store = SqliteStore.open(path, file_mode=GROUP_READABLE_FILE_MODE)
        store.begin()
        store.insert_conversation(conversation_record(new_id()))
        store.commit()
        modes = {stat.S_IMODE(os.stat(path + suffix).st_mode) for suffix in ("", "-wal", "-shm")}
        store.close()
    finally:
        os.umask(old_umask)
    assert modes == {0o640}


def test_reopening_is_not_a_creation_and_passes_the_start_check(path: str) -> None:
    _filled(path)
    store = SqliteStore.open(path, start_check_s=10.0)
    try:
        assert not store.created
        assert store.checked_fully
    finally:
        store.close()


def test_a_start_check_out_of_time_says_it_did_not_check_fully(path: str) -> None:
    _filled(path, entries=3000)
    store = SqliteStore.open(path, start_check_s=1e-9)
    try:
        assert not store.checked_fully
        assert store.head_seq() == 0  # and the database is served
    finally:
        store.close()


def test_another_applications_database_is_refused_untouched(path: str) -> None:
    db = apsw.Connection(path)
    db.execute("CREATE TABLE invoices (n INTEGER); INSERT INTO invoices VALUES (1);")
    db.close()
    message = _refused_untouched(path, NotATetherDatabase)
    assert "invoices" in message and path in message
    assert _header(path) == (0, 0)


def test_a_database_marked_by_another_application_is_refused_even_without_tables(path: str) -> None:
    db = apsw.Connection(path)
    db.execute("PRAGMA application_id=4660")  # 0x1234
    db.close()
    assert "0x1234" in _refused_untouched(path, NotATetherDatabase)


def test_another_application_with_a_high_user_version_is_foreign_not_too_new(path: str) -> None:
    db = apsw.Connection(path)
    db.execute(f"CREATE TABLE things (n INTEGER); PRAGMA user_version={SCHEMA_VERSION + 5}")
    db.close()
    _refused_untouched(path, NotATetherDatabase)


def test_a_newer_tether_database_is_too_new(path: str) -> None:
    _filled(path, entries=1)
    db = apsw.Connection(path)
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.close()
    _refused_untouched(path, SchemaTooNew)


def test_a_file_that_is_not_sqlite_is_refused_untouched(path: str) -> None:
    Path(path).write_bytes(b"a text file, not a database\n" * 200)
    _refused_untouched(path, NotATetherDatabase)


def test_an_empty_file_is_refused_not_started_over(path: str) -> None:
    Path(path).write_bytes(b"")
    message = _refused_untouched(path, NotATetherDatabase)
    assert "empty" in message
    assert os.path.getsize(path) == 0


def test_a_wal_without_its_database_is_refused_and_nothing_is_created(path: str) -> None:
    Path(path + "-wal").write_bytes(b"\0" * 64)
    with pytest.raises(NotATetherDatabase):
        SqliteStore.open(path)
    assert sorted(os.listdir(os.path.dirname(path))) == ["t.db-wal"]


def test_a_creation_cut_off_by_a_crash_is_cleared_and_done_again(path: str) -> None:
    Path(path + CREATING_SUFFIX).write_bytes(b"half a database")
    store = SqliteStore.open(path)
    store.close()
    assert sorted(os.listdir(os.path.dirname(path))) == ["t.db"]
    assert _header(path) == (APPLICATION_ID, SCHEMA_VERSION)


def test_a_blank_sqlite_file_becomes_a_new_tether_database(path: str) -> None:
    db = apsw.Connection(path)
    db.execute("CREATE TABLE scratch (n INTEGER); DROP TABLE scratch;")
    db.close()
    assert os.path.getsize(path) > 0
    SqliteStore.open(path).close()
    assert _header(path) == (APPLICATION_ID, SCHEMA_VERSION)


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION + 1))
def test_a_tether_database_from_before_the_mark_is_recognised_migrated_and_marked(path: str, version: int) -> None:
    db = apsw.Connection(path)
    for number in range(version):
        db.execute(MIGRATIONS[number])
    db.execute(f"PRAGMA user_version={version}")
    db.close()
    SqliteStore.open(path, start_check_s=10.0).close()
    assert _header(path) == (APPLICATION_ID, SCHEMA_VERSION)


def _damage_a_page(path: str, conversation_id: str) -> int:
    """Overwrite one b-tree page of the entries table with random bytes (seeded); the page number."""
    db = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        root = int(db.execute("SELECT rootpage FROM sqlite_schema WHERE name = 'entries'").fetchone()[0])  # type: ignore[index]
        pages = int(db.execute("PRAGMA page_count").fetchone()[0])  # type: ignore[index]
    finally:
        db.close()
    for suffix in ("-wal", "-shm"):  # left (empty) by the read-only connection
        os.unlink(path + suffix)
    assert pages > root + 2, "the entries table should span several pages"
    with open(path, "r+b") as stream:
        stream.seek((root - 1) * PAGE_BYTES)
        stream.write(random.Random(11).randbytes(PAGE_BYTES))
    return root


def test_a_damaged_database_is_refused_untouched_saying_what_to_do(path: str) -> None:
    conversation_id = _filled(path)
    _damage_a_page(path, conversation_id)
    message = _refused_untouched(path, DatabaseDamaged)
    assert "tether check" in message and ".recover" in message and "backup" in message


def test_full_check_reports_ok_then_the_problems_of_a_damaged_page(path: str) -> None:
    conversation_id = _filled(path)
    report = full_check(path, MIGRATIONS)
    assert report["ok"] and report["problems"] == []
    assert report["schema_version"] == SCHEMA_VERSION and report["application_id"] == APPLICATION_ID
    _damage_a_page(path, conversation_id)
    before = _digest(path)
    report = full_check(path, MIGRATIONS)
    assert not report["ok"] and report["problems"]
    assert _digest(path) == before


def _foreign_sqlite(path: str, *, application_id: int = 0, user_version: int = 0) -> None:
    db = apsw.Connection(path)
    db.execute(f"CREATE TABLE invoices (n INTEGER); PRAGMA application_id={application_id};")
    db.execute(f"PRAGMA user_version={user_version}")
    db.close()


@pytest.mark.parametrize(
    ("kind", "error", "why"),
    [
        ("text", NotATetherDatabase, "not a SQLite database"),
        ("empty", NotATetherDatabase, "empty file"),
        ("short", NotATetherDatabase, "not a SQLite database"),
        ("another-id", NotATetherDatabase, "application_id is 0x1234"),
        ("unmarked-foreign", NotATetherDatabase, "another application (tables invoices"),
        ("newer", SchemaTooNew, f"newer than this engine's {SCHEMA_VERSION}"),
    ],
)
def test_a_first_look_refuses_what_is_not_a_tether_database_creating_nothing_beside_it(
    path: str, kind: str, error: type[Exception], why: str
) -> None:
    if kind == "text":
        Path(path).write_text("hello\n" * 100)
    elif kind == "empty":
        Path(path).write_bytes(b"")
    elif kind == "short":
        Path(path).write_bytes(b"SQLite format 3\x00")
    elif kind == "another-id":
        _foreign_sqlite(path, application_id=0x1234)
    elif kind == "unmarked-foreign":
        _foreign_sqlite(path)
    else:
        _foreign_sqlite(path, application_id=APPLICATION_ID, user_version=SCHEMA_VERSION + 1)
    before = (_digest(path), sorted(os.listdir(os.path.dirname(path))))
    with pytest.raises(error, match="left untouched") as caught:
        refuse_foreign(path, MIGRATIONS)
    assert why in str(caught.value)
    assert (_digest(path), sorted(os.listdir(os.path.dirname(path)))) == before


def test_a_first_look_passes_a_new_path_a_tether_database_and_one_from_before_the_mark(path: str) -> None:
    refuse_foreign(path, MIGRATIONS)  # nothing there yet: a new database
    assert not os.path.exists(path)
    _filled(path, entries=3)
    files = sorted(os.listdir(os.path.dirname(path)))
    refuse_foreign(path, MIGRATIONS)
    db = apsw.Connection(path)
    db.execute("PRAGMA application_id=0")  # as an engine from before the mark left it
    db.close()
    refuse_foreign(path, MIGRATIONS)
    assert sorted(os.listdir(os.path.dirname(path))) == files
