"""Speaking the wire protocol by hand, for tests that send what the client never would."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator

import trio
import trio_websocket

import protocol
from protocol import RuntimeInfo, read_runtime
from runtime import tether_command

RECEIVE_TIMEOUT_S = 10.0


def hello(token: str, *, version: int = protocol.PROTOCOL_VERSION, role: str = "client") -> bytes:
    return protocol.encode_frame(protocol.Hello(protocol_version=version, token=token, role=role, peer_name="raw"))


@contextlib.asynccontextmanager
async def raw_connection(url: str) -> AsyncIterator[trio_websocket.WebSocketConnection]:
    """A WebSocket to the owner with no handshake done yet."""
    async with trio_websocket.open_websocket_url(
        url, max_message_size=protocol.WEBSOCKET_HARD_LIMIT_BYTES, connect_timeout=10, disconnect_timeout=2
    ) as ws:
        yield ws


@contextlib.asynccontextmanager
async def attached(info: RuntimeInfo) -> AsyncIterator[trio_websocket.WebSocketConnection]:
    """A WebSocket to the owner past a valid Hello (the Welcome has been read)."""
    async with raw_connection(info.url) as ws:
        await ws.send_message(hello(info.token))
        welcome = protocol.decode_frame(await ws.get_message())
        assert isinstance(welcome, protocol.Welcome), welcome
        yield ws


async def receive_frames(ws: trio_websocket.WebSocketConnection, count: int) -> list[protocol.Received]:
    """Read messages until ``count`` frames arrived (every frame must be well formed), each with its call id."""
    frames: list[protocol.Received] = []
    with trio.fail_after(RECEIVE_TIMEOUT_S):
        while len(frames) < count:
            for received in protocol.decode_message(
                await ws.get_message(), max_bytes=protocol.WEBSOCKET_HARD_LIMIT_BYTES
            ):
                assert not isinstance(received.frame, protocol.BadFrame), received
                frames.append(received)
    return frames


async def ping(ws: trio_websocket.WebSocketConnection, call_id: int = 424242) -> protocol.Pong:
    """A Ping round trip on a raw connection; the next frame must be its Pong."""
    await ws.send_message(protocol.encode_frame(protocol.Ping(), call_id=call_id))
    (received,) = await receive_frames(ws, 1)
    pong = received.frame
    assert isinstance(pong, protocol.Pong) and received.call_id == call_id, received
    return pong


@contextlib.contextmanager
def owner_popen(db: str, *extra: str) -> Iterator[tuple[subprocess.Popen[bytes], RuntimeInfo]]:
    """A ``tether owner`` started without trio (for module-scoped fixtures); stopped and reaped on exit."""
    process = subprocess.Popen(tether_command("owner", "--db", db, *extra), stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert process.poll() is None, f"the owner exited with status {process.returncode}"
            assert time.monotonic() < deadline, "the owner did not start listening"
            with contextlib.suppress(protocol.OwnerUnavailable):
                info = read_runtime(db)
                if info.pid == process.pid:
                    break
            time.sleep(0.01)
        yield process, info
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
