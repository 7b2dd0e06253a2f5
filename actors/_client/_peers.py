"""The client's calls of peers: who is attached, what a worker tells the owner, the owner's clock."""

from __future__ import annotations

from collections.abc import Sequence

from protocol import (
    AdvanceClock,
    Announce,
    ClockReply,
    ConfirmLease,
    LeaseRef,
    Ok,
    PeerInfo,
    PeersReply,
    Ping,
    Pong,
    ReadPeers,
    Release,
)

from ._base import BaseClient
from ._pages import read_pages


class PeerCalls(BaseClient):
    """Peers, a worker's announcement and releases, pings and a manual clock (a part of :class:`~actors.Client`)."""

    async def peers(self) -> list[PeerInfo]:
        """The connections attached to the owner: clients, readers and workers with what they announced, by peer
        id (read page by page: a peer attached or gone between two pages may be in the list or not)."""

        async def page(after: int | None) -> tuple[Sequence[PeerInfo], int | None]:
            reply = await self.connection.call(ReadPeers(after_peer_id=after), PeersReply)
            return reply.peers, reply.next_after_peer_id

        return await read_pages(page, "read_peers")

    async def announce(self, announcement: Announce) -> None:
        """Tell the owner what this worker runs (role ``worker`` only). Used by :func:`actors.serve`."""
        await self.connection.call(announcement, Ok)

    async def release(self, lease: LeaseRef, *, migration_error: str | None = None, closing: bool = False) -> None:
        """Give a lease back without a new state (role ``worker`` only; used by :func:`actors.serve`): the task is
        pending again, no restart counted. ``migration_error`` says why this worker could not run the stored task;
        ``closing``, that the worker stopped the phase because it is closing (a model request it left open is sent
        again as the same attempt, docs/runs.md). :class:`~protocol.StaleLease` if the lease is not current any more.
        A checkpoint."""
        await self.connection.call(Release(lease=lease, migration_error=migration_error, closing=closing), Ok)

    async def confirm_lease(self, lease: LeaseRef) -> None:
        """Return if the owner still holds ``lease`` for this connection (role ``worker`` only); raise
        :class:`~protocol.StaleLease` if it gave the task to someone else or is cancelling it, and
        :class:`~protocol.ConnectionLost` if the connection ended first (the lease ended with it). A checkpoint."""
        await self.connection.call(ConfirmLease(lease=lease), Ok)

    async def ping(self) -> Pong:
        """A round trip to the owner: its clock and newest ``seq``."""
        return await self.connection.call(Ping(), Pong)

    async def advance_clock(self, by_ms: int) -> int:
        """Move a manual owner clock forward and return its new time (owners run with ``--clock manual``)."""
        reply = await self.connection.call(AdvanceClock(by_ms=by_ms), ClockReply)
        return reply.now_ms
