"""The memory store: every port of the core (:class:`~storage_owner.core.Store`) over plain dicts and lists, sans-IO (no
apsw, no trio, no file). The core's unit tests run the whole owner core on it; it keeps the SQLite store's rules, which
the conformance suite (``tests/unit/test_store_conformance.py``) runs against both:

1. **Transactions and savepoints.** :meth:`MemoryStore.begin`, :meth:`~MemoryStore.commit` and
   :meth:`~MemoryStore.rollback` as the shell uses them; savepoints nest inside (one opened outside a transaction opens
   one, which its release commits). Inside a transaction every write journals how to undo itself; a rollback runs the
   journal back to its mark, newest first, so what was rolled back leaves nothing behind: no seq, no entry position,
   no operation ordinal, no place in a run's partial output. Outside one, a write is committed at once.
2. **Conflicts.** An insert that breaks a uniqueness rule raises :class:`~storage_owner.core.StoreConflict` for the
   same record and key as SQLite, and changes nothing. A write SQLite would refuse with a raw constraint error (a bug
   of the core, never bad input: a commit's seq logged twice, a piece stored twice at one offset) raises
   :class:`~protocol.StorageError`, as the shell would map it.
3. **Detached values.** A value is kept as the msgpack blob SQLite would store (``_blobs``) and read back as a new
   copy with the same types; a record that holds one is rebuilt on each read; a frozen record of plain fields is kept
   as it is (nothing in it can change). The ``REAL`` columns read back as ``float``, as SQLite's do.
4. **Orders and pages** as the SQLite store's queries give them: entries by position, the log by seq, runs by
   ``(created seq, run id)`` or run id, tasks by task id, operations by their ordinal in the run, partial output by
   first write, interactions, usage totals and prices by key.

:meth:`MemoryStore.close` ends it as closing a connection does (an open transaction rolled back; every later call
raises ``StorageError``); :meth:`MemoryStore.reopen` is the same data opened again, as a new owner opens the file.

This module holds the store's lifecycle and transactions; each port's methods are a mixin of :class:`MemoryStore` in
the module named as the SQLite store's: ``_memory_log``, ``_memory_conversations``, ``_memory_runs``,
``_memory_operations``, ``_memory_tasks``, ``_memory_usage`` and ``_memory_partials``, over the tables, rows and
journaled writes of ``_memory_tables``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from protocol import StorageError

from ._memory_conversations import ConversationsMemory
from ._memory_log import LogMemory
from ._memory_operations import OperationsMemory
from ._memory_partials import PartialsMemory
from ._memory_runs import RunsMemory
from ._memory_tables import Undo, _Closed, _Tables
from ._memory_tasks import TasksMemory
from ._memory_usage import UsageMemory

if TYPE_CHECKING:
    from storage_owner.core import Store


class MemoryStore(
    LogMemory, ConversationsMemory, RunsMemory, OperationsMemory, TasksMemory, UsageMemory, PartialsMemory
):
    """One memory database, open; not thread-safe (the owner core is used from one thread). See the module docstring.

    Its rooms are mixins sharing :attr:`_t` and the journal, as :class:`~storage_owner.store.SqliteStore`'s share its
    connection, so that the two stores read alike, room by room.
    """

    def __init__(self, tables: _Tables | None = None) -> None:
        self._data = _Tables() if tables is None else tables
        self._t = self._data
        """The tables in use: :attr:`_data` while open, a :class:`_Closed` once closed."""
        self._closed = False
        self._undo: list[Undo] | None = None
        """How to undo the open transaction's writes, oldest first; ``None`` outside a transaction."""
        self._marks: list[int] = []
        """Where each open savepoint began in :attr:`_undo`, outermost first."""
        self._savepoint_began = False
        """The open transaction was begun by a savepoint (releasing that savepoint commits it)."""

    # ------------------------------------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Roll back an open transaction, and refuse every later call (``StorageError``)."""
        if self._undo is not None:
            self.rollback()
        self._t = _Closed()
        self._closed = True

    def reopen(self) -> MemoryStore:
        """A store over this closed one's data, as the database opened again: what was committed, nothing else."""
        if not self._closed:
            raise StorageError("close the memory store before opening its data again")
        return MemoryStore(self._data)

    # -------------------------------------------------------------------------------------- transactions

    def begin(self) -> None:
        if self._closed:
            raise StorageError("the memory store is closed")
        if self._undo is not None:
            raise StorageError("cannot begin a transaction within a transaction")
        self._undo = []

    def commit(self) -> None:
        if self._undo is None:
            raise StorageError("cannot commit: no transaction is active")
        self._end()

    def rollback(self) -> None:
        if self._undo is None:
            raise StorageError("cannot roll back: no transaction is active")
        self._run_back(0)
        self._end()

    @property
    def in_transaction(self) -> bool:
        return self._undo is not None

    def savepoint(self) -> None:
        if self._closed:
            raise StorageError("the memory store is closed")
        if self._undo is None:
            self._undo = []
            self._savepoint_began = True
        self._marks.append(len(self._undo))

    def release_savepoint(self) -> None:
        if not self._marks:
            raise StorageError("no savepoint is open")
        self._marks.pop()
        if not self._marks and self._savepoint_began:
            self._end()

    def rollback_savepoint(self) -> None:
        if not self._marks:
            raise StorageError("no savepoint is open")
        self._run_back(self._marks[-1])
        self.release_savepoint()

    def _run_back(self, mark: int) -> None:
        undo = self._undo
        assert undo is not None
        while len(undo) > mark:
            undo.pop()()

    def _end(self) -> None:
        self._undo = None
        self._marks.clear()
        self._savepoint_began = False


if TYPE_CHECKING:
    _implements_every_port: Store = MemoryStore()
