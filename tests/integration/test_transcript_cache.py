"""The worker's transcript cache (actors/_transcript.py) against real owners: it returns what a whole read returns,
asks the owner only for what is new, notices a prefix that is not the owner's, and holds its bounds."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import actors
from actors._transcript import TranscriptCache
from tests.conftest import OwnerProcess


async def test_reads_only_the_entries_after_the_cached_ones(owner: OwnerProcess) -> None:
    cache = TranscriptCache()
    with trio.fail_after(30):
        async with actors.connect(db=owner.db) as client:
            conversation_id = await client.create_conversation()
            first = await cache.entries(client, conversation_id)
            assert first == [] and cache.entries_read == 0 and cache.cached(conversation_id) == 0
            for n in range(5):
                await client.append(conversation_id, kind="app.note", data={"n": n})
            assert await cache.entries(client, conversation_id) == await client.entries(conversation_id)
            assert cache.entries_read == 5
            async with client.commit() as tx:
                for n in range(5, 8):
                    tx.append(conversation_id, kind="app.note", data={"n": n})
            entries = await cache.entries(client, conversation_id)
            assert entries == await client.entries(conversation_id)
            assert cache.entries_read == 5 + 1 + 3  # the last cached entry again, then the three new ones
            assert await cache.entries(client, conversation_id) == entries
            assert cache.entries_read == 5 + 4 + 1  # nothing new: only the overlap
            # More than a page (500 entries) after the cached prefix: read in pages, still whole and in order.
            async with client.commit() as tx:
                for n in range(8, 1208):
                    tx.append(conversation_id, kind="app.note", data=n)
            assert await cache.entries(client, conversation_id) == await client.entries(conversation_id)
    assert [entry.position for entry in entries] == list(range(8))
    assert cache.cached(conversation_id) == 1208 and cache.size == 1208


async def test_a_prefix_from_another_database_is_dropped_and_read_whole(owner: OwnerProcess, tmp_path: Path) -> None:
    other = OwnerProcess(str(tmp_path / "other.db"))
    await other.start()
    cache = TranscriptCache()
    try:
        with trio.fail_after(30):
            async with actors.connect(db=owner.db) as first, actors.connect(db=other.db) as second:
                conversation_id = await first.create_conversation()
                await second.create_conversation(conversation_id)  # the same id, another transcript
                for n in range(3):
                    await first.append(conversation_id, kind="app.note", data={"db": "first", "n": n})
                for n in range(5):
                    await second.append(conversation_id, kind="app.note", data={"db": "second", "n": n})
                assert len(await cache.entries(first, conversation_id)) == 3
                # Longer there, but its entry at the last cached position is another entry.
                assert await cache.entries(second, conversation_id) == await second.entries(conversation_id)
                # Shorter there than the cached prefix: nothing after it, so read whole.
                for n in range(3, 7):
                    await first.append(conversation_id, kind="app.note", data={"db": "first", "n": n})
                assert await cache.entries(first, conversation_id) == await first.entries(conversation_id)
                assert [entry.data for entry in await cache.entries(first, conversation_id)] == [
                    {"db": "first", "n": n} for n in range(7)
                ]
    finally:
        await other.close()


async def test_bounds_hold(owner: OwnerProcess) -> None:
    cache = TranscriptCache(max_conversations=2, max_entries=10)
    with trio.fail_after(30):
        async with actors.connect(db=owner.db) as client:
            ids = [await client.create_conversation() for _ in range(4)]
            for index, conversation_id in enumerate(ids):
                async with client.commit() as tx:
                    for n in range(4 if index < 3 else 11):
                        tx.append(conversation_id, kind="app.note", data=n)
            for conversation_id in ids[:3]:
                assert len(await cache.entries(client, conversation_id)) == 4
                assert cache.size <= 10 and cache.cached(conversation_id) == 4
            # At most two conversations: the least recently read one went first.
            assert cache.cached(ids[0]) is None and cache.cached(ids[1]) == 4 and cache.size == 8
            # Three cached entries more would pass ten entries in all: the older conversation goes.
            async with client.commit() as tx:
                for n in range(4, 7):
                    tx.append(ids[2], kind="app.note", data=n)
            assert len(await cache.entries(client, ids[2])) == 7
            assert cache.cached(ids[1]) is None and cache.size == 7
            # A transcript longer than the whole bound is returned whole and not cached.
            assert len(await cache.entries(client, ids[3])) == 11
            assert cache.cached(ids[3]) is None and cache.size == 7


def test_a_cache_holds_something() -> None:
    with pytest.raises(ValueError, match="at least one"):
        TranscriptCache(max_entries=0)
