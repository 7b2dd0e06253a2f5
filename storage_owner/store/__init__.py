"""The SQLite store (APSW), its schema and migrations, and database ownership; the memory store (sans-IO)."""

from ._identity import (
    APPLICATION_ID,
    FILE_MODE,
    GROUP_READABLE_FILE_MODE,
    QUICK_CHECK_BUDGET_S,
    damaged_message,
    full_check,
    refuse_foreign,
)
from ._memory import MemoryStore
from ._ownership import LOCK_SUFFIX, Ownership, OwnershipWait, is_owned, lock_is_held, lock_path, open_lock_file
from ._reads import StoredTasks, read_live_tasks
from ._schema import MIGRATIONS, SCHEMA_VERSION
from ._sqlite import (
    CHECKPOINT_HOLD_PAGES,
    CHECKPOINT_PASS_PAGES,
    CHECKPOINT_START_PAGES,
    Checkpointer,
    SqliteStore,
    Sync,
    check_database,
    read_schema_version,
    storage_errors,
)

__all__ = [
    "APPLICATION_ID",
    "CHECKPOINT_HOLD_PAGES",
    "CHECKPOINT_PASS_PAGES",
    "CHECKPOINT_START_PAGES",
    "FILE_MODE",
    "GROUP_READABLE_FILE_MODE",
    "LOCK_SUFFIX",
    "MIGRATIONS",
    "QUICK_CHECK_BUDGET_S",
    "SCHEMA_VERSION",
    "Checkpointer",
    "MemoryStore",
    "Ownership",
    "OwnershipWait",
    "SqliteStore",
    "StoredTasks",
    "Sync",
    "check_database",
    "damaged_message",
    "full_check",
    "is_owned",
    "lock_is_held",
    "lock_path",
    "open_lock_file",
    "read_live_tasks",
    "read_schema_version",
    "refuse_foreign",
    "storage_errors",
]
