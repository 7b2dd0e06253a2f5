"""Watches against a real owner: a backlog longer than one catch-up page then live commits, conversation
filtering, and resuming without gap or duplicate across an owner SIGKILL and restart."""

from __future__ import annotations

import signal

import pytest
import trio

import actors
import protocol
from protocol import EntryRecord
from tests.conftest import OwnerProcess
from tests.integration._wire import attached, receive_frames

BACKLOG = 700
"""Commits written before the watch starts: several of the owner's 256-commit catch-up pages."""
LIVE = 150


async def append_many(client: actors.Client, conversation_id: str, count: int, tasks: int = 25) -> None:
    """``count`` appends (one commit each) from ``tasks`` concurrent tasks."""

    async def worker(share: int) -> None:
        for _ in range(share):
            await client.append(conversation_id, kind="app.note")

    async with trio.open_nursery() as nursery:
        for index in range(tasks):
            nursery.start_soon(worker, count // tasks + (index < count % tasks))


async def collect_until(stream: actors.WatchStream, last_seq: int) -> list[actors.Change]:
    changes: list[actors.Change] = []
    if last_seq <= stream.last_seq:
        return changes
    async for change in stream:
        changes.append(change)
        if change.seq >= last_seq:
            break
    return changes


async def test_watch_from_zero_pages_the_backlog_then_goes_live(owner: OwnerProcess) -> None:
    with trio.fail_after(60):
        async with actors.connect(db=owner.db) as writer, actors.connect(db=owner.db) as watcher:
            conversation_id = await writer.create_conversation()
            await append_many(writer, conversation_id, BACKLOG - 1)
            backlog_head = (await writer.ping()).head_seq
            assert backlog_head == BACKLOG
            async with watcher.watch(from_seq=0) as stream:
                # Live commits race the owner's catch-up of the backlog.
                await append_many(writer, conversation_id, LIVE)
                head = (await writer.ping()).head_seq
                changes = await collect_until(stream, head)
            entries = await writer.entries(conversation_id)
    assert head == BACKLOG + LIVE
    assert [change.seq for change in changes] == list(range(1, head + 1))
    by_seq = {change.seq: change.records for change in changes}
    assert [record.conversation_id for record in by_seq[1]] == [conversation_id]
    for entry in entries:
        (record,) = by_seq[entry.seq]
        assert isinstance(record, EntryRecord) and record.entry_id == entry.entry_id
    assert len(entries) == head - 1


async def test_conversation_watch_gets_only_its_records(owner: OwnerProcess) -> None:
    with trio.fail_after(30):
        async with actors.connect(db=owner.db) as client:
            mine = await client.create_conversation()
            other = await client.create_conversation()
            expected = [(await client.conversation(mine)).seq]
            expected.append(await client.append(mine, kind="app.note", data="mine 1"))
            await client.append(other, kind="app.note", data="other 1")
            await client.put_document("global", 1)
            await client.put_document("local", 1, conversation_id=other)
            await client.put_document("local", 1, conversation_id=mine)
            local = await client.document("local", conversation_id=mine)
            assert local is not None
            expected.append(local.seq)
            async with client.commit() as tx:
                tx.append(other, kind="app.note", data="other 2")
                tx.append(mine, kind="app.note", data="mine 2")
                tx.put_document("global", 2)
            assert tx.seq is not None
            expected.append(tx.seq)
            submitted = await client.submit(mine, kind="app.task", request_id="r1")
            expected.append(submitted.seq)
            await client.submit(other, kind="app.task", request_id="r1")
            head = (await client.ping()).head_seq
            async with client.watch(conversation_id=mine) as mine_stream:
                tail = await client.append(mine, kind="app.note", data="mine 3")
                expected.append(tail)
                await client.append(other, kind="app.note", data="other 3")
                mine_changes = await collect_until(mine_stream, tail)
            await client.ping()
    assert [change.seq for change in mine_changes] == expected
    assert all(record.conversation_id == mine for change in mine_changes for record in change.records)
    assert all(change.records for change in mine_changes)
    mixed = next(change for change in mine_changes if change.seq == tx.seq)
    assert [getattr(record, "data", None) for record in mixed.records] == ["mine 2"]
    assert head + 2 > tail > head


@pytest.mark.parametrize("stop", ["SIGKILL", "SIGTERM"])
async def test_watch_resumes_across_owner_restarts_without_gap_or_duplicate(owner: OwnerProcess, stop: str) -> None:
    kills = 3
    total = 240
    acked: list[str] = []
    progress = trio.Condition()

    async def write(client: actors.Client, conversation_id: str) -> None:
        for n in range(total):
            entry_id = actors.new_id()
            while True:
                try:
                    await client.append(conversation_id, kind="app.note", data=n, entry_id=entry_id)
                    break
                except (actors.ConnectionLost, actors.OwnerUnavailable):
                    continue  # unknown outcome: retry with the same id
                except actors.Duplicate:
                    break  # the lost attempt had landed
            acked.append(entry_id)
            async with progress:
                progress.notify_all()

    async def wait_for_acks(count: int) -> None:
        async with progress:
            while len(acked) < count:
                await progress.wait()

    with trio.fail_after(60):
        async with actors.connect(db=owner.db) as setup:
            conversation_id = await setup.create_conversation()
            created = (await setup.conversation(conversation_id)).seq
        async with actors.connect(db=owner.db) as watcher, actors.connect(db=owner.db) as writer:
            stream = watcher.watch(conversation_id=conversation_id, from_seq=created)
            async with stream:
                seen: list[int] = []
                delivered = trio.Condition()

                async def consume() -> None:
                    async for change in stream:
                        seen.append(change.seq)
                        async with delivered:
                            delivered.notify_all()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(consume)
                    async with trio.open_nursery() as writers:
                        writers.start_soon(write, writer, conversation_id)
                        for kill in range(1, kills + 1):
                            await wait_for_acks(kill * total // (kills + 1))
                            status = await (owner.kill() if stop == "SIGKILL" else owner.stop())
                            assert status == (-signal.SIGKILL if stop == "SIGKILL" else 0)
                            await owner.start()
                    entries = await writer.entries(conversation_id)
                    last = entries[-1].seq
                    async with delivered:
                        while not seen or seen[-1] < last:
                            await delivered.wait()
                    nursery.cancel_scope.cancel()
            await watcher.ping()
    assert [entry.entry_id for entry in entries] == acked
    assert seen == [entry.seq for entry in entries]
    assert watcher.reconnects >= kills and writer.reconnects >= kills


async def test_closing_the_client_right_after_a_watch_is_clean(owner: OwnerProcess) -> None:
    with trio.fail_after(20):
        async with actors.connect(db=owner.db) as client:
            conversation_id = await client.create_conversation()
            async with client.watch(conversation_id=conversation_id) as stream:
                change = await stream.__anext__()
    assert change.records[0].conversation_id == conversation_id


async def test_a_watcher_that_stops_reading_blocks_nobody_and_misses_nothing(owner: OwnerProcess) -> None:
    """A peer that reads nothing while 30 MB of commits go by: writers and other watchers carry on; once it
    reads again it gets every commit, in order, from the owner's log."""
    assert owner.info is not None
    blob = "w" * 100_000
    commits = 300
    with trio.fail_after(60):
        async with attached(owner.info) as stalled, actors.connect(db=owner.db) as client:
            await stalled.send_message(
                protocol.encode_frame(protocol.Watch(watch_id=7, conversation_id=None, from_seq=0), call_id=1)
            )
            conversation_id = await client.create_conversation()
            async with client.watch(conversation_id=conversation_id) as live:
                for _ in range(commits):
                    await client.append(conversation_id, kind="app.blob", data=blob)
                head = (await client.ping()).head_seq
                live_seqs = [change.seq for change in await collect_until(live, head)]
            await client.ping()  # flushes the Unwatch
            frames: list[protocol.Frame] = []
            while not frames or getattr(frames[-1], "seq", None) != head:
                frames.extend(received.frame for received in await receive_frames(stalled, 1))
    watching, *changes = frames
    assert isinstance(watching, protocol.Watching) and watching.watch_id == 7
    assert all(isinstance(change, protocol.Change) and change.watch_id == 7 for change in changes)
    assert [change.seq for change in changes] == list(range(1, head + 1))  # type: ignore[union-attr]
    assert live_seqs == list(range(1, head + 1))
    assert head == commits + 1
