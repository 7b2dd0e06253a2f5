"""Tether's client side: connect to an owner to submit, read and watch work.

``actors`` never imports ``storage_owner``; both speak only through ``protocol``.
"""

from protocol import (
    Change,
    Conflict,
    ConnectionLost,
    ConversationRecord,
    DocumentRecord,
    Duplicate,
    EntryRecord,
    ErrorCode,
    HandshakeRefused,
    InvalidRequest,
    NotAllowed,
    NotFound,
    OwnerUnavailable,
    ProtocolError,
    RequestFailed,
    StorageError,
    SubmissionRecord,
    TetherError,
    new_id,
)

from ._client import Client, EntryPage, Transaction, WatchStream, connect

__all__ = [
    "Change",
    "Client",
    "Conflict",
    "ConnectionLost",
    "ConversationRecord",
    "DocumentRecord",
    "Duplicate",
    "EntryPage",
    "EntryRecord",
    "ErrorCode",
    "HandshakeRefused",
    "InvalidRequest",
    "NotAllowed",
    "NotFound",
    "OwnerUnavailable",
    "ProtocolError",
    "RequestFailed",
    "StorageError",
    "SubmissionRecord",
    "TetherError",
    "Transaction",
    "WatchStream",
    "connect",
    "new_id",
]
