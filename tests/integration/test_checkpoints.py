"""The owner copies its WAL back into the database while it runs: under sustained writes the WAL stays bounded and
the database file grows (it does not wait for a clean stop)."""

from __future__ import annotations

import os

import trio

import actors
from storage_owner.store import CHECKPOINT_START_PAGES
from tests.conftest import OwnerProcess

PAGE_BYTES = 4096
WAL_BOUND_BYTES = 4 * CHECKPOINT_START_PAGES * PAGE_BYTES
"""Well above what the owner lets the WAL reach (about CHECKPOINT_START_PAGES pages and what commits while one
checkpoint runs), well below what 12,000 appends write without checkpoints (about 90 MB)."""
DATABASE_GROWN_BYTES = 1 << 20
"""12,000 appends fill about 5 MB of database pages; without checkpoints the file stays at its first page or two."""
APPENDS = 12_000
APPENDERS = 16


def _size(path: str) -> int:
    return os.path.getsize(path) if os.path.exists(path) else 0


async def test_the_wal_stays_bounded_under_sustained_writes_while_the_database_grows(db_path: str) -> None:
    owner = OwnerProcess(db_path)
    largest_wal = 0
    try:
        with trio.fail_after(60):
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
