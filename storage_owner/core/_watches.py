"""Watches, sans-IO: who is fed which commits, live from the batch that made them or caught up from the log.

1. A new watch first catches up from the commit log, page by page, between batches (:meth:`Watches.catch_up`); it
   turns live once it has read up to the head, and from then on receives each commit that matches it straight from
   the unit of work that logged it (:meth:`Watches.fan_out`). A watch of one conversation starts no earlier than
   the conversation's creation.
2. A congested peer's watches (the shell's send queue for it is over its bound, or the peer is past its output
   budget: ``_output``) stop being live and catch up again from the log once the peer drains, so a slow reader
   never holds memory in the owner and never misses a commit.
3. A connection holds at most :data:`MAX_WATCHES_PER_PEER` watches; a watch id is unique on its connection.
"""

from __future__ import annotations

from typing import Final

import attrs

from protocol import Change, ErrorCode, Frame, Ok, Unwatch, Watch, Watching

from ._checks import Refusal, no_conversation
from ._output import Outbox, PeerId
from ._ports import ConversationReads, LoggedCommit, LogStore
from ._unit import Head

CATCH_UP_PAGE: Final = 256
"""Commits a lagging watch reads from the log per turn of :meth:`Watches.catch_up`."""
CATCH_UP_SCAN_WINDOW: Final = 50_000
"""A conversation watch scans at most this many seqs of the (unindexed) log per turn, so one watch that starts far
back never holds up the commit loop for long."""
MAX_WATCHES_PER_PEER: Final = 64
"""Watches one connection may hold at once; one more is refused ``invalid`` (each is fed every matching commit)."""


@attrs.define(eq=False)
class WatchState:
    peer: PeerId
    watch_id: int
    conversation_id: str | None
    delivered_seq: int
    live: bool = False


class Watches:
    """The watches of one owner's peers: live ones by the conversation they filter on, lagging ones."""

    def __init__(self, store: LogStore, outbox: Outbox, head: Head, *, stored_conversations: ConversationReads) -> None:
        self._store = store
        self._stored_conversations = stored_conversations
        self._outbox = outbox
        self._head = head
        self._by_peer: dict[PeerId, dict[int, WatchState]] = {}
        self._live: dict[str | None, dict[tuple[PeerId, int], WatchState]] = {}
        self._lagging: dict[tuple[PeerId, int], WatchState] = {}
        self._congested: set[PeerId] = set()
        """Peers whose send queue the shell said is over its bound."""

    # ------------------------------------------------------------------------------------------ requests

    def on_watch(self, peer: PeerId, call_id: int, request: Watch, now_ms: int) -> Frame:
        watches = self._by_peer.get(peer, {})
        if request.watch_id in watches:
            message = f"watch id {request.watch_id} is already in use on this connection"
            raise Refusal(ErrorCode.CONFLICT, message)
        if len(watches) >= MAX_WATCHES_PER_PEER:
            message = (
                f"a connection may hold at most {MAX_WATCHES_PER_PEER} watches at once; unwatch one first (watch "
                f"{request.watch_id} was not added)"
            )
            raise Refusal(ErrorCode.INVALID, message)
        head_seq = self._head.seq
        if not 0 <= request.from_seq <= head_seq:
            message = f"from_seq must be between 0 and the newest seq {head_seq}, not {request.from_seq}"
            raise Refusal(ErrorCode.INVALID, message)
        from_seq = request.from_seq
        if request.conversation_id is not None:
            conversation = self._stored_conversations.conversation(request.conversation_id)
            if conversation is None:
                raise Refusal(ErrorCode.NOT_FOUND, no_conversation(request.conversation_id))
            from_seq = max(from_seq, conversation.seq - 1)  # nothing before its creation can touch it (rule 1)
        watch = WatchState(
            peer=peer, watch_id=request.watch_id, conversation_id=request.conversation_id, delivered_seq=from_seq
        )
        self._by_peer.setdefault(peer, watches)[request.watch_id] = watch
        self._lagging[(peer, request.watch_id)] = watch
        return Watching(watch_id=request.watch_id, head_seq=head_seq)

    def on_unwatch(self, peer: PeerId, call_id: int, request: Unwatch, now_ms: int) -> Frame:
        watch = self._by_peer.get(peer, {}).pop(request.watch_id, None)
        if watch is not None:
            self._drop(watch)
        return Ok()

    # ------------------------------------------------------------------------------------------- peers

    def forget_peer(self, peer: PeerId) -> None:
        """A connection ended: its watches end with it."""
        self._congested.discard(peer)
        for watch in self._by_peer.pop(peer, {}).values():
            self._drop(watch)

    def set_congested(self, peer: PeerId, congested: bool) -> None:
        """The shell's send queue for ``peer`` is over (``True``) or back under (``False``) its bound (rule 2)."""
        if congested == (peer in self._congested):
            return
        if not congested:
            self._congested.discard(peer)
            return
        self._congested.add(peer)
        for watch in self._by_peer.get(peer, {}).values():
            if watch.live:
                self._to_lagging(watch)

    @property
    def has_lagging(self) -> bool:
        """Whether :meth:`catch_up` has work for a peer that is not congested."""
        ledger = self._outbox.ledger
        return any(
            watch.peer not in self._congested and not ledger.is_over(watch.peer) for watch in self._lagging.values()
        )

    # ------------------------------------------------------------------------------------------- feeding

    def fan_out(self, logged: LoggedCommit, touched: set[str], packed: bytes) -> None:
        """A commit was logged: every live watch it matches is fed it, but one whose peer is past its output budget,
        which turns lagging and reads it from the log once its peer has read (rule 2). A watch fed every record of
        the commit sends them as the log packed them (``packed``), encoded once for both."""
        if not self._live:
            return
        ledger = self._outbox.ledger
        over: list[WatchState] = []
        for conversation_id in (*touched, None):
            for watch in self._live.get(conversation_id, {}).values():
                if ledger.is_over(watch.peer):
                    over.append(watch)  # not fed: it reads this commit from the log once its peer has read
                    continue
                change = _change(watch, logged)
                whole = len(change.records) == len(logged.records)
                self._outbox.change(watch.peer, change, conversation_id, packed if whole else None)
                watch.delivered_seq = logged.seq
        for watch in over:
            self._to_lagging(watch)

    def catch_up(self) -> None:
        """Feed lagging watches from the commit log, one page each (rule 1). Call between batches, never inside one:
        nothing is being committed meanwhile, so a watch that read up to the head turns live."""
        head = self._head.seq
        ledger = self._outbox.ledger
        for key, watch in list(self._lagging.items()):
            if watch.peer in self._congested or ledger.is_over(watch.peer):
                continue
            until = head if watch.conversation_id is None else min(head, watch.delivered_seq + CATCH_UP_SCAN_WINDOW)
            logged = self._store.read_log(watch.delivered_seq, watch.conversation_id, CATCH_UP_PAGE, until_seq=until)
            delivered = watch.delivered_seq
            for commit in logged:
                if ledger.is_over(watch.peer):
                    break  # the rest is read again once the peer has read what it was sent
                change = _change(watch, commit)
                if change.records:
                    self._outbox.change(watch.peer, change, watch.conversation_id)
                delivered = commit.seq
            else:
                delivered = logged[-1].seq if len(logged) == CATCH_UP_PAGE else until
            watch.delivered_seq = delivered
            if watch.delivered_seq >= head:
                del self._lagging[key]
                watch.live = True
                self._live.setdefault(watch.conversation_id, {})[key] = watch

    def _to_lagging(self, watch: WatchState) -> None:
        """A live watch stops being fed: it catches up from the log (from what it was last sent) instead."""
        key = (watch.peer, watch.watch_id)
        live = self._live[watch.conversation_id]
        live.pop(key)
        if not live:
            del self._live[watch.conversation_id]
        watch.live = False
        self._lagging[key] = watch

    def _drop(self, watch: WatchState) -> None:
        key = (watch.peer, watch.watch_id)
        self._lagging.pop(key, None)
        live = self._live.get(watch.conversation_id)
        if live is not None:
            live.pop(key, None)
            if not live:
                del self._live[watch.conversation_id]


def _change(watch: WatchState, logged: LoggedCommit) -> Change:
    records = logged.records
    if watch.conversation_id is not None:
        records = tuple(record for record in records if record.conversation_id == watch.conversation_id)
    return Change(watch_id=watch.watch_id, seq=logged.seq, committed_at_ms=logged.committed_at_ms, records=records)
