"""The storage owner's durable logic, sans-IO: :class:`OwnerCore`, its one entry.

The shell (``storage_owner.io``) feeds the core what happened: a peer said hello, a batch of frames arrived
(:meth:`OwnerCore.run_batch`, inside the transaction the shell opened), a peer went away. The core answers with
frames to send, which the shell takes (:meth:`OwnerCore.take_output`) only after it committed that transaction; a
batch call out of that order raises :class:`BatchOrderError`. The core never reads the clock (``now_ms`` is handed
in), never does I/O beyond calling the store it was given, and never raises on bad input: a handler refuses a bad
request by raising :class:`Refusal`, which becomes an ``Error`` reply in one place, and the request changes nothing.

The core keeps the batch loop and a table from frame type to handler; each handler lives in the room of the
aggregate it changes or reads (docs/architecture.md, "Reading the owner"): peers (``_peers``), watches
(``_watches``), conversations (``_conversations``), commits (``_commits``), runs (``_runs``), operations and
interactions (``_operations``), tasks (``_tasks``), usage (``_usage``), partial output (``_partials``). Rules:

1. A frame is checked in this order before its handler runs: a frame that decoded, a type a peer may send, a call
   id, a role that may send it (a reader reads and watches, never writes), the peer's output budget (requests that
   only resubscribe, ping or announce are answered past it).
2. Every request that writes is applied inside a unit of work (``_unit``), which owns its savepoint, the undo of
   memory, its commit-log record and the fan-out: a refused request changes nothing and does not disturb the other
   requests of its batch. A request that changed records takes the next ``seq``; a refused request, a setting
   (prices, budgets, the manual clock) and a no-op take none.
3. After a batch's requests, the settle (in a unit of work of its own) lets the runs derive their statuses and admit
   queued runs, and the task engine settle what changed: one more commit, after which the calls waiting on what
   ended are answered.
4. A budget refusal (``_usage`` rule 4) is replaced by a commit of its own that ends the run's task.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final, Literal

import attrs

from protocol import (
    AGENT_TASK_PREFIX,
    TOOL_TASK_PREFIX,
    AbortConversation,
    AdvanceClock,
    Announce,
    BadFrame,
    CancelRun,
    ClockReply,
    Commit,
    Configure,
    ConfirmLease,
    Error,
    ErrorCode,
    Frame,
    Ping,
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
    ReadSubmissions,
    ReadTask,
    ReadTaskGraph,
    ReadUsage,
    ReadUsageTotals,
    Received,
    Refused,
    Release,
    Resolve,
    Respond,
    RetryRun,
    RunRecord,
    RunUsage,
    SetBudget,
    SetPrices,
    Submit,
    TaskRecord,
    Unwatch,
    WaitRun,
    WaitSubmission,
    WaitTask,
    Watch,
    Welcome,
    Withdraw,
)

from ._checks import Refusal
from ._commits import ONE_STATEMENT_WRITES, Commits
from ._config import Configurations
from ._conversations import Conversations, Entries
from ._inbox import Inbox
from ._operation_records import OperationRecords
from ._operations import Operations
from ._output import DEFAULT_PEER_OUTPUT_BYTES, DEFAULT_TOTAL_OUTPUT_BYTES, Outbox, Output, OutputLedger, PeerId
from ._partials import Partials
from ._peers import DEFAULT_HEARTBEAT_MS, WRITER_ROLES, Peers, Waits
from ._ports import Store
from ._run_rules import DEFAULT_MAX_CONCURRENT_RUNS
from ._runs import Runs
from ._task_settle import MODEL_GRACE_MS, ORPHAN_GRACE_MS
from ._tasks import TaskEngine
from ._unit import CommitLog, Head, Journal, UnitOfWork, WriteHandler
from ._usage import BudgetRefusal, Usage
from ._watches import Watches

MANUAL_CLOCK_KEY: Final = "manual_clock_ms"
MAX_CLOCK_MS: Final = (1 << 62) - 1
"""The manual clock stays below this (SQLite integers are signed 64-bit, and deadlines add to the clock)."""
_NEVER_OVERLOADED: Final = frozenset({Watch, Unwatch, Ping, Announce})
"""Requests answered even past an output budget: their replies are small and fixed, the client sends them without
awaiting the reply (a resubscription, a heartbeat, a worker's announcement after a reconnect), and what they lead to
(a watch's catch-up, leases up to ``max_leases``) is budgeted or bounded on its own."""
_IDLE: Final = "idle"
_RAN: Final = "ran"
_BROKEN: Final = "broken"
"""The core's batch states: between batches, after :meth:`OwnerCore.run_batch` until its output is taken, and
after a batch or a catch-up turn raised half-way (nothing is callable any more)."""
ReadHandler = Callable[[PeerId, int, Any, int], Frame | None]
"""A request handler that only reads (or registers a watch or a wait): its reply, or ``None`` if answered later."""


class BatchOrderError(Exception):
    """The shell called the core's batch methods out of order (a bug in the caller, never bad input)."""


@attrs.frozen
class BatchEffects:
    """What the shell must apply once a batch has committed, besides sending frames."""

    clock_ms: int | None = None
    """A manual clock was advanced to this time."""
    ended_runs: tuple[RunRecord, ...] = ()
    """The runs the batch ended (terminal), with telemetry on (:meth:`OwnerCore.observe`)."""


@attrs.frozen
class CoreGauges:
    """What the owner's telemetry reads of the core, at one instant (:meth:`OwnerCore.gauges`)."""

    runs_by_status: dict[str, int]
    """Live (not terminal) runs by status."""
    ready_tasks: int
    blocked_tasks: int
    leased_tasks: int
    workers: int
    usage: dict[tuple[str, str], RunUsage]
    """The usage committed since :meth:`OwnerCore.observe`, by kind and name (see ``Usage.totals``)."""


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
        model_grace_ms: int = MODEL_GRACE_MS,
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
        """The manual clock's time, once a request of this batch advanced it."""
        # The rooms, each built with what it uses: its own port of the store first, and by name the read ports of
        # the other rooms' records it reads (``stored_...``, all ``store`` here); nothing is wired after it is built.
        head = Head(store.head_seq())
        self._head = head
        self._outbox = outbox = Outbox(OutputLedger(peer_budget=peer_output_budget, total_budget=total_output_budget))
        journal = Journal()  # the undo of every room's memory while a request's unit of work is open
        self.watches = Watches(store, outbox, head, stored_conversations=store)
        self._log = CommitLog(store, journal, head, outbox, self.watches)
        self.waits = Waits()
        self.peers = Peers(
            head, token=token, instance=instance, clock=clock, heartbeat_ms=heartbeat_ms, announced=self._announced
        )
        self._attached = self.peers.attached
        operation_records = OperationRecords(store, stored_tasks=store)
        self.config = Configurations(store, journal, self.peers.announcements)  # names checked at configure
        self.tasks = TaskEngine(
            store,
            outbox,
            journal,
            self.waits,
            head,
            self.peers,
            stored_conversations=store,
            orphan_grace_ms=orphan_grace_ms,
            model_grace_ms=model_grace_ms,  # a run's task blocked missing_model fails no_model past it
            # The run families: a cut-off phase of a run's task or tool task interrupts its operations (engine rule 9).
            cut_off_hooks={AGENT_TASK_PREFIX: operation_records.cut_off, TOOL_TASK_PREFIX: operation_records.cut_off},
            requires=self.config.requirement,  # a run's task in a conversation configured to use a model
            ends_owned=(TOOL_TASK_PREFIX,),  # no nested call outlives the call that made it (engine rule 12)
        )
        entries = Entries(store, journal)
        self.inbox = Inbox(store, journal, entries.place, self.waits, outbox, self.config)
        self.runs = Runs(
            store,
            self.tasks,
            journal,
            self.waits,
            outbox,
            operation_records.reset_attempts,
            self.inbox,
            stored_tasks=self.tasks.data,
            max_concurrent_runs=max_concurrent_runs,
        )
        self.usage = Usage(
            store, self.tasks, self.runs, stored_conversations=store, stored_tasks=self.tasks.data, journal=journal
        )
        self.operations = Operations(
            store, operation_records, self.tasks, self.runs, self.usage, stored_runs=store, stored_tasks=self.tasks.data
        )
        self.partials = Partials(
            store, journal, head, stored_runs=store, stored_operations=store, place_entry=entries.place
        )
        self.conversations = Conversations(store, entries, self.tasks, self.runs, self.inbox)
        self.commits = Commits(self.peers, self.tasks, self.runs, self.conversations, self.operations, self.partials)
        self._reads: dict[type[Any], ReadHandler] = {
            ReadConversation: self.conversations.on_read_conversation,
            ReadEntries: self.conversations.on_read_entries,
            ReadDocument: self.conversations.on_read_document,
            ReadSubmission: self.conversations.on_read_submission,
            ReadSubmissions: self.conversations.on_read_submissions,
            WaitSubmission: self.inbox.on_wait_submission,
            Watch: self.watches.on_watch,
            Unwatch: self.watches.on_unwatch,
            Ping: self.peers.on_ping,
            Announce: self.peers.on_announce,
            ReadPeers: self.peers.on_read_peers,
            ReadTask: self.tasks.on_read_task,
            ReadOutcomes: self.tasks.on_read_outcomes,
            WaitTask: self.tasks.on_wait_task,
            ReadTaskGraph: self.tasks.on_read_task_graph,
            ConfirmLease: self.tasks.on_confirm_lease,
            ReadRun: self.runs.on_read_run,
            ReadRuns: self.runs.on_read_runs,
            WaitRun: self.runs.on_wait_run,
            ReadOperations: self.operations.on_read_operations,
            ReadOperation: self.operations.on_read_operation,
            ReadInteractions: self.operations.on_read_interactions,
            ReadUsage: self.usage.on_read_usage,
            ReadUsageTotals: self.usage.on_read_usage_totals,
            ReadPrices: self.usage.on_read_prices,
            ReadPartials: self.partials.on_read_partials,
        }
        """The requests that only read (or register a watch or a wait), by frame type."""
        self._writes: dict[type[Any], WriteHandler] = {
            Commit: self.commits.on_commit,
            Submit: self.conversations.on_submit,
            Withdraw: self.conversations.on_withdraw,
            Configure: self.conversations.on_configure,
            AbortConversation: self.conversations.on_abort_conversation,
            CancelRun: self.runs.on_cancel_run,
            RetryRun: self.runs.on_retry_run,
            Resolve: self.operations.on_resolve,
            Respond: self.operations.on_respond,
            Release: self.tasks.on_release,
            SetPrices: self.usage.on_set_prices,
            SetBudget: self.usage.on_set_budget,
            AdvanceClock: self._on_advance_clock,
        }
        """The requests that write, by frame type: each is applied in a unit of work (rule 2)."""

    # ------------------------------------------------------------------------------------------ inspection

    @property
    def head_seq(self) -> int:
        """The ``seq`` of the newest commit applied (committed once the current batch commits)."""
        return self._head.seq

    def observe(self) -> None:
        """Keep what telemetry reads from now on: the runs each batch ends (:attr:`BatchEffects.ended_runs`) and the
        usage committed (:meth:`gauges`). Off by default: a core nobody observes pays one check where a run ends
        and where usage is added."""
        if self.runs.ended is None:
            self.runs.ended = []
            self.usage.totals = {}

    def gauges(self) -> CoreGauges:
        """Live runs by status, the task queues, and the usage committed (empty unless :meth:`observe` was
        called). Call between batches."""
        by_status: dict[str, int] = {}
        for run in self.runs.live.values():
            by_status[run.status] = by_status.get(run.status, 0) + 1
        ready, blocked, leased, workers = self.tasks.queue_depths()
        return CoreGauges(
            runs_by_status=by_status,
            ready_tasks=ready,
            blocked_tasks=blocked,
            leased_tasks=leased,
            workers=workers,
            usage=dict(self.usage.totals or {}),
        )

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

    def take_encoded(self) -> list[bytes]:
        """The encoded frames of the output last taken (by :meth:`take_output` or :meth:`catch_up`), one per
        output, in order: the shell sends these bytes instead of encoding the frames again."""
        encoded, self._encoded = self._encoded, []
        return encoded

    def _announced(self, peer: PeerId, name: str, announce: Announce) -> None:
        """A worker's announcement was taken: the runs derive their statuses again, the engine places work."""
        self.runs.workers_changed()
        self.tasks.worker_announced(peer, name, announce.capabilities, announce.max_leases, announce.leases)

    # --------------------------------------------------------------------------------------------- batches

    def run_batch(self, frames: Iterable[tuple[PeerId, Received]], now_ms: int) -> bool:
        """Handle one batch inside the shell's open transaction: each frame in order, then settle what they changed
        (rule 3). Returns whether the batch wrote a commit (took a ``seq``).

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
        self.tasks.write_saved()
        self._batch_state = _RAN
        return self._head.seq != head_before

    def take_output(self) -> tuple[list[Output], BatchEffects]:
        """Everything the batch produced, in order, and its effects. Call only once its transaction committed."""
        self._expect_batch("take_output", _RAN)
        self._batch_state = _IDLE
        out, self._encoded = self._outbox.take()
        ended = self.runs.ended
        if ended:
            effects = BatchEffects(clock_ms=self._clock_ms, ended_runs=tuple(ended))
            ended.clear()
        else:
            effects = BatchEffects(clock_ms=self._clock_ms)
        self._clock_ms = None
        return out, effects

    def catch_up(self) -> list[Output]:
        """Feed lagging watches from the commit log, one page each. Call between batches, never inside one."""
        self._expect_batch("catch_up", _IDLE)
        self._batch_state = _BROKEN  # until the turn got through whole (a storage error may stop it half-way)
        self.watches.catch_up()
        out, self._encoded = self._outbox.take()
        self._batch_state = _IDLE
        return out

    def needs_settle(self, now_ms: int) -> bool:
        """Whether the task engine has work (cut-off leases, runnable tasks, due sleeps): run a batch for it."""
        return self.tasks.needs_settle(now_ms) or self.runs.needs_settle()

    def next_deadline_ms(self) -> int | None:
        """The earliest deadline on the owner's clock (a sleep, the end of an orphan or a model grace), for the shell's
        timer."""
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
        """Handle one frame from an attached peer (rule 1): its handler replies, or raises :class:`Refusal`, answered
        here (a request that writes is rolled back whole by its unit of work first), addressed to ``call_id``."""
        state = self._attached.get(peer)
        if state is None:
            return  # the peer left while its frame waited for the batch: nobody can receive an answer
        try:
            if isinstance(frame, BadFrame):
                raise Refusal(frame.code, frame.message)
            kind = type(frame)
            write = self._writes.get(kind)  # first: commits are the hot path
            read = self._reads.get(kind) if write is None else None
            if read is None and write is None:
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
                assert read is not None
                reply = read(peer, call_id, frame, now_ms)
                if reply is not None:  # None: answered later (a wait)
                    self._outbox.reply(peer, call_id, reply)
                return
            # A savepoint unless the request's only fallible write is its first: a submission, most commits of one
            # write (``_commits`` rule 4: the hot path, written out here, decided before the unit opens).
            if isinstance(frame, Commit):
                guarded = len(frame.writes) != 1 or type(frame.writes[0]) not in ONE_STATEMENT_WRITES
            else:
                guarded = kind is not Submit
            try:
                self._log.apply(write, peer, call_id, frame, now_ms, guarded=guarded)
            except BudgetRefusal as refusal:
                # In the refused request's place, a commit of its own ends the run's task (rule 4).
                self._log.apply(self.usage.end_over_budget, peer, call_id, refusal, now_ms, guarded=True)
                raise
        except Refusal as refusal:
            self._outbox.reply(peer, call_id, Error(code=refusal.code, message=refusal.message))

    def _settle(self, unit: UnitOfWork) -> None:
        """Rule 3: the runs, then the task engine, settle what this batch changed, inside the batch's transaction;
        their changes are one more commit (``unit``), in this order: admitted runs' user entries and tasks, the
        operations cut-off phases interrupted, those the run tasks and tool tasks it ended left open (failed), the
        interactions whose approval ended unanswered, the task records, the runs, the partial output those ended."""
        seq, now_ms = unit.seq, unit.now_ms
        runs = self.runs
        changed_runs: dict[str, RunRecord] = {}
        records = unit.records
        if runs.live:  # nothing here for a store without runs: a plain commit costs what it did
            runs.refresh(seq, now_ms, changed_runs)  # what this batch's requests changed
            runs.admit(seq, now_ms, changed_runs, records)
        admitted = bool(records)
        result = self.tasks.settle(seq, now_ms)
        if runs.live or changed_runs:
            runs.tasks_changed(result.records)
            runs.refresh(seq, now_ms, changed_runs)
        records += result.cut_off
        if result.ended:
            records += self.operations.settle_ended(result.ended, seq, now_ms)
        records += self.operations.close_interactions(result.records, seq, now_ms)
        if admitted:
            settled = {record.task_id for record in result.records}
            # Drop the admitted task records settling changed again (logged below), keeping the rest: the
            # operations it interrupted were lost here once.
            records[:] = [r for r in records if not (isinstance(r, TaskRecord) and r.task_id in settled)]
        records += result.records
        records += changed_runs.values()
        self.inbox.flush(unit)  # the steers placed, the inputs settled
        if records:
            records += self.partials.settled(records, seq, now_ms)  # interrupted streams and ended runs: aborted
        if changed_runs or result.ended or runs.has_cancels:
            unit.then(lambda: self._answer_settled(changed_runs.values(), result.ended))

    def _answer_settled(self, runs: Iterable[RunRecord], ended: Iterable[TaskRecord]) -> None:
        """Once the settling commit is logged: the calls waiting on what it settled (``cancel_run`` included)."""
        self.runs.answer_settled(runs)
        self.tasks.answer_waits(ended)

    # -------------------------------------------------------------------------------------------- requests

    def _on_advance_clock(self, unit: UnitOfWork, request: AdvanceClock) -> Frame:
        """Move the manual clock: a setting (no seq), stored so that a restarted owner starts from it."""
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
