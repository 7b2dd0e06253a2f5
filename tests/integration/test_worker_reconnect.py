"""A worker whose owner goes away while it announces itself waits for the next owner (it used to exit)."""

from __future__ import annotations

import trio
import trio_websocket

import actors
import protocol

TOKEN = "fake-owner-token"


class FakeOwner:
    """Welcomes every worker; drops the first connection on its announcement, answers later ones."""

    def __init__(self) -> None:
        self.announcements = 0
        self.answered = trio.Event()

    async def handler(self, request: trio_websocket.WebSocketRequest) -> None:
        ws = await request.accept()
        hello = protocol.decode_frame(await ws.get_message())
        assert isinstance(hello, protocol.Hello) and hello.role == "worker"
        welcome = protocol.Welcome(
            protocol_version=protocol.PROTOCOL_VERSION,
            owner_instance=f"fake-{self.announcements}",
            head_seq=0,
            clock="manual",
            max_message_bytes=protocol.MAX_MESSAGE_BYTES,
            heartbeat_ms=60_000,
        )
        await ws.send_message(protocol.encode_frame(welcome))
        while True:
            try:
                message = await ws.get_message()
            except trio_websocket.ConnectionClosed:
                return
            for received in protocol.decode_message(message):
                if not isinstance(received.frame, protocol.Announce):
                    continue
                self.announcements += 1
                if self.announcements == 1:
                    await ws.aclose()  # the owner dies during the worker's first announcement
                    return
                await ws.send_message(protocol.encode_frame(protocol.Ok(), call_id=received.call_id))
                self.answered.set()


async def test_a_worker_waits_for_the_next_owner_when_its_first_announcement_is_lost() -> None:
    app = actors.App("test")

    async def work(rt: actors.Phase) -> None:
        await rt.complete()

    app.define_task("job", version=1, initial=lambda _: {"phase": "work"}, phases={"work": work})
    fake = FakeOwner()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(trio_websocket.serve_websocket, fake.handler, "127.0.0.1", 0, None)
            url = f"ws://127.0.0.1:{server.port}"
            client = await nursery.start(
                lambda task_status: actors.serve(app, url=url, token=TOKEN, task_status=task_status)
            )
            assert isinstance(client, actors.Client)
            await fake.answered.wait()
            nursery.cancel_scope.cancel(reason="the test is over")
    assert fake.announcements >= 2
