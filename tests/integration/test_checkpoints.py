"""The owner copies its WAL back into the database while it runs, off its commit path: under sustained writes the WAL
stays bounded and the database file grows (it does not wait for a clean stop), a batch commits while a checkpoint
copies, and a writer that is never idle still gets its WAL started over."""

from __future__ import annotations

import os
import threading

import pytest
import trio

import actors
from storage_owner.io import OwnerConfig, OwnerServer
from storage_owner.io import _server as server_module
from storage_owner.store import CHECKPOINT_START_PAGES, Checkpointer
from tests.conftest import OwnerProcess

PAGE_BYTES = 4096
WAL_BOUND_BYTES = 4 * CHECKPOINT_START_PAGES * PAGE_BYTES
"""The bound docs/operations.md states (32 MB; issue 20 asks for less than 96 MiB): well above what the owner lets
the WAL reach (CHECKPOINT_HOLD_PAGES pages at most, and what commits during one pass of the checkpoint thread), well
below what 20,000 appends write without checkpoints (about 150 MB)."""
DATABASE_GROWN_BYTES = 1 << 20
"""20,000 appends fill about 8 MB of database pages; without checkpoints the file stays at its first page or two."""
APPENDS = 20_000
APPENDERS = 64


def _size(path: str) -> int:
    return os.path.getsize(path) if os.path.exists(path) else 0


async def test_the_wal_stays_bounded_under_sustained_writes_while_the_database_grows(db_path: str) -> None:
    owner = OwnerProcess(db_path)
    largest_wal = 0
    try:
        with trio.fail_after(90):
            await owner.start()
            async with actors.connect(db=db_path) as client:
                conversation_id = await client.create_conversation()
                left = APPENDS

                async def append_until_done() -> None:
                    nonlocal left, largest_wal
                    while left > 0:
                        left -= 1
                        await client.append(conversation_id, kind="app.note", data={"n": left})
                        largest_wal = max(largest_wal, _size(db_path + "-wal"))

                async with trio.open_nursery() as nursery:
                    for _ in range(APPENDERS):
                        nursery.start_soon(append_until_done)
                database_bytes = _size(db_path)  # while the owner still runs: no stop has checkpointed yet
            assert largest_wal < WAL_BOUND_BYTES
            assert database_bytes > DATABASE_GROWN_BYTES
    finally:
        await owner.close()


# ----------------------------------------------------------------------------------------------------------------
# The owner's shell in this process, with its checkpointer's passes under the test's control.


class _Passes:
    """Wraps each checkpointer the owner opens: every pass but the first waits on the thread until :attr:`gate` is
    open (a pass that copies as slowly as the test likes); :attr:`entered` is set once a pass waits there."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.count = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real = Checkpointer.checkpoint

        def checkpoint(checkpointer: Checkpointer) -> tuple[int, int] | None:
            self.count += 1
            if self.count > 1:
                self.entered.set()
                self.gate.wait(timeout=30)  # bounded: a failed test never leaves the owner's stop waiting for ever
            return real(checkpointer)

        monkeypatch.setattr(Checkpointer, "checkpoint", checkpoint)


async def test_batches_commit_while_a_pass_of_the_checkpoint_copies_the_tail(
    db_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pass that copies the tail (the second: writes went on during the first) runs on the checkpoint thread:
    however long it takes, the commit loop commits batches meanwhile."""
    passes = _Passes()
    passes.install(monkeypatch)
    monkeypatch.setattr(server_module, "CHECKPOINT_START_PAGES", 20)  # a checkpoint after a few commits
    server = OwnerServer(OwnerConfig(db=db_path, clock="manual"), log=lambda line: None)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(server.run)
            async with actors.connect(url=url, token=server.token) as client:
                conversation_id = await client.create_conversation()
                while not passes.entered.is_set():  # each append during a pass makes the one after it
                    await client.append(conversation_id, kind="app.note", data="before")
                for number in range(30):
                    await client.append(conversation_id, kind="app.note", data=number)
                assert not passes.gate.is_set()  # all 30 committed while the pass was still copying
                passes.gate.set()
                assert len(await client.entries(conversation_id)) >= 31
            nursery.cancel_scope.cancel(reason="the test is over")


async def test_a_writer_that_is_never_idle_gets_its_wal_started_over_past_the_hold_bound(
    db_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass that the commit loop does not hold never ends here with every frame copied and no transaction begun
    meanwhile (as under a writer that is never idle): it copies nothing. So only a held pass lets the WAL start over:
    past CHECKPOINT_HOLD_PAGES the loop holds its next batch for one pass, and the transaction after it restarts it."""
    hold_pages = 40
    real = Checkpointer.checkpoint
    server = OwnerServer(OwnerConfig(db=db_path, clock="manual"), log=lambda line: None)

    def checkpoint(checkpointer: Checkpointer) -> tuple[int, int] | None:
        if server._held is None:
            frames = server._store.wal_pages
            return frames, frames  # overtaken: the owner's next transaction began before it ended
        return real(checkpointer)

    monkeypatch.setattr(Checkpointer, "checkpoint", checkpoint)
    monkeypatch.setattr(server_module, "CHECKPOINT_START_PAGES", 1)
    monkeypatch.setattr(server_module, "CHECKPOINT_HOLD_PAGES", hold_pages)
    largest_wal_pages = 0
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(server.run)
            async with actors.connect(url=url, token=server.token) as client:
                conversation_id = await client.create_conversation()
                for number in range(300):
                    await client.append(conversation_id, kind="app.note", data={"n": number, "text": "x" * 2000})
                    largest_wal_pages = max(largest_wal_pages, server._store.wal_pages)
                restarts = server._store.wal_restarts
            nursery.cancel_scope.cancel(reason="the test is over")
    assert restarts >= 3  # none without the hold
    # The hold bound plus what commits during one pass (a loaded machine stretches a thread's hop over tens of these
    # commits), far below the 1,800 pages or so that the 300 appends write without a restart.
    assert largest_wal_pages < 8 * hold_pages
