"""Deterministic kills around a COMMIT (``--fault-kill-before-commit K`` / ``--fault-kill-after-commit K``): a
write is durable exactly when its COMMIT returned, whether or not its acknowledgement got out."""

from __future__ import annotations

import signal

import pytest
import trio

import actors
from tests.conftest import OwnerProcess


async def prepare(db_path: str) -> str:
    """A conversation created by an owner without faults (its COMMIT must not count towards K)."""
    owner = OwnerProcess(db_path)
    try:
        await owner.start()
        async with actors.connect(db=db_path) as client:
            conversation_id = await client.create_conversation()
        assert await owner.stop() == 0
    finally:
        await owner.close()
    return conversation_id


@pytest.mark.parametrize("fault", ["--fault-kill-before-commit", "--fault-kill-after-commit"])
@pytest.mark.parametrize("k", [1, 3])
async def test_kth_append_is_lost_or_kept_by_the_kill_point(db_path: str, fault: str, k: int) -> None:
    faulty = OwnerProcess(db_path, fault, str(k))
    healthy = OwnerProcess(db_path)
    entry_ids = [actors.new_id() for _ in range(k)]
    try:
        with trio.fail_after(40):
            conversation_id = await prepare(db_path)
            await faulty.start()
            acknowledged = []
            async with actors.connect(db=db_path, reconnect=False) as client:
                for entry_id in entry_ids[:-1]:
                    acknowledged.append(
                        await client.append(conversation_id, kind="app.note", data=entry_id, entry_id=entry_id)
                    )
                with pytest.raises(actors.ConnectionLost):
                    await client.append(conversation_id, kind="app.note", data=entry_ids[-1], entry_id=entry_ids[-1])
            status = await faulty.wait()

            await healthy.start()
            async with actors.connect(db=db_path) as client:
                stored = await client.entries(conversation_id)
                head = (await client.ping()).head_seq
                if fault == "--fault-kill-after-commit":
                    with pytest.raises(actors.Duplicate):
                        await client.append(conversation_id, kind="app.note", entry_id=entry_ids[-1])
                else:
                    retried = await client.append(conversation_id, kind="app.note", entry_id=entry_ids[-1])
                    assert retried == head + 1
                final = await client.entries(conversation_id)
    finally:
        await faulty.close()
        await healthy.close()
    assert status == -signal.SIGKILL
    assert [entry.seq for entry in stored[: k - 1]] == acknowledged
    if fault == "--fault-kill-before-commit":
        assert [entry.entry_id for entry in stored] == entry_ids[:-1]
        assert head == k  # the conversation's commit and the K-1 acknowledged appends
    else:
        assert [entry.entry_id for entry in stored] == entry_ids
        assert head == k + 1
        assert stored[-1].seq == head
    assert [entry.entry_id for entry in final] == entry_ids


@pytest.mark.parametrize("fault", ["--fault-kill-before-commit", "--fault-kill-after-commit"])
async def test_multi_write_commit_is_all_or_nothing_at_the_kill_point(db_path: str, fault: str) -> None:
    faulty = OwnerProcess(db_path, fault, "2")
    healthy = OwnerProcess(db_path)
    try:
        with trio.fail_after(40):
            conversation_id = await prepare(db_path)
            await faulty.start()
            async with actors.connect(db=db_path, reconnect=False) as client:
                other = await client.create_conversation()
                with pytest.raises(actors.ConnectionLost):
                    async with client.commit() as tx:
                        first = tx.append(conversation_id, kind="app.note", data=1)
                        second = tx.append(other, kind="app.note", data=2)
                        tx.put_document("state", {"done": True}, conversation_id=conversation_id)
                        tx.put_document("global", 1)
            status = await faulty.wait()
            await healthy.start()
            async with actors.connect(db=db_path) as client:
                found = [
                    [entry.entry_id for entry in await client.entries(conversation_id)],
                    [entry.entry_id for entry in await client.entries(other)],
                    await client.document("state", conversation_id=conversation_id),
                    await client.document("global"),
                ]
                head = (await client.ping()).head_seq
    finally:
        await faulty.close()
        await healthy.close()
    assert status == -signal.SIGKILL
    if fault == "--fault-kill-before-commit":
        assert found == [[], [], None, None]
        assert head == 2
    else:
        entries_a, entries_b, state, shared = found
        assert (entries_a, entries_b) == ([first], [second])
        assert state is not None and state.value == {"done": True} and state.seq == 3
        assert shared is not None and shared.version == 1 and shared.seq == 3
        assert head == 3
