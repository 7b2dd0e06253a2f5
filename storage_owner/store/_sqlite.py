"""The SQLite store, through APSW: :class:`SqliteStore`, one open database, and what reads or checkpoints a file beside
it. This module holds the connection (opening, its pragmas and migrations, transactions and savepoints, the WAL hook),
the WAL checkpointer and :func:`check_database`; the SQL of the core's ports lives in one module per room, each a
mixin of :class:`SqliteStore` (every SQL string in the method that runs it, or in a named constant or function beside
it):

- ``_log``: ``LogSql``, the commit log and meta (``LogStore``, but for its savepoints, which are here);
- ``_conversations``: ``ConversationsSql``, conversations, entries, documents and submissions (``ConversationStore``);
- ``_runs``: ``RunsSql``, runs (``RunStore``);
- ``_operations``: ``OperationsSql``, the operation journal and interactions, with the operation records kept as
  last written (``OperationStore``);
- ``_tasks``: ``TasksSql``, tasks, their columns and generated row codecs (``TaskStore``);
- ``_usage``: ``UsageSql``, usage totals, prices and budgets (``UsageStore``);
- ``_partials``: ``PartialsSql``, partial output (``PartialStore``).

apsw errors are mapped at this boundary, in two ways:

- a uniqueness violation of an insert becomes :class:`~storage_owner.core.StoreConflict` right where the insert
  runs (the core refuses the request; the transaction stays usable);
- any other apsw error becomes :class:`~protocol.StorageError` (the owner fails closed) through
  :func:`storage_errors`. The methods the core calls inside a batch let apsw errors through, and the shell wraps
  the whole batch (and each catch-up turn) in ``storage_errors``; the methods the shell calls on their own (opening,
  closing, recording the owner, checkpoints) map their own. A checkpoint SQLite did not run is a
  ``StorageError`` too, though SQLite reports it with a result, not an error.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from functools import partial
from typing import Any, Final, Literal

import apsw

from protocol import StorageError

from ._conversations import ConversationsSql
from ._identity import APPLICATION_ID, FILE_MODE, create_database, identify, quick_check
from ._log import LogSql
from ._operations import OperationsSql
from ._partials import PartialsSql
from ._runs import RunsSql
from ._schema import MIGRATIONS, SCHEMA_VERSION
from ._tasks import TasksSql
from ._usage import UsageSql

Sync = Literal["normal", "full"]

BUSY_TIMEOUT_MS: Final = 5_000
CHECKPOINT_START_PAGES: Final = 2_000
"""With background checkpoints, the WAL size (in pages) past which the shell starts one."""
CHECKPOINT_PASS_PAGES: Final = 64
"""With background checkpoints, the frames committed during a pass of the checkpoint thread that make the next
pass worth its two fsyncs: a lone writer's commits do not each bring a pass, an owner's batches nearly do (so the
tail a hold copies stays short)."""
CHECKPOINT_HOLD_PAGES: Final = 5_000
"""With background checkpoints, the WAL size (in pages) past which the shell holds its writes for the moment the
checkpoint thread copies the WAL's tail, so that its next transaction starts the WAL over (the last resort of a
writer that is never idle; see :meth:`SqliteStore.use_background_checkpoints`)."""
JOURNAL_SIZE_LIMIT_BYTES: Final = 64 << 20
"""A WAL file larger than this is truncated back to it after a checkpoint resets the log."""


@contextlib.contextmanager
def storage_errors(action: str) -> Iterator[None]:
    """Map any apsw error raised inside to :class:`StorageError`, naming ``action``."""
    try:
        yield
    except apsw.Error as exc:
        raise StorageError(f"storage failed while {action}: {type(exc).__name__}: {exc}") from exc


def read_schema_version(path: str) -> int | None:
    """The schema version of the database at ``path``, opened read-only; ``None`` if it cannot be read."""
    try:
        db = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    except apsw.Error:
        return None
    try:
        return int(db.execute("PRAGMA user_version").fetchone()[0])  # type: ignore[index]
    except apsw.Error:
        return None
    finally:
        db.close()


def _prepare(db: apsw.Connection, *, sync: Sync, version: int = 0, marked: bool = False) -> None:
    """Switch ``db`` to WAL, set its durability, and migrate it from ``version``, marking it as Tether's in the first
    transaction that writes (the first migration, or the mark alone)."""
    db.setbusytimeout(BUSY_TIMEOUT_MS)
    db.execute("PRAGMA journal_mode=WAL").fetchall()
    db.execute(f"PRAGMA synchronous={'FULL' if sync == 'full' else 'NORMAL'}")
    db.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT_BYTES}").fetchall()
    if not marked and version == SCHEMA_VERSION:
        with db:
            db.execute(f"PRAGMA application_id={APPLICATION_ID}")
    for number in range(version, SCHEMA_VERSION):
        with db:  # one transaction per migration, user_version included
            db.execute(MIGRATIONS[number])
            db.execute(f"PRAGMA user_version={number + 1}")
            if not marked:
                db.execute(f"PRAGMA application_id={APPLICATION_ID}")
                marked = True


class SqliteStore(LogSql, ConversationsSql, RunsSql, OperationsSql, TasksSql, UsageSql, PartialsSql):
    """One open database. Not thread-safe: the owner uses it from one thread only.

    It is its rooms' SQL by inheritance (one mixin per port, sharing :attr:`_db`) rather than an object holding one
    object per room, because the core calls it on its hot path (``insert_task``, ``update_task``, ``log_commit``): a
    mixin's method is found and called as one defined here would be, where delegating to a room's object would add
    an attribute lookup and a call to each. The core's ports keep each room to its own methods. Everything a rollback
    must drop (the kept operation records) is reset here, in :meth:`rollback` and :meth:`rollback_savepoint`.
    """

    def __init__(self, db: apsw.Connection, path: str) -> None:
        self._db = db
        self.path = path
        self.wal_pages = 0
        """Pages in the WAL after the last commit (tracked once background checkpoints are on)."""
        self.wal_commits = 0
        """Commits that wrote to the WAL (counted once background checkpoints are on)."""
        self.wal_restarts = 0
        """Commits that started the WAL over from its beginning (counted once background checkpoints are on), seen
        as a WAL that holds fewer pages than before: one that wrote more frames than the WAL held is not counted."""
        self.created = False
        """:meth:`open` created the database (there was no file)."""
        self.checked_fully = False
        """:meth:`open`'s start check read the whole file within its time budget."""
        self._operations = {}  # the operation records kept as last written (OperationsSql)
        self._operation_bytes = 0

    # ------------------------------------------------------------------------------------------- lifecycle

    @classmethod
    def open(
        cls, path: str, *, sync: Sync = "normal", file_mode: int = FILE_MODE, start_check_s: float | None = None
    ) -> SqliteStore:
        """Open (creating if needed) and migrate the database. The caller must already hold ownership.

        A missing file is created complete with ``file_mode`` (see :func:`create_database`; :attr:`created` says
        so). An existing one is identified and, with ``start_check_s`` above 0, checked (``PRAGMA quick_check`` for
        at most that long; :attr:`checked_fully` says whether it finished) before anything is written: raises
        :class:`NotATetherDatabase`, :class:`SchemaTooNew` or :class:`DatabaseDamaged` with the file untouched.
        """
        created = False
        if not os.path.exists(path):
            with storage_errors(f"creating {path}"):
                create_database(path, file_mode=file_mode, prepare=partial(_prepare, sync=sync))
            created = True
        with storage_errors(f"opening {path}"):
            db = apsw.Connection(path)
            try:
                # Before the first read: the owner it takes over from may have died mid-write, and a reader such as
                # tether status may hold the lock a moment while the WAL is recovered.
                db.setbusytimeout(BUSY_TIMEOUT_MS)
                version, marked = identify(db, path, MIGRATIONS)
                checked_fully = (
                    not created and bool(start_check_s) and quick_check(db, path, budget_s=start_check_s or 0.0)
                )
                _prepare(db, sync=sync, version=version, marked=marked)
            except BaseException:
                db.close()
                raise
        store = cls(db, path)
        store.created = created
        store.checked_fully = checked_fully
        return store

    def close(self) -> None:
        with storage_errors("closing the database"):
            self._db.close()

    def use_background_checkpoints(self) -> Checkpointer:
        """Stop checkpointing inside COMMIT; the caller runs the returned checkpointer on another thread whenever
        :attr:`wal_pages` passes :data:`CHECKPOINT_START_PAGES`, and until :attr:`wal_restarts` counts one more.

        SQLite's automatic checkpoint copies the WAL into the database inside whichever COMMIT crosses the
        threshold, which stalls the commit loop; a passive checkpoint on its own connection runs beside it. But
        SQLite starts the WAL over only in a transaction that began while every frame was copied (wal.c: a reader
        that begins then takes read lock 0, and its first write restarts the log): under sustained writes a
        checkpoint that runs while this connection commits never gets there. So the checkpointer copies again and
        again, each pass what was committed during the one before, until one ends between two of this
        connection's transactions; past :data:`CHECKPOINT_HOLD_PAGES` the caller makes that moment by holding its
        next transaction while one last pass runs. Nothing here checkpoints on this connection.
        """
        self._db.set_wal_hook(self._on_wal)  # replaces (and so disables) the automatic checkpoint
        return Checkpointer(self.path)

    def _on_wal(self, _db: apsw.Connection, _name: str, pages: int) -> int:
        if pages < self.wal_pages:
            self.wal_restarts += 1
        self.wal_pages = pages
        self.wal_commits += 1
        return apsw.SQLITE_OK

    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])  # type: ignore[index]

    def record_owner(self, *, pid: int, host: str, started_at_ms: int, instance: str, engine: str) -> None:
        with storage_errors("recording the owner"), self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO owner (singleton, pid, host, started_at_ms, instance, engine) "
                "VALUES (1, ?, ?, ?, ?, ?)",
                (pid, host, started_at_ms, instance, engine),
            )

    def integrity_check(self) -> str:
        rows = self._db.execute("PRAGMA integrity_check").fetchall()
        return "; ".join(str(row[0]) for row in rows)

    # -------------------------------------------------------------------------------------- transactions

    def begin(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        self._db.execute("COMMIT")

    def rollback(self) -> None:
        self._forget_operations()
        self._db.execute("ROLLBACK")

    @property
    def in_transaction(self) -> bool:
        return not self._db.getautocommit()

    def savepoint(self) -> None:
        self._db.execute("SAVEPOINT request")

    def release_savepoint(self) -> None:
        self._db.execute("RELEASE request")

    def rollback_savepoint(self) -> None:
        self._forget_operations()
        self._db.execute("ROLLBACK TO request")
        self._db.execute("RELEASE request")


def _passive_checkpoint(db: apsw.Connection, action: str) -> tuple[int, int] | None:
    """Run a passive checkpoint on ``db``: (WAL frames, frames copied), or ``None`` if SQLite answered SQLITE_BUSY at
    once: another connection was checkpointing, or (seen under sustained writes with no other checkpointer) the
    pass met the writer at a moment a passive checkpoint does not wait out. Nothing is wrong; the next pass copies.

    Raises :class:`StorageError` for any other failure, and if SQLite did not run it: it answers (-1, -1) instead
    of failing when the connection is not in WAL mode."""
    with storage_errors(action):
        try:
            frames, copied = db.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE)
        except apsw.BusyError:
            return None
    if frames < 0 or copied < 0:
        raise StorageError(f"storage failed while {action}: SQLite did not run the checkpoint")
    return frames, copied


class Checkpointer:
    """A connection of its own that copies the WAL back into the database. Use from one thread at a time."""

    def __init__(self, path: str) -> None:
        with storage_errors(f"opening {path} for checkpoints"):
            self._db = apsw.Connection(path)
            try:
                self._db.setbusytimeout(BUSY_TIMEOUT_MS)
                # A connection that has read nothing does not know the database is in WAL mode, and SQLite answers
                # its checkpoints with (-1, -1) without copying anything: read the journal mode first.
                mode = self._db.execute("PRAGMA journal_mode").fetchone()[0]  # type: ignore[index]
            except BaseException:
                self._db.close()
                raise
        if mode != "wal":
            self._db.close()
            raise StorageError(f"cannot checkpoint {path}: its journal mode is {mode!r}, not 'wal'")

    def checkpoint(self) -> tuple[int, int] | None:
        """A passive checkpoint: never blocks the writer. See :func:`_passive_checkpoint`."""
        return _passive_checkpoint(self._db, "checkpointing the WAL")

    def close(self) -> None:
        with storage_errors("closing the checkpoint connection"):
            self._db.close()


def check_database(path: str) -> dict[str, Any]:
    """Read-only facts about a database for diagnostics and tests: schema version, integrity, counts.

    Safe while an owner holds the database (WAL readers do not block the writer).
    """
    db = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        with storage_errors(f"checking {path}"):
            integrity = "; ".join(str(row[0]) for row in db.execute("PRAGMA integrity_check"))
            version = int(db.execute("PRAGMA user_version").fetchone()[0])  # type: ignore[index]
            head = db.execute("SELECT MAX(seq) FROM commits").fetchone()[0] if version else None  # type: ignore[index]
            return {"schema_version": version, "integrity": integrity, "head_seq": head or 0}
    finally:
        db.close()
