"""At the wire: a hello after the handshake, alone or in a batch, is a protocol violation; a release is a worker's."""

from __future__ import annotations

import msgpack
import trio

import protocol
from protocol import ErrorCode
from tests.conftest import OwnerProcess
from tests.integration._wire import attached, hello, ping, receive_frames


async def test_a_hello_inside_a_batch_after_the_handshake_is_a_protocol_violation(owner: OwnerProcess) -> None:
    assert owner.info is not None
    with trio.fail_after(30):
        async with attached(owner.info) as ws:
            await ws.send_message(msgpack.packb([msgpack.unpackb(hello(owner.info.token))]))  # a one-frame batch
            (alone,) = await receive_frames(ws, 1)
            await ws.send_message(
                protocol.join_frames([hello(owner.info.token), protocol.encode_frame(protocol.Ping(), call_id=7)])
            )
            mixed = await receive_frames(ws, 2)
            await ping(ws)  # the connection is still served
    for received in (alone, mixed[0]):
        assert isinstance(received.frame, protocol.Error), received
        assert received.frame.code == ErrorCode.PROTOCOL_VIOLATION
        assert "hello" in received.frame.message
    assert isinstance(mixed[1].frame, protocol.Pong) and mixed[1].call_id == 7


async def test_a_client_sending_release_is_not_allowed(owner: OwnerProcess) -> None:
    assert owner.info is not None
    release = protocol.Release(lease=protocol.LeaseRef(task_id=protocol.new_id(), epoch=1))
    with trio.fail_after(30):
        async with attached(owner.info) as ws:
            await ws.send_message(protocol.encode_frame(release, call_id=11))
            (received,) = await receive_frames(ws, 1)
    assert received.call_id == 11
    assert isinstance(received.frame, protocol.Error)
    assert received.frame.code == ErrorCode.NOT_ALLOWED, received.frame
