"""A worker starts a tool call's handler only under a lease it knows is live (issue 28, point 12): after a silence of
its owner longer than its connection can vouch for, and always for a ``manual`` or ``report`` call, it confirms the
lease with a round trip first (``confirm_lease``) and starts nothing if the owner says it is lost. The owner is a
WebSocket server in the test process that leases one tool call and answers as each case needs, under trio's
autojump clock: no real time passes. The process-level case (a worker SIGSTOPped, its owner killed, the standby
taking over) is tests/faults/test_paused_worker.py."""

from __future__ import annotations

from typing import Any, Final

import pytest
import trio
import trio.testing
import trio_websocket

import actors
from protocol import (
    PROTOCOL_VERSION,
    Announce,
    Commit,
    Committed,
    ConfirmLease,
    Error,
    ErrorCode,
    Hello,
    JsonValue,
    Lease,
    LeaseRef,
    Ok,
    Ping,
    Pong,
    Release,
    StartOperation,
    Welcome,
    decode_frame,
    decode_message,
    encode_frame,
)

HEARTBEAT_MS: Final = 1000
"""The owner's heartbeat: it drops a peer silent for 4 s; the worker vouches for what it heard for 2 s."""
TOKEN: Final = "0" * 48
LEASE: Final = LeaseRef(task_id="01890a5d-ac9a-7000-8000-000000000004", epoch=1)


class LeasingOwner:
    """Welcomes one worker, leases it one call of ``lookup``, acknowledges its intent after ``ack_delay_s``, and
    answers a ``confirm_lease`` with ``ok`` if ``live``, else ``stale_lease``; notes every request's type."""

    def __init__(self, *, ack_delay_s: float, live: bool) -> None:
        self.ack_delay_s = ack_delay_s
        self.live = live
        self.received: list[str] = []
        self.done = trio.Event()
        """Set once the call's fate is known: its result committed, or its lease confirmed lost."""

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
        leased = False
        async with trio.open_nursery() as nursery:
            while True:
                for received in decode_message(await ws.get_message()):
                    frame, call_id = received.frame, received.call_id
                    self.received.append(frame.TYPE)
                    if isinstance(frame, Ping):
                        await ws.send_message(encode_frame(Pong(now_ms=0, head_seq=0), call_id=call_id))
                    elif isinstance(frame, Announce):
                        await ws.send_message(encode_frame(Ok(), call_id=call_id))
                        if not leased:
                            leased = True
                            await ws.send_message(encode_frame(_lease()))
                    elif isinstance(frame, Commit):
                        results = (0,) * len(frame.writes)
                        reply = Committed(seq=len(self.received), committed_at_ms=0, results=results)
                        nursery.start_soon(self._answer, ws, reply, call_id, frame)
                    elif isinstance(frame, ConfirmLease):
                        assert frame.lease == LEASE
                        if self.live:
                            await ws.send_message(encode_frame(Ok(), call_id=call_id))
                        else:
                            lost = Error(code=ErrorCode.STALE_LEASE, message="the task was given to someone else")
                            await ws.send_message(encode_frame(lost, call_id=call_id))
                            self.done.set()
                    else:
                        assert isinstance(frame, Release), frame
                        await ws.send_message(encode_frame(Ok(), call_id=call_id))

    async def _answer(self, ws: Any, reply: Committed, call_id: int | None, commit: Commit) -> None:
        """The intent's acknowledgement comes after ``ack_delay_s`` (an owner stalled, or a worker paused with it
        unread); the result's at once."""
        is_intent = any(isinstance(write, StartOperation) for write in commit.writes)
        if is_intent:
            await trio.sleep(self.ack_delay_s)
        await ws.send_message(encode_frame(reply, call_id=call_id))
        if not is_intent:
            self.done.set()


def _lease() -> Lease:
    return Lease(
        lease=LEASE,
        mode="phase",
        kind="tool:lookup",
        version=1,
        input=JsonValue(
            {
                "run_id": "01890a5d-ac9a-7000-8000-000000000001",
                "operation_id": "01890a5d-ac9a-7000-8000-000000000002",
                "turn": 1,
                "call_id": "call_1",
                "name": "lookup",
                "arguments": {"order_id": "A1"},
            }
        ),
        checkpoint=None,
        conversation_id="01890a5d-ac9a-7000-8000-000000000003",
        owner_task_id="01890a5d-ac9a-7000-8000-000000000005",
        restarts=0,
        abort=None,
        now_ms=0,
    )


def _app(recovery: actors.Recovery, started: list[float]) -> actors.App:
    async def lookup(call: actors.ToolCall, args: dict[str, Any]) -> str:
        started.append(trio.current_time())
        return "shipped"

    app = actors.App("confirm")
    app.define_tool("lookup", lookup, description="Look an order up.", parameters={"type": "object"}, recovery=recovery)
    return app


async def _serve_one_call(owner: LeasingOwner, recovery: actors.Recovery) -> list[float]:
    """Serve ``lookup`` against ``owner`` until the call's fate is known: when its handler started (if it did)."""
    started: list[float] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(trio_websocket.serve_websocket, owner.serve, "127.0.0.1", 0, None)
            url = f"ws://127.0.0.1:{server.port}"
            await nursery.start(
                lambda task_status: actors.serve(
                    _app(recovery, started), url=url, token=TOKEN, handle_signals=False, log=lambda line: None,
                    task_status=task_status,
                )
            )  # fmt: skip
            await owner.done.wait()
            await trio.sleep(1)  # (time enough for a handler that would start)
            nursery.cancel_scope.cancel()
    return started


@pytest.mark.parametrize("recovery", ["safe", "idempotent", "manual"])
async def test_a_call_acknowledged_after_a_silence_starts_only_once_its_lease_is_confirmed(
    autojump_clock: trio.testing.MockClock, recovery: actors.Recovery
) -> None:
    """The intent's acknowledgement comes 3 s after it was sent (past the 2 s the connection vouches for, short of
    the 4 s after which the worker gives the owner up): the owner may have dropped the worker meanwhile, so the worker
    asks; told the lease is lost, it never starts the handler."""
    owner = LeasingOwner(ack_delay_s=3.0, live=False)
    assert await _serve_one_call(owner, recovery) == []
    assert owner.received.count("confirm_lease") == 1
    after = owner.received[owner.received.index("confirm_lease") + 1 :]
    assert "commit" not in after  # no result: nothing ran (the lease is offered back, which an owner refuses)


async def test_a_manual_call_is_confirmed_even_after_a_prompt_acknowledgement(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A manual call's cut-off needs a person: its lease is confirmed before its handler whatever the timing, and a
    lease the owner no longer holds starts nothing."""
    owner = LeasingOwner(ack_delay_s=0.0, live=False)
    assert await _serve_one_call(owner, "manual") == []
    assert owner.received.count("confirm_lease") == 1


@pytest.mark.parametrize(("recovery", "asked"), [("safe", 0), ("report", 1)])
async def test_a_live_lease_starts_the_call_and_costs_a_round_trip_only_where_it_must(
    autojump_clock: trio.testing.MockClock, recovery: actors.Recovery, asked: int
) -> None:
    """A prompt acknowledgement: a safe call starts at once, with no question asked; a report call asks, hears the
    lease is live, and starts."""
    owner = LeasingOwner(ack_delay_s=0.0, live=True)
    assert len(await _serve_one_call(owner, recovery)) == 1
    assert owner.received.count("confirm_lease") == asked
