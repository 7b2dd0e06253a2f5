"""The handshake: anything but a valid Hello is answered with one Refused frame and the connection ends, while
the owner keeps serving everyone else."""

from __future__ import annotations

import msgpack
import pytest
import trio
import trio_websocket

import actors
import protocol
from protocol import ErrorCode
from tests.conftest import OwnerProcess
from tests.integration._wire import hello, raw_connection

BAD_VERSION = protocol.PROTOCOL_VERSION + 41


async def refusal_for(owner: OwnerProcess, first: bytes | str) -> tuple[protocol.Refused, bool]:
    """Send ``first`` as the first message; the Refused answer and whether the owner then closed the socket."""
    assert owner.info is not None
    async with raw_connection(owner.info.url) as ws:
        await ws.send_message(first)
        answer = protocol.decode_frame(await ws.get_message())
        assert isinstance(answer, protocol.Refused), answer
        try:
            await ws.get_message()
        except trio_websocket.ConnectionClosed:
            closed = True
        else:
            closed = False
    return answer, closed


def first_messages(token: str) -> dict[str, tuple[bytes | str, str, tuple[str, ...]]]:
    """name: (first message, expected code, words the refusal must contain)."""
    return {
        "unsupported version": (
            hello(token, version=BAD_VERSION),
            ErrorCode.UNSUPPORTED_VERSION,
            (str(BAD_VERSION), str(protocol.PROTOCOL_VERSION)),
        ),
        "unknown role": (hello(token, role="admin"), ErrorCode.ROLE_NOT_ALLOWED, ("admin",)),
        "bad token": (hello("0" * 48), ErrorCode.BAD_TOKEN, ("token",)),
        "ping first": (protocol.encode_frame(protocol.Ping(), call_id=1), ErrorCode.PROTOCOL_VIOLATION, ("ping",)),
        "hello in a batch": (
            protocol.join_frames([hello(token), protocol.encode_frame(protocol.Ping(), call_id=1)]),
            ErrorCode.PROTOCOL_VIOLATION,
            ("batch",),
        ),
        "hello in a one-frame batch": (
            msgpack.packb([msgpack.unpackb(hello(token))]),
            ErrorCode.PROTOCOL_VIOLATION,
            ("batch",),
        ),
        "hello missing its token": (
            msgpack.packb({"type": "hello", "protocol_version": protocol.PROTOCOL_VERSION, "role": "client"}),
            ErrorCode.BAD_FRAME,
            ("token",),
        ),
        "garbage": (b"\xc1garbage", ErrorCode.BAD_FRAME, ("msgpack",)),
        "text": ("hello", ErrorCode.BAD_FRAME, ("text",)),
    }


@pytest.mark.parametrize(
    "case",
    [
        "unsupported version",
        "unknown role",
        "bad token",
        "ping first",
        "hello in a batch",
        "hello in a one-frame batch",
        "hello missing its token",
        "garbage",
        "text",
    ],
)
async def test_bad_first_frame_is_refused(owner: OwnerProcess, case: str) -> None:
    assert owner.info is not None
    first, code, words = first_messages(owner.info.token)[case]
    with trio.fail_after(20):
        async with actors.connect(db=owner.db) as bystander:
            conversation_id = await bystander.create_conversation()
            answer, closed = await refusal_for(owner, first)
            await bystander.append(conversation_id, kind="app.note")
            head = (await bystander.ping()).head_seq
    assert answer.code == code
    assert answer.supported_versions == protocol.SUPPORTED_VERSIONS
    for word in words:
        assert word in answer.message, (word, answer.message)
    assert closed, "the owner must end a refused connection"
    assert head == 2
    assert owner.process is not None and owner.process.returncode is None


async def test_client_surfaces_refusals_as_handshake_refused(owner: OwnerProcess) -> None:
    with trio.fail_after(20):
        with pytest.raises(actors.HandshakeRefused) as role:
            async with actors.connect(db=owner.db, role="superuser"):
                pass
        async with actors.connect(db=owner.db, role="worker") as worker:
            conversation_id = await worker.create_conversation()
    assert role.value.code == ErrorCode.ROLE_NOT_ALLOWED
    assert role.value.supported_versions == protocol.SUPPORTED_VERSIONS
    assert protocol.is_id(conversation_id)
