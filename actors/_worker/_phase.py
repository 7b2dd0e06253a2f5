"""``actors.Phase``: what a task's phase (or abort handler) sees while it runs under a lease."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import trio

from protocol import (
    Committed,
    ConnectionLost,
    CreateInteraction,
    ErrorCode,
    FaultReason,
    FinishOperation,
    Lease,
    LeaseRef,
    OutcomeReason,
    SetTaskState,
    StaleLease,
    StartOperation,
    TaskOutcome,
    UsageError,
    WaitPolicy,
    json_value,
    operation_key_json,
    phase_of,
)

from .._app._reports import Report, Reports
from .._client._client import Client
from .._client._transaction import Transaction
from ._faults import KillSwitch

if TYPE_CHECKING:
    from ._telemetry import WorkerTelemetry


class PhaseEnded(UsageError):
    """The phase already committed its task's next state; it may not commit another."""


class GiveBack(Exception):
    """Raised by a phase that gives its lease back unrun to a worker that stops (a step it could as well leave to the
    next worker, and whose cut-off would need a person: a manual tool call not started yet). The worker releases the
    lease: the task is pending again, no restart counted."""


class PhaseTransaction(Transaction):
    """Writes of one atomic commit made by a phase: everything :class:`~actors.Transaction` has, with tasks owned
    by this task by default, and the verbs that end the phase (at most one per commit)."""

    def __init__(self, phase: Phase) -> None:
        super().__init__(default_owner_task_id=phase.task_id)
        self._phase = phase
        self.ends_phase = False
        self.state: SetTaskState | None = None
        """The task's next state this commit holds, if it ends the phase."""

    def start_operation(self, write: StartOperation) -> None:
        """Commit an operation's intent (a model request of the run, or a tool call) in this commit."""
        self.writes.append(write)

    def finish_operation(self, write: FinishOperation) -> None:
        """Commit an operation's result in this commit (under the lease that started it)."""
        self.writes.append(write)

    def create_interaction(self, write: CreateInteraction) -> None:
        """Ask a person for an approval in this commit (a tool task waits on its approval task in the same one)."""
        self.writes.append(write)

    def advance(self, checkpoint: Any) -> None:
        """Continue with the phase ``checkpoint["phase"]`` names, from ``checkpoint``."""
        if operation_key_json(checkpoint) == operation_key_json(self._phase.checkpoint):
            raise UsageError("advance() needs a new checkpoint: committing the same one is not progress")
        self._state(SetTaskState(task_id=self._phase.task_id, status="running", checkpoint=json_value(checkpoint)))

    def wait(self, *, on: Sequence[str], policy: WaitPolicy = "all_settled", checkpoint: Any) -> None:
        """Resume at ``checkpoint`` once every task of ``on`` is terminal. With ``fail_fast`` (tasks this one
        owns only) the first that does not complete aborts the others."""
        self._state(
            SetTaskState(
                task_id=self._phase.task_id,
                status="waiting",
                checkpoint=json_value(checkpoint),
                on=tuple(on),
                policy=policy,
            )
        )

    def sleep_until(self, until_ms: int, checkpoint: Any) -> None:
        """Resume at ``checkpoint`` once the owner's clock reaches ``until_ms``. The deadline is stored."""
        self._state(
            SetTaskState(
                task_id=self._phase.task_id, status="sleeping", checkpoint=json_value(checkpoint), until_ms=until_ms
            )
        )

    def complete(self, result: Any = None) -> None:
        self._end(TaskOutcome(status="completed", result=json_value(result)))

    def answer(self, text: str, steer_checkpoint: Any, value: Any = None) -> None:
        """End a run's task with its answer (``value``: the text parsed, for an agent with an ``output_schema``),
        unless its conversation has a steer queued: the owner then places it after the answer and the task goes on
        at ``steer_checkpoint`` (the same run answers it)."""
        result = {"text": text} if value is None else {"text": text, "value": value}
        outcome = TaskOutcome(status="completed", result=json_value(result))
        write = SetTaskState(
            task_id=self._phase.task_id,
            status="terminal",
            outcome=outcome,
            steer_checkpoint=json_value(steer_checkpoint),
        )
        self._state(write)

    def fail(self, message: str, *, reason: OutcomeReason | None = None) -> None:
        """End the task ``failed`` with ``message`` (and ``reason``, where one of :data:`~protocol.OutcomeReason`
        applies, such as a run's ``max_turns``)."""
        self._end(TaskOutcome(status="failed", reason=reason, error=str(message)))

    def aborted(self, result: Any = None) -> None:
        """End an abort handler: the task is ``aborted`` with ``result``."""
        self._end(TaskOutcome(status="aborted", result=json_value(result)))

    def fault(self, reason: FaultReason | None, error: str) -> None:
        """End the task ``faulted`` (what the worker commits for a phase that raised or made no progress; ``None``: no
        reason of its own, such as a run whose tool call's task faulted)."""
        self._end(TaskOutcome(status="faulted", reason=reason, error=error))

    def _end(self, outcome: TaskOutcome) -> None:
        self._state(SetTaskState(task_id=self._phase.task_id, status="terminal", outcome=outcome))

    def _state(self, write: SetTaskState) -> None:
        if self.ends_phase:
            raise UsageError("a commit holds at most one new state of its task")
        self.ends_phase = True
        self.state = write
        self.writes.append(write)


class Phase:
    """One run of a phase (or of the abort handler) of one task, under one lease.

    ``input`` and ``checkpoint`` are what is stored; ``restarts`` counts the runs of this state cut off so far;
    ``abort`` is the reason of the abort mark an abort handler runs for. A phase ends by committing its task's
    next state: :meth:`advance`, :meth:`wait`, :meth:`sleep_until`, :meth:`complete`, :meth:`fail` (or
    :meth:`aborted` in an abort handler), alone or with other writes in :meth:`commit`.
    """

    def __init__(
        self,
        client: Client,
        lease: Lease,
        checkpoint: Any,
        version: int,
        *,
        stopping: Callable[[], bool] = lambda: False,
        kill_switch: KillSwitch | None = None,
        telemetry: WorkerTelemetry | None = None,
        received_s: float | None = None,
        reports: Reports | None = None,
    ) -> None:
        self.client = client
        """The worker's connection, for reads (entries, documents, other tasks)."""
        self.task_id = lease.lease.task_id
        self.kind = lease.kind
        self.version = version
        self.input: Any = lease.input
        self.checkpoint: Any = checkpoint
        self._identity_checkpoint: Any = checkpoint if lease.checkpoint is None else lease.checkpoint
        """What operation ids hash: the checkpoint as stored (before a newer worker migrates it), or the first
        phase's ``initial(input)`` when nothing is stored yet."""
        self.conversation_id = lease.conversation_id
        self.owner_task_id = lease.owner_task_id
        self.restarts = lease.restarts
        self.abort = lease.abort
        self.mode: Literal["phase", "abort"] = lease.mode
        self.lease: LeaseRef = lease.lease
        self._lease_now_ms = lease.now_ms
        self._received_s = trio.current_time() if received_s is None else received_s
        """When the lease arrived (``trio.current_time()``)."""
        self._live_s = self._received_s
        """When the lease was last known live: it arrived, or a request the owner accepted under it was sent (see
        :meth:`ensure_lease`)."""
        self._manual_call = False
        """Whether this phase committed the intent of a ``manual`` or ``report`` tool call, whose cut-off needs a person
        (or ends in its error result): a stopping worker waits for it past its drain deadline."""
        self.ended = False
        """Whether this run committed its task's next state."""
        self.end_state: SetTaskState | None = None
        """The task's next state this run committed (its spans' outcome)."""
        self._stopping = stopping
        self._kill_switch = kill_switch
        """Fault injection (``tether worker --fault-kill``): told of each commit before it is sent and once it is
        acknowledged; it kills the process at its point."""
        self._telemetry = telemetry
        """The worker's spans (``None``: telemetry is off, the run loop makes none)."""
        self._reports = reports
        """Where the run loop's reports go (the app's ``on_report``, through the worker); ``None``: nowhere."""

    @property
    def stopping(self) -> bool:
        """Whether the worker running this phase is stopping (it drains: it lets the phases it runs finish, for at
        most its drain timeout, and takes no new lease). A phase about to start a long step it could as well start
        in its next run may commit a checkpoint instead and end: the task goes on from it under another worker (or
        this one once it is back). The run loop does so between a turn's tool results and its next model request."""
        return self._stopping()

    @property
    def phase(self) -> str | None:
        """The name of the running phase (``checkpoint["phase"]``); ``None`` in an abort handler."""
        return None if self.mode == "abort" else phase_of(self.checkpoint)

    def now_ms(self) -> int:
        """The owner's clock now, as best known here: the lease's time plus what elapsed since (a manual clock
        does not move by itself, so then the lease's time)."""
        welcome = self.client.welcome
        if welcome is not None and welcome.clock == "manual":
            return self._lease_now_ms
        return self._lease_now_ms + int((trio.current_time() - self._received_s) * 1000)

    def operation_id(self, key: str) -> str:
        """An id stable across re-runs of this phase from this checkpoint: an idempotency key for effects.

        It depends on the task, the stored checkpoint and ``key`` only, so an abort handler (which sees the
        checkpoint of the phase it interrupted) derives the same id to undo that phase's effect. The checkpoint is
        taken as stored, before any migration: a newer worker re-running (or aborting) a phase of an older version
        derives the ids that version derived.
        """
        material = operation_key_json([self.task_id, self._identity_checkpoint, key]).encode()
        digest = bytearray(hashlib.sha256(material).digest()[:16])
        digest[6] = (digest[6] & 0x0F) | 0x80  # version 8 (custom), RFC 9562
        digest[8] = (digest[8] & 0x3F) | 0x80
        hex_id = digest.hex()
        return f"{hex_id[:8]}-{hex_id[8:12]}-{hex_id[12:16]}-{hex_id[16:20]}-{hex_id[20:]}"

    @contextlib.asynccontextmanager
    async def commit(self) -> AsyncIterator[PhaseTransaction]:
        """Collect writes and commit them atomically under this lease when the block exits without an error."""
        if self.ended:
            raise PhaseEnded(f"task {self.task_id} already committed its next state in this run")
        tx = PhaseTransaction(self)
        yield tx
        if not tx.writes:
            return
        committed = await self._commit(tx)
        tx.seq = committed.seq
        tx.results = committed.results
        if tx.ends_phase:
            self.ended = True
            self.end_state = tx.state

    async def ensure_lease(self, *, always: bool = False) -> None:
        """Return once this phase's lease is known live; raise :class:`~protocol.StaleLease` (nothing started) if the
        owner no longer holds it for this connection. A phase calls it before a step it cannot take back (a tool's
        handler, a model request): after a silence or a pause longer than its connection can vouch for
        (:meth:`~actors._client._connection.Connection.live_since`), or ``always``, it asks the owner (one round
        trip); otherwise it costs nothing. A checkpoint only when it asks."""
        if not always and self.client.connection.live_since(self._live_s):
            return
        asked_s = trio.current_time()
        try:
            await self.client.confirm_lease(self.lease)
        except ConnectionLost as exc:
            raise StaleLease(
                ErrorCode.STALE_LEASE,
                f"the lease on task {self.task_id} at epoch {self.lease.epoch} ended with its connection before "
                "it could be confirmed; nothing was started",
            ) from exc
        self._live_s = asked_s

    async def _commit(self, tx: PhaseTransaction) -> Committed:
        if self._kill_switch is not None:
            self._kill_switch.before(tx.writes, self.kind, self.client.connection.after_next_sent)
        sent_s = trio.current_time()
        try:
            committed = await self.client.commit_writes(tx.writes, lease=self.lease)
        except ConnectionLost:
            # The outcome is unknown, and the lease is gone either way: it belonged to the lost connection. Sending
            # the commit again once reconnected lets the owner say so (``StaleLease``, nothing written), which ends
            # this run like any late commit; what was applied before the loss stays applied.
            committed = await self.client.commit_writes(tx.writes, lease=self.lease)
        self._live_s = sent_s  # the owner held the lease when it took this commit, sent then
        if self._kill_switch is not None:
            self._kill_switch.after(tx.writes, self.kind)
        return committed

    async def advance(self, checkpoint: Any) -> None:
        async with self.commit() as tx:
            tx.advance(checkpoint)

    async def wait(self, *, on: Sequence[str], policy: WaitPolicy = "all_settled", checkpoint: Any) -> None:
        async with self.commit() as tx:
            tx.wait(on=on, policy=policy, checkpoint=checkpoint)

    async def sleep_until(self, until_ms: int, checkpoint: Any) -> None:
        async with self.commit() as tx:
            tx.sleep_until(until_ms, checkpoint)

    async def complete(self, result: Any = None) -> None:
        async with self.commit() as tx:
            tx.complete(result)

    async def fail(self, message: str, *, reason: OutcomeReason | None = None) -> None:
        async with self.commit() as tx:
            tx.fail(message, reason=reason)

    async def aborted(self, result: Any = None) -> None:
        async with self.commit() as tx:
            tx.aborted(result)

    async def fault(self, reason: FaultReason | None, error: str) -> None:
        """End the task ``faulted`` (what the worker does when a phase raises or makes no progress)."""
        async with self.commit() as tx:
            tx.fault(reason, error)

    async def report(self, report: Report) -> None:
        """Hand ``report`` to the app's ``on_report`` callback (a checkpoint; it never raises but for a
        cancellation). Call it after the commit that recorded what it reports."""
        if self._reports is not None:
            await self._reports(report)

    async def outcomes(self, task_ids: Sequence[str]) -> dict[str, TaskOutcome | None]:
        """The outcome of each task (``None`` while one is not terminal), in the order given."""
        return await self.client.outcomes(task_ids)
