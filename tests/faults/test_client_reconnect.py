"""The client when its owner dies in the middle of a send: the calls in flight fail with ConnectionLost and the
client reconnects by itself, whichever of its send or receive loops notices the dead connection first."""

from __future__ import annotations

import signal

import trio
import trio.testing

import actors
from tests.conftest import OwnerProcess

CLIENTS = 4
BIG_APPENDS = 8
BIG = "x" * 900_000
"""Eight of these per client fill the loopback socket buffers, so the client's sender blocks mid-send."""
TRIALS = 5


async def kill_owner_mid_send(owner: OwnerProcess, conversation_id: str) -> list[str]:
    """One trial: stop the owner, let clients block sending big appends to it, SIGKILL and restart it, then use
    the same clients again. Returns each big append's outcome."""
    outcomes: list[str] = []

    async def big_append(client: actors.Client) -> None:
        try:
            await client.append(conversation_id, kind="app.big", data=BIG)
            outcomes.append("acknowledged")
        except actors.ConnectionLost:
            outcomes.append("lost")

    async def run_client(ready: trio.Semaphore, stopped: trio.Event, killed: trio.Event, restarted: trio.Event) -> None:
        async with actors.connect(db=owner.db) as client:
            await client.ping()
            ready.release()
            await stopped.wait()
            async with trio.open_nursery() as nursery:
                for _ in range(BIG_APPENDS):
                    nursery.start_soon(big_append, client)
                await killed.wait()
            await restarted.wait()
            await client.ping()
            assert client.reconnects >= 1

    ready = trio.Semaphore(0, max_value=CLIENTS)
    stopped, killed, restarted = trio.Event(), trio.Event(), trio.Event()
    assert owner.process is not None
    try:
        async with trio.open_nursery() as nursery:
            for _ in range(CLIENTS):
                nursery.start_soon(run_client, ready, stopped, killed, restarted)
            for _ in range(CLIENTS):
                await ready.acquire()
            owner.process.send_signal(signal.SIGSTOP)
            stopped.set()
            # Every task here blocked: the big appends are queued and each client's sender waits on socket
            # buffers the stopped owner no longer drains (a condition to wait for, not a guessed duration).
            await trio.testing.wait_all_tasks_blocked()
            assert await owner.kill() == -signal.SIGKILL
            killed.set()
            await owner.start()
            restarted.set()
    finally:
        if owner.process.returncode is None and not restarted.is_set():
            await owner.kill()  # a stopped owner would ignore the fixture's SIGTERM
    return outcomes


async def test_client_reconnects_when_the_owner_dies_mid_send(owner: OwnerProcess) -> None:
    with trio.fail_after(60):
        async with actors.connect(db=owner.db) as client:
            conversation_id = await client.create_conversation()
        for _ in range(TRIALS):
            outcomes = await kill_owner_mid_send(owner, conversation_id)
            assert outcomes == ["lost"] * (CLIENTS * BIG_APPENDS)
        async with actors.connect(db=owner.db) as client:
            entries = await client.entries(conversation_id)
    assert entries == [], "nothing was sent to a stopped owner, so nothing may be stored"
