"""A client that cannot connect says which step of the connection timed out, and after how long: the TCP connection,
the WebSocket upgrade, or the hello. The owners here are sockets in the test process that never answer (a stopped
owner, as SIGSTOP leaves it, looks the same from outside), under trio's autojump clock: no real time passes."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from functools import partial

import pytest
import trio
import trio.testing
import trio_websocket

import actors
from actors._client._connection import CONNECT_TIMEOUT_S

TOKEN = "0" * 48


async def _refused_message(url: str) -> str:
    with pytest.raises(actors.OwnerUnavailable) as caught:
        async with actors.connect(url=url, token=TOKEN, reconnect=False):
            pass
    return str(caught.value)


async def _silent_listener(nursery: trio.Nursery, *, upgrade: bool) -> int:
    """A port that accepts connections and then never answers (``upgrade``: accepts the WebSocket upgrade, then never
    answers the hello); the port."""

    async def accept_and_hold(stream: trio.SocketStream) -> None:
        async with stream:
            await trio.sleep_forever()

    async def upgrade_and_hold(request: trio_websocket.WebSocketRequest) -> None:
        await request.accept()
        await trio.sleep_forever()

    if upgrade:
        server = await nursery.start(trio_websocket.serve_websocket, upgrade_and_hold, "127.0.0.1", 0, None)
        return int(server.port)
    [listener] = await nursery.start(partial(trio.serve_tcp, accept_and_hold, 0, host="127.0.0.1"))
    return int(listener.socket.getsockname()[1])


@pytest.fixture
async def full_backlog() -> AsyncIterator[int]:
    """A port whose listener never accepts and whose backlog is full: the kernel drops new SYNs, so a TCP connect to
    it never completes."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        queued = []
        for _ in range(4):
            waiting = socket.socket()
            waiting.setblocking(False)
            waiting.connect_ex(("127.0.0.1", port))
            queued.append(waiting)
        try:
            yield port
        finally:
            for waiting in queued:
                waiting.close()


async def test_a_tcp_connection_that_never_completes_is_named_with_its_timeout(
    autojump_clock: trio.testing.MockClock, full_backlog: int
) -> None:
    message = await _refused_message(f"ws://127.0.0.1:{full_backlog}")
    assert f"the TCP connection to 127.0.0.1:{full_backlog} did not complete within {CONNECT_TIMEOUT_S:g} s" in message


async def test_an_owner_that_accepts_and_never_answers_the_upgrade_is_named_with_its_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        port = await _silent_listener(nursery, upgrade=False)
        message = await _refused_message(f"ws://127.0.0.1:{port}")
        nursery.cancel_scope.cancel()
    assert f"the WebSocket upgrade did not complete within {CONNECT_TIMEOUT_S:g} s" in message
    assert message.startswith(f"cannot reach the owner at ws://127.0.0.1:{port} (url ws://127.0.0.1:{port}): ")


async def test_an_owner_that_never_answers_the_hello_is_named_with_its_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        port = await _silent_listener(nursery, upgrade=True)
        message = await _refused_message(f"ws://127.0.0.1:{port}")
        nursery.cancel_scope.cancel()
    assert f"the owner did not answer the hello within {CONNECT_TIMEOUT_S:g} s" in message
