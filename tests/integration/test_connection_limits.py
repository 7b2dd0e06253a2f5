"""Connections that never become peers: the handshake is bounded in time, unauthenticated connections in count,
and a listener out of file descriptors backs off and keeps serving. Loopback only, bounded in count and time."""

from __future__ import annotations

import resource
import subprocess

import trio
import trio_websocket

import actors
from runtime import kill_and_reap, stop_gracefully, tether_command, wait_for_owner
from tests.conftest import OwnerProcess
from tests.integration._wire import raw_connection

MAX_UNAUTHENTICATED = 8
EXTRA = 10


class _Closes:
    """The sockets the owner closed, and a way to wait until there are enough."""

    def __init__(self) -> None:
        self.streams: list[trio.SocketStream] = []
        self._changed = trio.Event()

    def __len__(self) -> int:
        return len(self.streams)

    def append(self, stream: trio.SocketStream) -> None:
        self.streams.append(stream)
        self._changed.set()

    async def wait_for(self, count: int) -> None:
        while len(self.streams) < count:
            self._changed = trio.Event()
            await self._changed.wait()


async def _closed_by_owner(stream: trio.SocketStream, closed: _Closes) -> None:
    """Read until the owner closes ``stream`` (EOF or reset); then record it."""
    try:
        while await stream.receive_some(4096):
            pass
    except trio.BrokenResourceError:
        pass
    closed.append(stream)


async def _idle_sockets(url: str, count: int) -> list[trio.SocketStream]:
    host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
    return [await trio.open_tcp_stream(host, int(port)) for _ in range(count)]


async def test_connections_past_the_bound_are_closed_at_once_and_peers_keep_working(db_path: str) -> None:
    owner = OwnerProcess(
        db_path, "--handshake-timeout", "600", "--max-unauthenticated", str(MAX_UNAUTHENTICATED)
    )  # the timeout never ends a connection here: only the count bound can
    info = await owner.start()
    try:
        with trio.fail_after(60):
            async with actors.connect(db=db_path) as peer:
                conversation_id = await peer.create_conversation()
                sockets = await _idle_sockets(info.url, MAX_UNAUTHENTICATED + EXTRA)
                closed = _Closes()
                async with trio.open_nursery() as nursery:
                    for stream in sockets:
                        nursery.start_soon(_closed_by_owner, stream, closed)
                    await closed.wait_for(EXTRA)
                    # The attached peer is served while every handshake slot is held.
                    seq = await peer.append(conversation_id, kind="app.note", data={"during": "flood"})
                    nursery.cancel_scope.cancel(reason="done")
                for stream in sockets:
                    await stream.aclose()  # the slots free up once the owner sees these closes
                async with actors.connect(db=db_path, wait_for_owner_s=30) as late:
                    after = await late.append(conversation_id, kind="app.note", data={"after": "flood"})
                    entries = await late.entries(conversation_id)
    finally:
        await owner.close()
    assert len(closed) >= EXTRA
    assert after == seq + 1
    assert [entry.data for entry in entries] == [{"during": "flood"}, {"after": "flood"}]


async def test_a_slow_upgrade_and_a_silent_websocket_are_closed_after_the_handshake_timeout(db_path: str) -> None:
    owner = OwnerProcess(db_path, "--handshake-timeout", "1", "--max-unauthenticated", str(MAX_UNAUTHENTICATED))
    info = await owner.start()
    try:
        with trio.fail_after(60):
            # Slow loris: a request header trickled a line at a time never completes the upgrade.
            (loris,) = await _idle_sockets(info.url, 1)
            await loris.send_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            trickled = 0
            try:
                while True:
                    await trio.sleep(0.2)
                    await loris.send_all(b"X-Slow: %d\r\n" % trickled)
                    trickled += 1
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            # Upgraded, and silent: never says hello.
            async with raw_connection(info.url) as ws:
                silent_closed = False
                try:
                    await ws.get_message()
                except trio_websocket.ConnectionClosed:
                    silent_closed = True
            # Every slot held by idle sockets, still open on our side: a real client gets in once they time out.
            sockets = await _idle_sockets(info.url, MAX_UNAUTHENTICATED + EXTRA)
            async with actors.connect(db=db_path, wait_for_owner_s=30) as client:
                conversation_id = await client.create_conversation()
                seq = await client.append(conversation_id, kind="app.note")
            for stream in sockets:
                await stream.aclose()
    finally:
        await owner.close()
    assert trickled < 5 / 0.2, "the slow upgrade was held far past the handshake timeout"
    assert silent_closed
    assert seq == 2


def _low_descriptor_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))


async def test_an_owner_out_of_descriptors_backs_off_and_serves_again_once_they_free_up(db_path: str) -> None:
    process = await trio.lowlevel.open_process(
        tether_command("owner", "--db", db_path, "--handshake-timeout", "2", "--max-unauthenticated", "500"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=_low_descriptor_limit,
    )
    try:
        with trio.fail_after(90):
            info = await wait_for_owner(db_path, process)
            sockets = await _idle_sockets(info.url, 120)  # far more than the owner has descriptors for
            closed = _Closes()
            async with trio.open_nursery() as nursery:
                for stream in sockets:
                    nursery.start_soon(_closed_by_owner, stream, closed)
                await closed.wait_for(len(sockets))  # each accepted in turn, then timed out: the owner kept going
            async with actors.connect(db=db_path, wait_for_owner_s=30) as client:
                conversation_id = await client.create_conversation()
                seq = await client.append(conversation_id, kind="app.note")
            assert process.returncode is None
            await stop_gracefully(process)
            assert process.stderr is not None
            chunks = []
            while chunk := await process.stderr.receive_some(65536):
                chunks.append(chunk)
    finally:
        await kill_and_reap(process)
    lines = b"".join(chunks).decode(errors="replace").splitlines()
    assert seq == 2
    # Accept failures are summarised (a line at first, then at most one per 10 s), never one per attempt.
    assert len(lines) <= 12, lines
