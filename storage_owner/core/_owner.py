"""The storage owner's durable logic, sans-IO.

The shell (``storage_owner.io``) feeds the core what happened: a peer said hello, a batch of frames arrived
(:meth:`OwnerCore.run_batch`, inside the transaction the shell opened), a peer went away. The core answers with
frames to send, which the shell takes (:meth:`OwnerCore.take_output`) only after it committed that transaction; a
batch call out of that order raises :class:`BatchOrderError`. The core never reads the clock (``now_ms`` is handed
in), never does I/O beyond calling the store it was given, and never raises on bad input: a handler refuses a bad
request by raising :class:`Refusal`, which becomes an ``Error`` reply in one place, and the request changes nothing.

Rules:

1. A refused request changes nothing and does not disturb the other requests of its batch. Every request that
   writes is applied inside a unit of work (:mod:`._unit`), which owns its savepoint, the undo of memory, its
   commit-log record and the fan-out: a refusal anywhere rolls back everything the request touched. A request whose
   only fallible write is its first statement (a commit of one write of most kinds, a submission) needs no
   savepoint, since SQLite undoes a failed statement by itself (:data:`ONE_STATEMENT_WRITES`).
2. A request that changed records (a ``Commit``, a newly admitted ``Submit``, a cancel, an owner's decision) takes
   the next ``seq``, logs its records in the commit log and is fanned out to the live watches that match it. A
   refused request, a setting (prices, budgets, the manual clock) and a no-op take no ``seq``.
3. A repeated submission ``request_id`` is looked up before any other check or write; the same kind and payload
   return the original, anything else is a conflict.
4. A new watch first catches up from the commit log, page by page, between batches; it turns live once it has
   read up to the head. A congested peer's watches stop being live and catch up again from the log once the peer
   drains, so a slow reader never holds memory in the owner and never misses a commit.
5. A reader may read and watch, never write.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final, Literal, TypeVar

import attrs

from protocol import (
    RESERVED_ENTRY_PREFIX,
    AbortTask,
    AdvanceClock,
    Announce,
    AppendEntry,
    AppendPartial,
    BadFrame,
    CancelRun,
    ClockReply,
    Commit,
    Committed,
    ConversationRecord,
    ConversationReply,
    CreateConversation,
    CreateInteraction,
    CreateTask,
    DocumentRecord,
    DocumentReply,
    EntriesReply,
    EntryRecord,
    Error,
    ErrorCode,
    FinishOperation,
    Frame,
    InteractionReply,
    InteractionsReply,
    LeaseRef,
    Ok,
    OperationReply,
    OperationsReply,
    OutcomesReply,
    PartialsReply,
    Ping,
    PricesReply,
    PutDocument,
    ReadConversation,
    ReadDocument,
    ReadEntries,
    ReadInteractions,
    ReadOperation,
    ReadOperations,
    ReadOutcomes,
    ReadPartials,
    ReadPeers,
    ReadPrices,
    ReadRun,
    ReadRuns,
    ReadSubmission,
    ReadTask,
    ReadTaskGraph,
    ReadUsage,
    ReadUsageTotals,
    Received,
    Record,
    Refused,
    Release,
    Resolve,
    Respond,
    RetryRun,
    RunRecord,
    RunReply,
    RunsReply,
    SetBudget,
    SetPrices,
    SetTaskState,
    StartOperation,
    SubmissionRecord,
    SubmissionReply,
    Submit,
    Submitted,
    TaskGraphReply,
    TaskOutcome,
    TaskRecord,
    TaskReply,
    Unwatch,
    UsageReply,
    UsageTotal,
    WaitRun,
    WaitTask,
    Watch,
    Welcome,
    Write,
)

from ._checks import (
    Refusal,
    check_id,
    check_name,
    missing_conversation,
    no_conversation,
    same_json,
)
from ._output import (
    DEFAULT_PEER_OUTPUT_BYTES,
    DEFAULT_TOTAL_OUTPUT_BYTES,
    Outbox,
    Output,
    OutputLedger,
    PeerId,
    fitting,
)
from ._partials import Partials
from ._peers import DEFAULT_HEARTBEAT_MS, WRITER_ROLES, Peers, Waits
from ._ports import Store, StoreConflict
from ._runs import DEFAULT_MAX_CONCURRENT_RUNS, SETTLED, TERMINAL, Runs
from ._tasks import ORPHAN_GRACE_MS, TaskEngine
from ._unit import CommitLog, Head, Journal, UnitOfWork, WriteHandler
from ._usage import BudgetRefusal
from ._watches import Watches

T = TypeVar("T")

MAX_WRITES_PER_COMMIT: Final = 10_000
MAX_READ_LIMIT: Final = 1000
MAX_REQUEST_ID_CHARS: Final = 200
MAX_CACHED_POSITIONS: Final = 100_000
"""Conversations whose next entry position the core remembers (the cache is dropped whole past this)."""
MAX_CURSOR: Final = (1 << 62) - 1
READ_BUDGET_BYTES: Final = 512 << 10
"""A page of entries ends early rather than carry more stored data than this, so a reply stays far below the
WebSocket layer's hard limit however large the entries are."""
MANUAL_CLOCK_KEY: Final = "manual_clock_ms"
MAX_CLOCK_MS: Final = (1 << 62) - 1
"""The manual clock stays below this (SQLite integers are signed 64-bit, and deadlines add to the clock)."""
SUBMISSION_QUEUED: Final = "queued"
INPUT_KIND: Final = "input"
"""The submission kind that starts a run in a conversation bound to an agent."""
MAX_INPUT_BYTES: Final = 1 << 20
ONE_STATEMENT_WRITES: Final[frozenset[type[Write]]] = frozenset(
    {AppendEntry, PutDocument, CreateConversation, CreateTask, SetTaskState, AbortTask, StartOperation, FinishOperation}
    | {AppendPartial}
)
"""Writes that run every check before their first fallible statement (a write past it cannot be refused): alone in a
commit, they need no savepoint. A ``create_interaction`` inserts its approval task, then its interaction (which may
clash), so it is guarded even alone."""
_NEVER_OVERLOADED: Final = frozenset({Watch, Unwatch, Ping, Announce})
"""Requests answered even past an output budget: their replies are small and fixed, the client sends them without
awaiting the reply (a resubscription, a heartbeat, a worker's announcement after a reconnect), and what they lead to
(a watch's catch-up, leases up to ``max_leases``) is budgeted or bounded on its own."""
_IDLE: Final = "idle"
_RAN: Final = "ran"
_BROKEN: Final = "broken"
"""The core's batch states: between batches, after :meth:`OwnerCore.run_batch` until its output is taken, and
after a batch or a catch-up turn raised half-way (nothing is callable any more)."""


class BatchOrderError(Exception):
    """The shell called the core's batch methods out of order (a bug in the caller, never bad input)."""


@attrs.frozen
class BatchEffects:
    """What the shell must apply once a batch has committed, besides sending frames."""

    clock_ms: int | None = None
    """A manual clock was advanced to this time."""


class OwnerCore:
    """The durable logic of one owner over one store. See the module docstring for the rules."""

    def __init__(
        self,
        store: Store,
        *,
        token: str,
        instance: str,
        clock: Literal["wall", "manual"] = "wall",
        heartbeat_ms: int = DEFAULT_HEARTBEAT_MS,
        orphan_grace_ms: int = ORPHAN_GRACE_MS,
        max_concurrent_runs: int = DEFAULT_MAX_CONCURRENT_RUNS,
        peer_output_budget: int = DEFAULT_PEER_OUTPUT_BYTES,
        total_output_budget: int = DEFAULT_TOTAL_OUTPUT_BYTES,
    ) -> None:
        self._store = store
        self._encoded: list[bytes] = []
        """The encoded frames of the output last taken (:meth:`take_output`, :meth:`catch_up`)."""
        self._batch_state = _IDLE
        self._clock = clock
        self._clock_ms: int | None = None
        self._head = head = Head(store.head_seq())
        self._outbox = outbox = Outbox(OutputLedger(peer_budget=peer_output_budget, total_budget=total_output_budget))
        journal = Journal()
        """The undo of every aggregate's memory while a request's unit of work is open (``_unit``)."""
        self.watches = Watches(store, outbox, head)
        self._log = CommitLog(store, journal, head, outbox, self.watches)
        self.waits = Waits()
        self.tasks = TaskEngine(store, outbox.push, journal, orphan_grace_ms=orphan_grace_ms)
        self.runs = Runs(store, self.tasks, journal, max_concurrent_runs=max_concurrent_runs)
        self.partials = Partials(store, journal)
        self.peers = Peers(
            head,
            token=token,
            instance=instance,
            clock=clock,
            heartbeat_ms=heartbeat_ms,
            announced=self._worker_announced,
        )
        self._attached = self.peers.attached
        self._cancel_replies: list[tuple[PeerId, int, str]] = []
        """``cancel_run`` requests of this batch, answered after its settle with the run as it is then."""
        self._next_positions: dict[str, int] = {}
        """Next entry position per conversation: saves a read per append. Updated only once a request succeeded."""
        self._handlers: dict[type[Any], Callable[[PeerId, int, Any, int], Frame | None]] = {
            ReadConversation: self._on_read_conversation,
            ReadEntries: self._on_read_entries,
            ReadDocument: self._on_read_document,
            ReadSubmission: self._on_read_submission,
            Watch: self.watches.on_watch,
            Unwatch: self.watches.on_unwatch,
            Ping: self.peers.on_ping,
            Announce: self.peers.on_announce,
            ReadPeers: self.peers.on_read_peers,
            ReadTask: self._on_read_task,
            ReadOutcomes: self._on_read_outcomes,
            WaitTask: self._on_wait_task,
            ReadTaskGraph: self._on_read_task_graph,
            ReadRun: self._on_read_run,
            ReadRuns: self._on_read_runs,
            WaitRun: self._on_wait_run,
            ReadOperations: self._on_read_operations,
            ReadOperation: self._on_read_operation,
            ReadUsage: self._on_read_usage,
            ReadUsageTotals: self._on_read_usage_totals,
            ReadPrices: self._on_read_prices,
            ReadInteractions: self._on_read_interactions,
            ReadPartials: self._on_read_partials,
        }
        self._writes: dict[type[Any], WriteHandler] = {
            Commit: self._on_commit,
            Submit: self._on_submit,
            AdvanceClock: self._on_advance_clock,
            Release: self._on_release,
            CancelRun: self._on_cancel_run,
            Resolve: self._on_resolve,
            Respond: self._on_respond,
            RetryRun: self._on_retry_run,
            SetPrices: self._on_set_prices,
            SetBudget: self._on_set_budget,
        }
        """The requests that write: each is applied in a unit of work (``_unit``)."""

    # ------------------------------------------------------------------------------------------ inspection

    @property
    def head_seq(self) -> int:
        """The ``seq`` of the newest commit applied (committed once the current batch commits)."""
        return self._head.seq

    def stored_clock_ms(self) -> int:
        """The manual clock's time as last committed (0 on a new database)."""
        return self._store.get_meta(MANUAL_CLOCK_KEY) or 0

    @property
    def has_lagging_watches(self) -> bool:
        """Whether :meth:`catch_up` has work for a peer that is not congested."""
        return self.watches.has_lagging

    @property
    def queued_output_bytes(self) -> int:
        """Unsent output across every peer, as the shell last said plus what the core produced since."""
        return self._outbox.ledger.total

    # ----------------------------------------------------------------------------------------- connections

    def hello(self, frame: Frame | BadFrame) -> Welcome | Refused:
        """Answer a connection's first frame: ``Welcome`` when it may proceed, ``Refused`` saying why not."""
        return self.peers.hello(frame)

    def attach(self, peer: PeerId, role: str, *, peer_name: str = "", now_ms: int = 0) -> None:
        """A connection completed its handshake with ``role``."""
        self.peers.attach(peer, role, peer_name=peer_name, now_ms=now_ms)

    def detach(self, peer: PeerId) -> None:
        """A connection ended: its watches and waits end, its leases are cut off (settled by the next batch). Safe
        to call for a peer that never attached."""
        state = self.peers.detach(peer)
        if state is None:
            return
        self._outbox.ledger.forget(peer)
        self.watches.forget_peer(peer)
        self.tasks.peer_left(peer)
        if state.announced is not None:
            self.runs.workers_changed()
        self.waits.forget(peer)

    def set_congested(self, peer: PeerId, congested: bool) -> None:
        """The shell's send queue for ``peer`` is over (``True``) or back under (``False``) its bound."""
        if peer in self.peers:
            self.watches.set_congested(peer, congested)

    def set_queued(self, peer: PeerId, queued_bytes: int) -> bool:
        """The shell holds ``queued_bytes`` of ``peer``'s output unsent (call after handing it a batch's output
        and after each send). Whether that brought the peer back under its output budget: its lagging watches may
        catch up again (see :mod:`._output`)."""
        if peer not in self.peers:
            return False
        return self._outbox.ledger.set_queued(peer, queued_bytes)

    def _worker_announced(self, peer: PeerId, name: str, announce: Announce) -> None:
        """A worker's announcement was taken: the runs derive their statuses again, the engine places work."""
        self.runs.workers_changed()
        self.tasks.worker_announced(peer, name, announce.capabilities, announce.max_leases, announce.leases)

    def take_encoded(self) -> list[bytes]:
        """The encoded frames of the output last taken (by :meth:`take_output` or :meth:`catch_up`), one per
        output, in order: the shell sends these bytes instead of encoding the frames again."""
        encoded, self._encoded = self._encoded, []
        return encoded

    # --------------------------------------------------------------------------------------------- batches

    def run_batch(self, frames: Iterable[tuple[PeerId, Received]], now_ms: int) -> bool:
        """Handle one batch inside the shell's open transaction: each frame in order, then let the task engine
        settle what they changed. Returns whether the batch wrote a commit (took a ``seq``).

        What the batch produced waits in the core: the shell commits the transaction, then calls
        :meth:`take_output`; nothing leaves the core before. If this raises (a storage error), the core is broken:
        the shell fails closed and every later batch call raises :class:`BatchOrderError`.
        """
        self._expect_batch("run_batch", _IDLE)
        self._batch_state = _BROKEN  # until the batch got through whole
        head_before = self._head.seq
        for peer, received in frames:
            self._handle(peer, received.call_id, received.frame, now_ms)
        self._log.settle(now_ms if self._clock_ms is None else max(now_ms, self._clock_ms), self._settle)
        self._batch_state = _RAN
        return self._head.seq != head_before

    def take_output(self) -> tuple[list[Output], BatchEffects]:
        """Everything the batch produced, in order, and its effects. Call only once its transaction committed."""
        self._expect_batch("take_output", _RAN)
        self._batch_state = _IDLE
        out, self._encoded = self._outbox.take()
        effects = BatchEffects(clock_ms=self._clock_ms)
        self._clock_ms = None
        return out, effects

    def needs_settle(self, now_ms: int) -> bool:
        """Whether the task engine has work (cut-off leases, runnable tasks, due sleeps): run a batch for it."""
        return self.tasks.needs_settle(now_ms) or self.runs.needs_settle()

    def next_deadline_ms(self) -> int | None:
        """The earliest sleep deadline on the owner's clock, for the shell's timer."""
        return self.tasks.next_deadline_ms()

    def _expect_batch(self, call: str, expected: str) -> None:
        """Refuse a batch call out of order (h11's "can't send data when our state is ERROR"): a shell bug."""
        state = self._batch_state
        if state == expected:
            return
        if state == _BROKEN:
            message = f"{call}() after a batch or a catch-up failed half-way: this core is unusable, start a new owner"
            raise BatchOrderError(message)
        if state == _RAN:
            raise BatchOrderError(f"{call}() before take_output(): the last batch's output was never taken")
        raise BatchOrderError(f"{call}() without a batch: call run_batch() first")

    def _handle(self, peer: PeerId, call_id: int | None, frame: Frame | BadFrame, now_ms: int) -> None:
        """Handle one frame from an attached peer: its handler replies, or raises :class:`Refusal`, answered here
        (a request that writes is rolled back whole by its unit of work first), addressed to ``call_id`` either way."""
        state = self._attached.get(peer)
        if state is None:
            return  # the peer left while its frame waited for the batch: nobody can receive an answer
        try:
            if isinstance(frame, BadFrame):
                raise Refusal(frame.code, frame.message)
            kind = type(frame)
            handler = self._handlers.get(kind)
            write = self._writes.get(kind) if handler is None else None
            if handler is None and write is None:
                raise Refusal(ErrorCode.PROTOCOL_VIOLATION, f"a peer may not send {frame.TYPE} frames to the owner")
            if call_id is None:  # the codec refuses this already; a core fed by hand must not answer nobody
                raise Refusal(ErrorCode.BAD_FRAME, f"bad {frame.TYPE} frame: $.call_id: required field missing")
            if write is not None and state.role not in WRITER_ROLES:
                message = f"this connection is a reader: it may read and watch, never write ({frame.TYPE} refused)"
                raise Refusal(ErrorCode.READ_ONLY, message)
            if self._clock_ms is not None:
                now_ms = max(now_ms, self._clock_ms)
            overload = self._outbox.ledger.overload(peer)
            if overload is not None and kind not in _NEVER_OVERLOADED:
                raise Refusal(ErrorCode.OVERLOADED, overload)
            if write is None:
                assert handler is not None
                reply = handler(peer, call_id, frame, now_ms)
                if reply is not None:  # None: answered later (a wait)
                    self._outbox.reply(peer, call_id, reply)
                return
            # A savepoint for every request but those whose only fallible write is their first (rule 1): a
            # submission, and a commit of one write of ONE_STATEMENT_WRITES (the hot path, written out here).
            if isinstance(frame, Commit):
                guarded = len(frame.writes) != 1 or type(frame.writes[0]) not in ONE_STATEMENT_WRITES
            else:
                guarded = kind is not Submit
            try:
                self._log.apply(write, peer, call_id, frame, now_ms, guarded=guarded)
            except BudgetRefusal as refusal:
                # In the refused request's place, a commit of its own ends the run's task (``_usage`` rule 4).
                self._log.apply(self._end_over_budget, peer, call_id, refusal, now_ms, guarded=True)
                raise
        except Refusal as refusal:
            self._outbox.reply(peer, call_id, Error(code=refusal.code, message=refusal.message))

    def _settle(self, unit: UnitOfWork) -> None:
        """Let the task engine settle what this batch changed, inside the batch's transaction: its changes are one
        more commit (``unit``), and the calls waiting on what ended are answered once it is logged."""
        seq, now_ms = unit.seq, unit.now_ms
        runs = self.runs
        changed_runs: dict[str, RunRecord] = {}
        admitted: list[Record] = []
        if runs.live:  # nothing here for a store without runs: a plain commit costs what it did
            runs.refresh(seq, now_ms, changed_runs)  # what this batch's requests changed
            for conversation_id in runs.admit(seq, now_ms, changed_runs, admitted):
                self._next_positions.pop(conversation_id, None)
        result = self.tasks.settle(seq, now_ms)
        if runs.live or changed_runs:
            runs.tasks_changed(result.records)
            runs.refresh(seq, now_ms, changed_runs)
        records = unit.records
        records += admitted
        if runs.settle_records:
            records += runs.settle_records
            runs.settle_records = []
        if admitted:
            settled = {record.task_id for record in result.records}
            # Drop the admitted task records settling changed again (logged below), keeping the rest: the
            # operations it interrupted were lost here once.
            records[:] = [r for r in records if not (isinstance(r, TaskRecord) and r.task_id in settled)]
        records += result.records
        records += changed_runs.values()
        if records:
            records += self.partials.settled(records, seq, now_ms)  # interrupted streams and ended runs: aborted
        if changed_runs or self._cancel_replies or result.ended:
            unit.then(lambda: self._answer_settled(changed_runs.values(), result.ended))

    def _answer_settled(self, runs: Iterable[RunRecord], ended: Iterable[TaskRecord]) -> None:
        """Once the settling commit is logged: the calls waiting on runs it settled and tasks that ended, and the
        ``cancel_run`` requests of the batch (with the run as it is now)."""
        for run in runs:
            self._answer_run_waits(run)
        if self._cancel_replies:
            cancels, self._cancel_replies = self._cancel_replies, []
            for peer, call_id, run_id in cancels:
                self._outbox.reply(peer, call_id, RunReply(run=self._require_run(run_id)))
        for record in ended:
            waits = self.waits.take("task", record.task_id)
            if waits:
                reply = self._task_reply(record)
                for peer, call_id in waits:
                    self._outbox.reply(peer, call_id, reply)

    def catch_up(self) -> list[Output]:
        """Feed lagging watches from the commit log, one page each. Call between batches, never inside one."""
        self._expect_batch("catch_up", _IDLE)
        self._batch_state = _BROKEN  # until the turn got through whole (a storage error may stop it half-way)
        self.watches.catch_up()
        out, self._encoded = self._outbox.take()
        self._batch_state = _IDLE
        return out

    # -------------------------------------------------------------------------------------------- requests

    def _on_commit(self, unit: UnitOfWork, request: Commit) -> Frame:
        count = len(request.writes)
        if not 1 <= count <= MAX_WRITES_PER_COMMIT:
            message = f"a commit holds 1 to {MAX_WRITES_PER_COMMIT} writes, not {count}"
            raise Refusal(ErrorCode.INVALID, message)
        seq, now_ms = unit.seq, unit.now_ms
        records = unit.records
        results: list[int] = []
        positions: dict[str, int] = {}
        store = self._store
        if request.lease is not None:
            self.peers.require_worker(unit.peer, "only workers commit under a lease")
            self.tasks.check_lease(unit.peer, request.lease)
        for index, write in enumerate(request.writes):
            where = f"writes[{index}]"
            if isinstance(write, StartOperation):
                record: Record = self.runs.start_operation(write, request.lease, seq, now_ms, where)
                result = 0
            elif isinstance(write, CreateInteraction):
                record, result = self.runs.create_interaction(write, request.lease, seq, now_ms, where)
            elif isinstance(write, FinishOperation):
                record, run = self.runs.finish_operation(write, request.lease, seq, now_ms, where)
                records.append(record)
                results.append(0)
                if run is not None:
                    unit.last(run.run_id, run)
                ended = self.partials.finished(record, seq, now_ms)  # after the operation's record
                if ended is not None:
                    records.append(ended)
                continue
            elif isinstance(write, AppendPartial):
                op = store.operation(write.operation_id) if write.operation_id else None
                piece = self.partials.append(write, op, request.lease, seq, now_ms, where)
                results.append(0)
                if piece is not None:
                    records.append(piece)
                continue
            else:
                record, result = self._apply(write, seq, now_ms, where, positions, request.lease)
            records.append(record)
            results.append(result)
        if len(self._next_positions) > MAX_CACHED_POSITIONS:
            self._next_positions.clear()
        self._next_positions.update(positions)  # every write succeeded (nothing in the handler refuses after)
        if self.runs.live:  # the runs of the tasks it changed derive their statuses at the settle
            self.runs.tasks_changed(records)
        return Committed(seq=seq, committed_at_ms=now_ms, results=tuple(results))

    def _apply(
        self, write: Write, seq: int, now_ms: int, where: str, positions: dict[str, int], lease: LeaseRef | None
    ) -> tuple[Record, int]:
        """Apply one write of a commit. ``positions`` holds the entry positions this commit has taken so far."""
        if isinstance(write, CreateTask):
            return self.tasks.create_task(write, seq, now_ms, where), 0
        if isinstance(write, SetTaskState):
            return self.tasks.set_state(write, lease, seq, now_ms, where), 0
        if isinstance(write, AbortTask):
            return self.tasks.abort_task(write, seq, now_ms, where)
        if isinstance(write, AppendEntry):
            conversation_id = write.conversation_id
            check_id(conversation_id, f"{where}.conversation_id")
            check_id(write.entry_id, f"{where}.entry_id")
            check_name(write.kind, f"{where}.kind")
            if write.kind.startswith(RESERVED_ENTRY_PREFIX):
                self.runs.check_run_entry(conversation_id, write.kind, lease, where)
            position = positions.get(conversation_id)
            if position is None:
                position = self._next_positions.get(conversation_id)
            if position is None:
                position = self._store.next_entry_position(conversation_id)
                if position is None:
                    raise missing_conversation(conversation_id)
            entry = _entry(write, position, seq, now_ms)
            try:
                self._store.insert_entry(entry)
            except StoreConflict as exc:
                raise Refusal(ErrorCode.DUPLICATE, f"{where}: entry id {exc.key} already exists") from exc
            positions[conversation_id] = position + 1
            return entry, position
        if isinstance(write, PutDocument):
            check_name(write.name, f"{where}.name")
            if write.conversation_id is not None:
                check_id(write.conversation_id, f"{where}.conversation_id")
                if self._store.conversation(write.conversation_id) is None:
                    raise missing_conversation(write.conversation_id)
            current = self._store.document(write.conversation_id, write.name)
            current_version = 0 if current is None else current.version
            if write.expected_version is not None and write.expected_version != current_version:
                raise Refusal(
                    ErrorCode.CONFLICT,
                    f"{where}: document {write.name!r} is at version {current_version}, "
                    f"not the expected {write.expected_version}",
                )
            document = DocumentRecord(
                conversation_id=write.conversation_id,
                name=write.name,
                version=current_version + 1,
                value=write.value,
                seq=seq,
                updated_at_ms=now_ms,
            )
            self._store.put_document(document)
            return document, document.version
        assert isinstance(write, CreateConversation), write
        check_id(write.conversation_id, f"{where}.conversation_id")
        if write.agent is not None:
            check_name(write.agent, f"{where}.agent")
        if write.owner_task_id is not None:
            self.tasks.check_conversation_owner(write.owner_task_id, where)
        conversation = ConversationRecord(
            conversation_id=write.conversation_id,
            created_at_ms=now_ms,
            seq=seq,
            entry_count=0,
            owner_task_id=write.owner_task_id,
            agent=write.agent,
        )
        try:
            self._store.insert_conversation(conversation)
        except StoreConflict as exc:
            raise Refusal(ErrorCode.DUPLICATE, f"{where}: conversation {exc.key} already exists") from exc
        if write.owner_task_id is not None:
            self.tasks.conversation_created(write.conversation_id, write.owner_task_id)
        return conversation, 0

    def _on_submit(self, unit: UnitOfWork, request: Submit) -> Frame:
        existing = self._store.submission(request.conversation_id, request.request_id)
        if existing is not None:
            if not (existing.kind == request.kind and same_json(existing.payload, request.payload)):
                message = (
                    f"request id {request.request_id!r} was already used in this conversation for a different "
                    f"submission ({existing.submission_id}, kind {existing.kind!r}); nothing was written"
                )
                raise Refusal(ErrorCode.CONFLICT, message)
            return Submitted(submission=existing, created=False)
        seq, now_ms = unit.seq, unit.now_ms
        store = self._store
        # One fallible write, the first: no savepoint needed (rule 1).
        check_id(request.conversation_id, "conversation_id")
        check_id(request.submission_id, "submission_id")
        check_name(request.kind, "kind")
        if not 1 <= len(request.request_id) <= MAX_REQUEST_ID_CHARS:
            raise Refusal(ErrorCode.INVALID, f"request_id must hold 1 to {MAX_REQUEST_ID_CHARS} characters")
        conversation = store.conversation(request.conversation_id)
        if conversation is None:
            raise missing_conversation(request.conversation_id)
        run: RunRecord | None = None
        if request.kind == INPUT_KIND:
            run = self._new_run(request, conversation, seq, now_ms)
        submission = SubmissionRecord(
            submission_id=request.submission_id,
            conversation_id=request.conversation_id,
            request_id=request.request_id,
            kind=request.kind,
            payload=request.payload,
            status=SUBMISSION_QUEUED,
            seq=seq,
            created_at_ms=now_ms,
            run_id=None if run is None else run.run_id,
        )
        try:
            store.insert_submission(submission)
        except StoreConflict as exc:
            raise Refusal(ErrorCode.DUPLICATE, f"submission id {exc.key} already exists") from exc
        unit.records.append(submission)
        if run is not None:
            # Cannot clash: a run is named after its submission, whose id the insert above found unused.
            store.insert_run(run, request.payload)
            self.runs.created(run)
            unit.records.append(run)
        return Submitted(submission=submission, created=True)

    def _new_run(self, request: Submit, conversation: ConversationRecord, seq: int, now_ms: int) -> RunRecord:
        """The queued run an ``input`` submission admits (checked here, stored by the caller). A run takes its
        submission's id (see ``_runs``)."""
        if conversation.agent is None:
            message = (
                f"conversation {conversation.conversation_id} is not bound to an agent, so an input has no run to "
                "start; bind one with create_conversation(agent=...), or submit another kind; nothing was written"
            )
            raise Refusal(ErrorCode.INVALID, message)
        payload = request.payload
        if not isinstance(payload, str) or not 1 <= len(payload.encode()) <= MAX_INPUT_BYTES:
            raise Refusal(ErrorCode.INVALID, f"an input's payload is a text of 1 byte to {MAX_INPUT_BYTES} bytes")
        if request.when_busy not in ("follow_up", "reject"):
            raise Refusal(ErrorCode.INVALID, f"when_busy must be follow_up or reject, not {request.when_busy!r}")
        active = self.runs.active_run(conversation.conversation_id)
        if request.when_busy == "reject" and active is not None:
            message = (
                f"conversation {conversation.conversation_id} has an active run ({active.run_id}, {active.status}) "
                "and this submission asked to be refused while busy; nothing was written. Submit with "
                "when_busy='follow_up' to queue a run after it, or wait for it"
            )
            raise Refusal(ErrorCode.CONFLICT, message)
        return RunRecord(
            run_id=request.submission_id,
            conversation_id=conversation.conversation_id,
            agent=conversation.agent,
            version=0,
            status="queued",
            submission_id=request.submission_id,
            seq=seq,
            created_at_ms=now_ms,
            updated_at_ms=now_ms,
        )

    def _on_read_run(self, peer: PeerId, call_id: int, request: ReadRun, now_ms: int) -> None:
        self._outbox.reply(peer, call_id, RunReply(run=self._require_run(request.run_id)))

    def _on_read_runs(self, peer: PeerId, call_id: int, request: ReadRuns, now_ms: int) -> None:
        if not 1 <= request.limit <= MAX_READ_LIMIT:
            message = f"limit must be between 1 and {MAX_READ_LIMIT}, not {request.limit}"
            raise Refusal(ErrorCode.INVALID, message)
        runs, more = self._store.run_page(request.conversation_id, request.status, request.after_run_id, request.limit)
        runs, more = _fit_page(runs, more, lambda one: RunsReply(runs=(one,)))
        next_after = runs[-1].run_id if more else None
        self._outbox.reply(peer, call_id, RunsReply(runs=tuple(runs), next_after_run_id=next_after))

    def _on_wait_run(self, peer: PeerId, call_id: int, request: WaitRun, now_ms: int) -> None:
        run = self._require_run(request.run_id)
        if run.status in SETTLED:
            self._outbox.reply(peer, call_id, RunReply(run=run))
        else:
            self.waits.add("run", run.run_id, peer, call_id)

    def _on_cancel_run(self, unit: UnitOfWork, request: CancelRun) -> Frame | None:
        """Cancel a run: a queued one ends ``cancelled`` now; an active one has its task aborted (bottom-up, by the
        engine) and ends ``cancelled`` once that is terminal. Cancelling a cancelled run again is a no-op; a run that
        ended otherwise is a ``conflict``. The reply is the run as it is once this batch has settled the mark:
        ``cancelled`` if nothing had to run first, otherwise its status with reason ``cancelling``."""
        run = self._require_run(request.run_id)
        if run.status in TERMINAL:
            if run.status == "cancelled":
                return RunReply(run=run)
            raise Refusal(ErrorCode.CONFLICT, f"run {run.run_id} already ended {run.status}: nothing to cancel")
        if run.task_id is None:
            cancelled = attrs.evolve(run, status="cancelled", seq=unit.seq, updated_at_ms=unit.now_ms)
            self.runs.put(cancelled)
            unit.records.append(cancelled)
            unit.then(lambda: self._answer_run_waits(cancelled))
            return RunReply(run=cancelled)
        record, _ = self.tasks.abort_task(AbortTask(task_id=run.task_id), unit.seq, unit.now_ms, "run")
        unit.records.append(record)
        self.runs.tasks_changed((record,))
        peer, call_id, run_id = unit.peer, unit.call_id, run.run_id
        assert call_id is not None
        unit.then(lambda: self._cancel_replies.append((peer, call_id, run_id)))  # answered once settled
        return None

    def _on_read_operations(self, peer: PeerId, call_id: int, request: ReadOperations, now_ms: int) -> None:
        if not 1 <= request.limit <= MAX_READ_LIMIT or not 0 <= request.cursor <= MAX_CURSOR:
            message = f"limit must be between 1 and {MAX_READ_LIMIT} and cursor 0 or more"
            raise Refusal(ErrorCode.INVALID, message)
        self._require_run(request.run_id)
        operations, more = self._store.operation_page(request.run_id, request.cursor, request.limit)
        operations, more = _fit_page(operations, more, lambda one: OperationsReply(operations=(one,)))
        next_cursor = request.cursor + len(operations) if more else None
        self._outbox.reply(peer, call_id, OperationsReply(operations=tuple(operations), next_cursor=next_cursor))

    def _on_read_operation(self, peer: PeerId, call_id: int, request: ReadOperation, now_ms: int) -> None:
        operation = self._store.operation(request.operation_id)
        if operation is None:
            raise Refusal(ErrorCode.NOT_FOUND, f"operation {request.operation_id} does not exist")
        self._outbox.reply(peer, call_id, OperationReply(operation=operation))

    def _on_read_usage(self, peer: PeerId, call_id: int, request: ReadUsage, now_ms: int) -> None:
        if request.conversation_id is None:
            totals = [
                UsageTotal(scope="model", key=key, usage=usage) for key, usage in self._store.usage("model", None)
            ]
        else:
            if self._store.conversation(request.conversation_id) is None:
                raise Refusal(ErrorCode.NOT_FOUND, no_conversation(request.conversation_id))
            found = self._store.usage("conversation", request.conversation_id)
            totals = [UsageTotal(scope="conversation", key=key, usage=usage) for key, usage in found]
        self._outbox.reply(peer, call_id, UsageReply(totals=tuple(totals)))

    def _end_over_budget(self, unit: UnitOfWork, refusal: BudgetRefusal) -> None:
        """A run's model request was refused for its budget (``_usage`` rule 4): its task ends ``failed``
        (``budget_exceeded``) in a commit of its own, in place of the refused one, which ends the phase's lease.
        Refused (a plain ``conflict``, which the phase meets as any other error) under another task's lease or an
        abort handler's, which ends as it was going to."""
        lease = refusal.lease
        if lease is None or lease.task_id != refusal.task_id:
            raise Refusal(ErrorCode.CONFLICT, refusal.message)
        outcome = TaskOutcome(status="failed", reason="budget_exceeded", error=refusal.why)
        end = SetTaskState(task_id=lease.task_id, status="terminal", outcome=outcome)
        try:
            record = self.tasks.set_state(end, lease, unit.seq, unit.now_ms, "budget")
        except Refusal:  # an abort handler's lease
            raise Refusal(ErrorCode.CONFLICT, refusal.message) from None
        unit.records.append(record)
        self.runs.tasks_changed((record,))

    def _on_read_usage_totals(self, peer: PeerId, call_id: int, request: ReadUsageTotals, now_ms: int) -> None:
        self._outbox.reply(peer, call_id, self.runs.accounting.read_totals(request, MAX_READ_LIMIT))

    def _on_set_prices(self, unit: UnitOfWork, request: SetPrices) -> Frame:
        """Settings, not history: a price change takes no seq (results committed from now on use it)."""
        self.runs.accounting.set_prices(request)
        return PricesReply(prices=self.runs.accounting.price_table())

    def _on_read_prices(self, peer: PeerId, call_id: int, request: ReadPrices, now_ms: int) -> None:
        self._outbox.reply(peer, call_id, PricesReply(prices=self.runs.accounting.price_table()))

    def _on_set_budget(self, unit: UnitOfWork, request: SetBudget) -> Frame:
        """Settings, not history: a budget change takes no seq; the next model request of a run is checked."""
        return self.runs.accounting.set_budget(request)

    def _on_resolve(self, unit: UnitOfWork, request: Resolve) -> Frame:
        operation, records = self.runs.resolve(request, unit.seq, unit.now_ms)
        unit.records += records
        self.runs.tasks_changed(records)
        return OperationReply(operation=operation)

    def _on_respond(self, unit: UnitOfWork, request: Respond) -> Frame:
        interaction, records = self.runs.respond(request, unit.seq, unit.now_ms)
        unit.records += records
        self.runs.tasks_changed(records)
        return InteractionReply(interaction=interaction)

    def _on_retry_run(self, unit: UnitOfWork, request: RetryRun) -> Frame:
        run, records = self.runs.retry_run(request.run_id, unit.seq, unit.now_ms)
        unit.records += records
        self.runs.tasks_changed(records)
        return RunReply(run=run)

    def _on_read_partials(self, peer: PeerId, call_id: int, request: ReadPartials, now_ms: int) -> None:
        page = self.partials.read(
            run_id=request.run_id,
            operation_id=request.operation_id,
            from_operation_id=request.from_operation_id,
            from_offset=request.from_offset,
            budget=READ_BUDGET_BYTES,
        )
        if not page.records:  # nothing streamed yet, or nothing by that id: say which
            if request.run_id is not None and self._store.run(request.run_id) is None:
                raise Refusal(ErrorCode.NOT_FOUND, f"run {request.run_id} does not exist")
            if request.operation_id is not None and self._store.operation(request.operation_id) is None:
                raise Refusal(ErrorCode.NOT_FOUND, f"operation {request.operation_id} does not exist")
        reply = PartialsReply(
            partials=tuple(page.records),
            seq=self._head.seq,
            next_operation_id=page.next_operation_id,
            next_offset=page.next_offset,
        )
        self._outbox.reply(peer, call_id, reply)

    def _on_read_interactions(self, peer: PeerId, call_id: int, request: ReadInteractions, now_ms: int) -> None:
        if not 1 <= request.limit <= MAX_READ_LIMIT:
            message = f"limit must be between 1 and {MAX_READ_LIMIT}, not {request.limit}"
            raise Refusal(ErrorCode.INVALID, message)
        found, more = self._store.interaction_page(
            request.status, request.run_id, request.after_interaction_id, request.limit
        )
        found, more = _fit_page(found, more, lambda one: InteractionsReply(interactions=(one,)))
        next_after = found[-1].interaction_id if more else None
        interactions = tuple(found)
        reply = InteractionsReply(interactions=interactions, next_after_interaction_id=next_after)
        self._outbox.reply(peer, call_id, reply)

    def _require_run(self, run_id: str) -> RunRecord:
        run = self.runs.live.get(run_id) or self._store.run(run_id)
        if run is None:
            raise Refusal(ErrorCode.NOT_FOUND, f"run {run_id} does not exist")
        return run

    def _answer_run_waits(self, run: RunRecord) -> None:
        if run.status in SETTLED:
            for peer, call_id in self.waits.take("run", run.run_id):
                self._outbox.reply(peer, call_id, RunReply(run=run))

    def _on_advance_clock(self, unit: UnitOfWork, request: AdvanceClock) -> Frame:
        if self._clock != "manual":
            message = "this owner runs on the wall clock; start it with --clock manual to move time by request"
            raise Refusal(ErrorCode.NOT_ALLOWED, message)
        if request.by_ms < 0:
            message = f"by_ms must not be negative (got {request.by_ms}); the clock never goes back"
            raise Refusal(ErrorCode.INVALID, message)
        new_ms = unit.now_ms + request.by_ms
        if new_ms > MAX_CLOCK_MS:
            message = f"advancing by {request.by_ms} ms would take the clock past {MAX_CLOCK_MS} ms"
            raise Refusal(ErrorCode.INVALID, message)
        self._store.set_meta(MANUAL_CLOCK_KEY, new_ms)
        unit.then(lambda: self._clock_moved(new_ms))
        return ClockReply(now_ms=new_ms)

    def _clock_moved(self, now_ms: int) -> None:
        """The manual clock was advanced: the batch's later requests and its settle see the new time."""
        self._clock_ms = now_ms

    def _on_read_conversation(self, peer: PeerId, call_id: int, request: ReadConversation, now_ms: int) -> None:
        conversation = self._store.conversation(request.conversation_id)
        if conversation is None:
            raise Refusal(ErrorCode.NOT_FOUND, no_conversation(request.conversation_id))
        self._outbox.reply(peer, call_id, ConversationReply(conversation=conversation))

    def _on_read_entries(self, peer: PeerId, call_id: int, request: ReadEntries, now_ms: int) -> None:
        if not 1 <= request.limit <= MAX_READ_LIMIT:
            message = f"limit must be between 1 and {MAX_READ_LIMIT}, not {request.limit}"
            raise Refusal(ErrorCode.INVALID, message)
        if request.cursor is not None and not 0 <= request.cursor <= MAX_CURSOR:
            message = f"cursor must be a position (0 or more) or null, not {request.cursor}"
            raise Refusal(ErrorCode.INVALID, message)
        if self._store.conversation(request.conversation_id) is None:
            raise Refusal(ErrorCode.NOT_FOUND, no_conversation(request.conversation_id))
        entries, more = self._store.entry_page(
            request.conversation_id, request.order, request.cursor, request.limit, max_data_bytes=READ_BUDGET_BYTES
        )
        next_cursor = entries[-1].position if more else None
        self._outbox.reply(peer, call_id, EntriesReply(entries=tuple(entries), next_cursor=next_cursor))

    def _on_read_document(self, peer: PeerId, call_id: int, request: ReadDocument, now_ms: int) -> None:
        conversation_id = request.conversation_id
        if conversation_id is not None and self._store.conversation(conversation_id) is None:
            raise Refusal(ErrorCode.NOT_FOUND, no_conversation(conversation_id))
        document = self._store.document(conversation_id, request.name)
        self._outbox.reply(peer, call_id, DocumentReply(document=document))

    def _on_read_submission(self, peer: PeerId, call_id: int, request: ReadSubmission, now_ms: int) -> None:
        if self._store.conversation(request.conversation_id) is None:
            raise Refusal(ErrorCode.NOT_FOUND, no_conversation(request.conversation_id))
        submission = self._store.submission(request.conversation_id, request.request_id)
        self._outbox.reply(peer, call_id, SubmissionReply(submission=submission))

    def _on_read_task(self, peer: PeerId, call_id: int, request: ReadTask, now_ms: int) -> None:
        record = self.tasks.record(request.task_id)
        if record is None:
            raise Refusal(ErrorCode.NOT_FOUND, _no_task(request.task_id))
        self._outbox.reply(peer, call_id, self._task_reply(record))

    def _on_read_outcomes(self, peer: PeerId, call_id: int, request: ReadOutcomes, now_ms: int) -> None:
        if len(request.task_ids) > MAX_READ_LIMIT:
            message = f"read at most {MAX_READ_LIMIT} outcomes at once, not {len(request.task_ids)}"
            raise Refusal(ErrorCode.INVALID, message)
        outcomes: list[TaskOutcome | None] = []
        for task_id in request.task_ids:
            record = self.tasks.record(task_id)
            if record is None:
                raise Refusal(ErrorCode.NOT_FOUND, _no_task(task_id))
            outcomes.append(record.outcome if record.status == "terminal" else None)
        # The first outcomes that fit the read budget (one at least): the client asks again for the rest.
        count = fitting(outcomes, lambda outcome: OutcomesReply(outcomes=(outcome,)), READ_BUDGET_BYTES)
        self._outbox.reply(peer, call_id, OutcomesReply(outcomes=tuple(outcomes[:count])))

    def _on_wait_task(self, peer: PeerId, call_id: int, request: WaitTask, now_ms: int) -> None:
        record = self.tasks.record(request.task_id)
        if record is None:
            raise Refusal(ErrorCode.NOT_FOUND, _no_task(request.task_id))
        if record.status == "terminal":
            self._outbox.reply(peer, call_id, self._task_reply(record))
        else:
            self.waits.add("task", request.task_id, peer, call_id)

    def _on_read_task_graph(self, peer: PeerId, call_id: int, request: ReadTaskGraph, now_ms: int) -> None:
        if not 1 <= request.limit <= MAX_READ_LIMIT:
            message = f"limit must be between 1 and {MAX_READ_LIMIT}, not {request.limit}"
            raise Refusal(ErrorCode.INVALID, message)
        nodes, more = self.tasks.graph(request.after_task_id, request.limit)
        nodes, more = _fit_page(nodes, more, lambda one: TaskGraphReply(seq=0, nodes=(one,)))
        next_after = nodes[-1].task.task_id if more else None
        reply = TaskGraphReply(seq=self._head.seq, nodes=tuple(nodes), next_after_task_id=next_after)
        self._outbox.reply(peer, call_id, reply)

    def _on_release(self, unit: UnitOfWork, request: Release) -> Frame:
        self.peers.require_worker(unit.peer, "only workers hold leases: a release is a worker's (nothing changed)")
        self.tasks.release(unit.peer, request.lease, request.migration_error)
        return Ok()

    def _task_reply(self, record: TaskRecord) -> TaskReply:
        input_value, checkpoint = self._store.task_data(record.task_id)
        return TaskReply(task=record, input=input_value, checkpoint=checkpoint)

    # ---------------------------------------------------------------------------------------------- helpers


def _fit_page(items: list[T], more: bool, alone: Callable[[T], Frame]) -> tuple[list[T], bool]:
    """A page cut to the items that fit the read budget once encoded (one at least); ``more`` if any was cut."""
    count = fitting(items, alone, READ_BUDGET_BYTES)
    if count == len(items):
        return items, more
    return items[:count], True


def _no_task(task_id: str) -> str:
    return f"task {task_id} does not exist"


def _entry(write: AppendEntry, position: int, seq: int, now_ms: int) -> EntryRecord:
    return EntryRecord(
        entry_id=write.entry_id,
        conversation_id=write.conversation_id,
        position=position,
        seq=seq,
        kind=write.kind,
        data=write.data,
        created_at_ms=now_ms,
    )
