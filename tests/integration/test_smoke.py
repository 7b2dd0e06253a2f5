from __future__ import annotations

import trio

import actors
from tests.conftest import OwnerProcess


async def test_append_then_read_back(owner: OwnerProcess) -> None:
    with trio.fail_after(20):
        async with actors.connect(db=owner.db) as client:
            conversation_id = await client.create_conversation()
            seq = await client.append(conversation_id, kind="app.note", data={"n": 1})
            entries = await client.entries(conversation_id)
    assert [(entry.seq, entry.kind, entry.data) for entry in entries] == [(seq, "app.note", {"n": 1})]
