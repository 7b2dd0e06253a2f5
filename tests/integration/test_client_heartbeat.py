"""A client's heartbeat: a ping once nothing else was sent for the owner's ``heartbeat_ms``, so an idle connection
pings at that pace and a connection that sends requests anyway sends no ping at all (each costs both ends a wake-up).
The owner is a WebSocket server in the test process that answers every request and records when each came, under
trio's autojump clock: no real time passes."""

from __future__ import annotations

import trio
import trio.testing
import trio_websocket

import actors
from protocol import (
    PROTOCOL_VERSION,
    Hello,
    PeersReply,
    Ping,
    Pong,
    ReadPeers,
    Welcome,
    decode_frame,
    decode_message,
    encode_frame,
)

HEARTBEAT_MS = 1000
TOKEN = "0" * 48


class FakeOwner:
    """Welcomes one client with ``HEARTBEAT_MS``, answers its pings and peer reads, and notes when each came."""

    def __init__(self) -> None:
        self.received: list[tuple[float, str]] = []

    async def serve(self, request: trio_websocket.WebSocketRequest) -> None:
        ws = await request.accept()
        hello = decode_frame(await ws.get_message())
        assert isinstance(hello, Hello)
        welcome = Welcome(
            protocol_version=PROTOCOL_VERSION,
            owner_instance="fake",
            head_seq=0,
            clock="wall",
            max_message_bytes=1 << 20,
            heartbeat_ms=HEARTBEAT_MS,
        )
        await ws.send_message(encode_frame(welcome))
        while True:
            for received in decode_message(await ws.get_message()):
                self.received.append((trio.current_time(), received.frame.TYPE))
                reply = Pong(now_ms=0, head_seq=0) if isinstance(received.frame, Ping) else PeersReply(peers=())
                assert isinstance(received.frame, Ping | ReadPeers)
                await ws.send_message(encode_frame(reply, call_id=received.call_id))


async def test_an_idle_client_pings_at_the_owners_pace_and_a_busy_one_not_at_all(
    autojump_clock: trio.testing.MockClock,
) -> None:
    owner = FakeOwner()
    async with trio.open_nursery() as nursery:
        server = await nursery.start(trio_websocket.serve_websocket, owner.serve, "127.0.0.1", 0, None)
        async with actors.connect(url=f"ws://127.0.0.1:{server.port}", token=TOKEN, reconnect=False) as client:
            started = trio.current_time()
            await trio.sleep(10.5)  # idle: a ping every second
            idle = [at - started for at, kind in owner.received]
            busy_from = trio.current_time()
            for _ in range(20):  # busy: a request every 0.6 s, more often than the heartbeat
                await client.peers()
                await trio.sleep(0.6)
            busy = [kind for at, kind in owner.received if at >= busy_from]
        nursery.cancel_scope.cancel()
    assert [round(at, 1) for at in idle] == [float(second) for second in range(1, 11)]
    assert {kind for _, kind in owner.received if _ < busy_from} == {"ping"}
    assert busy == ["read_peers"] * 20  # no ping: the requests are heard by the owner anyway
