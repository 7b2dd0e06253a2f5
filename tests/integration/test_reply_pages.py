"""Replies that grew with what peers sent, against a real owner (issue 11): ``client.peers()`` with workers that
announced large capability lists, over several pages; an announce past its bound is refused and changes nothing."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
import trio

import actors
from protocol import MAX_ANNOUNCE_BYTES, Announce, Capability, InvalidRequest, encode_frame
from tests.conftest import OwnerProcess

WORKERS = 36
CAPABILITIES = 1200


def capabilities(count: int, tag: str) -> tuple[Capability, ...]:
    return tuple(
        Capability(kind="task", name=f"{tag}.{index:05d}.".ljust(150, "c"), version=1) for index in range(count)
    )


async def test_peers_lists_every_large_announcement_over_several_pages(owner: OwnerProcess) -> None:
    """36 workers of about 245 KB of capabilities each: one ``peers`` reply was 8.8 MB, past the WebSocket layer's
    8 MiB hard limit (the connection closed, and the retry failed the same way); the client now pages."""
    with trio.fail_after(120):
        async with AsyncExitStack() as stack:
            client = await stack.enter_async_context(actors.connect(db=owner.db))
            for index in range(WORKERS):
                worker = await stack.enter_async_context(
                    actors.connect(db=owner.db, role="worker", name=f"big-{index}")
                )
                listed = capabilities(CAPABILITIES, f"w{index}")
                announce = Announce(pid=100 + index, host="h", app="a", capabilities=listed)
                assert len(encode_frame(announce, call_id=1)) <= MAX_ANNOUNCE_BYTES
                await worker.announce(announce)
            peers = await client.peers()
            too_big = Announce(pid=1, host="h", app="a", capabilities=capabilities(2000, "over"))
            with pytest.raises(InvalidRequest, match=str(MAX_ANNOUNCE_BYTES)):
                await worker.announce(too_big)
            assert await client.peers() == peers  # the refused announcement changed nothing
    workers = {peer.peer_name: peer for peer in peers if peer.role == "worker"}
    assert sorted(workers) == sorted(f"big-{index}" for index in range(WORKERS))
    assert all(len(peer.capabilities) == CAPABILITIES for peer in workers.values())
    assert workers["big-7"].pid == 107
    assert [peer.peer_id for peer in peers] == sorted({peer.peer_id for peer in peers})
