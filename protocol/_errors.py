"""Stable error codes and the exception tree shared by the owner and its peers.

Errors cross the wire as an :class:`ErrorCode` plus a message, never as exception types. The tree::

    TetherError
    ├── ProtocolError          a frame could not be decoded or broke the protocol
    ├── HandshakeRefused       the owner refused the Hello (token, version, role)
    ├── ConnectionLost         the connection to the owner ended; in-flight outcomes are unknown
    ├── OwnerUnavailable       no owner could be reached (not running, runtime files missing)
    ├── RequestFailed          the owner answered a request with an error code
    │   ├── NotFound
    │   ├── Duplicate
    │   ├── Conflict
    │   ├── InvalidRequest
    │   ├── NotAllowed
    │   ├── Overloaded         too much output unread: not handled, retried with back-off
    │   └── StaleLease
    │       └── BudgetExceeded
    ├── StorageError           the database failed; the owner fails closed
    ├── SchemaTooNew           the database was written by a newer engine
    ├── NotATetherDatabase     the file is not a Tether database (another application's, or not SQLite at all)
    ├── DatabaseDamaged        the database failed its integrity check
    ├── OwnerAlreadyRunning    another live owner holds the database
    └── UsageError             the API was called in a way it cannot serve (also a ValueError)
        └── PhaseEnded         (actors) a phase committed again after ending its run
"""

from __future__ import annotations

import enum
from typing import NoReturn


class ErrorCode(enum.StrEnum):
    """Codes carried by ``Error`` and ``Refused`` frames. Values never change once published."""

    BAD_FRAME = "bad_frame"
    """The frame could not be decoded: not msgpack, unknown type, missing, extra or mistyped field."""
    FRAME_TOO_LARGE = "frame_too_large"
    """The message exceeded ``MAX_MESSAGE_BYTES`` (or a batch exceeded ``MAX_BATCH_FRAMES``)."""
    PROTOCOL_VIOLATION = "protocol_violation"
    """A well-formed frame arrived where it is not allowed (a reply sent to the owner, a second Hello)."""
    UNSUPPORTED_VERSION = "unsupported_version"
    BAD_TOKEN = "bad_token"
    ROLE_NOT_ALLOWED = "role_not_allowed"
    NOT_FOUND = "not_found"
    DUPLICATE = "duplicate"
    """A record with this id already exists; nothing was written."""
    CONFLICT = "conflict"
    """The request contradicts stored state (a stale expected version, a reused request id)."""
    INVALID = "invalid"
    """A field has a value the owner does not accept (bad id, negative limit, non-JSON payload)."""
    READ_ONLY = "read_only"
    """A reader connection sent a write."""
    NOT_ALLOWED = "not_allowed"
    """The request is well formed but not possible in this owner's configuration."""
    STALE_LEASE = "stale_lease"
    """A commit under a lease the owner has since given to someone else (or ended); nothing was written."""
    STORAGE_FAILED = "storage_failed"
    """The database failed; the owner is failing closed and will exit."""
    BUDGET_EXCEEDED = "budget_exceeded"
    """A run's model request would start past its conversation's or task tree's budget: nothing of the commit was
    written, and the owner ended the run's task ``failed`` (reason ``budget_exceeded``), which ends the lease."""
    SHUTTING_DOWN = "shutting_down"
    """The owner is stopping and did not take the request."""
    OVERLOADED = "overloaded"
    """The connection (or the owner as a whole) has more unread output than its budget: the request was not handled
    and nothing changed. Retryable: the client retries with back-off once its reader has drained."""
    OWNER_UNAVAILABLE = "owner_unavailable"
    """Never sent by an owner: no owner could be reached (none runs, or it did not answer in time), so the request
    was not handled, or its outcome is unknown. The client raises :class:`OwnerUnavailable` (or
    :class:`ConnectionLost`) without a reply; ``tether ui`` answers its page's reads and actions with this code."""


class TetherError(Exception):
    """Base of every error Tether raises on purpose."""


class ProtocolError(TetherError):
    """A frame could not be decoded or broke the protocol."""

    def __init__(self, message: str, *, code: ErrorCode = ErrorCode.BAD_FRAME) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self) -> tuple[object, ...]:
        return _rebuild, (type(self), (str(self),), {"code": self.code})


class HandshakeRefused(TetherError):
    """The owner refused our ``Hello``; ``code`` says why."""

    def __init__(self, code: str, message: str, supported_versions: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.supported_versions = supported_versions

    def __reduce__(self) -> tuple[object, ...]:
        return _rebuild, (type(self), (self.code, str(self), self.supported_versions), {})


class ConnectionLost(TetherError):
    """The connection to the owner ended before the reply arrived.

    A write that was in flight may or may not have been committed; read to find out, or retry with an id that
    makes the retry safe (the owner refuses a duplicate entry id and deduplicates submissions by request id).
    """


class OwnerUnavailable(TetherError):
    """No owner could be reached for this database or URL."""


class RequestFailed(TetherError):
    """The owner answered a request with an error. ``code`` is a stable :class:`ErrorCode` value."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self) -> tuple[object, ...]:
        return _rebuild, (type(self), (self.code, str(self)), {})


class NotFound(RequestFailed):
    """The conversation, document or submission named by the request does not exist."""


class Duplicate(RequestFailed):
    """A record with the request's id already exists; nothing was written."""


class Conflict(RequestFailed):
    """The request contradicts stored state; nothing was written."""


class InvalidRequest(RequestFailed):
    """The request carried a value the owner does not accept; nothing was written."""


class NotAllowed(RequestFailed):
    """The request is not allowed for this connection or owner (a write from a reader, say)."""


class StaleLease(RequestFailed):
    """The commit's lease is no longer valid: the task was given to another worker, aborted or ended."""


class BudgetExceeded(StaleLease):
    """The run's budget is spent: the owner refused the model request and ended the run ``failed``
    (``budget_exceeded``); the phase's lease ended with it, as a stale lease's does."""


class Overloaded(RequestFailed):
    """The owner did not handle the request: this connection, or every peer together, has too much output unread
    (``overloaded``). Nothing changed; the client retries it with back-off before raising this."""


class StorageError(TetherError):
    """The database failed. The owner fails closed: it exits and recovers from the committed state."""


class SchemaTooNew(TetherError):
    """The database was written by a newer engine; it is left untouched."""


class NotATetherDatabase(TetherError):
    """The file is not a Tether database: another application's SQLite database, an empty file, or not SQLite at all.
    It is left untouched."""


class DatabaseDamaged(TetherError):
    """The database failed its integrity check; it is left untouched (restore it from a backup)."""


class OwnerAlreadyRunning(TetherError):
    """Another live owner holds the database."""


class UsageError(TetherError, ValueError):
    """The API was called in a way it cannot serve (a bad argument, a call out of order); nothing was sent.

    Also a ``ValueError``, which is what these errors were before they joined the tree."""


_REQUEST_ERRORS: dict[str, type[RequestFailed]] = {
    ErrorCode.NOT_FOUND: NotFound,
    ErrorCode.DUPLICATE: Duplicate,
    ErrorCode.CONFLICT: Conflict,
    ErrorCode.INVALID: InvalidRequest,
    ErrorCode.BAD_FRAME: InvalidRequest,
    ErrorCode.FRAME_TOO_LARGE: InvalidRequest,
    ErrorCode.READ_ONLY: NotAllowed,
    ErrorCode.NOT_ALLOWED: NotAllowed,
    ErrorCode.STALE_LEASE: StaleLease,
    ErrorCode.BUDGET_EXCEEDED: BudgetExceeded,
    ErrorCode.OVERLOADED: Overloaded,
}


def error_for_code(code: str, message: str) -> TetherError:
    """Build the exception a client raises for an ``Error`` reply."""
    if code == ErrorCode.STORAGE_FAILED:
        return StorageError(message)
    if code == ErrorCode.SHUTTING_DOWN:
        return ConnectionLost(message)
    if code == ErrorCode.OWNER_UNAVAILABLE:
        return OwnerUnavailable(message)
    return _REQUEST_ERRORS.get(code, RequestFailed)(code, message)


def _rebuild(cls: type[TetherError], args: tuple[object, ...], kwargs: dict[str, object]) -> TetherError:
    """Errors with more than a message copy and pickle through this (``copy.copy`` gives a fresh instance)."""
    return cls(*args, **kwargs)


def collapse_group(exc: BaseException) -> BaseException:
    """At a public boundary, an exception group holding one exception becomes that exception (raise it with
    :func:`raise_collapsed`, which keeps its cause)."""
    leaves: list[BaseException] = []

    def walk(current: BaseException) -> None:
        if isinstance(current, BaseExceptionGroup):
            for inner in current.exceptions:
                walk(inner)
        else:
            leaves.append(current)

    walk(exc)
    return leaves[0] if len(leaves) == 1 else exc


def raise_collapsed(group: BaseExceptionGroup[BaseException]) -> NoReturn:
    """Raise ``group`` as :func:`collapse_group` collapses it, from the ``except`` clause that caught it.

    A single leaf is raised as itself with its own ``__cause__``, ``__context__`` and traceback: an
    :class:`OwnerUnavailable` raised ``from`` an ``OSError`` or ``SSLError`` arrives with it. (``raise leaf from
    None`` would drop the cause; a plain ``raise leaf`` there would make the group its context.) Several leaves
    are raised as the group, unchanged, so a ``Cancelled`` among them is never swallowed; a lone ``Cancelled`` is
    raised as itself, for its cancel scope to catch.
    """
    leaf = collapse_group(group)
    if leaf is group:
        raise group
    context = leaf.__context__
    try:
        raise leaf
    finally:
        leaf.__context__ = context  # what raising it inside the ``except`` replaced with the group
        del leaf, context  # the frame would hold the exception that holds the frame
