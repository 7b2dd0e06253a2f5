"""What every part of :class:`~actors.Client` stands on: the connection, a commit, a watch, a long-poll wait."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import TypeVar

from protocol import Commit, Committed, ConnectionLost, LeaseRef, Request, Welcome, Write

from ._connection import Connection
from ._transaction import Transaction
from ._watch import WatchStream

_R = TypeVar("_R")


class BaseClient:
    """The connection under a client, and the calls every part of :class:`~actors.Client` uses: a commit, a watch, a
    long-poll wait."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        """The connection layer under this client (see ``actors/_client/_connection.py`` for its surface)."""

    @property
    def welcome(self) -> Welcome | None:
        """The owner's last ``Welcome`` (its instance, clock and head ``seq`` at connect time)."""
        return self.connection.welcome

    @property
    def reconnects(self) -> int:
        """How many times the connection was re-established."""
        return self.connection.reconnects

    @contextlib.asynccontextmanager
    async def commit(self) -> AsyncIterator[Transaction]:
        """Collect writes and apply them as one atomic commit when the block exits without an exception.

        ``tx.seq`` and ``tx.results`` are set once the commit is durable.
        """
        tx = Transaction()
        yield tx
        if tx.writes:
            committed = await self.commit_writes(tx.writes)
            tx.seq = committed.seq
            tx.results = committed.results

    async def commit_writes(self, writes: Sequence[Write], *, lease: LeaseRef | None = None) -> Committed:
        """Apply ``writes`` as one atomic commit and return the owner's ``Committed`` (the commit's ``seq`` and each
        write's result) once durable: what :meth:`commit` sends, for writes collected elsewhere. A worker's phase
        commits under its ``lease``: once the lease has ended the whole commit is refused
        (:class:`~protocol.StaleLease`) and nothing of it lands. A checkpoint."""
        return await self.connection.call(Commit(writes=tuple(writes), lease=lease), Committed)

    def watch(self, *, conversation_id: str | None = None, from_seq: int = 0) -> WatchStream:
        """Every commit after ``from_seq`` touching ``conversation_id`` (every commit when ``None``), in order.

        Use as ``async for change in client.watch(...)``, or ``async with`` it to unsubscribe on exit.
        """
        return WatchStream(self.connection, conversation_id, from_seq)

    async def _wait(self, request: Request, expected: type[_R]) -> _R:
        """Make a long-poll ``request`` until it is answered, asking again after each lost connection; raise
        :class:`ConnectionLost` once the connection cannot come back (closed, ``reconnect=False``, refused)."""
        while True:
            try:
                return await self.connection.call(request, expected)
            except ConnectionLost:
                if not self.connection.can_reconnect():
                    raise  # closed, or reconnect=False: asking again would fail again at once, forever
