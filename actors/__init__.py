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
    PeerInfo,
    ProtocolError,
    RequestFailed,
    StaleLease,
    StorageError,
    SubmissionRecord,
    TaskNode,
    TaskOutcome,
    TaskRecord,
    TetherError,
    UsageError,
    new_id,
)

from ._app import App, AppLoadError, TaskDefinition, load_app
from ._client import Client, EntryPage, TaskGraph, Transaction, connect
from ._phase import Phase, PhaseEnded, PhaseTransaction
from ._watch import WatchStream
from ._worker import serve

__all__ = [
    "App",
    "AppLoadError",
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
    "PeerInfo",
    "Phase",
    "PhaseEnded",
    "PhaseTransaction",
    "ProtocolError",
    "RequestFailed",
    "StaleLease",
    "StorageError",
    "SubmissionRecord",
    "TaskDefinition",
    "TaskGraph",
    "TaskNode",
    "TaskOutcome",
    "TaskRecord",
    "TetherError",
    "Transaction",
    "UsageError",
    "WatchStream",
    "connect",
    "load_app",
    "new_id",
    "serve",
]
