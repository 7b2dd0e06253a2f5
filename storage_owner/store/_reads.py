"""Reading a database without its owner: what the command line shows when no owner answers (``tether tasks``).

Every read here opens the file read-only (nothing is created, migrated or written, so it runs beside a live or a
hung owner), reads through :class:`SqliteStore`'s own SQL, and maps every ``apsw`` error to a
:class:`~protocol.StorageError` that says the file was left untouched: callers never see ``apsw``.
"""

from __future__ import annotations

from typing import Final

import apsw
import attrs

from protocol import SchemaTooNew, StorageError, TaskRecord

from ._schema import SCHEMA_VERSION
from ._sqlite import SqliteStore

TASKS_SINCE_VERSION: Final = 2
"""The schema version that added the tasks table: an older database has no task to show."""


@attrs.frozen(kw_only=True)
class StoredTasks:
    """The live tasks of a database as last committed (:func:`read_live_tasks`)."""

    seq: int
    """The head of the commit log: the tasks are as of this commit."""
    tasks: tuple[TaskRecord, ...]
    """Every task that is not terminal, oldest first."""


def read_live_tasks(path: str) -> StoredTasks:
    """The live tasks stored in the database at ``path``, read-only (no owner is asked: nothing is leased, and
    blocked reasons, which only a running owner knows, are not stored).

    Raises :class:`SchemaTooNew` for a database a newer engine wrote, and :class:`StorageError` for a file that is not
    a Tether database; neither changes the file.
    """
    try:
        connection = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
        try:
            version = int(connection.execute("PRAGMA user_version").fetchone()[0])  # type: ignore[index]
            if version > SCHEMA_VERSION:
                raise SchemaTooNew(
                    f"database {path} has schema version {version}, newer than this engine's {SCHEMA_VERSION}; "
                    "it was left untouched. Use the newer tether that wrote it."
                )
            if version < TASKS_SINCE_VERSION:
                return StoredTasks(seq=0, tasks=())
            connection.execute("BEGIN")  # one snapshot: the tasks as of the head read with them
            store = SqliteStore(connection, path)
            return StoredTasks(seq=store.head_seq(), tasks=tuple(store.live_tasks()))
        finally:
            connection.close()
    except apsw.Error as exc:
        raise StorageError(
            f"cannot read the tasks of {path}: it is not a Tether database ({type(exc).__name__}: {exc}); "
            "it was left untouched. Check the --db path."
        ) from exc
