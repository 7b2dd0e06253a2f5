"""The worker's transcript cache (actors/_worker/_transcript.py) against real owners: it returns what a whole read
returns, asks the owner only for what is new, notices a prefix that is not the owner's, and holds its bounds."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import actors
from actors._worker._transcript import TranscriptCache, encoded_size
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


async def test_the_byte_bound_holds_and_counts_the_memos(owner: OwnerProcess) -> None:
    cache = TranscriptCache(max_bytes=50_000)
    with trio.fail_after(30):
        async with actors.connect(db=owner.db) as client:
            ids = [await client.create_conversation() for _ in range(3)]
            for index, conversation_id in enumerate(ids):
                async with client.commit() as tx:
                    for _ in range(2 if index < 2 else 6):
                        tx.append(conversation_id, kind="app.note", data="x" * 10_000)
            first = await cache.entries(client, ids[0])
            size = sum(encoded_size(entry) for entry in first)
            assert 20_000 < size < 21_000 and cache.bytes == size and cache.cached(ids[0]) == 2
            await cache.entries(client, ids[1])
            assert cache.bytes == 2 * size
            # What a memo holds is counted; past the bound the least recently read transcript goes, with its memo.
            cache.memo(ids[1])["derived"] = "y" * 5_000
            cache.charge(ids[1], 5_000)
            assert cache.bytes == 2 * size + 5_000 and cache.cached(ids[0]) == 2
            cache.memo(ids[0])["derived"] = "y" * 10_000
            cache.charge(ids[0], 10_000)  # over 50,000 bytes in all: ids[0], read first, goes
            assert cache.cached(ids[0]) is None and cache.memo(ids[0]) == {}
            assert cache.cached(ids[1]) == 2 and cache.bytes == size + 5_000
            cache.charge(ids[1], 1_000)  # a charge replaces the last one
            assert cache.bytes == size + 1_000
            # A transcript past the byte bound alone (six 10 KB entries) is returned whole and not cached.
            whole = await cache.entries(client, ids[2])
            assert len(whole) == 6 and cache.cached(ids[2]) is None and cache.bytes <= cache.max_bytes


async def test_a_read_is_a_view_that_later_reads_do_not_change(owner: OwnerProcess) -> None:
    cache = TranscriptCache()
    with trio.fail_after(30):
        async with actors.connect(db=owner.db) as client:
            conversation_id = await client.create_conversation()
            await client.append(conversation_id, kind="app.note", data=0)
            before = await cache.entries(client, conversation_id)
            await client.append(conversation_id, kind="app.note", data=1)
            after = await cache.entries(client, conversation_id)
            assert len(before) == 1 and len(after) == 2 and after[:1] == list(before) and before[-1] == after[0]
            assert [entry.data for entry in after] == [0, 1] and after == await client.entries(conversation_id)
            with pytest.raises(IndexError):
                before[1]
