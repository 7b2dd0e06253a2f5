"""``client.watch(...)``: an ordered stream of commits that survives reconnections without gaps or duplicates."""

from __future__ import annotations

from collections import deque
from typing import Final

import trio

from protocol import Change, ConnectionLost, TetherError, Unwatch, Watch, Watching

from ._connection import Connection

WATCH_BUFFER_LIMIT: Final = 10_000
"""Changes a watch holds for a slow consumer before it stops receiving and re-reads from the log later."""


class WatchStream:
    """An ordered stream of :class:`~protocol.Change` for one watch; survives reconnects without gaps."""

    def __init__(self, connection: Connection, conversation_id: str | None, from_seq: int) -> None:
        self._connection = connection
        self.conversation_id = conversation_id
        self._buffered_seq = from_seq
        """The newest seq put in the buffer: where a resubscription resumes."""
        self.last_seq = from_seq
        """The newest seq handed to the consumer."""
        self._buffer: deque[Change] = deque()
        self._ready = trio.Event()
        self._watch_id: int | None = None
        self._subscribed = False
        self._lagging = False
        self._closed = False

    async def __aenter__(self) -> WatchStream:
        await self._subscribe()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __aiter__(self) -> WatchStream:
        return self

    async def __anext__(self) -> Change:
        if not self._subscribed:
            await self._subscribe()
        while not self._buffer:
            if self._closed:
                raise StopAsyncIteration
            if self._lagging:
                self._lagging = False
                await self._subscribe()
                continue
            self._ready = trio.Event()
            await self._ready.wait()
        change = self._buffer.popleft()
        self.last_seq = change.seq
        return change

    async def aclose(self) -> None:
        """Stop the watch. Buffered changes are dropped."""
        self._closed = True
        self._ready.set()
        self._unsubscribe()

    async def _subscribe(self) -> None:
        self._subscribed = True
        request = self._new_subscription()
        try:
            await self._connection.call(request, Watching)
        except ConnectionLost:
            pass  # resubscribed from the buffered seq when the connection returns
        except TetherError:
            self._drop_subscription()
            raise

    def resume(self) -> None:
        """The connection was re-established: subscribe again from where the buffer ends (called by the
        connection; see :class:`~actors._client._connection.WatchSubscriber`)."""
        if self._closed or not self._subscribed or self._lagging:
            return
        self._connection.send_nowait(self._new_subscription())

    def _new_subscription(self) -> Watch:
        """Register under a fresh watch id (a late change of an old subscription is then ignored) and return the
        request that subscribes from where the buffer ends."""
        self._drop_subscription()
        watch_id = self._connection.add_watch(self)
        self._watch_id = watch_id
        return Watch(watch_id=watch_id, conversation_id=self.conversation_id, from_seq=self._buffered_seq)

    def _unsubscribe(self) -> None:
        """Forget the subscription and tell the owner, if it can be told."""
        watch_id = self._watch_id
        self._drop_subscription()
        if watch_id is not None and self._connection.is_up:
            self._connection.send_nowait(Unwatch(watch_id=watch_id))

    def _drop_subscription(self) -> None:
        if self._watch_id is not None:
            self._connection.remove_watch(self._watch_id)
            self._watch_id = None

    def deliver(self, change: Change) -> None:
        """A change pushed for this watch (called by the connection)."""
        if change.seq <= self._buffered_seq or self._lagging:
            return
        if len(self._buffer) >= WATCH_BUFFER_LIMIT:
            # The consumer is slow: stop receiving, and re-read from the log once the buffer has drained.
            self._lagging = True
            self._unsubscribe()
            self._ready.set()
            return
        self._buffer.append(change)
        self._buffered_seq = change.seq
        self._ready.set()
