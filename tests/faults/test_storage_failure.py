"""A storage error fails the owner closed: nothing of the failed batch is acknowledged or stored, the owner exits
non-zero, and a restarted owner recovers from the committed state."""

from __future__ import annotations

import pytest
import trio

import actors
from tests.conftest import OwnerProcess


async def test_storage_error_fails_the_owner_closed(db_path: str) -> None:
    owner = OwnerProcess(db_path)
    try:
        with trio.fail_after(30):
            # Writing commits: 1 creates the conversation, 2 is the first append, 3 fails.
            await owner.start("--fault-storage-error-at-commit", "3")
            async with actors.connect(db=db_path, reconnect=False) as client:
                conversation_id = await client.create_conversation()
                acknowledged = await client.append(conversation_id, kind="app.note", data="kept")
                with pytest.raises(actors.StorageError, match="injected storage failure"):
                    await client.append(conversation_id, kind="app.note", data="lost")
            assert await owner.wait() == 1

            await owner.start()
            async with actors.connect(db=db_path) as client:
                entries = await client.entries(conversation_id)
                pong = await client.ping()
            assert [(entry.seq, entry.data) for entry in entries] == [(acknowledged, "kept")]
            assert pong.head_seq == acknowledged
    finally:
        await owner.close()


async def test_requests_pending_behind_a_failed_batch_get_storage_failed(db_path: str) -> None:
    owner = OwnerProcess(db_path)
    try:
        with trio.fail_after(30):
            await owner.start("--fault-storage-error-at-commit", "2")
            outcomes: list[str] = []
            async with actors.connect(db=db_path, reconnect=False) as client:
                conversation_id = await client.create_conversation()

                async def append(number: int) -> None:
                    try:
                        await client.append(conversation_id, kind="app.note", data=number)
                        outcomes.append("acknowledged")
                    except actors.StorageError:
                        outcomes.append("storage_failed")
                    except actors.ConnectionLost:
                        outcomes.append("lost")

                async with trio.open_nursery() as nursery:
                    for number in range(50):
                        nursery.start_soon(append, number)
            assert await owner.wait() == 1
            assert "acknowledged" not in outcomes
            assert outcomes.count("storage_failed") >= 1

            await owner.start()
            async with actors.connect(db=db_path) as client:
                assert await client.entries(conversation_id) == []
    finally:
        await owner.close()
