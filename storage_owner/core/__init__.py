"""The owner's durable logic, sans-IO: no trio, no sockets, no apsw (a unit test enforces it)."""

from ._owner import (
    CATCH_UP_PAGE,
    MAX_READ_LIMIT,
    MAX_WRITES_PER_COMMIT,
    BatchEffects,
    Output,
    OwnerCore,
    PeerId,
    same_json,
)
from ._ports import LoggedCommit, Store, StoreConflict

__all__ = [
    "CATCH_UP_PAGE",
    "MAX_READ_LIMIT",
    "MAX_WRITES_PER_COMMIT",
    "BatchEffects",
    "LoggedCommit",
    "Output",
    "OwnerCore",
    "PeerId",
    "Store",
    "StoreConflict",
    "same_json",
]
