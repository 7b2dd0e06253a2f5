"""Knowing a Tether database before writing to it: creating one privately, recognising one, and checking it.

- **Marking.** Every Tether database carries ``PRAGMA application_id`` :data:`APPLICATION_ID` (set when its schema
  is created, or when an engine from before the mark migrates it). ``file(1)`` and other tools read it from the
  header at offset 68.
- **Recognising** (:func:`identify`, before anything is written; :func:`refuse_foreign`, a first look before anything
  is even created beside the file): a foreign ``application_id`` is another
  application's database; an ``application_id`` of 0 is a database from before the mark only if its tables are
  exactly those of its ``user_version`` (a blank SQLite file, no tables at version 0, is accepted as new). Anything
  else is refused with :class:`~protocol.NotATetherDatabase` and left untouched: no WAL switch, no table.
- **Creating** (:func:`create_database`): a new database is built under a temporary name, created with the
  owner's file mode (``O_EXCL | O_NOFOLLOW``), and linked into place once complete. So a crash while creating never
  leaves an empty or half-built file at the database's path, and a 0-byte file there is never Tether's own: it is
  refused (it is what a truncated database looks like), not silently started over. SQLite gives the ``-wal`` and
  ``-shm`` files the database file's mode.
- **Checking**: :func:`quick_check` at start, bounded in time (a large database is "not checked fully", said so);
  :func:`full_check` runs ``PRAGMA integrity_check`` read-only for ``tether check``, also while an owner runs.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import apsw

from protocol import DatabaseDamaged, NotATetherDatabase, SchemaTooNew, StorageError

APPLICATION_ID: Final = 0x54455448
"""``PRAGMA application_id`` of every Tether database: the bytes ``TETH``."""
FILE_MODE: Final = 0o600
"""A new database (and so its ``-wal`` and ``-shm``) is readable and writable by the owner's user only."""
GROUP_READABLE_FILE_MODE: Final = 0o640
"""With ``--group-readable``: the owner's group may read it too (for backups run under another account)."""
CREATING_SUFFIX: Final = ".creating"
"""A new database is built at ``PATH.creating`` and linked to ``PATH`` once complete."""
QUICK_CHECK_BUDGET_S: Final = 1.0
"""The start check (``PRAGMA quick_check``) stops after this long; the owner then says it did not check fully."""
_PROGRESS_STEPS: Final = 2_000
"""SQLite virtual-machine steps between two looks at the clock during a check."""
_SHOWN_PROBLEMS: Final = 3
_SIDE_FILES: Final = ("-wal", "-shm", "-journal")
_IMMUTABLE_FLAGS: Final = apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI


def damaged_message(path: str, problems: Sequence[str]) -> str:
    """What a damaged database's error says (the owner's refusal, ``tether check``'s last line): the first problems
    found, that the file was left untouched, and how to recover."""
    shown = "; ".join(problems[:_SHOWN_PROBLEMS])
    more = f" (and {len(problems) - _SHOWN_PROBLEMS} more)" if len(problems) > _SHOWN_PROBLEMS else ""
    return (
        f"database {path} is damaged: {shown}{more}. It was left untouched and will not be served. Stop what uses "
        f"it, keep a copy of the file (with its -wal), and restore your last backup; `tether check --db {path}` "
        f"lists every problem, and `sqlite3 {path} .recover` salvages what is still readable into a new database."
    )


SERVE_ADVICE: Final = "Pass --db the path of a Tether database, or a path that does not exist yet to create a new one."
"""What to do about a foreign file, for the commands that open (or create) a database to serve it."""
CHECK_ADVICE: Final = (
    "`tether check` checks Tether databases only: pass --db the path of one (the file a Tether owner serves)."
)
"""What to do about a foreign file, for ``tether check`` (which never creates a database)."""


EMPTY_FILE: Final = (
    "it is an empty file (0 bytes), and Tether never leaves one (a new database is linked into place complete); if "
    "it held your data it was truncated: restore it from a backup, or remove the file to start a new database"
)
SQLITE_MAGIC: Final = b"SQLite format 3\x00"
"""The first 16 bytes of every SQLite database file."""
_HEADER_BYTES: Final = 100
_USER_VERSION_OFFSET: Final = 60
_APPLICATION_ID_OFFSET: Final = 68


def _foreign(path: str, why: str, advice: str) -> NotATetherDatabase:
    return NotATetherDatabase(f"{path} is not a Tether database: {why}. It was left untouched. {advice}")


def _another_application(application_id: int) -> str:
    return f"its application_id is {application_id:#x} (another application's; Tether's is {APPLICATION_ID:#x})"


def _newer(path: str, version: int, schema_version: int) -> SchemaTooNew:
    return SchemaTooNew(
        f"database {path} has schema version {version}, newer than this engine's {schema_version}; it was left "
        "untouched. Use the newer tether that wrote it."
    )


def refuse_foreign(path: str, migrations: tuple[str, ...], *, advice: str = SERVE_ADVICE) -> None:
    """Raise :class:`NotATetherDatabase` for a file at ``path`` that is not a Tether database (empty, not SQLite,
    another application's), and :class:`SchemaTooNew` for a Tether database of a newer schema, before anything is
    created beside it (an ownership lock, the supervisor's lock) or a command reads it. Nothing is written, locked
    or created: the header is read as bytes, and only a SQLite file without the mark (``application_id`` 0) is
    opened, immutable, to read its tables as :func:`identify` does.

    Passes a path that does not exist (a new database), a file marked as Tether's, and whatever it cannot tell
    (unreadable, a read that failed): those are left to :func:`identify`, which the owner runs under its lock. It is
    a first look for a clear refusal, not the check itself (the file may change after it)."""
    try:
        with open(path, "rb") as stream:
            header = stream.read(_HEADER_BYTES)
    except OSError:  # none there (a new database), a directory, no permission: said by whoever opens it
        return
    if not header:
        raise _foreign(path, EMPTY_FILE, advice)
    if len(header) < _HEADER_BYTES or not header.startswith(SQLITE_MAGIC):
        raise _foreign(path, "it is not a SQLite database (its first bytes are not SQLite's file header)", advice)
    offset = _APPLICATION_ID_OFFSET
    application_id = int.from_bytes(header[offset : offset + 4], "big")
    if application_id == APPLICATION_ID:
        version = int.from_bytes(header[_USER_VERSION_OFFSET : _USER_VERSION_OFFSET + 4], "big")
        if version > len(migrations):
            raise _newer(path, version, len(migrations))
        return
    if application_id != 0:
        raise _foreign(path, _another_application(application_id), advice)
    try:  # immutable: no lock taken, no -wal or -shm created
        db = apsw.Connection(f"{Path(path).absolute().as_uri()}?immutable=1", flags=_IMMUTABLE_FLAGS)
    except apsw.Error:
        return
    try:
        identify(db, path, migrations, advice=advice)
    except (SchemaTooNew, DatabaseDamaged, apsw.Error):
        return  # said by the owner's own check, under its lock
    finally:
        db.close()


def create_database(path: str, *, file_mode: int, prepare: Callable[[apsw.Connection], None]) -> None:
    """Create the database at ``path`` (which must not exist): built at ``PATH.creating`` with ``file_mode`` by
    ``prepare`` (which creates the schema), closed, then linked into place, so ``path`` appears complete or not at
    all. The caller holds ownership, so no other owner creates it meanwhile.

    Refuses (:class:`NotATetherDatabase`) when a ``-wal`` or ``-shm`` of ``path`` exists without it: that log
    belongs to a database that was moved or deleted, and SQLite would replay it into the new file.
    """
    for suffix in ("-wal", "-shm"):
        if os.path.lexists(path + suffix):
            raise NotATetherDatabase(
                f"{path} does not exist, but {path}{suffix} does: it belongs to a database that was moved or "
                f"deleted, and a new database there would take its log in. Nothing was created. Put the database "
                f"file back (or restore it from a backup); to start a new database, remove {path}-wal and "
                f"{path}-shm first."
            )
    temporary = path + CREATING_SUFFIX
    _remove_leftovers(temporary)  # of a creation cut off by a crash: never a database anyone used
    fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, file_mode)
    try:
        os.fchmod(fd, file_mode)  # exactly this mode, whatever the umask
    finally:
        os.close(fd)
    try:
        db = apsw.Connection(temporary)
        try:
            prepare(db)
        finally:
            db.close()
        try:
            os.link(temporary, path)
        except FileExistsError:
            raise StorageError(f"cannot create {path}: a file appeared there while the database was created") from None
        except OSError:
            os.rename(temporary, path)  # a filesystem without hard links; we hold ownership, and path was free
        _sync_directory(os.path.dirname(path) or ".")
    finally:
        _remove_leftovers(temporary)


def _remove_leftovers(temporary: str) -> None:
    for name in (temporary, *(temporary + suffix for suffix in _SIDE_FILES)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


def _sync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@functools.cache
def _tables_at(migrations: tuple[str, ...], version: int) -> frozenset[str]:
    """The tables a Tether database has at schema ``version``: the migrations run on a scratch database."""
    db = apsw.Connection(":memory:")
    try:
        for migration in migrations[:version]:
            db.execute(migration)
        return _tables(db)
    finally:
        db.close()


def _tables(db: apsw.Connection) -> frozenset[str]:
    rows = db.execute("SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite%'")
    return frozenset(str(name) for (name,) in rows)


def identify(
    db: apsw.Connection, path: str, migrations: tuple[str, ...], *, advice: str = SERVE_ADVICE
) -> tuple[int, bool]:
    """``(schema version, marked)`` of the existing database ``db`` (at ``path``), read without writing.

    ``marked`` is False for a database from before the mark (or a blank SQLite file): the caller marks it as it
    migrates. Raises :class:`NotATetherDatabase` (another application's database, an empty file, not SQLite),
    :class:`SchemaTooNew`, or :class:`DatabaseDamaged` (its header or schema cannot be read). ``advice`` ends the
    message of a :class:`NotATetherDatabase`: what the user of the command at hand should do.
    """
    if os.path.getsize(path) == 0:
        raise _foreign(path, EMPTY_FILE, advice)
    try:
        application_id = int(db.execute("PRAGMA application_id").fetchone()[0])  # type: ignore[index]
        version = int(db.execute("PRAGMA user_version").fetchone()[0])  # type: ignore[index]
        tables = _tables(db)
    except apsw.NotADBError as exc:
        raise _foreign(path, f"it is not a SQLite database ({exc})", advice) from exc
    except apsw.CorruptError as exc:
        raise DatabaseDamaged(damaged_message(path, [str(exc)])) from exc
    schema_version = len(migrations)
    if application_id not in (0, APPLICATION_ID):
        raise _foreign(path, _another_application(application_id), advice)
    if version > schema_version and (
        application_id == APPLICATION_ID or tables >= _tables_at(migrations, schema_version)
    ):
        raise _newer(path, version, schema_version)
    if application_id == 0 and (version > schema_version or tables != _tables_at(migrations, version)):
        listed = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        raise _foreign(
            path, f"it is a SQLite database of another application (tables {listed}; user_version {version})", advice
        )
    return version, application_id == APPLICATION_ID


def quick_check(db: apsw.Connection, path: str, *, budget_s: float = QUICK_CHECK_BUDGET_S) -> bool:
    """Run ``PRAGMA quick_check`` for at most ``budget_s``: True if it checked the whole file, False if it ran out
    of time first. Raises :class:`DatabaseDamaged` naming the problems it found."""
    deadline = time.monotonic() + budget_s
    db.set_progress_handler(lambda: time.monotonic() > deadline, _PROGRESS_STEPS, id=quick_check)
    try:
        problems = [str(row[0]) for row in db.execute("PRAGMA quick_check")]
    except apsw.InterruptError:
        return False
    except (apsw.CorruptError, apsw.NotADBError) as exc:
        raise DatabaseDamaged(damaged_message(path, [str(exc)])) from exc
    finally:
        db.set_progress_handler(None, id=quick_check)
    if problems != ["ok"]:
        raise DatabaseDamaged(damaged_message(path, problems))
    return True


def full_check(path: str, migrations: tuple[str, ...]) -> dict[str, Any]:
    """``tether check``: identify the database at ``path`` and run ``PRAGMA integrity_check`` on it, read-only
    (nothing is created or written; it runs beside a live owner). Returns ``{"db", "ok", "problems",
    "schema_version", "application_id", "pages"}``. Raises :class:`NotATetherDatabase` for another application's
    file and :class:`StorageError` for a file that cannot be opened."""
    if not os.path.exists(path):
        raise StorageError(f"cannot check {path}: it does not exist")
    try:
        db = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    except apsw.Error as exc:
        raise StorageError(f"cannot open {path} to check it: {exc}") from exc
    try:
        try:
            version, _marked = identify(db, path, migrations, advice=CHECK_ADVICE)
        except (SchemaTooNew, DatabaseDamaged):
            version = -1
            with contextlib.suppress(apsw.Error):
                version = int(db.execute("PRAGMA user_version").fetchone()[0])  # type: ignore[index]
        try:
            problems = [str(row[0]) for row in db.execute("PRAGMA integrity_check")]
            pages = int(db.execute("PRAGMA page_count").fetchone()[0])  # type: ignore[index]
            application_id = int(db.execute("PRAGMA application_id").fetchone()[0])  # type: ignore[index]
        except (apsw.CorruptError, apsw.NotADBError) as exc:
            problems, pages, application_id = [str(exc)], 0, 0
    finally:
        db.close()
    ok = problems == ["ok"]
    return {
        "db": path,
        "ok": ok,
        "problems": [] if ok else problems,
        "schema_version": version,
        "application_id": application_id,
        "pages": pages,
    }
