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
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

import attrs

from protocol import (
    RESET_ENTRY,
    RUN_TERMINAL,
    Budget,
    ConversationRecord,
    DocumentRecord,
    EntryRecord,
    InteractionRecord,
    JsonValue,
    ModelPrice,
    OperationRecord,
    Order,
    RunRecord,
    RunUsage,
    StorageError,
    SubmissionRecord,
    TaskOutcome,
    TaskRecord,
)
from storage_owner.core import NO_CHANGE, LoggedCommit, PartialHead, StoreConflict, TaskRow

from ._blobs import (
    RECORDS,
    pack,
    pack_interaction,
    pack_operation,
    structure_interaction,
    structure_outcome,
    structure_records,
    unpack,
    unpack_operation,
    unstructure_outcome,
    unstructure_records,
)
from ._schema import GLOBAL_SCOPE

if TYPE_CHECKING:
    from storage_owner.core import Store

K = TypeVar("K")
V = TypeVar("V")
Undo = Callable[[], None]

_RUN_ENDED: Final = frozenset(RUN_TERMINAL)
"""The run statuses ``live_runs`` leaves out (the SQLite store's ``runs_live`` index)."""
_MISSING: Final[Any] = object()
_BEYOND: Final = 1 << 62
"""Past every position and seq (the SQLite store's bound for an open end)."""


@attrs.frozen
class _Entry:
    entry_id: str
    seq: int
    kind: str
    data: bytes
    created_at_ms: int
    model: bytes | None = None
    head: str | None = None


@attrs.frozen
class _Run:
    record: RunRecord
    input: bytes
    created_seq: int


@attrs.frozen
class _Operation:
    run_id: str
    ordinal: int
    task_id: str
    status: str
    record: bytes


@attrs.frozen
class _Interaction:
    operation_id: str
    run_id: str
    status: str
    record: bytes


@attrs.frozen
class _Task:
    record: TaskRecord
    """Its outcomes (``held``, ``outcome``) as stored: copied in and out, since their results are values."""
    input: bytes
    checkpoint: bytes


@attrs.frozen
class _Partial:
    order: int
    """Its place in its run's partial output (the SQLite row's rowid): kept when a later attempt replaces it."""
    head: PartialHead


class _Tables:
    """Every table of one memory database: what stays when a store over it is closed and :meth:`reopened
    <MemoryStore.reopen>`. A row is replaced, never changed in place, so that an undo can put the old one back."""

    def __init__(self) -> None:
        self.log: dict[int, tuple[str | None, int, bytes]] = {}
        """Commits by seq: the one conversation it touched (``None``: none or several), its time, its records."""
        self.seqs: list[int] = []
        """The log's seqs, in order."""
        self.meta: dict[str, int] = {}
        self.conversations: dict[str, ConversationRecord] = {}
        """As inserted, but for ``entry_count``, which is counted when read."""
        self.entries: dict[str, dict[int, _Entry]] = {}
        """Each conversation's entries by position."""
        self.positions: dict[str, list[int]] = {}
        """Each conversation's entry positions, in order."""
        self.entry_ids: dict[str, str] = {}
        """The conversation of every entry id (unique across conversations)."""
        self.documents: dict[tuple[str, str], tuple[int, bytes, int, int]] = {}
        """By ``(scope, name)``: version, value, seq, updated_at_ms."""
        self.submissions: dict[str, tuple[SubmissionRecord, bytes]] = {}
        """By submission id: the record (its payload aside) and its payload."""
        self.requests: dict[tuple[str, str], str] = {}
        """The submission id of each ``(conversation_id, request_id)``."""
        self.runs: dict[str, _Run] = {}
        self.operations: dict[str, _Operation] = {}
        self.journals: dict[str, list[str]] = {}
        """Each run's operation ids, by ordinal (the index in the list)."""
        self.interactions: dict[str, _Interaction] = {}
        self.asked: dict[str, str] = {}
        """The approval of each operation that asked one (its questions are found by their ids)."""
        self.usage: dict[tuple[str, str], RunUsage] = {}
        self.prices: dict[str, ModelPrice] = {}
        self.budgets: dict[tuple[str, str], Budget] = {}
        self.tasks: dict[str, _Task] = {}
        self.partials: dict[str, _Partial] = {}
        self.pieces: dict[str, dict[int, str]] = {}
        """Each operation's pieces of partial output, by character offset."""
        self.counters: dict[str, int] = {"partial_order": 0}


class _Closed(_Tables):
    """A closed store's tables: every use raises (every method reads its tables first, so none needs a check)."""

    def __init__(self) -> None:
        pass

    def __getattribute__(self, name: str) -> Any:
        raise StorageError("the memory store is closed")


class MemoryStore:
    """One memory database, open; not thread-safe (the owner core is used from one thread). See the module docstring."""

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

    # ------------------------------------------------------------------------------ journaled changes

    def _put(self, table: dict[K, V], key: K, value: V) -> None:
        undo = self._undo
        if undo is not None:
            old = table.get(key, _MISSING)
            undo.append(lambda: _restore(table, key, old))
        table[key] = value

    def _delete(self, table: dict[K, V], key: K) -> None:
        old = table.pop(key, _MISSING)
        if old is not _MISSING and self._undo is not None:
            self._undo.append(lambda: _restore(table, key, old))

    def _insert_sorted(self, values: list[int], value: int) -> None:
        if values and value > values[-1]:
            values.append(value)
        else:
            bisect.insort(values, value)
        if self._undo is not None:
            self._undo.append(lambda: values.remove(value))

    def _append(self, values: list[V], value: V) -> None:
        values.append(value)
        if self._undo is not None:
            self._undo.append(lambda: values.remove(value))

    # ----------------------------------------------------------------------------------------- commit log

    def head_seq(self) -> int:
        seqs = self._t.seqs
        return seqs[-1] if seqs else 0

    def log_commit(self, commit: LoggedCommit, conversation_ids: frozenset[str]) -> bytes:
        t = self._t
        if commit.seq in t.log:
            raise StorageError(f"storage failed: commit {commit.seq} is already logged")
        only = next(iter(conversation_ids)) if len(conversation_ids) == 1 else None
        blob = pack(unstructure_records(commit.records))
        self._put(t.log, commit.seq, (only, commit.committed_at_ms, blob))
        self._insert_sorted(t.seqs, commit.seq)
        return blob

    def read_log(
        self, after_seq: int, conversation_id: str | None, limit: int, *, until_seq: int | None = None
    ) -> list[LoggedCommit]:
        t = self._t
        until = _BEYOND if until_seq is None else until_seq
        found: list[LoggedCommit] = []
        seqs = t.seqs
        for index in range(bisect.bisect_right(seqs, after_seq), len(seqs)):  # no copy of the log's tail
            seq = seqs[index]
            if seq > until or len(found) >= limit:
                break
            only, at_ms, blob = t.log[seq]
            if conversation_id is None or only is None or only == conversation_id:
                found.append(
                    LoggedCommit(seq=seq, committed_at_ms=at_ms, records=structure_records(unpack(blob), RECORDS))
                )
        return found

    # ----------------------------------------------------------------------------------------------- meta

    def get_meta(self, key: str) -> int | None:
        return self._t.meta.get(key)

    def set_meta(self, key: str, value: int) -> None:
        self._put(self._t.meta, key, int(value))

    # -------------------------------------------------------------------------------------- conversations

    def insert_conversation(self, record: ConversationRecord) -> None:
        t = self._t
        if record.conversation_id in t.conversations:
            raise StoreConflict("conversation", record.conversation_id)
        self._put(t.conversations, record.conversation_id, attrs.evolve(record, entry_count=0))

    def conversation(self, conversation_id: str) -> ConversationRecord | None:
        record = self._t.conversations.get(conversation_id)
        if record is None:
            return None
        return attrs.evolve(record, entry_count=self._next_position(conversation_id))

    def _next_position(self, conversation_id: str) -> int:
        positions = self._t.positions.get(conversation_id)
        return positions[-1] + 1 if positions else 0

    def task_owned_conversations(self) -> list[tuple[str, str]]:
        t = self._t
        owned = []
        for conversation_id in sorted(t.conversations):
            owner = t.conversations[conversation_id].owner_task_id
            if owner is not None:
                task = t.tasks.get(owner)
                if task is not None and task.record.status != "terminal":
                    owned.append((conversation_id, owner))
        return owned

    def conversation_count(self) -> int:
        return len(self._t.conversations)

    # -------------------------------------------------------------------------------------------- entries

    def next_entry_position(self, conversation_id: str) -> int | None:
        if conversation_id not in self._t.conversations:
            return None
        return self._next_position(conversation_id)

    def insert_entry(self, record: EntryRecord) -> None:
        t = self._t
        entries = t.entries.get(record.conversation_id)
        if record.entry_id in t.entry_ids or (entries is not None and record.position in entries):
            raise StoreConflict("entry", record.entry_id)
        if entries is None:
            self._put(t.entries, record.conversation_id, {})
            self._put(t.positions, record.conversation_id, [])
            entries = t.entries[record.conversation_id]
        model = None if record.model is None else pack(record.model)
        entry = _Entry(
            record.entry_id, record.seq, record.kind, pack(record.data), record.created_at_ms, model, record.head
        )
        self._put(entries, record.position, entry)
        self._insert_sorted(t.positions[record.conversation_id], record.position)
        self._put(t.entry_ids, record.entry_id, record.conversation_id)

    def entry_page(
        self, conversation_id: str, order: Order, cursor: int | None, limit: int, *, max_data_bytes: int | None = None
    ) -> tuple[list[EntryRecord], bool]:
        t = self._t
        positions = t.positions.get(conversation_id, [])
        entries = t.entries.get(conversation_id, {})
        if order == "asc":
            chosen = range(bisect.bisect_right(positions, -1 if cursor is None else cursor), len(positions))
        else:
            chosen = range(bisect.bisect_left(positions, _BEYOND if cursor is None else cursor) - 1, -1, -1)
        page: list[EntryRecord] = []
        total_bytes = 0
        for index in chosen:  # no copy of the transcript's positions
            position = positions[index]
            entry = entries[position]
            total_bytes += len(entry.data) + (0 if entry.model is None else len(entry.model))
            if len(page) == limit or (page and max_data_bytes is not None and total_bytes > max_data_bytes):
                return page, True
            page.append(
                EntryRecord(
                    entry_id=entry.entry_id,
                    conversation_id=conversation_id,
                    position=position,
                    seq=entry.seq,
                    kind=entry.kind,
                    data=unpack(entry.data),
                    created_at_ms=entry.created_at_ms,
                    model=JsonValue(None if entry.model is None else unpack(entry.model)),
                    head=entry.head,
                )
            )
        return page, False

    def entry_position(self, conversation_id: str, entry_id: str) -> int | None:
        if self._t.entry_ids.get(entry_id) != conversation_id:
            return None
        for position, entry in self._t.entries[conversation_id].items():
            if entry.entry_id == entry_id:
                return position
        return None

    def context_start(self, conversation_id: str) -> int:
        start = 0
        for position, entry in self._t.entries.get(conversation_id, {}).items():
            if entry.kind == RESET_ENTRY:
                start = max(start, position + 1)
            elif entry.head is not None:
                start = max(start, self.entry_position(conversation_id, entry.head) or 0)
        return start

    def entry_count(self) -> int:
        return len(self._t.entry_ids)

    # ------------------------------------------------------------------------------------------ documents

    def document(self, conversation_id: str | None, name: str) -> DocumentRecord | None:
        scope = GLOBAL_SCOPE if conversation_id is None else conversation_id
        stored = self._t.documents.get((scope, name))
        if stored is None:
            return None
        version, value, seq, updated_at_ms = stored
        return DocumentRecord(
            conversation_id=conversation_id,
            name=name,
            version=version,
            value=unpack(value),
            seq=seq,
            updated_at_ms=updated_at_ms,
        )

    def put_document(self, record: DocumentRecord) -> None:
        scope = GLOBAL_SCOPE if record.conversation_id is None else record.conversation_id
        stored = (record.version, pack(record.value), record.seq, record.updated_at_ms)
        self._put(self._t.documents, (scope, record.name), stored)

    # ---------------------------------------------------------------------------------------- submissions

    def submission(self, conversation_id: str, request_id: str) -> SubmissionRecord | None:
        submission_id = self._t.requests.get((conversation_id, request_id))
        return None if submission_id is None else self.submission_by_id(submission_id)

    def submission_by_id(self, submission_id: str) -> SubmissionRecord | None:
        stored = self._t.submissions.get(submission_id)
        if stored is None:
            return None
        record, payload = stored
        return attrs.evolve(record, payload=unpack(payload))

    def open_submissions(self) -> list[SubmissionRecord]:
        # Insertion order is creation order: a dict keeps it, and an update replaces a value in place.
        return [
            attrs.evolve(record, payload=unpack(payload))
            for record, payload in self._t.submissions.values()
            if record.status in ("queued", "placed")
        ]

    def unanswered_of_run(self, conversation_id: str, run_id: str) -> list[SubmissionRecord]:
        return [
            attrs.evolve(record, payload=unpack(payload))
            for record, payload in self._t.submissions.values()
            if record.conversation_id == conversation_id and record.run_id == run_id and record.status == "unanswered"
        ]

    def submission_page(
        self, conversation_id: str, after_submission_id: str | None, limit: int
    ) -> tuple[list[SubmissionRecord], bool]:
        found = [
            attrs.evolve(record, payload=unpack(payload))
            for record, payload in self._t.submissions.values()
            if record.conversation_id == conversation_id
        ]
        ids = [record.submission_id for record in found]
        if after_submission_id in ids:
            found = found[ids.index(after_submission_id) + 1 :]
        return found[:limit], len(found) > limit

    def insert_submission(self, record: SubmissionRecord) -> None:
        t = self._t
        key = (record.conversation_id, record.request_id)
        if record.submission_id in t.submissions or key in t.requests:
            raise StoreConflict("submission", record.submission_id)
        self._put(t.submissions, record.submission_id, (record, pack(record.payload)))
        self._put(t.requests, key, record.submission_id)

    def update_submission(self, record: SubmissionRecord) -> None:
        t = self._t
        stored = t.submissions.get(record.submission_id)
        assert stored is not None, f"submission {record.submission_id} is not stored"
        self._put(t.submissions, record.submission_id, (record, stored[1]))

    # ----------------------------------------------------------------------------------------------- runs

    def insert_run(self, record: RunRecord, input: object) -> None:
        t = self._t
        if record.run_id in t.runs:
            raise StoreConflict("run", record.run_id)
        self._put(t.runs, record.run_id, _Run(record, pack(input), record.seq))

    def update_run(self, record: RunRecord) -> None:
        t = self._t
        stored = t.runs.get(record.run_id)
        if stored is not None:
            self._put(t.runs, record.run_id, _Run(record, stored.input, stored.created_seq))

    def run(self, run_id: str) -> RunRecord | None:
        stored = self._t.runs.get(run_id)
        return None if stored is None else stored.record

    def run_input(self, run_id: str) -> Any:
        stored = self._t.runs.get(run_id)
        assert stored is not None, f"run {run_id} is not stored"
        return unpack(stored.input)

    def live_runs(self) -> list[RunRecord]:
        live = [run for run in self._t.runs.values() if run.record.status not in _RUN_ENDED]
        live.sort(key=lambda run: (run.created_seq, run.record.run_id))
        return [run.record for run in live]

    def later_run_started(self, run_id: str) -> bool:
        t = self._t
        this = t.runs.get(run_id)
        if this is None:
            return False
        return any(
            later.record.conversation_id == this.record.conversation_id
            and later.created_seq > this.created_seq
            and later.record.task_id is not None
            for later in t.runs.values()
        )

    def run_page(
        self, conversation_id: str | None, status: str | None, after_run_id: str | None, limit: int
    ) -> tuple[list[RunRecord], bool]:
        runs = self._t.runs
        after = None if after_run_id is None else runs.get(after_run_id)
        start = (-1, "") if after is None else (after.created_seq, after.record.run_id)
        ordered = sorted(runs.values(), key=lambda run: (run.created_seq, run.record.run_id))
        found = [
            run.record
            for run in ordered
            if (run.created_seq, run.record.run_id) > start
            and (conversation_id is None or run.record.conversation_id == conversation_id)
            and (status is None or run.record.status == status)
        ]
        return found[:limit], len(found) > limit

    # ----------------------------------------------------------------------------------------- operations

    def insert_operation(self, record: OperationRecord) -> None:
        t = self._t
        if record.operation_id in t.operations:
            raise StoreConflict("operation", record.operation_id)
        journal = t.journals.get(record.run_id)
        if journal is None:
            self._put(t.journals, record.run_id, [])
            journal = t.journals[record.run_id]
        stored = _Operation(record.run_id, len(journal), record.task_id, record.status, pack_operation(record))
        self._put(t.operations, record.operation_id, stored)
        self._append(journal, record.operation_id)

    def update_operation(self, record: OperationRecord) -> None:
        t = self._t
        stored = t.operations.get(record.operation_id)
        if stored is not None:
            updated = _Operation(stored.run_id, stored.ordinal, record.task_id, record.status, pack_operation(record))
            self._put(t.operations, record.operation_id, updated)

    def operation(self, operation_id: str) -> OperationRecord | None:
        stored = self._t.operations.get(operation_id)
        return None if stored is None else unpack_operation(stored.record)

    def open_operations(self, task_id: str) -> list[OperationRecord]:
        found = [op for op in self._t.operations.values() if op.task_id == task_id and op.status == "started"]
        found.sort(key=lambda op: op.ordinal)
        return [unpack_operation(op.record) for op in found]

    def operation_page(self, run_id: str, cursor: int, limit: int) -> tuple[list[OperationRecord], bool]:
        t = self._t
        ids = t.journals.get(run_id, [])[max(cursor, 0) :]
        return [unpack_operation(t.operations[op_id].record) for op_id in ids[:limit]], len(ids) > limit

    def insert_interaction(self, record: InteractionRecord) -> None:
        t = self._t
        approval = record.kind == "approval"
        if record.interaction_id in t.interactions or (approval and record.operation_id in t.asked):
            raise StoreConflict("interaction", record.interaction_id)
        stored = _Interaction(record.operation_id, record.run_id, record.status, pack_interaction(record))
        self._put(t.interactions, record.interaction_id, stored)
        if approval:
            self._put(t.asked, record.operation_id, record.interaction_id)

    def update_interaction(self, record: InteractionRecord) -> None:
        t = self._t
        stored = t.interactions.get(record.interaction_id)
        if stored is not None:
            updated = _Interaction(stored.operation_id, stored.run_id, record.status, pack_interaction(record))
            self._put(t.interactions, record.interaction_id, updated)

    def interaction(self, interaction_id: str) -> InteractionRecord | None:
        stored = self._t.interactions.get(interaction_id)
        return None if stored is None else _unpack_interaction(stored.record)

    def operation_interaction(self, operation_id: str) -> InteractionRecord | None:
        interaction_id = self._t.asked.get(operation_id)
        return None if interaction_id is None else self.interaction(interaction_id)

    def interaction_page(
        self, status: str | None, run_id: str | None, after_interaction_id: str | None, limit: int
    ) -> tuple[list[InteractionRecord], bool]:
        interactions = self._t.interactions
        found = [
            interactions[interaction_id].record
            for interaction_id in sorted(interactions)
            if interaction_id > (after_interaction_id or "")
            and (status is None or interactions[interaction_id].status == status)
            and (run_id is None or interactions[interaction_id].run_id == run_id)
        ]
        return [_unpack_interaction(blob) for blob in found[:limit]], len(found) > limit

    # ---------------------------------------------------------------------------------------------- usage

    def add_usages(self, totals: Sequence[tuple[str, str]], usage: RunUsage) -> None:
        for scope, key in totals:
            self.add_usage(scope, key, usage)

    def add_usage(self, scope: str, key: str, usage: RunUsage) -> None:
        t = self._t
        total = t.usage.get((scope, key))
        if total is None:
            added = attrs.evolve(usage, cost=_real(usage.cost))
        else:
            added = RunUsage(
                input_tokens=total.input_tokens + usage.input_tokens,
                output_tokens=total.output_tokens + usage.output_tokens,
                cached_tokens=total.cached_tokens + usage.cached_tokens,
                reasoning_tokens=total.reasoning_tokens + usage.reasoning_tokens,
                cost=total.cost if usage.cost is None else (total.cost or 0.0) + usage.cost,
                unpriced_tokens=total.unpriced_tokens + usage.unpriced_tokens,
            )
        self._put(t.usage, (scope, key), added)

    def usage(self, scope: str, key: str | None) -> list[tuple[str, RunUsage]]:
        totals = self._t.usage
        if key is not None:
            total = totals.get((scope, key))
            return [] if total is None else [(key, total)]
        return sorted((key, total) for (of, key), total in totals.items() if of == scope)

    def usage_count(self, scope: str) -> int:
        return sum(1 for of, _ in self._t.usage if of == scope)

    def usage_page(self, scope: str, after_key: str | None, limit: int) -> tuple[list[tuple[str, RunUsage]], bool]:
        totals = self._t.usage
        found = sorted((key, total) for (of, key), total in totals.items() if of == scope and key > (after_key or ""))
        return found[:limit], len(found) > limit

    def prices(self) -> list[ModelPrice]:
        prices = self._t.prices
        return [prices[model] for model in sorted(prices)]

    def put_price(self, price: ModelPrice) -> None:
        stored = ModelPrice(
            model=price.model,
            input_per_mtok=float(price.input_per_mtok),
            output_per_mtok=float(price.output_per_mtok),
            cached_input_per_mtok=_real(price.cached_input_per_mtok),
            reasoning_per_mtok=_real(price.reasoning_per_mtok),
        )
        self._put(self._t.prices, price.model, stored)

    def delete_price(self, model: str) -> None:
        self._delete(self._t.prices, model)

    def budget(self, scope: str, key: str) -> Budget | None:
        return self._t.budgets.get((scope, key))

    def put_budget(self, budget: Budget) -> None:
        self._put(self._t.budgets, (budget.scope, budget.key), attrs.evolve(budget, max_cost=_real(budget.max_cost)))

    def delete_budget(self, scope: str, key: str) -> None:
        self._delete(self._t.budgets, (scope, key))

    def budget_count(self) -> int:
        return len(self._t.budgets)

    # ---------------------------------------------------------------------------------------------- tasks

    def insert_task(self, record: TaskRecord, input: object, checkpoint: object) -> int:
        t = self._t
        if record.task_id in t.tasks:
            raise StoreConflict("task", record.task_id)
        packed = pack(input)
        self._put(t.tasks, record.task_id, _Task(_task_copy(record), packed, pack(checkpoint)))
        return len(packed)

    def update_task(self, record: TaskRecord, *, checkpoint: object = NO_CHANGE) -> int:
        t = self._t
        stored = t.tasks.get(record.task_id)
        if stored is None:
            return 0
        kept = stored.checkpoint if checkpoint is NO_CHANGE else pack(checkpoint)
        self._put(t.tasks, record.task_id, _Task(_task_copy(record), stored.input, kept))
        return 0 if checkpoint is NO_CHANGE else len(kept)

    def task(self, task_id: str) -> TaskRecord | None:
        stored = self._t.tasks.get(task_id)
        return None if stored is None else _task_copy(stored.record)

    def task_data(self, task_id: str) -> tuple[Any, Any]:
        stored = self._t.tasks.get(task_id)
        assert stored is not None, f"task {task_id} is not stored"
        return unpack(stored.input), unpack(stored.checkpoint)

    def live_tasks(self, *, unsettled_only: bool = False) -> Iterator[TaskRecord]:
        for task_id in sorted(self._t.tasks):
            record = self._t.tasks[task_id].record
            if record.status != "terminal" and not (
                unsettled_only and record.status == "pending" and record.abort is None
            ):
                yield _task_copy(record)

    def live_task_rows(self) -> Iterator[TaskRow]:
        tasks = self._t.tasks
        for task_id in sorted(tasks):
            record = tasks[task_id].record
            if record.status != "terminal":
                yield (
                    task_id,
                    record.kind,
                    record.conversation_id,
                    record.owner_task_id,
                    record.status,
                    record.abort,
                    record.abandon_on_restart,
                )

    def task_count(self) -> int:
        return len(self._t.tasks)

    # ------------------------------------------------------------------------------------ partial output

    def partial(self, operation_id: str) -> PartialHead | None:
        stored = self._t.partials.get(operation_id)
        return None if stored is None else stored.head

    def held_partials(self) -> list[PartialHead]:
        return [
            stored.head
            for stored in self._ordered_partials()
            if stored.head.pieces > 0 or stored.head.status == "streaming"
        ]

    def put_partial(self, head: PartialHead) -> None:
        t = self._t
        stored = t.partials.get(head.operation_id)
        if stored is None:
            order = t.counters["partial_order"] + 1
            self._put(t.counters, "partial_order", order)
            self._put(t.partials, head.operation_id, _Partial(order, head))
        else:  # the run and conversation stay as first stored (the SQLite store's upsert leaves them)
            kept = attrs.evolve(head, run_id=stored.head.run_id, conversation_id=stored.head.conversation_id)
            self._put(t.partials, head.operation_id, _Partial(stored.order, kept))

    def insert_partial_piece(self, operation_id: str, offset: int, text: str) -> None:
        t = self._t
        pieces = t.pieces.get(operation_id)
        if pieces is None:
            self._put(t.pieces, operation_id, {})
            pieces = t.pieces[operation_id]
        if offset in pieces:
            raise StorageError(f"storage failed: operation {operation_id} has a piece at offset {offset} already")
        self._put(pieces, offset, text)

    def delete_partial_pieces(self, operation_id: str) -> None:
        self._delete(self._t.pieces, operation_id)

    def partial_text(self, operation_id: str) -> str:
        pieces = self._t.pieces.get(operation_id, {})
        return "".join(pieces[offset] for offset in sorted(pieces))

    def run_partials_from(self, run_id: str, from_operation_id: str | None, limit: int) -> list[PartialHead]:
        first = 0
        if from_operation_id is not None:
            start = self._t.partials.get(from_operation_id)
            if start is None:
                return []
            first = start.order
        ordered = (stored.head for stored in self._ordered_partials() if stored.order >= first)
        return [head for head in ordered if head.run_id == run_id][:limit]

    def _ordered_partials(self) -> list[_Partial]:
        return sorted(self._t.partials.values(), key=lambda stored: stored.order)

    def partial_piece_count(self) -> int:
        """Pieces stored in all (for tests of the bounds)."""
        return sum(len(pieces) for pieces in self._t.pieces.values())


def _restore(table: dict[K, V], key: K, old: V) -> None:
    if old is _MISSING:
        del table[key]
    else:
        table[key] = old


def _real(value: float | None) -> float | None:
    """A value as a ``REAL`` column keeps it."""
    return None if value is None else float(value)


def _outcome_copy(outcome: TaskOutcome | None) -> TaskOutcome | None:
    if outcome is None:
        return None
    return structure_outcome(unpack(pack(unstructure_outcome(outcome))), TaskOutcome)  # type: ignore[no-any-return]


def _task_copy(record: TaskRecord) -> TaskRecord:
    """``record`` detached: its outcomes' results are values (a record without outcomes holds none)."""
    if record.held is None and record.outcome is None:
        return record
    return attrs.evolve(record, held=_outcome_copy(record.held), outcome=_outcome_copy(record.outcome))


def _unpack_interaction(blob: bytes) -> InteractionRecord:
    return structure_interaction(unpack(blob), InteractionRecord)  # type: ignore[no-any-return]


if TYPE_CHECKING:
    _implements_every_port: Store = MemoryStore()
