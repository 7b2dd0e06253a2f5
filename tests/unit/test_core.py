"""The owner's core, driven directly over the memory store, batch by batch, as the shell does:
``store.begin(); core.run_batch(...); store.commit(); core.take_output()``, and ``core.catch_up()`` between batches.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from protocol import (
    MAX_MESSAGE_BYTES,
    REPLY_TYPES,
    REQUEST_TYPES,
    SUPPORTED_VERSIONS,
    AdvanceClock,
    AppendEntry,
    BadFrame,
    Change,
    ClockReply,
    Commit,
    Committed,
    ConversationReply,
    CreateConversation,
    DocumentReply,
    EntriesReply,
    EntryRecord,
    Error,
    ErrorCode,
    Frame,
    Goodbye,
    Hello,
    Ok,
    Ping,
    Pong,
    PutDocument,
    ReadConversation,
    ReadDocument,
    ReadEntries,
    ReadSubmission,
    Received,
    Refused,
    SubmissionReply,
    Submit,
    Submitted,
    Unwatch,
    Watch,
    Watching,
    Welcome,
    Write,
)
from storage_owner.core import (
    CATCH_UP_PAGE,
    MAX_READ_LIMIT,
    MAX_WRITES_PER_COMMIT,
    BatchEffects,
    BatchOrderError,
    Output,
    OwnerCore,
    PeerId,
)
from storage_owner.core import _watches as watches_module
from storage_owner.core._peers import DEFAULT_HEARTBEAT_MS
from storage_owner.store import MemoryStore
from tests.unit._stores import StoreUnderTest, reopened

TOKEN = "test-token"
INSTANCE = "01890a5d-0000-7000-8000-00000000abcd"
START_MS = 1_700_000_000_000

_ids = itertools.count(1)
_calls = itertools.count(1)


def fresh_id() -> str:
    """A new canonical id, unique within the test run (deterministic, unlike ``new_id``)."""
    return f"00000000-0000-7000-8000-{next(_ids):012x}"


def call() -> int:
    return next(_calls)


def create(conversation_id: str) -> CreateConversation:
    return CreateConversation(conversation_id=conversation_id)


def append(conversation_id: str, entry_id: str | None = None, data: Any = None) -> AppendEntry:
    return AppendEntry(
        conversation_id=conversation_id,
        entry_id=entry_id or fresh_id(),
        kind="message",
        data={"text": "hi"} if data is None else data,
    )


def put(conversation_id: str | None, name: str, value: Any, expected_version: int | None = None) -> PutDocument:
    return PutDocument(conversation_id=conversation_id, name=name, value=value, expected_version=expected_version)


def commit(*writes: Write) -> Commit:
    return Commit(writes=writes)


def submit(
    conversation_id: str,
    request_id: str,
    payload: Any = None,
    *,
    kind: str = "prompt",
    submission_id: str | None = None,
) -> Submit:
    return Submit(
        conversation_id=conversation_id,
        submission_id=submission_id or fresh_id(),
        request_id=request_id,
        kind=kind,
        payload={"q": 1} if payload is None else payload,
    )


def read_entries(
    conversation_id: str, order: Literal["asc", "desc"] = "asc", cursor: int | None = None, limit: int = 100
) -> ReadEntries:
    return ReadEntries(conversation_id=conversation_id, order=order, cursor=cursor, limit=limit)


def watch(watch_id: int, conversation_id: str | None = None, from_seq: int = 0) -> Watch:
    return Watch(watch_id=watch_id, conversation_id=conversation_id, from_seq=from_seq)


def sent(frame: Frame) -> Received:
    """``frame`` as a request under a fresh call id, for :func:`reply_to`."""
    return Received(call(), frame)


def envelope(frame: Frame | BadFrame | Received) -> Received:
    """What the shell hands the core: a request or reply under a fresh call id, anything else under none."""
    if isinstance(frame, Received):
        return frame
    return Received(call() if type(frame) in REQUEST_TYPES + REPLY_TYPES else None, frame)


def changes(out: list[Output], peer: PeerId, watch_id: int | None = None) -> list[Change]:
    return [
        frame
        for to, _, frame in out
        if to == peer and isinstance(frame, Change) and (watch_id is None or frame.watch_id == watch_id)
    ]


class Harness:
    """One core over one store (a new memory store unless one is given), driven like the shell drives it."""

    def __init__(self, store: StoreUnderTest | None = None, *, clock: Literal["wall", "manual"] = "wall") -> None:
        self.clock: Literal["wall", "manual"] = clock
        self.now_ms = START_MS
        self._peers = itertools.count(1)
        self.store: StoreUnderTest = MemoryStore() if store is None else store
        self.core = OwnerCore(self.store, token=TOKEN, instance=INSTANCE, clock=clock)
        self.effects = BatchEffects()

    def restart(self) -> None:
        """Close the store and start a new core on it, as a new owner process would."""
        self.store.close()
        self.store = reopened(self.store)
        self.core = OwnerCore(self.store, token=TOKEN, instance=INSTANCE, clock=self.clock)

    def close(self) -> None:
        self.store.close()

    def connect(self, role: str = "client") -> PeerId:
        answer = self.core.hello(Hello(protocol_version=SUPPORTED_VERSIONS[-1], token=TOKEN, role=role))
        assert isinstance(answer, Welcome), answer
        peer = next(self._peers)
        self.core.attach(peer, role)
        return peer

    def batch(self, *items: tuple[PeerId, Frame | BadFrame | Received]) -> list[Output]:
        self.store.begin()
        self.core.run_batch([(peer, envelope(frame)) for peer, frame in items], self.now_ms)
        self.store.commit()
        out, self.effects = self.core.take_output()
        return out

    def request(self, peer: PeerId, frame: Frame) -> Any:
        """Run ``frame`` alone in a batch, under a fresh call id, and return its one reply (addressed to that id)."""
        request = sent(frame)
        return reply_to(self.batch((peer, request)), peer, request)

    def catch_up(self) -> list[Output]:
        """Run catch-up turns until no watch lags (the shell runs one turn between batches)."""
        out: list[Output] = []
        for _ in range(100_000):
            if not self.core.has_lagging_watches:
                return out
            out.extend(self.core.catch_up())
        raise AssertionError("catch_up never finished")


def reply_to(out: list[Output], peer: PeerId, request: Received) -> Any:
    replies = [(call_id, frame) for to, call_id, frame in out if to == peer and not isinstance(frame, Change | Goodbye)]
    matching = [frame for call_id, frame in replies if call_id == request.call_id]
    assert len(matching) == 1, out
    return matching[0]


def error_code(reply: object) -> str:
    assert isinstance(reply, Error), reply
    return reply.code


@pytest.fixture
def harness() -> Iterator[Harness]:
    opened = Harness()
    yield opened
    opened.close()


@pytest.fixture
def manual() -> Iterator[Harness]:
    opened = Harness(clock="manual")
    yield opened
    opened.close()


def new_conversation(harness: Harness, peer: PeerId) -> str:
    conversation_id = fresh_id()
    assert isinstance(harness.request(peer, commit(create(conversation_id))), Committed)
    return conversation_id


# ------------------------------------------------------------------------------------------------------ hello


def test_good_hello_is_welcomed_with_the_head_seq(harness: Harness) -> None:
    peer = harness.connect()
    new_conversation(harness, peer)
    new_conversation(harness, peer)
    answer = harness.core.hello(Hello(protocol_version=SUPPORTED_VERSIONS[0], token=TOKEN, role="worker"))
    assert isinstance(answer, Welcome)
    assert answer.head_seq == 2
    assert answer.owner_instance == INSTANCE
    assert answer.clock == "wall"
    assert answer.max_message_bytes == MAX_MESSAGE_BYTES  # the core builds the welcome whole
    assert answer.heartbeat_ms == DEFAULT_HEARTBEAT_MS


def test_the_welcome_tells_the_heartbeat_the_core_was_given() -> None:
    core = OwnerCore(MemoryStore(), token=TOKEN, instance=INSTANCE, heartbeat_ms=1234)
    answer = core.hello(Hello(protocol_version=SUPPORTED_VERSIONS[0], token=TOKEN, role="client"))
    assert isinstance(answer, Welcome)
    assert answer.heartbeat_ms == 1234


def test_hello_with_a_bad_token_is_refused(harness: Harness) -> None:
    answer = harness.core.hello(Hello(protocol_version=SUPPORTED_VERSIONS[0], token="wrong", role="client"))
    assert isinstance(answer, Refused)
    assert answer.code == ErrorCode.BAD_TOKEN


def test_hello_with_an_unsupported_version_is_refused_listing_the_supported(harness: Harness) -> None:
    answer = harness.core.hello(Hello(protocol_version=max(SUPPORTED_VERSIONS) + 1, token=TOKEN, role="client"))
    assert isinstance(answer, Refused)
    assert answer.code == ErrorCode.UNSUPPORTED_VERSION
    assert answer.supported_versions == SUPPORTED_VERSIONS


def test_hello_with_an_unknown_role_is_refused(harness: Harness) -> None:
    answer = harness.core.hello(Hello(protocol_version=SUPPORTED_VERSIONS[0], token=TOKEN, role="admin"))
    assert isinstance(answer, Refused)
    assert answer.code == ErrorCode.ROLE_NOT_ALLOWED


@pytest.mark.parametrize("role", ["client", "worker", "reader"])
def test_hello_with_each_known_role_is_welcomed(harness: Harness, role: str) -> None:
    answer = harness.core.hello(Hello(protocol_version=SUPPORTED_VERSIONS[0], token=TOKEN, role=role))
    assert isinstance(answer, Welcome)


def test_first_frame_other_than_hello_is_a_protocol_violation(harness: Harness) -> None:
    answer = harness.core.hello(Ping())
    assert isinstance(answer, Refused)
    assert answer.code == ErrorCode.PROTOCOL_VIOLATION


def test_undecodable_first_frame_is_refused_with_its_code(harness: Harness) -> None:
    answer = harness.core.hello(BadFrame(code=ErrorCode.FRAME_TOO_LARGE, message="big"))
    assert isinstance(answer, Refused)
    assert answer.code == ErrorCode.FRAME_TOO_LARGE


# ----------------------------------------------------------------------------------------------------- commit


def test_commit_of_several_writes_takes_one_seq_with_a_result_per_write(harness: Harness) -> None:
    peer = harness.connect()
    conversation_id = fresh_id()
    reply = harness.request(
        peer,
        commit(
            create(conversation_id),
            append(conversation_id),
            append(conversation_id),
            put(conversation_id, "state", {"a": 1}),
            put(conversation_id, "state", {"a": 2}),
            put(None, "settings", [1]),
        ),
    )
    assert isinstance(reply, Committed)
    assert reply.seq == 1
    assert reply.committed_at_ms == START_MS
    assert reply.results == (0, 0, 1, 1, 2, 1)
    assert harness.core.head_seq == harness.store.head_seq() == 1


def test_entry_positions_continue_across_commits(harness: Harness) -> None:
    peer = harness.connect()
    conversation_id = new_conversation(harness, peer)
    assert harness.request(peer, commit(append(conversation_id), append(conversation_id))).results == (0, 1)
    assert harness.request(peer, commit(append(conversation_id))).results == (2,)


def test_seq_grows_by_one_per_commit_and_a_refusal_takes_none(harness: Harness) -> None:
    peer = harness.connect()
    seqs = []
    for index in range(6):
        if index % 2:
            assert error_code(harness.request(peer, commit(append(fresh_id())))) == ErrorCode.NOT_FOUND
        else:
            reply = harness.request(peer, commit(create(fresh_id())))
            seqs.append(reply.seq)
    assert seqs == [1, 2, 3]
    assert harness.core.head_seq == 3


def test_refused_request_mid_batch_is_rolled_back_alone(harness: Harness) -> None:
    peer = harness.connect()
    first, refused, last = fresh_id(), fresh_id(), fresh_id()
    requests = [
        sent(commit(create(first))),
        sent(commit(create(refused), append(refused), append(fresh_id()))),
        sent(commit(create(last), append(last))),
    ]
    out = harness.batch(*((peer, request) for request in requests))
    replies = [reply_to(out, peer, request) for request in requests]
    assert isinstance(replies[0], Committed) and replies[0].seq == 1
    assert error_code(replies[1]) == ErrorCode.NOT_FOUND
    assert isinstance(replies[2], Committed) and replies[2].seq == 2 and replies[2].results == (0, 0)
    assert harness.store.conversation(first) is not None
    assert harness.store.conversation(refused) is None
    assert harness.store.conversation(last) is not None
    assert harness.store.entry_count() == 1
    assert [commit.seq for commit in harness.store.read_log(0, None, 10)] == [1, 2]


def test_refused_one_write_requests_mid_batch_leave_no_trace(harness: Harness) -> None:
    peer = harness.connect()
    conversation_id = new_conversation(harness, peer)
    entry_id, submission_id = fresh_id(), fresh_id()
    harness.request(peer, commit(append(conversation_id, entry_id)))
    harness.request(peer, submit(conversation_id, "r1", submission_id=submission_id))
    requests = [
        sent(commit(create(conversation_id))),
        sent(commit(append(conversation_id, entry_id))),
        sent(submit(conversation_id, "r2", submission_id=submission_id)),
        sent(commit(put(None, "d", 1, expected_version=3))),
        sent(commit(append(conversation_id))),
    ]
    out = harness.batch(*((peer, request) for request in requests))
    replies = [reply_to(out, peer, request) for request in requests]
    assert [error_code(reply) for reply in replies[:4]] == [
        ErrorCode.DUPLICATE,
        ErrorCode.DUPLICATE,
        ErrorCode.DUPLICATE,
        ErrorCode.CONFLICT,
    ]
    assert isinstance(replies[4], Committed)
    assert (replies[4].seq, replies[4].results) == (4, (1,))
    assert harness.store.entry_count() == 2
    assert harness.store.submission(conversation_id, "r2") is None
    assert harness.store.document(None, "d") is None
    assert [logged.seq for logged in harness.store.read_log(0, None, 10)] == [1, 2, 3, 4]


def test_duplicate_entry_id_is_refused_and_writes_nothing(harness: Harness) -> None:
    peer = harness.connect()
    conversation_id = new_conversation(harness, peer)
    entry_id = fresh_id()
    harness.request(peer, commit(append(conversation_id, entry_id)))
    other = fresh_id()
    reply = harness.request(peer, commit(create(other), append(other, entry_id)))
    assert error_code(reply) == ErrorCode.DUPLICATE
    assert harness.store.conversation(other) is None
    assert harness.core.head_seq == 2
    # The position claimed by the refused append was released too.
    assert harness.request(peer, commit(append(conversation_id))).results == (1,)


def test_duplicate_entry_id_within_one_commit_is_refused(harness: Harness) -> None:
    peer = harness.connect()
    conversation_id = new_conversation(harness, peer)
    entry_id = fresh_id()
    reply = harness.request(peer, commit(append(conversation_id, entry_id), append(conversation_id, entry_id)))
    assert error_code(reply) == ErrorCode.DUPLICATE
    assert harness.store.entry_count() == 0


def test_duplicate_conversation_is_refused(harness: Harness) -> None:
    peer = harness.connect()
    conversation_id = new_conversation(harness, peer)
    assert error_code(harness.request(peer, commit(create(conversation_id)))) == ErrorCode.DUPLICATE
    assert harness.core.head_seq == 1


@pytest.mark.parametrize("write_kind", ["append", "put"])
def test_write_to_an_unknown_conversation_is_not_found(harness: Harness, write_kind: str) -> None:
    peer = harness.connect()
    missing = fresh_id()
    write: Write = append(missing) if write_kind == "append" else put(missing, "d", 1)
    assert error_code(harness.request(peer, commit(write))) == ErrorCode.NOT_FOUND
    assert harness.core.head_seq == 0


@pytest.mark.parametrize(
    "write",
    [
        CreateConversation(conversation_id="not-an-id"),
        CreateConversation(conversation_id="01890A5D-AC96-7B3C-8F2E-3C4D5E6F7A80"),
        AppendEntry(conversation_id="x", entry_id="00000000-0000-7000-8000-000000000000", kind="k", data=1),
        PutDocument(conversation_id=None, name="", value=1),
        PutDocument(conversation_id=None, name="n" * 201, value=1),
    ],
    ids=["bad-id", "upper-case-id", "bad-conversation-id", "empty-name", "long-name"],
)
def test_invalid_write_is_refused_as_invalid(harness: Harness, write: Write) -> None:
    peer = harness.connect()
    assert error_code(harness.request(peer, commit(write))) == ErrorCode.INVALID
    assert harness.core.head_seq == 0


@pytest.mark.parametrize("count", [0, MAX_WRITES_PER_COMMIT + 1])
def test_commit_with_no_or_too_many_writes_is_invalid(harness: Harness, count: int) -> None:
    peer = harness.connect()
    writes = tuple(put(None, f"d{index}", index) for index in range(count))
    assert error_code(harness.request(peer, Commit(writes=writes))) == ErrorCode.INVALID
    assert harness.core.head_seq == 0


def test_commit_of_the_most_writes_allowed_succeeds(harness: Harness) -> None:
    peer = harness.connect()
    writes = tuple(put(None, f"d{index}", index) for index in range(MAX_WRITES_PER_COMMIT))
    reply = harness.request(peer, Commit(writes=writes))
    assert isinstance(reply, Committed) and reply.results == (1,) * MAX_WRITES_PER_COMMIT


# -------------------------------------------------------------------------------------------------- documents


def test_document_versions_count_from_one(harness: Harness) -> None:
    peer = harness.connect()
    conversation_id = new_conversation(harness, peer)
    assert harness.request(peer, commit(put(conversation_id, "d", "a", expected_version=0))).results == (1,)
    assert harness.request(peer, commit(put(conversation_id, "d", "b", expected_version=1))).results == (2,)
    assert harness.request(peer, commit(put(conversation_id, "d", "c"))).results == (3,)
    reply = harness.request(peer, ReadDocument(conversation_id=conversation_id, name="d"))
    assert isinstance(reply, DocumentReply) and reply.document is not None
    assert (reply.document.version, reply.document.value, reply.document.seq) == (3, "c", 4)


@pytest.mark.parametrize("expected_version", [0, 2, 5])
def test_stale_expected_version_is_a_conflict_and_changes_nothing(harness: Harness, expected_version: int) -> None:
    peer = harness.connect()
    harness.request(peer, commit(put(None, "d", "first")))
    reply = harness.request(peer, commit(put(None, "d", "second", expected_version=expected_version)))
    assert error_code(reply) == ErrorCode.CONFLICT
    document = harness.store.document(None, "d")
    assert document is not None and (document.version, document.value) == (1, "first")
    assert harness.core.head_seq == 1


def test_global_and_conversation_documents_are_separate(harness: Harness) -> None:
    peer = harness.connect()
    conversation_id = new_conversation(harness, peer)
    harness.request(peer, commit(put(None, "d", "global"), put(None, "d", "global 2")))
    harness.request(peer, commit(put(conversation_id, "d", "scoped")))
    global_reply = harness.request(peer, ReadDocument(conversation_id=None, name="d"))
    scoped_reply = harness.request(peer, ReadDocument(conversation_id=conversation_id, name="d"))
    assert (global_reply.document.version, global_reply.document.value) == (2, "global 2")
    assert global_reply.document.conversation_id is None
    assert (scoped_reply.document.version, scoped_reply.document.value) == (1, "scoped")


def test_missing_document_reads_as_none(harness: Harness) -> None:
    peer = harness.connect()
    reply = harness.request(peer, ReadDocument(conversation_id=None, name="nothing"))
    assert isinstance(reply, DocumentReply) and reply.document is None
    missing = harness.request(peer, ReadDocument(conversation_id=fresh_id(), name="d"))
    assert error_code(missing) == ErrorCode.NOT_FOUND


# ------------------------------------------------------------------------------------------------ submissions


def test_submission_is_created_with_its_own_seq(harness: Harness) -> None:
    peer = harness.connect()
    conversation_id = new_conversation(harness, peer)
    request = submit(conversation_id, "r1", {"q": [1, 2]})
    reply = harness.request(peer, request)
    assert isinstance(reply, Submitted) and reply.created
    record = reply.submission
    assert (record.submission_id, record.request_id, record.payload, record.seq) == (
        request.submission_id,
        "r1",
        {"q": [1, 2]},
        2,
    )
    assert record.status == "done"  # an application kind: stored for it, nothing of the runtime answers it
    read = harness.request(peer, ReadSubmission(conversation_id=conversation_id, request_id="r1"))
    assert isinstance(read, SubmissionReply) and read.submission == record


def test_repeated_submission_returns_the_original_without_a_new_seq(harness: Harness) -> None:
    peer = harness.connect()
    conversation_id = new_conversation(harness, peer)
    original = harness.request(peer, submit(conversation_id, "r1", {"q": 1})).submission
    harness.now_ms += 1_000
    repeat = harness.request(peer, submit(conversation_id, "r1", {"q": 1}))
    assert isinstance(repeat, Submitted)
    assert repeat.created is False
    assert repeat.submission == original
    assert harness.core.head_seq == 2


def test_repeated_submission_in_one_batch_returns_the_original(harness: Harness) -> None:
    peer = harness.connect()
    conversation_id = new_conversation(harness, peer)
    first, second = sent(submit(conversation_id, "r1", [1])), sent(submit(conversation_id, "r1", [1]))
    out = harness.batch((peer, first), (peer, second))
    assert reply_to(out, peer, first).created is True
    assert reply_to(out, peer, second).created is False
    assert reply_to(out, peer, second).submission == reply_to(out, peer, first).submission


def test_repeated_submission_is_deduplicated_after_a_restart(harness: Harness) -> None:
    peer = harness.connect()
    conversation_id = new_conversation(harness, peer)
    original = harness.request(peer, submit(conversation_id, "r1", {"q": 1.5})).submission
    harness.restart()
    peer = harness.connect()
    repeat = harness.request(peer, submit(conversation_id, "r1", {"q": 1.5}))
    assert isinstance(repeat, Submitted) and repeat.created is False
    assert repeat.submission == original
    assert harness.core.head_seq == 2
    conflict = harness.request(peer, submit(conversation_id, "r1", {"q": 2}))
    assert error_code(conflict) == ErrorCode.CONFLICT


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"q": 1}, {"q": 2}),
        (1, 1.0),
        (1, True),
        (1.0, True),
        (0, False),
        ([1], [1.0]),
        ({"a": 1}, {"a": 1, "b": None}),
        ("1", 1),
        (None, {}),
    ],
    ids=repr,
)
def test_same_request_id_with_another_payload_is_a_conflict(harness: Harness, first: Any, second: Any) -> None:
    peer = harness.connect()
    conversation_id = new_conversation(harness, peer)
    original = harness.request(peer, submit(conversation_id, "r1", first)).submission
    reply = harness.request(peer, submit(conversation_id, "r1", second))
    assert error_code(reply) == ErrorCode.CONFLICT
    assert harness.core.head_seq == 2
    assert harness.store.submission(conversation_id, "r1") == original


def test_same_request_id_with_another_kind_is_a_conflict(harness: Harness) -> None:
    peer = harness.connect()
    conversation_id = new_conversation(harness, peer)
    harness.request(peer, submit(conversation_id, "r1", [1], kind="prompt"))
    assert error_code(harness.request(peer, submit(conversation_id, "r1", [1], kind="tool"))) == ErrorCode.CONFLICT
    assert harness.core.head_seq == 2


def test_same_request_id_in_another_conversation_is_a_new_submission(harness: Harness) -> None:
    peer = harness.connect()
    first, second = new_conversation(harness, peer), new_conversation(harness, peer)
    assert harness.request(peer, submit(first, "r1")).created is True
    assert harness.request(peer, submit(second, "r1")).created is True


def test_submission_to_an_unknown_conversation_is_not_found(harness: Harness) -> None:
    peer = harness.connect()
    assert error_code(harness.request(peer, submit(fresh_id(), "r1"))) == ErrorCode.NOT_FOUND
    assert harness.core.head_seq == 0


def test_reused_submission_id_is_a_duplicate(harness: Harness) -> None:
    peer = harness.connect()
    conversation_id = new_conversation(harness, peer)
    submission_id = fresh_id()
    harness.request(peer, submit(conversation_id, "r1", submission_id=submission_id))
    reply = harness.request(peer, submit(conversation_id, "r2", submission_id=submission_id))
    assert error_code(reply) == ErrorCode.DUPLICATE
    assert harness.store.submission(conversation_id, "r2") is None


@pytest.mark.parametrize("request_id", ["", "r" * 201])
def test_submission_with_a_bad_request_id_is_invalid(harness: Harness, request_id: str) -> None:
    peer = harness.connect()
    conversation_id = new_conversation(harness, peer)
    assert error_code(harness.request(peer, submit(conversation_id, request_id))) == ErrorCode.INVALID


# ---------------------------------------------------------------------------------------------------- readers


@pytest.mark.parametrize(
    "make",
    [
        lambda: commit(create(fresh_id())),
        lambda: commit(put(None, "d", 1)),
        lambda: submit(fresh_id(), "r1"),
        lambda: AdvanceClock(by_ms=1),
    ],
    ids=["commit", "commit-document", "submit", "advance-clock"],
)
def test_reader_may_not_write(harness: Harness, make: Any) -> None:
    reader = harness.connect("reader")
    request = make()
    reply = harness.request(reader, request)
    assert error_code(reply) == ErrorCode.READ_ONLY  # addressed to the request's call id (harness.request)
    assert harness.core.head_seq == 0


def test_reader_may_read_and_watch(harness: Harness) -> None:
    writer = harness.connect("worker")
    reader = harness.connect("reader")
    conversation_id = new_conversation(harness, writer)
    harness.request(writer, commit(append(conversation_id), put(conversation_id, "d", 1)))
    harness.request(writer, submit(conversation_id, "r1"))
    reads: list[tuple[Frame, type[Any]]] = [
        (ReadConversation(conversation_id=conversation_id), ConversationReply),
        (read_entries(conversation_id), EntriesReply),
        (ReadDocument(conversation_id=conversation_id, name="d"), DocumentReply),
        (ReadSubmission(conversation_id=conversation_id, request_id="r1"), SubmissionReply),
        (watch(1), Watching),
        (Unwatch(watch_id=1), Ok),
        (Ping(), Pong),
    ]
    for request, reply_type in reads:
        assert isinstance(harness.request(reader, request), reply_type)


# ------------------------------------------------------------------------------------------------------ reads


def test_read_conversation_counts_entries(harness: Harness) -> None:
    peer = harness.connect()
    conversation_id = new_conversation(harness, peer)
    harness.request(peer, commit(append(conversation_id), append(conversation_id)))
    reply = harness.request(peer, ReadConversation(conversation_id=conversation_id))
    assert isinstance(reply, ConversationReply)
    assert (reply.conversation.entry_count, reply.conversation.seq) == (2, 1)
    missing = harness.request(peer, ReadConversation(conversation_id=fresh_id()))
    assert error_code(missing) == ErrorCode.NOT_FOUND


def _entries_with_data(harness: Harness, peer: PeerId, count: int) -> tuple[str, list[int]]:
    conversation_id = new_conversation(harness, peer)
    harness.request(peer, commit(*(append(conversation_id, data=index) for index in range(count))))
    return conversation_id, list(range(count))


def _read_all(harness: Harness, peer: PeerId, conversation_id: str, order: Literal["asc", "desc"], limit: int) -> Any:
    pages: list[list[EntryRecord]] = []
    cursor: int | None = None
    while True:
        reply = harness.request(peer, read_entries(conversation_id, order, cursor, limit))
        assert isinstance(reply, EntriesReply)
        pages.append(list(reply.entries))
        if reply.next_cursor is None:
            return pages
        cursor = reply.next_cursor


def test_read_entries_pages_ascending_until_next_cursor_is_none(harness: Harness) -> None:
    peer = harness.connect()
    conversation_id, data = _entries_with_data(harness, peer, 7)
    pages = _read_all(harness, peer, conversation_id, "asc", 3)
    assert [[entry.data for entry in page] for page in pages] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [entry.position for page in pages for entry in page] == data


def test_read_entries_pages_descending_until_next_cursor_is_none(harness: Harness) -> None:
    peer = harness.connect()
    conversation_id, _ = _entries_with_data(harness, peer, 7)
    pages = _read_all(harness, peer, conversation_id, "desc", 3)
    assert [[entry.position for entry in page] for page in pages] == [[6, 5, 4], [3, 2, 1], [0]]


@pytest.mark.parametrize("order", ["asc", "desc"])
def test_exactly_full_last_page_has_no_next_cursor(harness: Harness, order: Literal["asc", "desc"]) -> None:
    peer = harness.connect()
    conversation_id, _ = _entries_with_data(harness, peer, 6)
    pages = _read_all(harness, peer, conversation_id, order, 3)
    assert [len(page) for page in pages] == [3, 3]


def test_read_entries_with_a_cursor_is_exclusive(harness: Harness) -> None:
    peer = harness.connect()
    conversation_id, _ = _entries_with_data(harness, peer, 5)
    after = harness.request(peer, read_entries(conversation_id, "asc", 2, 10))
    before = harness.request(peer, read_entries(conversation_id, "desc", 2, 10))
    assert [entry.position for entry in after.entries] == [3, 4]
    assert [entry.position for entry in before.entries] == [1, 0]
    assert after.next_cursor is None and before.next_cursor is None


def test_read_entries_of_an_empty_conversation(harness: Harness) -> None:
    peer = harness.connect()
    conversation_id = new_conversation(harness, peer)
    reply = harness.request(peer, read_entries(conversation_id))
    assert reply == EntriesReply(entries=(), next_cursor=None)


@pytest.mark.parametrize(
    ("limit", "cursor"),
    [(0, None), (-1, None), (MAX_READ_LIMIT + 1, None), (10, -1)],
    ids=["zero-limit", "negative-limit", "over-limit", "negative-cursor"],
)
def test_read_entries_with_a_bad_limit_or_cursor_is_invalid(harness: Harness, limit: int, cursor: int | None) -> None:
    peer = harness.connect()
    conversation_id = new_conversation(harness, peer)
    assert error_code(harness.request(peer, read_entries(conversation_id, "asc", cursor, limit))) == ErrorCode.INVALID


def test_read_entries_of_an_unknown_conversation_is_not_found(harness: Harness) -> None:
    peer = harness.connect()
    assert error_code(harness.request(peer, read_entries(fresh_id()))) == ErrorCode.NOT_FOUND


def test_read_entries_returns_each_entry_with_its_commit(harness: Harness) -> None:
    peer = harness.connect()
    conversation_id = new_conversation(harness, peer)
    first = append(conversation_id, data={"n": 1})
    second = append(conversation_id, data=[None, True, 2.5])
    harness.request(peer, commit(first))
    harness.now_ms += 5
    harness.request(peer, commit(second))
    reply = harness.request(peer, read_entries(conversation_id))
    assert [(e.entry_id, e.position, e.seq, e.data, e.created_at_ms) for e in reply.entries] == [
        (first.entry_id, 0, 2, {"n": 1}, START_MS),
        (second.entry_id, 1, 3, [None, True, 2.5], START_MS + 5),
    ]


def test_ping_reports_time_and_head(harness: Harness) -> None:
    peer = harness.connect()
    new_conversation(harness, peer)
    request = Ping()
    assert harness.request(peer, request) == Pong(now_ms=START_MS, head_seq=1)


# --------------------------------------------------------------------------------------------- frame handling


def test_bad_frame_is_answered_with_its_code_and_call_id(harness: Harness) -> None:
    peer = harness.connect()
    out = harness.batch((peer, Received(41, BadFrame(code=ErrorCode.BAD_FRAME, message="bad"))))
    assert out == [(peer, 41, Error(code=ErrorCode.BAD_FRAME, message="bad"))]


@pytest.mark.parametrize(
    "frame",
    [
        Hello(protocol_version=1, token=TOKEN, role="client"),
        Committed(seq=1, committed_at_ms=1, results=()),
        Ok(),
        Change(watch_id=1, seq=1, committed_at_ms=1, records=()),
        Goodbye(code="x", message="y"),
    ],
    ids=["hello", "committed", "ok", "change", "goodbye"],
)
def test_frame_the_owner_does_not_take_is_a_protocol_violation(harness: Harness, frame: Frame) -> None:
    peer = harness.connect()
    received = envelope(frame)
    [(to, call_id, reply)] = harness.batch((peer, received))
    assert to == peer
    assert error_code(reply) == ErrorCode.PROTOCOL_VIOLATION
    assert call_id == received.call_id


def test_replies_come_out_in_request_order_to_their_peers(harness: Harness) -> None:
    first, second = harness.connect(), harness.connect()
    requests = [(first, Received(1, Ping())), (second, Received(1, Ping())), (first, Received(2, Ping()))]
    out = harness.batch(*requests)
    assert [(to, call_id) for to, call_id, _ in out] == [(first, 1), (second, 1), (first, 2)]


@pytest.mark.parametrize(
    "make",
    [lambda: commit(create(fresh_id())), lambda: watch(1), lambda: submit(fresh_id(), "r")],
    ids=["commit", "watch", "submit"],
)
def test_frame_from_a_detached_peer_does_not_raise(harness: Harness, make: Any) -> None:
    peer = harness.connect()
    harness.core.detach(peer)
    head = harness.core.head_seq
    out = harness.batch((peer, make()))
    assert out == []  # nobody is left to answer
    assert harness.core.head_seq == head  # and nothing was written for it


def test_frames_from_a_detached_peer_are_dropped(harness: Harness) -> None:
    peer = harness.connect()
    harness.core.detach(peer)
    harness.core.detach(peer)  # detaching twice, or a peer never attached, is safe
    harness.core.detach(999)
    other = harness.connect()
    out = harness.batch((peer, Ping()), (other, Ping()))
    assert [to for to, _, _ in out] == [other]


# ------------------------------------------------------------------------------------------------------ clock


def test_advance_clock_on_a_wall_clock_is_not_allowed(harness: Harness) -> None:
    peer = harness.connect()
    assert error_code(harness.request(peer, AdvanceClock(by_ms=10))) == ErrorCode.NOT_ALLOWED
    assert harness.effects.clock_ms is None


def test_advance_clock_on_a_manual_clock_moves_time(manual: Harness) -> None:
    peer = manual.connect()
    request = AdvanceClock(by_ms=1_500)
    assert manual.request(peer, request) == ClockReply(now_ms=START_MS + 1_500)
    assert manual.effects.clock_ms == START_MS + 1_500
    assert manual.core.stored_clock_ms() == START_MS + 1_500
    assert manual.core.head_seq == 0  # moving the clock is not a commit


def test_advanced_time_applies_to_the_rest_of_the_batch(manual: Harness) -> None:
    peer = manual.connect()
    advance, later = AdvanceClock(by_ms=500), sent(commit(create(fresh_id())))
    out = manual.batch((peer, advance), (peer, later))
    assert reply_to(out, peer, later).committed_at_ms == START_MS + 500
    assert manual.effects.clock_ms == START_MS + 500
    manual.batch((peer, Ping()))
    assert manual.effects.clock_ms is None  # effects belong to one batch


def test_advance_clock_by_a_negative_amount_is_invalid(manual: Harness) -> None:
    peer = manual.connect()
    assert error_code(manual.request(peer, AdvanceClock(by_ms=-1))) == ErrorCode.INVALID
    assert manual.effects.clock_ms is None
    assert manual.core.stored_clock_ms() == 0


def test_advance_clock_by_zero_is_allowed(manual: Harness) -> None:
    peer = manual.connect()
    assert manual.request(peer, AdvanceClock(by_ms=0)).now_ms == START_MS


def test_stored_clock_survives_a_new_core(manual: Harness) -> None:
    assert manual.core.stored_clock_ms() == 0
    peer = manual.connect()
    manual.request(peer, AdvanceClock(by_ms=250))
    manual.restart()
    assert manual.core.stored_clock_ms() == START_MS + 250


@pytest.mark.parametrize("by_ms", [2**63 - 1, 2**63, 2**64 - 1])
def test_advance_clock_past_the_integer_range_is_refused_not_raised(manual: Harness, by_ms: int) -> None:
    peer = manual.connect()
    request = AdvanceClock(by_ms=by_ms)
    reply = manual.request(peer, request)
    assert error_code(reply) == ErrorCode.INVALID


@pytest.mark.parametrize("order", ["asc", "desc"])
def test_read_entries_with_a_huge_cursor_is_answered_not_raised(
    harness: Harness, order: Literal["asc", "desc"]
) -> None:
    peer = harness.connect()
    conversation_id, _ = _entries_with_data(harness, peer, 2)
    reader = harness.connect("reader")
    reply = harness.request(reader, read_entries(conversation_id, order, 2**63, 10))
    assert isinstance(reply, EntriesReply | Error)
    if isinstance(reply, Error):
        assert reply.code == ErrorCode.INVALID


# ----------------------------------------------------------------------------------------------------- watches


def test_watch_from_past_the_head_is_invalid(harness: Harness) -> None:
    peer = harness.connect()
    new_conversation(harness, peer)
    assert error_code(harness.request(peer, watch(1, from_seq=2))) == ErrorCode.INVALID
    assert error_code(harness.request(peer, watch(2, from_seq=-1))) == ErrorCode.INVALID
    assert isinstance(harness.request(peer, watch(3, from_seq=1)), Watching)


def test_watch_of_an_unknown_conversation_is_not_found(harness: Harness) -> None:
    peer = harness.connect()
    assert error_code(harness.request(peer, watch(1, fresh_id()))) == ErrorCode.NOT_FOUND


def test_watch_id_in_use_on_the_connection_is_a_conflict(harness: Harness) -> None:
    peer, other = harness.connect(), harness.connect()
    assert isinstance(harness.request(peer, watch(1)), Watching)
    assert error_code(harness.request(peer, watch(1))) == ErrorCode.CONFLICT
    assert isinstance(harness.request(other, watch(1)), Watching)  # watch ids are per connection


def test_watching_reports_the_head(harness: Harness) -> None:
    peer = harness.connect()
    new_conversation(harness, peer)
    request = watch(5)
    assert harness.request(peer, request) == Watching(watch_id=5, head_seq=1)


def _commit_many(harness: Harness, peer: PeerId, count: int, per_batch: int = 100) -> list[Output]:
    out: list[Output] = []
    while count:
        size = min(count, per_batch)
        out.extend(harness.batch(*((peer, commit(put(None, "counter", index))) for index in range(size))))
        count -= size
    return out


def test_watch_from_zero_gets_a_long_backlog_then_live_changes_exactly_once(harness: Harness) -> None:
    writer, watcher = harness.connect(), harness.connect("reader")
    backlog = 2 * CATCH_UP_PAGE + 88
    _commit_many(harness, writer, backlog)
    harness.request(watcher, watch(1))
    seen: list[int] = []
    turns = 0
    while harness.core.has_lagging_watches:
        seen.extend(change.seq for change in changes(harness.core.catch_up(), watcher, 1))
        turns += 1
        # Commits made between catch-up turns must neither be lost nor delivered twice.
        seen.extend(change.seq for change in changes(_commit_many(harness, writer, 3), watcher, 1))
    assert turns >= 3
    live = _commit_many(harness, writer, 5)
    live_seqs = [change.seq for change in changes(live, watcher, 1)]
    assert len(live_seqs) == 5
    seen.extend(live_seqs)
    assert seen == list(range(1, harness.core.head_seq + 1))


def test_changes_carry_the_commit_records(harness: Harness) -> None:
    writer, watcher = harness.connect(), harness.connect()
    harness.request(watcher, watch(1))
    assert harness.catch_up() == []
    conversation_id = fresh_id()
    out = harness.batch((writer, commit(create(conversation_id), append(conversation_id), put(None, "g", 1))))
    [change] = changes(out, watcher, 1)
    assert (change.seq, change.committed_at_ms) == (1, START_MS)
    assert [record.RECORD for record in change.records] == ["conversation", "entry", "document"]
    assert all(record.seq == 1 for record in change.records)


def test_watch_starting_mid_log_gets_only_later_commits(harness: Harness) -> None:
    writer, watcher = harness.connect(), harness.connect()
    _commit_many(harness, writer, 10)
    harness.request(watcher, watch(1, from_seq=7))
    assert [change.seq for change in changes(harness.catch_up(), watcher)] == [8, 9, 10]


def test_watch_registered_before_a_commit_in_the_same_batch_gets_it_once(harness: Harness) -> None:
    writer, watcher = harness.connect(), harness.connect()
    _commit_many(harness, writer, 2)
    out = harness.batch((watcher, watch(1, from_seq=2)), (writer, commit(put(None, "d", 1))))
    seqs = [change.seq for change in changes(out, watcher)]
    seqs += [change.seq for change in changes(harness.catch_up(), watcher)]
    assert seqs == [3]


def test_conversation_watch_gets_only_that_conversations_records(harness: Harness) -> None:
    writer, watcher = harness.connect(), harness.connect()
    mine, other = new_conversation(harness, writer), new_conversation(harness, writer)
    harness.request(writer, commit(append(mine), append(other)))  # seq 3: both
    harness.request(writer, commit(append(other)))  # seq 4: other only
    harness.request(writer, commit(put(None, "g", 1)))  # seq 5: global only
    harness.request(writer, submit(mine, "r1"))  # seq 6: mine
    harness.request(watcher, watch(1, mine))
    backlog = changes(harness.catch_up(), watcher, 1)
    live = changes(harness.batch((writer, commit(append(other), append(mine)))), watcher, 1)  # seq 7: both
    live += changes(harness.batch((writer, commit(append(other)))), watcher, 1)  # seq 8: other only
    live += changes(harness.batch((writer, commit(append(mine)))), watcher, 1)  # seq 9: mine
    assert [change.seq for change in backlog] == [1, 3, 6]
    assert [change.seq for change in live] == [7, 9]
    for change in backlog + live:
        assert change.records
        assert all(record.conversation_id == mine for record in change.records)


def test_conversation_watch_live_change_holds_only_its_records(harness: Harness) -> None:
    writer, watcher = harness.connect(), harness.connect()
    mine, other = new_conversation(harness, writer), new_conversation(harness, writer)
    harness.request(watcher, watch(1, mine, from_seq=2))
    assert harness.catch_up() == []
    out = harness.batch((writer, commit(append(other), append(mine), put(mine, "d", 1), put(None, "g", 1))))
    [change] = changes(out, watcher, 1)
    assert change.seq == 3
    assert [record.RECORD for record in change.records] == ["entry", "document"]
    assert all(record.conversation_id == mine for record in change.records)
    assert changes(harness.batch((writer, commit(append(other)))), watcher) == []
    assert changes(harness.batch((writer, commit(put(None, "g", 2)))), watcher) == []


@pytest.mark.parametrize("window", [None, 7])
def test_conversation_watch_catches_up_over_a_long_log_without_gaps(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, window: int | None
) -> None:
    if window is not None:
        # A small scan window (where the core has one) makes catch-up cross many windows.
        monkeypatch.setattr(watches_module, "CATCH_UP_SCAN_WINDOW", window)
    writer, watcher = harness.connect(), harness.connect()
    mine, other = new_conversation(harness, writer), new_conversation(harness, writer)
    expected = [1]
    for index in range(CATCH_UP_PAGE + 150):
        if index % 3 == 0:
            reply = harness.request(writer, commit(append(mine)))
            expected.append(reply.seq)
        else:
            harness.request(writer, commit(append(other)))
    harness.request(watcher, watch(1, mine))
    seen = [change.seq for change in changes(harness.catch_up(), watcher, 1)]
    live = sent(commit(append(mine)))
    out = harness.batch((writer, live))
    expected.append(reply_to(out, writer, live).seq)
    seen += [change.seq for change in changes(out, watcher, 1)]
    assert seen == expected


def test_unwatch_stops_delivery(harness: Harness) -> None:
    writer, watcher = harness.connect(), harness.connect()
    harness.request(watcher, watch(1))
    harness.catch_up()
    assert len(changes(_commit_many(harness, writer, 1), watcher)) == 1
    request = Unwatch(watch_id=1)
    assert harness.request(watcher, request) == Ok()
    assert changes(_commit_many(harness, writer, 2), watcher) == []
    assert isinstance(harness.request(watcher, Unwatch(watch_id=99)), Ok)  # unknown id: still Ok
    assert isinstance(harness.request(watcher, watch(1)), Watching)  # the id is free again


def test_congested_peer_misses_no_commit_and_gets_none_twice(harness: Harness) -> None:
    writer, watcher = harness.connect(), harness.connect()
    harness.request(watcher, watch(1))
    harness.catch_up()
    seen = [change.seq for change in changes(_commit_many(harness, writer, 3), watcher)]
    harness.core.set_congested(watcher, True)
    assert changes(_commit_many(harness, writer, CATCH_UP_PAGE + 10), watcher) == []
    assert not harness.core.has_lagging_watches  # a congested peer is not caught up
    assert harness.core.catch_up() == []
    harness.core.set_congested(watcher, False)
    seen += [change.seq for change in changes(harness.catch_up(), watcher)]
    seen += [change.seq for change in changes(_commit_many(harness, writer, 2), watcher)]
    assert seen == list(range(1, harness.core.head_seq + 1))


def test_congested_conversation_watch_catches_up_with_only_its_commits(harness: Harness) -> None:
    writer, watcher = harness.connect(), harness.connect()
    mine, other = new_conversation(harness, writer), new_conversation(harness, writer)
    harness.request(watcher, watch(1, mine))
    seen = [change.seq for change in changes(harness.catch_up(), watcher)]
    seen += [change.seq for change in changes(harness.batch((writer, commit(append(mine)))), watcher)]
    harness.core.set_congested(watcher, True)
    expected = [1, 3]
    for index in range(30):
        if index % 4 == 0:
            expected.append(harness.request(writer, commit(append(mine))).seq)
        elif index % 4 == 1:
            expected.append(harness.request(writer, commit(append(other), put(mine, "d", index))).seq)
        elif index % 4 == 2:
            harness.request(writer, commit(append(other), put(None, "g", index)))
        else:
            harness.request(writer, commit(put(None, "g", index)))
    harness.core.set_congested(watcher, False)
    received = changes(harness.catch_up(), watcher)
    seen += [change.seq for change in received]
    assert seen == expected
    assert all(record.conversation_id == mine for change in received for record in change.records)


def test_congestion_does_not_affect_other_peers(harness: Harness) -> None:
    writer, slow, fast = harness.connect(), harness.connect(), harness.connect()
    harness.request(slow, watch(1))
    harness.request(fast, watch(1))
    harness.catch_up()
    harness.core.set_congested(slow, True)
    out = _commit_many(harness, writer, 4)
    assert [change.seq for change in changes(out, fast)] == [1, 2, 3, 4]
    assert changes(out, slow) == []


def test_congestion_of_a_lagging_watch_pauses_its_catch_up(harness: Harness) -> None:
    writer, watcher = harness.connect(), harness.connect()
    _commit_many(harness, writer, 5)
    harness.request(watcher, watch(1))
    harness.core.set_congested(watcher, True)
    assert not harness.core.has_lagging_watches
    harness.core.set_congested(watcher, True)  # repeated signals are harmless
    harness.core.set_congested(watcher, False)
    harness.core.set_congested(watcher, False)
    assert [change.seq for change in changes(harness.catch_up(), watcher)] == [1, 2, 3, 4, 5]


def test_detach_drops_the_peers_watches(harness: Harness) -> None:
    writer, watcher = harness.connect(), harness.connect()
    _commit_many(harness, writer, 3)
    harness.request(watcher, watch(1))
    harness.request(watcher, watch(2))
    assert harness.core.has_lagging_watches
    harness.core.detach(watcher)
    assert not harness.core.has_lagging_watches
    assert harness.core.catch_up() == []
    live_watcher = harness.connect()
    harness.request(live_watcher, watch(1))
    harness.catch_up()
    harness.core.detach(live_watcher)
    out = _commit_many(harness, writer, 2)
    assert changes(out, watcher) == [] and changes(out, live_watcher) == []


# ---------------------------------------------------------------------------------------- stateful (Hypothesis)


def _same_json(left: object, right: object) -> bool:
    """The model's own notion of "the same payload": equal values of equal types, all the way down."""
    if type(left) is not type(right):
        return False
    if isinstance(left, dict):
        assert isinstance(right, dict)
        return left.keys() == right.keys() and all(_same_json(left[key], right[key]) for key in left)
    if isinstance(left, list):
        assert isinstance(right, list)
        return len(left) == len(right) and all(_same_json(a, b) for a, b in zip(left, right, strict=True))
    return left == right


PAYLOADS: list[Any] = [1, 1.0, True, "s", [1], [1.0], {"a": 1}, None]
NAMES = ["a", "b"]
REQUEST_IDS = ["r1", "r2", "r3"]
WATCH_ID = 1


class CoreMachine(RuleBasedStateMachine):
    """Random batches of commits and submissions against a model of what must be stored and watched."""

    def __init__(self) -> None:
        super().__init__()
        self.harness = Harness()
        self.writer = self.harness.connect("client")
        self.watcher = self.harness.connect("reader")
        self.harness.request(self.watcher, watch(WATCH_ID))
        self.pending: list[Frame] = []
        self.congested = False
        # every id ever used in a request, so requests can reuse them (valid or not)
        self.conversation_pool: list[str] = []
        self.entry_pool: list[str] = []
        self.submission_pool: list[str] = []
        # the model: acknowledged state only
        self.head = 0
        self.entries: dict[str, list[tuple[str, int]]] = {}
        self.entry_ids: set[str] = set()
        self.documents: dict[tuple[str | None, str], int] = {}
        self.submissions: dict[tuple[str, str], Any] = {}
        self.submission_ids: set[str] = set()
        self.record_counts: dict[int, int] = {}
        self.seen: list[Change] = []

    def teardown(self) -> None:
        self.harness.close()

    # ------------------------------------------------------------------------------------------- drawing

    def _pick(self, data: st.DataObject, pool: list[str], *, reuse: int = 1) -> str:
        """An id from ``pool`` (about ``reuse`` times in 4) or a fresh one."""
        if pool and data.draw(st.integers(min_value=0, max_value=3), label="reuse") < reuse:
            return data.draw(st.sampled_from(pool))
        value = fresh_id()
        pool.append(value)
        return value

    def _target(self, data: st.DataObject) -> str:
        """A conversation to write to: mostly one that exists, sometimes any id seen, or an unknown one."""
        known = sorted(self.entries)
        if known and data.draw(st.integers(min_value=0, max_value=3), label="known") < 3:
            return data.draw(st.sampled_from(known))
        return self._pick(data, self.conversation_pool, reuse=2)

    def _draw_write(self, data: st.DataObject) -> Write:
        kind = data.draw(st.sampled_from(["create", "append", "append", "put"]))
        if kind == "create":
            return create(self._pick(data, self.conversation_pool))
        if kind == "append":
            return append(
                self._target(data),
                self._pick(data, self.entry_pool),
                data=data.draw(st.sampled_from(PAYLOADS)),
            )
        scope = None if data.draw(st.booleans(), label="global") else self._target(data)
        return put(
            scope,
            data.draw(st.sampled_from(NAMES)),
            data.draw(st.sampled_from(PAYLOADS)),
            data.draw(st.sampled_from([None, None, 0, 1, 2, 3]), label="expected_version"),
        )

    # --------------------------------------------------------------------------------------------- rules

    @rule(data=st.data(), count=st.integers(min_value=1, max_value=3))
    def queue_commit(self, data: st.DataObject, count: int) -> None:
        self.pending.append(commit(*(self._draw_write(data) for _ in range(count))))

    @rule(data=st.data())
    def queue_submit(self, data: st.DataObject) -> None:
        self.pending.append(
            submit(
                self._target(data),
                data.draw(st.sampled_from(REQUEST_IDS)),
                data.draw(st.sampled_from(PAYLOADS)),
                kind=data.draw(st.sampled_from(["x", "y"])),
                submission_id=self._pick(data, self.submission_pool),
            )
        )

    @precondition(lambda self: self.pending)
    @rule(advance_ms=st.integers(min_value=0, max_value=5))
    def run_batch(self, advance_ms: int) -> None:
        self.harness.now_ms += advance_ms
        requests, self.pending = self.pending, []
        envelopes = [sent(request) for request in requests]
        out = self.harness.batch(*((self.writer, request) for request in envelopes))
        for request, envelope in zip(requests, envelopes, strict=True):
            reply = reply_to(out, self.writer, envelope)
            if isinstance(request, Commit):
                self._check_commit(request, reply)
            else:
                assert isinstance(request, Submit)
                self._check_submit(request, reply)
        self._watch(out)
        self._watch(self.harness.catch_up())

    @rule()
    def toggle_congestion(self) -> None:
        self.congested = not self.congested
        self.harness.core.set_congested(self.watcher, self.congested)
        self._watch(self.harness.catch_up())

    @precondition(lambda self: not self.pending)
    @rule()
    def restart(self) -> None:
        self.harness.restart()
        self.writer = self.harness.connect("client")
        self.watcher = self.harness.connect("reader")
        self.congested = False
        reply = self.harness.request(self.watcher, watch(WATCH_ID, from_seq=len(self.seen)))
        assert isinstance(reply, Watching) and reply.head_seq == self.head
        self._watch(self.harness.catch_up())

    # -------------------------------------------------------------------------------------------- checks

    def _check_commit(self, request: Commit, reply: object) -> None:
        conversations = set(self.entries)
        counts = {conversation_id: len(entries) for conversation_id, entries in self.entries.items()}
        entry_ids = set(self.entry_ids)
        documents = dict(self.documents)
        results: list[int] = []
        appended: list[tuple[str, str]] = []
        refusal: str | None = None
        for write in request.writes:
            if isinstance(write, CreateConversation):
                if write.conversation_id in conversations:
                    refusal = ErrorCode.DUPLICATE
                    break
                conversations.add(write.conversation_id)
                counts[write.conversation_id] = 0
                results.append(0)
            elif isinstance(write, AppendEntry):
                if write.conversation_id not in conversations:
                    refusal = ErrorCode.NOT_FOUND
                    break
                if write.entry_id in entry_ids:
                    refusal = ErrorCode.DUPLICATE
                    break
                entry_ids.add(write.entry_id)
                results.append(counts[write.conversation_id])
                counts[write.conversation_id] += 1
                appended.append((write.conversation_id, write.entry_id))
            else:
                assert isinstance(write, PutDocument)
                if write.conversation_id is not None and write.conversation_id not in conversations:
                    refusal = ErrorCode.NOT_FOUND
                    break
                key = (write.conversation_id, write.name)
                current = documents.get(key, 0)
                if write.expected_version is not None and write.expected_version != current:
                    refusal = ErrorCode.CONFLICT
                    break
                documents[key] = current + 1
                results.append(current + 1)
        if refusal is not None:
            assert error_code(reply) == refusal, (request, reply)
            return
        assert isinstance(reply, Committed), (request, reply)
        self.head += 1
        assert reply.seq == self.head
        assert reply.results == tuple(results)
        for conversation_id in conversations - set(self.entries):
            self.entries[conversation_id] = []
        for conversation_id, entry_id in appended:
            self.entries[conversation_id].append((entry_id, reply.seq))
        self.entry_ids = entry_ids
        self.documents = documents
        self.record_counts[reply.seq] = len(request.writes)

    def _check_submit(self, request: Submit, reply: object) -> None:
        key = (request.conversation_id, request.request_id)
        original = self.submissions.get(key)
        if original is not None:
            if original.kind == request.kind and _same_json(original.payload, request.payload):
                assert isinstance(reply, Submitted) and reply.created is False, (request, reply)
                assert reply.submission == original
            else:
                assert error_code(reply) == ErrorCode.CONFLICT, (request, reply)
            return
        if request.conversation_id not in self.entries:
            assert error_code(reply) == ErrorCode.NOT_FOUND, (request, reply)
            return
        if request.submission_id in self.submission_ids:
            assert error_code(reply) == ErrorCode.DUPLICATE, (request, reply)
            return
        assert isinstance(reply, Submitted) and reply.created is True, (request, reply)
        self.head += 1
        assert reply.submission.seq == self.head
        assert _same_json(reply.submission.payload, request.payload)
        self.submissions[key] = reply.submission
        self.submission_ids.add(request.submission_id)
        self.record_counts[self.head] = 1

    def _watch(self, out: list[Output]) -> None:
        self.seen.extend(changes(out, self.watcher, WATCH_ID))

    # ------------------------------------------------------------------------------------------ invariants

    @invariant()
    def head_counts_the_acknowledged_commits(self) -> None:
        assert self.harness.core.head_seq == self.harness.store.head_seq() == self.head

    @invariant()
    def watch_sees_every_commit_once_in_order(self) -> None:
        seqs = [change.seq for change in self.seen]
        assert seqs == list(range(1, len(seqs) + 1))
        if not self.congested:
            assert len(seqs) == self.head
        for change in self.seen:
            assert len(change.records) == self.record_counts[change.seq]
            assert all(record.seq == change.seq for record in change.records)

    @invariant()
    def acknowledged_entries_are_stored_once_in_position_order(self) -> None:
        if self.pending:
            return  # checked between batches
        reader = self.watcher
        stored_ids: list[str] = []
        for conversation_id, expected in self.entries.items():
            reply = self.harness.request(reader, read_entries(conversation_id, "asc", None, MAX_READ_LIMIT))
            assert isinstance(reply, EntriesReply) and reply.next_cursor is None
            assert [entry.position for entry in reply.entries] == list(range(len(expected)))
            assert [(entry.entry_id, entry.seq) for entry in reply.entries] == expected
            stored_ids.extend(entry.entry_id for entry in reply.entries)
        assert len(stored_ids) == len(set(stored_ids)) == len(self.entry_ids)
        assert self.harness.store.entry_count() == len(self.entry_ids)

    @invariant()
    def documents_and_submissions_match_the_model(self) -> None:
        if self.pending:
            return
        for (conversation_id, name), version in self.documents.items():
            document = self.harness.store.document(conversation_id, name)
            assert document is not None and document.version == version
        for (conversation_id, request_id), original in self.submissions.items():
            assert self.harness.store.submission(conversation_id, request_id) == original


CoreMachine.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_core_state_machine = CoreMachine.TestCase


# ------------------------------------------------------------------------------------------ batch order


def test_take_output_without_a_batch_is_refused(harness: Harness) -> None:
    with pytest.raises(BatchOrderError, match="run_batch"):
        harness.core.take_output()


def test_a_second_batch_before_the_first_ones_output_was_taken_is_refused(harness: Harness) -> None:
    peer = harness.connect()
    harness.store.begin()
    harness.core.run_batch([(peer, Received(1, Ping()))], harness.now_ms)
    with pytest.raises(BatchOrderError, match="take_output"):
        harness.core.run_batch([(peer, Received(2, Ping()))], harness.now_ms)
    with pytest.raises(BatchOrderError, match="take_output"):
        harness.core.catch_up()  # never inside a batch
    harness.store.commit()
    out, _ = harness.core.take_output()
    assert [call_id for _, call_id, frame in out if isinstance(frame, Pong)] == [1]  # the refused batch did nothing


def test_a_batch_that_raised_half_way_leaves_the_core_unusable(harness: Harness) -> None:
    peer = harness.connect()
    conversation_id = new_conversation(harness, peer)
    harness.store.begin()
    harness.store.close()  # the storage breaks under the batch
    with pytest.raises(Exception, match="closed"):
        harness.core.run_batch([(peer, sent(commit(append(conversation_id))))], harness.now_ms)
    for call_ in (
        harness.core.take_output,
        harness.core.catch_up,
        lambda: harness.core.run_batch([], harness.now_ms),
    ):
        with pytest.raises(BatchOrderError, match="failed half-way"):
            call_()
    harness.store = reopened(harness.store)  # for the fixture's close


def test_a_catch_up_that_raised_half_way_leaves_the_core_unusable(harness: Harness) -> None:
    peer = harness.connect()
    new_conversation(harness, peer)
    harness.request(peer, watch(1))
    harness.store.close()  # the storage breaks under the catch-up
    with pytest.raises(Exception, match="closed"):
        harness.core.catch_up()
    with pytest.raises(BatchOrderError, match="failed half-way"):
        harness.core.run_batch([], harness.now_ms)
    harness.store = reopened(harness.store)  # for the fixture's close


def test_a_request_without_a_call_id_is_refused_unanswerable(harness: Harness) -> None:
    # The codec refuses a request map without call_id; a core fed one by hand refuses it too, to no call id.
    peer = harness.connect()
    [(to, call_id, reply)] = harness.batch((peer, Received(None, Ping())))
    assert (to, call_id, error_code(reply)) == (peer, None, ErrorCode.BAD_FRAME)
