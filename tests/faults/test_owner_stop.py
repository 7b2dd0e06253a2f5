"""Stopping closes what the owner opened whatever else fails.

The issue's case is a database directory made read-only while the owner runs: SIGTERM then fails to remove the
runtime file, and that failure used to skip closing the store. Tests run as root here, which a read-only
directory does not stop, so the removal's failure is injected where it happens (the OS call's ``PermissionError``);
the owner itself runs for real in this process.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import trio

import actors
from protocol import runtime_path
from storage_owner.io import OwnerConfig, OwnerServer, _server
from storage_owner.store import Ownership, SqliteStore


def _refuse_removal(db: str | os.PathLike[str], *, instance: str) -> None:
    raise PermissionError(13, "Permission denied (injected: a read-only directory)", str(runtime_path(db)))


async def test_stop_closes_the_store_and_releases_ownership_when_the_runtime_file_cannot_be_removed(
    db_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_server, "remove_runtime", _refuse_removal)
    lines: list[str] = []
    server = OwnerServer(OwnerConfig(db=db_path), log=lines.append)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(server.run)
            async with actors.connect(url=url, token=server.token) as client:
                conversation_id = await client.create_conversation()
                await client.append(conversation_id, kind="test.n", data=1)
            assert os.path.exists(db_path + "-wal")
            nursery.cancel_scope.cancel(reason="SIGTERM, as the test has it")
    # The store was closed cleanly: its WAL was copied back and removed, so the database file alone holds it all.
    assert not os.path.exists(db_path + "-wal")
    assert runtime_path(db_path).exists()  # what could not be removed is left, and harmless
    alone = str(tmp_path / "copy" / "alone.db")
    os.mkdir(os.path.dirname(alone))
    shutil.copyfile(db_path, alone)
    copy = SqliteStore.open(alone)
    try:
        assert copy.next_entry_position(conversation_id) == 1
    finally:
        copy.close()
    Ownership.acquire(db_path, started_at_ms=0, instance="next").release()  # and ownership was given back
