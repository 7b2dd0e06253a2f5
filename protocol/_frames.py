"""Every frame of the wire protocol, as frozen attrs classes.

A frame travels as a msgpack map whose ``type`` key holds the class's ``TYPE`` tag, never its Python name.
Fields are msgpack-native: ``int``, ``str``, ``bool``, ``None``, tuples, nested frozen classes, and opaque
JSON-like application values (:data:`JsonValue`). Times are integer milliseconds on the owner's clock.

Requests carry a ``call_id`` chosen by the sender; the owner's reply carries the same ``call_id``. Events
(``Change``, ``Goodbye``) are pushed by the owner without one.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, NewType, TypeAlias

import attrs

JsonValue = NewType("JsonValue", object)
"""An application value: ``None``, ``bool``, ``int``, ``float``, ``str``, lists and str-keyed maps of them."""

Role: TypeAlias = Literal["client", "worker", "reader"]
Order: TypeAlias = Literal["asc", "desc"]


# --------------------------------------------------------------------------------------------------- records


@attrs.frozen(kw_only=True)
class ConversationRecord:
    """A conversation: a transcript of immutable entries."""

    RECORD: ClassVar[str] = "conversation"
    conversation_id: str
    created_at_ms: int
    seq: int
    """The commit that created it."""
    entry_count: int


@attrs.frozen(kw_only=True)
class EntryRecord:
    """One immutable transcript entry. ``position`` counts from 0 within its conversation."""

    RECORD: ClassVar[str] = "entry"
    entry_id: str
    conversation_id: str
    position: int
    seq: int
    kind: str
    data: JsonValue
    created_at_ms: int


@attrs.frozen(kw_only=True)
class DocumentRecord:
    """A named JSON-like value, per conversation or global (``conversation_id`` is ``None``), versioned from 1."""

    RECORD: ClassVar[str] = "document"
    conversation_id: str | None
    name: str
    version: int
    value: JsonValue
    seq: int
    updated_at_ms: int


@attrs.frozen(kw_only=True)
class SubmissionRecord:
    """Something handed to a conversation, deduplicated by ``(conversation_id, request_id)``."""

    RECORD: ClassVar[str] = "submission"
    submission_id: str
    conversation_id: str
    request_id: str
    kind: str
    payload: JsonValue
    status: str
    seq: int
    created_at_ms: int


Record: TypeAlias = ConversationRecord | EntryRecord | DocumentRecord | SubmissionRecord
"""A record a commit created or changed; tagged by ``record`` on the wire."""


@attrs.frozen(kw_only=True)
class Capability:
    """Something a worker can run: a task kind, a tool or an agent, at one version."""

    kind: Literal["task", "tool", "agent"]
    name: str
    version: int


@attrs.frozen(kw_only=True)
class PeerInfo:
    """An attached connection, as the owner sees it. Workers fill in the rest with ``Announce``."""

    peer_id: int
    role: str
    peer_name: str
    attached_at_ms: int
    announced: bool
    pid: int | None
    host: str | None
    app: str | None
    capabilities: tuple[Capability, ...]


# ---------------------------------------------------------------------------------------------------- writes


@attrs.frozen(kw_only=True)
class CreateConversation:
    OP: ClassVar[str] = "create_conversation"
    conversation_id: str


@attrs.frozen(kw_only=True)
class AppendEntry:
    OP: ClassVar[str] = "append_entry"
    conversation_id: str
    entry_id: str
    kind: str
    data: JsonValue


@attrs.frozen(kw_only=True)
class PutDocument:
    """Write a document. ``expected_version`` (0 for "must not exist yet") makes the write conditional."""

    OP: ClassVar[str] = "put_document"
    conversation_id: str | None
    name: str
    value: JsonValue
    expected_version: int | None = None


Write: TypeAlias = CreateConversation | AppendEntry | PutDocument
"""One write of a ``Commit``; tagged by ``op`` on the wire."""

# ------------------------------------------------------------------------------------------------ handshake


@attrs.frozen(kw_only=True)
class Hello:
    TYPE: ClassVar[str] = "hello"
    protocol_version: int
    token: str
    role: str
    """One of :data:`Role`; checked by the owner so an unknown role gets a ``role_not_allowed`` refusal."""
    peer_name: str = ""


@attrs.frozen(kw_only=True)
class Welcome:
    TYPE: ClassVar[str] = "welcome"
    protocol_version: int
    owner_instance: str
    """Changes every time an owner starts, so a peer can tell a restart from a reconnect."""
    head_seq: int
    clock: Literal["wall", "manual"]
    max_message_bytes: int
    heartbeat_ms: int
    """Send something (a ``ping`` will do) at least this often: the owner drops a peer silent for 4 times as long."""


@attrs.frozen(kw_only=True)
class Refused:
    TYPE: ClassVar[str] = "refused"
    code: str
    message: str
    supported_versions: tuple[int, ...]


# ------------------------------------------------------------------------------------------------- requests


@attrs.frozen(kw_only=True)
class Commit:
    """Apply ``writes`` atomically as one commit with one ``seq``."""

    TYPE: ClassVar[str] = "commit"
    call_id: int
    writes: tuple[Write, ...]


@attrs.frozen(kw_only=True)
class Submit:
    """Admit a submission; a repeated ``request_id`` returns the original instead."""

    TYPE: ClassVar[str] = "submit"
    call_id: int
    conversation_id: str
    submission_id: str
    request_id: str
    kind: str
    payload: JsonValue


@attrs.frozen(kw_only=True)
class ReadConversation:
    TYPE: ClassVar[str] = "read_conversation"
    call_id: int
    conversation_id: str


@attrs.frozen(kw_only=True)
class ReadEntries:
    """Read a page of entries. ``cursor`` is exclusive: positions after it (``asc``) or before it (``desc``)."""

    TYPE: ClassVar[str] = "read_entries"
    call_id: int
    conversation_id: str
    order: Order
    cursor: int | None
    limit: int


@attrs.frozen(kw_only=True)
class ReadDocument:
    TYPE: ClassVar[str] = "read_document"
    call_id: int
    conversation_id: str | None
    name: str


@attrs.frozen(kw_only=True)
class ReadSubmission:
    TYPE: ClassVar[str] = "read_submission"
    call_id: int
    conversation_id: str
    request_id: str


@attrs.frozen(kw_only=True)
class Watch:
    """Subscribe to every commit after ``from_seq`` touching ``conversation_id`` (``None``: every commit)."""

    TYPE: ClassVar[str] = "watch"
    call_id: int
    watch_id: int
    conversation_id: str | None
    from_seq: int


@attrs.frozen(kw_only=True)
class Unwatch:
    TYPE: ClassVar[str] = "unwatch"
    call_id: int
    watch_id: int


@attrs.frozen(kw_only=True)
class Ping:
    TYPE: ClassVar[str] = "ping"
    call_id: int


@attrs.frozen(kw_only=True)
class Announce:
    """A worker says who it is and what it can run. Sent after every (re)connection; a later one replaces it."""

    TYPE: ClassVar[str] = "announce"
    call_id: int
    pid: int
    host: str
    app: str
    capabilities: tuple[Capability, ...]


@attrs.frozen(kw_only=True)
class ReadPeers:
    """List the attached connections (for ``tether status``)."""

    TYPE: ClassVar[str] = "read_peers"
    call_id: int


@attrs.frozen(kw_only=True)
class AdvanceClock:
    """Move a manual clock forward (owners started with ``--clock manual`` only)."""

    TYPE: ClassVar[str] = "advance_clock"
    call_id: int
    by_ms: int


# -------------------------------------------------------------------------------------------------- replies


@attrs.frozen(kw_only=True)
class Committed:
    """A ``Commit`` is durable. ``results`` has one int per write: the entry's position, the document's new
    version, or 0 for a created conversation."""

    TYPE: ClassVar[str] = "committed"
    call_id: int
    seq: int
    committed_at_ms: int
    results: tuple[int, ...]


@attrs.frozen(kw_only=True)
class Submitted:
    """``created`` is false when ``request_id`` was already used and ``submission`` is the original."""

    TYPE: ClassVar[str] = "submitted"
    call_id: int
    submission: SubmissionRecord
    created: bool


@attrs.frozen(kw_only=True)
class ConversationReply:
    TYPE: ClassVar[str] = "conversation"
    call_id: int
    conversation: ConversationRecord


@attrs.frozen(kw_only=True)
class EntriesReply:
    """``next_cursor`` continues the read in the same order; ``None`` when there is nothing further."""

    TYPE: ClassVar[str] = "entries"
    call_id: int
    entries: tuple[EntryRecord, ...]
    next_cursor: int | None


@attrs.frozen(kw_only=True)
class DocumentReply:
    TYPE: ClassVar[str] = "document"
    call_id: int
    document: DocumentRecord | None


@attrs.frozen(kw_only=True)
class SubmissionReply:
    TYPE: ClassVar[str] = "submission"
    call_id: int
    submission: SubmissionRecord | None


@attrs.frozen(kw_only=True)
class Watching:
    """The watch is registered; every commit after ``from_seq`` will follow as ``Change`` events."""

    TYPE: ClassVar[str] = "watching"
    call_id: int
    watch_id: int
    head_seq: int


@attrs.frozen(kw_only=True)
class PeersReply:
    TYPE: ClassVar[str] = "peers"
    call_id: int
    peers: tuple[PeerInfo, ...]


@attrs.frozen(kw_only=True)
class Ok:
    TYPE: ClassVar[str] = "ok"
    call_id: int


@attrs.frozen(kw_only=True)
class Pong:
    TYPE: ClassVar[str] = "pong"
    call_id: int
    now_ms: int
    head_seq: int


@attrs.frozen(kw_only=True)
class ClockReply:
    TYPE: ClassVar[str] = "clock"
    call_id: int
    now_ms: int


@attrs.frozen(kw_only=True)
class Error:
    """A request failed and changed nothing. ``call_id`` is ``None`` when the frame was too broken to read one."""

    TYPE: ClassVar[str] = "error"
    call_id: int | None
    code: str
    message: str


# --------------------------------------------------------------------------------------------------- events


@attrs.frozen(kw_only=True)
class Change:
    """One commit, pushed to a watch. ``seq`` strictly increases along a watch, without gaps in what it matches.

    A watch of one conversation receives the records of that conversation only; a watch of everything receives
    every record of the commit.
    """

    TYPE: ClassVar[str] = "change"
    watch_id: int
    seq: int
    committed_at_ms: int
    records: tuple[Record, ...]


@attrs.frozen(kw_only=True)
class Goodbye:
    """The owner is closing this connection (shutting down, or failing closed after a storage error)."""

    TYPE: ClassVar[str] = "goodbye"
    code: str
    message: str


Request: TypeAlias = (
    Commit
    | Submit
    | ReadConversation
    | ReadEntries
    | ReadDocument
    | ReadSubmission
    | Watch
    | Unwatch
    | Ping
    | AdvanceClock
    | Announce
    | ReadPeers
)
Reply: TypeAlias = (
    Committed
    | Submitted
    | ConversationReply
    | EntriesReply
    | DocumentReply
    | SubmissionReply
    | Watching
    | PeersReply
    | Ok
    | Pong
    | ClockReply
    | Error
)
Event: TypeAlias = Change | Goodbye
Frame: TypeAlias = Hello | Welcome | Refused | Request | Reply | Event

REQUEST_TYPES: tuple[type[Any], ...] = (
    Commit,
    Submit,
    ReadConversation,
    ReadEntries,
    ReadDocument,
    ReadSubmission,
    Watch,
    Unwatch,
    Ping,
    AdvanceClock,
    Announce,
    ReadPeers,
)
REPLY_TYPES: tuple[type[Any], ...] = (
    Committed,
    Submitted,
    ConversationReply,
    EntriesReply,
    DocumentReply,
    SubmissionReply,
    Watching,
    PeersReply,
    Ok,
    Pong,
    ClockReply,
    Error,
)
EVENT_TYPES: tuple[type[Any], ...] = (Change, Goodbye)
FRAME_TYPES: tuple[type[Any], ...] = (Hello, Welcome, Refused, *REQUEST_TYPES, *REPLY_TYPES, *EVENT_TYPES)
WRITE_TYPES: tuple[type[Any], ...] = (CreateConversation, AppendEntry, PutDocument)
RECORD_TYPES: tuple[type[Any], ...] = (ConversationRecord, EntryRecord, DocumentRecord, SubmissionRecord)
