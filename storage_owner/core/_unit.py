"""The unit of work: every request that writes is applied inside one, and so is the settle after a batch's requests.

A unit of work owns what every write shares, so that no handler repeats it:

1. **The savepoint.** A request that may be refused after its first write runs inside a savepoint of its own, rolled
   back alone if it is refused (the other requests of its batch keep theirs). A request whose only fallible write is
   its first statement needs none, since SQLite undoes a failed statement by itself: the dispatcher says which when it
   opens the unit (``guarded``), so the hot path (a commit of one entry) pays no savepoint.
2. **The undo of memory.** Every aggregate keeps its in-memory state in step with the store through the one
   :class:`Journal` it was built with: a change made inside a request journals the action that puts it back, and a
   refused request runs those actions newest first. Caches a request fills as it goes (an entry position) are dropped
   whole instead. Outside a request nothing is journaled: settling is never refused.
3. **The commit-log record.** The handler adds the records it changed, in order, to :attr:`UnitOfWork.records`. A unit
   that holds any takes the next ``seq`` and logs them as one commit; one that holds none (a setting, a no-op, a
   refusal) takes no ``seq``.
4. **The fan-out.** Once logged, the request's reply is queued first, then the commit for every live watch that
   matches it, then whatever the handler asked to follow (:meth:`UnitOfWork.then`: an answer to a call waiting on
   what it changed).

A refusal anywhere inside the handler (its own checks, an aggregate's, the task engine's) rolls back everything the
request touched, in the store and in memory; it reaches the caller as the :class:`Refusal` it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Protocol

import attrs

from protocol import Frame, Record

from ._checks import Refusal
from ._output import Outbox, PeerId
from ._ports import LoggedCommit, LogStore

SETTLE_PEER: Final = -1
"""The ``peer`` of the settle's unit of work: nobody asked for it, nobody is answered by its commit."""
Undo = Callable[[], None]


@attrs.define
class Head:
    """The ``seq`` of the newest commit logged (committed once the current batch commits): the :class:`CommitLog`
    moves it; the rooms that answer with it (a welcome, a watch, a ping, a page that a watch continues) read it."""

    seq: int


class FanOut(Protocol):
    """Who is fed each logged commit (the watches, ``_watches``)."""

    def fan_out(self, logged: LoggedCommit, touched: set[str], packed: bytes) -> None:
        """Feed ``logged`` (its records ``packed`` as the log stored them) to whoever watches what it touched."""
        ...


class Journal:
    """The undo of in-memory state while a request's unit of work is open: one for every aggregate of an owner."""

    __slots__ = ("_actions", "_caches")

    def __init__(self) -> None:
        self._actions: list[Undo] | None = None
        self._caches: list[Undo] = []

    def undo(self, action: Undo) -> None:
        """Run ``action`` if the open request is refused (outside a request, nothing: settling is never refused)."""
        if self._actions is not None:
            self._actions.append(action)

    @property
    def open(self) -> bool:
        """Whether a request's unit of work is open (what changes now is undone if it is refused)."""
        return self._actions is not None

    def cache(self, drop: Undo) -> None:
        """``drop`` empties a cache that requests fill as they go: a refused request drops it whole, which costs less
        than journaling every entry of the hot path (the cache is filled again from the store)."""
        self._caches.append(drop)

    def _rollback(self) -> None:
        actions, self._actions = self._actions, None
        assert actions is not None, "a rollback outside a unit of work"
        for action in reversed(actions):
            action()
        for drop in self._caches:
            drop()


class UnitOfWork:
    """One request's writes (or the settle's): its ``seq`` if it logs anything, its time, the records it changed."""

    __slots__ = ("after", "call_id", "late", "now_ms", "peer", "records", "seq")

    def __init__(self, peer: PeerId, call_id: int | None, seq: int, now_ms: int) -> None:
        self.peer = peer
        self.call_id = call_id
        self.seq = seq
        """The ``seq`` this unit's commit takes if it logs any record."""
        self.now_ms = now_ms
        self.records: list[Record] = []
        """What the commit logs, in order."""
        self.late: dict[str, Record] | None = None
        self.after: list[Undo] | None = None

    def last(self, key: str, record: Record) -> None:
        """Log ``record`` after the others, once however often the request changed it (a run whose usage several
        results of one commit add to: its last record, under its id)."""
        if self.late is None:
            self.late = {}
        self.late[key] = record

    def then(self, action: Undo) -> None:
        """Run ``action`` once the commit is logged and fanned out (never if the request is refused)."""
        if self.after is None:
            self.after = []
        self.after.append(action)


WriteHandler = Callable[[UnitOfWork, Any], Frame | None]
"""A request handler that writes: it applies the request to ``unit`` and returns its reply (``None``: the request is
answered later, once settled)."""


class CommitLog:
    """The head of the commit log and the units of work that append to it. See the module docstring."""

    def __init__(self, store: LogStore, journal: Journal, head: Head, outbox: Outbox, watches: FanOut) -> None:
        self._store = store
        self._journal = journal
        self._head = head
        self._reply = outbox.reply
        self._fan_out = watches.fan_out

    def apply(
        self, handler: WriteHandler, peer: PeerId, call_id: int | None, request: Any, now_ms: int, *, guarded: bool
    ) -> None:
        """Apply ``request`` with ``handler`` in a unit of work: logged and answered if it succeeds, rolled back whole
        (and re-raised) if it is refused. ``guarded``: it may be refused after its first write (a savepoint).

        Written out rather than split into helpers: it is the hot path of every commit."""
        unit = UnitOfWork(peer, call_id, self._head.seq + 1, now_ms)
        store = self._store
        journal = self._journal
        if guarded:
            store.savepoint()
        journal._actions = []  # the journal opens (its state set in place: this is the hot path)
        try:
            reply = handler(unit, request)
        except Refusal:
            journal._rollback()
            if guarded:
                store.rollback_savepoint()
            raise
        journal._actions = None
        if guarded:
            store.release_savepoint()
        records = unit.records
        if unit.late:
            records.extend(unit.late.values())
        if records:
            touched = {record.conversation_id for record in records if record.conversation_id is not None}
            logged = LoggedCommit(seq=unit.seq, committed_at_ms=now_ms, records=tuple(records))
            packed = store.log_commit(logged, frozenset(touched))
            self._head.seq = unit.seq
            if reply is not None:
                self._reply(peer, call_id, reply)
            self._fan_out(logged, touched, packed)
        elif reply is not None:
            self._reply(peer, call_id, reply)
        if unit.after:
            for action in unit.after:
                action()

    def settle(self, now_ms: int, settle: Callable[[UnitOfWork], None]) -> bool:
        """Run a batch's settling in a unit of its own; whether it logged a commit. Settling is never refused (what
        fails there is a storage error or a bug, which breaks the core), so it journals nothing and needs no
        savepoint; nobody is answered by its commit, but its actions (:meth:`UnitOfWork.then`) follow it."""
        unit = UnitOfWork(SETTLE_PEER, None, self._head.seq + 1, now_ms)
        settle(unit)
        records = unit.records
        if records:
            touched = {record.conversation_id for record in records if record.conversation_id is not None}
            logged = LoggedCommit(seq=unit.seq, committed_at_ms=now_ms, records=tuple(records))
            packed = self._store.log_commit(logged, frozenset(touched))
            self._head.seq = unit.seq
            self._fan_out(logged, touched, packed)
        if unit.after:
            for action in unit.after:
                action()
        return bool(records)
