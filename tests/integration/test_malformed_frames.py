"""Malformed messages on an attached connection: each gets an Error frame naming the problem, the connection and
the owner stay usable, other clients are unaffected and the database never changes.

One owner serves the whole module (nothing here may change its database, which is the point).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import msgpack
import pytest
import trio
import trio_websocket
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import actors
import protocol
from protocol import ErrorCode, RuntimeInfo
from storage_owner.store import check_database
from tests.integration._wire import attached, owner_popen, ping, receive_frames


@attrs.frozen
class SharedOwner:
    db: str
    info: RuntimeInfo
    process: Any
    conversation_id: str
    head_seq: int

    def assert_unharmed(self) -> None:
        assert self.process.poll() is None, f"the owner died with status {self.process.returncode}"
        facts = check_database(self.db)
        assert facts["head_seq"] == self.head_seq
        assert facts["integrity"] == "ok"


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedOwner]:
    db = str(tmp_path_factory.mktemp("malformed") / "tether.db")
    with owner_popen(db) as (process, info):

        async def seed() -> tuple[str, int]:
            with trio.fail_after(20):
                async with actors.connect(db=db) as client:
                    conversation_id = await client.create_conversation()
                    for n in range(3):
                        await client.append(conversation_id, kind="app.note", data=n)
                    await client.put_document("doc", {"v": 1}, conversation_id=conversation_id)
                    return conversation_id, (await client.ping()).head_seq

        conversation_id, head_seq = trio.run(seed)
        yield SharedOwner(db=db, info=info, process=process, conversation_id=conversation_id, head_seq=head_seq)
        assert process.poll() is None, "the owner died during the module"


def pack(value: object) -> bytes:
    return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]


def append_write(conversation_id: str, data: object) -> dict[str, object]:
    return {
        "op": "append_entry",
        "conversation_id": conversation_id,
        "entry_id": protocol.new_id(),
        "kind": "app.note",
        "data": data,
    }


def too_deep(levels: int) -> object:
    value: object = "bottom"
    for _ in range(levels):
        value = [value]
    return value


Expected = tuple[str, int | None, tuple[str, ...]]
"""(error code or "pong", call_id, words the error message must contain)."""

CASES: dict[str, tuple[Callable[[str], bytes | str], list[Expected]]] = {
    "text message": (lambda cid: "hello there", [(ErrorCode.BAD_FRAME, None, ("text",))]),
    "oversize message": (
        lambda cid: b"\x00" * (protocol.MAX_MESSAGE_BYTES + 1000),
        [(ErrorCode.FRAME_TOO_LARGE, None, (str(protocol.MAX_MESSAGE_BYTES + 1000), str(protocol.MAX_MESSAGE_BYTES)))],
    ),
    "not msgpack": (lambda cid: b"\xc1\xc1\xc1", [(ErrorCode.BAD_FRAME, None, ("msgpack",))]),
    "truncated msgpack": (
        lambda cid: protocol.encode_frame(protocol.Ping(), call_id=5)[:-1],
        [(ErrorCode.BAD_FRAME, None, ("msgpack",))],
    ),
    "random bytes": (
        lambda cid: bytes(range(0xC1, 0x100)) * 3,
        [(ErrorCode.BAD_FRAME, None, ("msgpack",))],
    ),
    "msgpack scalar": (lambda cid: pack(42), [(ErrorCode.BAD_FRAME, None, ("map",))]),
    "empty batch": (lambda cid: pack([]), [(ErrorCode.BAD_FRAME, None, ("batch",))]),
    "batch over the frame limit": (
        lambda cid: pack([{"type": "ping", "call_id": n} for n in range(protocol.MAX_BATCH_FRAMES + 1)]),
        [(ErrorCode.FRAME_TOO_LARGE, None, (str(protocol.MAX_BATCH_FRAMES + 1), str(protocol.MAX_BATCH_FRAMES)))],
    ),
    "non-string map key": (lambda cid: pack({1: "x", "type": "ping"}), [(ErrorCode.BAD_FRAME, None, ())]),
    "msgpack extension": (
        lambda cid: pack(msgpack.ExtType(7, b"xyz")),
        [(ErrorCode.BAD_FRAME, None, ("extension",))],
    ),
    "frame not a map": (lambda cid: pack(["ping"]), [(ErrorCode.BAD_FRAME, None, ("map",))]),
    "unknown type": (
        lambda cid: pack({"type": "drop_tables", "call_id": 7}),
        [(ErrorCode.BAD_FRAME, 7, ("drop_tables",))],
    ),
    "missing type": (lambda cid: pack({"call_id": 7}), [(ErrorCode.BAD_FRAME, 7, ("type",))]),
    "missing field": (
        lambda cid: pack(
            {"type": "read_entries", "call_id": 8, "conversation_id": cid, "order": "asc", "cursor": None}
        ),
        [(ErrorCode.BAD_FRAME, 8, ("read_entries", "limit", "missing"))],
    ),
    "extra field": (
        lambda cid: pack({"type": "ping", "call_id": 9, "sneaky": True}),
        [(ErrorCode.BAD_FRAME, 9, ("ping", "sneaky"))],
    ),
    "mistyped field": (
        lambda cid: pack(
            {
                "type": "read_entries",
                "call_id": 10,
                "conversation_id": cid,
                "order": "asc",
                "cursor": None,
                "limit": "9",
            }
        ),
        [(ErrorCode.BAD_FRAME, 10, ("limit", "int"))],
    ),
    "bool for an int": (
        lambda cid: pack({"type": "ping", "call_id": True}),
        [(ErrorCode.BAD_FRAME, None, ("call_id",))],
    ),
    "literal out of range": (
        lambda cid: pack(
            {"type": "read_entries", "call_id": 11, "conversation_id": cid, "order": "up", "cursor": None, "limit": 3}
        ),
        [(ErrorCode.BAD_FRAME, 11, ("order",))],
    ),
    "commit with bytes in data": (
        lambda cid: pack({"type": "commit", "call_id": 12, "writes": [append_write(cid, b"\x00\x01")]}),
        [(ErrorCode.BAD_FRAME, 12, ("writes[0].data",))],
    ),
    "commit with NaN in data": (
        lambda cid: pack({"type": "commit", "call_id": 13, "writes": [append_write(cid, [1.0, math.nan])]}),
        [(ErrorCode.BAD_FRAME, 13, ("writes[0].data",))],
    ),
    "commit nested too deep": (
        lambda cid: pack({"type": "commit", "call_id": 14, "writes": [append_write(cid, too_deep(80))]}),
        [(ErrorCode.BAD_FRAME, 14, ("writes[0].data",))],
    ),
    "commit with unknown op": (
        lambda cid: pack({"type": "commit", "call_id": 15, "writes": [{"op": "truncate", "conversation_id": cid}]}),
        [(ErrorCode.BAD_FRAME, 15, ("writes[0]",))],
    ),
    "commit with writes not an array": (
        lambda cid: pack({"type": "commit", "call_id": 16, "writes": "everything"}),
        [(ErrorCode.BAD_FRAME, 16, ("writes",))],
    ),
    "reply sent to the owner": (
        lambda cid: protocol.encode_frame(protocol.Pong(now_ms=0, head_seq=99), call_id=17),
        [(ErrorCode.PROTOCOL_VIOLATION, 17, ("pong",))],
    ),
    "second hello": (
        lambda cid: protocol.encode_frame(
            protocol.Hello(protocol_version=protocol.PROTOCOL_VERSION, token="x", role="client")
        ),
        [(ErrorCode.PROTOCOL_VIOLATION, None, ("hello",))],
    ),
    "batch mixing good and bad frames": (
        lambda cid: pack(
            [
                {"type": "ping", "call_id": 20},
                {"type": "commit", "call_id": 21, "writes": [append_write(cid, b"bytes")]},
                {"type": "nope", "call_id": 22},
                {"type": "ping", "call_id": 23},
            ]
        ),
        [
            ("pong", 20, ()),
            (ErrorCode.BAD_FRAME, 21, ("writes[0].data",)),
            (ErrorCode.BAD_FRAME, 22, ("nope",)),
            ("pong", 23, ()),
        ],
    ),
}


def check_replies(replies: list[protocol.Received], expected: list[Expected]) -> None:
    assert len(replies) == len(expected)
    for received, (code, call_id, words) in zip(replies, expected, strict=True):
        reply = received.frame
        if code == "pong":
            assert isinstance(reply, protocol.Pong) and received.call_id == call_id, received
            continue
        assert isinstance(reply, protocol.Error), reply
        assert (reply.code, received.call_id) == (code, call_id), received
        assert reply.message
        for word in words:
            assert word in reply.message, (word, reply.message)


@pytest.mark.parametrize("case", list(CASES))
async def test_malformed_message_gets_an_error_and_changes_nothing(shared: SharedOwner, case: str) -> None:
    build, expected = CASES[case]
    with trio.fail_after(20):
        async with (
            actors.connect(url=shared.info.url, token=shared.info.token) as bystander,
            attached(shared.info) as ws,
        ):
            await bystander.ping()
            await ws.send_message(build(shared.conversation_id))
            replies = await receive_frames(ws, len(expected))
            pong = await ping(ws)
            bystander_pong = await bystander.ping()
            entries = await bystander.entries(shared.conversation_id)
            document = await bystander.document("doc", conversation_id=shared.conversation_id)
    check_replies(replies, expected)
    assert pong.head_seq == bystander_pong.head_seq == shared.head_seq
    assert [entry.data for entry in entries] == [0, 1, 2]
    assert document is not None and document.version == 1
    shared.assert_unharmed()


async def test_message_over_the_hard_limit_closes_only_that_connection(shared: SharedOwner) -> None:
    with trio.fail_after(30):
        async with actors.connect(url=shared.info.url, token=shared.info.token) as bystander:
            async with attached(shared.info) as ws:
                await ws.send_message(b"\x00" * (protocol.WEBSOCKET_HARD_LIMIT_BYTES + 1))
                with pytest.raises(trio_websocket.ConnectionClosed):
                    await ws.get_message()
                assert ws.closed is not None
                close_code = ws.closed.code
            pong = await bystander.ping()
            async with attached(shared.info) as fresh:
                fresh_pong = await ping(fresh)
    assert close_code == 1009  # message too big
    assert pong.head_seq == fresh_pong.head_seq == shared.head_seq
    shared.assert_unharmed()


# ---------------------------------------------------------------------------------------------- hypothesis

CONVERSATION = protocol.new_id()
"""Templates name a conversation that does not exist, so a mutation can never make a write land anyway."""

TEMPLATES: list[dict[str, Any]] = [
    protocol.unstructure_frame(frame, call_id=call_id)
    for call_id, frame in (
        (
            1,
            protocol.Commit(
                writes=(
                    protocol.AppendEntry(
                        conversation_id=CONVERSATION,
                        entry_id=protocol.new_id(),
                        kind="app.note",
                        data=protocol.JsonValue({"n": 1}),
                    ),
                    protocol.PutDocument(conversation_id=None, name="doc", value=protocol.JsonValue(1)),
                    protocol.CreateConversation(conversation_id=protocol.new_id()),
                ),
            ),
        ),
        (
            2,
            protocol.Submit(
                conversation_id=CONVERSATION,
                submission_id=protocol.new_id(),
                request_id="r",
                kind="app.task",
                payload=protocol.JsonValue(None),
            ),
        ),
        (3, protocol.ReadEntries(conversation_id=CONVERSATION, order="asc", cursor=None, limit=10)),
        (4, protocol.ReadDocument(conversation_id=None, name="doc")),
        (5, protocol.ReadSubmission(conversation_id=CONVERSATION, request_id="r")),
        (6, protocol.Watch(watch_id=1, conversation_id=None, from_seq=0)),
        (7, protocol.Unwatch(watch_id=1)),
        (8, protocol.Ping()),
        (9, protocol.AdvanceClock(by_ms=1000)),
        (None, protocol.Hello(protocol_version=1, token="t", role="client")),
        (10, protocol.Pong(now_ms=0, head_seq=0)),
        (11, protocol.Error(code="bad_frame", message="m")),
    )
]

leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=16)
    | st.binary(max_size=16)
)
values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)


@st.composite
def mutated_frames(draw: st.DrawFn) -> dict[str, Any]:
    frame = copy.deepcopy(draw(st.sampled_from(TEMPLATES)))
    target = frame
    if "writes" in frame and draw(st.booleans()):
        target = frame["writes"][draw(st.integers(0, len(frame["writes"]) - 1))]
    how = draw(st.sampled_from(["drop", "extra", "retype", "retag"]))
    if how == "drop":
        del target[draw(st.sampled_from(sorted(target)))]
    elif how == "extra":
        target[draw(st.text(min_size=1, max_size=8).filter(lambda key: key not in target))] = draw(values)
    elif how == "retype":
        target[draw(st.sampled_from(sorted(target)))] = draw(values)
    else:
        target["op" if "op" in target else "type"] = draw(st.text(max_size=12))
    return frame


messages = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=40),
    values.map(pack),
    mutated_frames().map(pack),
    st.lists(st.one_of(mutated_frames(), st.just({"type": "ping", "call_id": 99}), values), min_size=1, max_size=6).map(
        pack
    ),
)


def expected_replies(message: bytes | str) -> list[tuple[str, int | None]] | None:
    """What the owner must answer, frame by frame; ``None`` if the message holds a request that could act."""
    try:
        frames = protocol.decode_message(message)
    except protocol.ProtocolError as exc:
        return [(exc.code, None)]
    expected: list[tuple[str, int | None]] = []
    for received in frames:
        frame = received.frame
        if isinstance(frame, protocol.BadFrame):
            expected.append((frame.code, received.call_id))
        elif isinstance(frame, protocol.Ping):
            expected.append(("pong", received.call_id))
        elif isinstance(frame, protocol.REQUEST_TYPES):
            return None  # a well-formed read, watch or write: not what this test is about
        else:
            expected.append((ErrorCode.PROTOCOL_VIOLATION, received.call_id))
    return expected


async def exchange(info: RuntimeInfo, message: bytes | str, count: int) -> tuple[list[protocol.Received], int]:
    with trio.fail_after(20):
        async with attached(info) as ws:
            await ws.send_message(message)
            replies = await receive_frames(ws, count)
            pong = await ping(ws)
    return replies, pong.head_seq


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture],
)
@given(message=messages)
def test_random_messages_never_crash_the_owner_or_change_the_database(
    shared: SharedOwner, message: bytes | str
) -> None:
    expected = expected_replies(message)
    assume(expected is not None)
    assert expected is not None
    replies, head_seq = trio.run(exchange, shared.info, message, len(expected))
    got = [
        ("pong", received.call_id)
        if isinstance(received.frame, protocol.Pong)
        else (getattr(received.frame, "code", received.frame.TYPE), received.call_id)
        for received in replies
    ]
    assert got == expected
    assert head_seq == shared.head_seq
    shared.assert_unharmed()


def test_module_owner_database_is_where_it_was(shared: SharedOwner) -> None:
    """A last look, after everything above: the seeded rows are intact (sync: reads the file directly)."""
    shared.assert_unharmed()
    assert Path(shared.db).exists()
