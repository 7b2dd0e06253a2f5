"""The commit request, sans-IO: a batch of writes, each applied in order by the room that owns its records, as one
commit (``Commit``: what ``client.commit()`` and a phase's ``rt.commit()`` send).

1. A commit holds 1 to :data:`MAX_WRITES_PER_COMMIT` writes; its result holds one value per write (an entry's
   position, a document's version, whether an abort marked the task, whether an interaction was asked).
2. A commit under a lease is a worker's, and the lease must be the current grant to that worker, not being
   cancelled (``stale_lease`` otherwise, before any write).
3. Each write is applied by its room (:attr:`Commits.rooms`); the commit's records are theirs, in order, then a run's
   record once if results of the commit added to its usage, logged as one commit. A refusal of any write refuses the
   whole commit (its unit of work rolls back what the earlier ones wrote).
4. A commit of one write of :data:`ONE_STATEMENT_WRITES` needs no savepoint: its only fallible statement is its
   first (the hot path: a commit of one entry; the dispatcher decides it before the unit of work opens).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from protocol import (
    AbortTask,
    AppendEntry,
    AppendPartial,
    Commit,
    Committed,
    CreateConversation,
    CreateInteraction,
    CreateTask,
    ErrorCode,
    FinishOperation,
    Frame,
    LeaseRef,
    PutDocument,
    SetTaskState,
    StartOperation,
    SubmitWrite,
    Write,
)

from ._checks import Refusal
from ._conversations import Conversations
from ._operations import Operations
from ._partials import Partials
from ._peers import Peers
from ._runs import Runs
from ._tasks import TaskEngine
from ._unit import UnitOfWork

MAX_WRITES_PER_COMMIT: Final = 10_000
ONE_STATEMENT_WRITES: Final[frozenset[type[Write]]] = frozenset(
    {AppendEntry, PutDocument, CreateConversation, CreateTask, SetTaskState, AbortTask, StartOperation, FinishOperation}
    | {AppendPartial}
)
"""Writes that run every check before their first fallible statement (a write past it cannot be refused): alone in a
commit, they need no savepoint. A ``create_interaction`` inserts its approval task, then its interaction (which may
clash), so it is guarded even alone."""
Apply = Callable[[UnitOfWork, Any, str, LeaseRef | None], int]
"""A room's apply function for one write: it adds its records to the unit and returns the write's result."""


class Commits:
    """The ``Commit`` request. See the module docstring."""

    def __init__(
        self,
        peers: Peers,
        tasks: TaskEngine,
        runs: Runs,
        conversations: Conversations,
        operations: Operations,
        partials: Partials,
    ) -> None:
        self._attached = peers.attached
        self._tasks = tasks
        self._runs = runs
        self._partials = partials
        self._operations = operations
        self.rooms: dict[type[Write], Apply] = {
            AppendEntry: conversations.apply_append,
            PutDocument: conversations.apply_put_document,
            CreateConversation: conversations.apply_create,
            CreateTask: tasks.apply_create,
            SetTaskState: self._set_state,
            AbortTask: tasks.apply_abort,
            StartOperation: operations.apply_start,
            FinishOperation: self._finish_operation,
            CreateInteraction: operations.apply_interaction,
            AppendPartial: partials.apply_append,
            SubmitWrite: conversations.apply_submit,
        }
        """Who applies each kind of write (rule 3)."""

    def on_commit(self, unit: UnitOfWork, request: Commit) -> Frame:
        count = len(request.writes)
        if not 1 <= count <= MAX_WRITES_PER_COMMIT:
            message = f"a commit holds 1 to {MAX_WRITES_PER_COMMIT} writes, not {count}"
            raise Refusal(ErrorCode.INVALID, message)
        lease = request.lease
        if lease is not None:
            if self._attached[unit.peer].role != "worker":  # rule 2 (read in place: a phase's every commit)
                raise Refusal(ErrorCode.NOT_ALLOWED, "only workers commit under a lease")
            self._tasks.check_lease(unit.peer, lease)
        rooms = self.rooms
        results = [
            rooms[type(write)](unit, write, f"writes[{index}]", lease) for index, write in enumerate(request.writes)
        ]
        if self._runs.live:  # the runs of the tasks it changed derive their statuses at the settle
            self._runs.tasks_changed(unit.records)
        return Committed(seq=unit.seq, committed_at_ms=unit.now_ms, results=tuple(results))

    def _set_state(self, unit: UnitOfWork, write: SetTaskState, where: str, lease: LeaseRef | None) -> int:
        """A task's next state; a task of a run that ends otherwise than ``completed`` with operations still open (a
        phase that raised after its intent, such as a tool whose result was too large to commit) settles them
        ``failed`` with its error, after its record: the journal never shows a call of an ended task in flight."""
        result = self._runs.apply_set_state(unit, write, where, lease)
        outcome = write.outcome
        if write.status == "terminal" and outcome is not None and outcome.status != "completed":
            unit.records += self._operations.settle_open(write.task_id, outcome, unit.seq, unit.now_ms)
        return result

    def _finish_operation(self, unit: UnitOfWork, write: FinishOperation, where: str, lease: LeaseRef | None) -> int:
        """An operation's result, then its partial output's end (``done`` or ``aborted``) right after its record;
        the run's record once, at the end, if the result added to its usage."""
        record, run = self._operations.finish_operation(write, lease, unit.seq, unit.now_ms, where)
        unit.records.append(record)
        ended = self._partials.finished(record, unit.seq, unit.now_ms)
        if ended is not None:
            unit.records.append(ended)
        if run is not None:
            unit.last(run.run_id, run)
        return 0
