"""The SQLite store (APSW), its schema and migrations, and database ownership."""

from ._ownership import LOCK_SUFFIX, Ownership, is_owned, lock_is_held, lock_path
from ._schema import MIGRATIONS, SCHEMA_VERSION
from ._sqlite import (
    CHECKPOINT_START_PAGES,
    Checkpointer,
    SqliteStore,
    Sync,
    check_database,
    read_schema_version,
    storage_errors,
)

__all__ = [
    "CHECKPOINT_START_PAGES",
    "LOCK_SUFFIX",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Checkpointer",
    "Ownership",
    "SqliteStore",
    "Sync",
    "check_database",
    "is_owned",
    "lock_is_held",
    "lock_path",
    "read_schema_version",
    "storage_errors",
]
