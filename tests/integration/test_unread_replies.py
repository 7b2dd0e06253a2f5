"""A peer that keeps sending requests but never reads the replies is dropped before its output grows without bound;
everyone else keeps being served."""

from __future__ import annotations

import trio

import actors
import protocol
from tests.conftest import OwnerProcess
from tests.integration._wire import hello, raw_connection

ENTRY_BYTES = 50_000
ENTRIES = 10  # a page of them is about 500 kB of replies
PAGES_ASKED = 200  # about 100 MB of replies, past the owner's 64 MiB limit of unread output


async def test_a_peer_that_never_reads_its_replies_is_dropped(owner: OwnerProcess) -> None:
    assert owner.info is not None
    with trio.fail_after(60):
        async with actors.connect(db=owner.db) as client:
            conversation_id = await client.create_conversation()
            async with client.commit() as tx:
                for _ in range(ENTRIES):
                    tx.append(conversation_id, kind="app.blob", data="z" * ENTRY_BYTES)

            async with raw_connection(owner.info.url) as ws:
                await ws.send_message(hello(owner.info.token))
                protocol.decode_frame(await ws.get_message())  # the Welcome; nothing is read after it
                requests = [
                    protocol.encode_frame(
                        protocol.ReadEntries(conversation_id=conversation_id, order="asc", cursor=None, limit=1000),
                        call_id=call_id,
                    )
                    for call_id in range(PAGES_ASKED)
                ]
                for start in range(0, PAGES_ASKED, 50):
                    await ws.send_message(protocol.join_frames(requests[start : start + 50]))

                # Dropped for its unread output, well before the heartbeat timeout (10 s) would drop it as silent.
                with trio.fail_after(5):
                    while any(peer.peer_name == "raw" for peer in await client.peers()):  # noqa: ASYNC110
                        await trio.sleep(0.05)

            # The owner is still serving: a write and a read by the well-behaved client.
            seq = await client.append(conversation_id, kind="app.note", data="after")
            entries = await client.entries(conversation_id)
    assert entries[-1].seq == seq
    assert len(entries) == ENTRIES + 1
