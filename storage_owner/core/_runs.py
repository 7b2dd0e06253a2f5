"""Runs of agents, sans-IO: what the owner decides and stores about them (docs/runs.md states it for users).

A run is admitted by an ``input`` submission to a conversation bound to an agent, and run by a task of kind
``agent:<agent>`` owned by its conversation; the task engine schedules, leases, restarts and aborts it and the tool
tasks it owns, unchanged. This module adds what the engine does not know:

1. **Queues.** A conversation has at most one active run (``pending``, ``running``, ``retry_wait``, ``waiting``,
   ``needs_attention``); its other runs wait ``queued`` in creation order (FIFO).
2. **Admission** (a settling step, once per batch): the queued run at the head of an idle conversation is admitted,
   oldest first across conversations, while fewer than ``max_concurrent_runs`` runs are ``pending``, ``running``
   or ``retry_wait`` (``waiting`` and ``needs_attention`` free global capacity but keep their conversation
   blocked). Admission appends the user entry to the transcript (only now: a follow-up is not visible to the run
   before it) and creates the run's task, in the settling commit.
   A run whose task cannot be created (its conversation's owner task can own no new work) fails ``not_admitted``.
3. **Status** is derived by :func:`~._run_status.run_status` from the run's task and the live tasks it owns, and
   written to the run's row in the commit that changed it; never set independently (a queued run's cancellation
   aside, which has no task to derive from). A result's usage adds to the run's without changing its status.
4. Ids the owner mints are derived from the run id (uuid5), so a settle that runs again after a crash writes the
   same ids, and no clock or randomness enters the core: a run's id is its submission's id (one id to correlate a
   submit with its run), its n-th task is ``uuid5(run_id, "task/n")``, its user entry ``uuid5(run_id, "user")``.
5. **Cancel.** A queued run ends ``cancelled`` at once; an active run's task is aborted, and the run ends
   ``cancelled`` when it is derived from that task once terminal (rule 3).
6. **Retry.** A ``failed`` run is ``queued`` again, at the head of its conversation's queue (a later run admitted
   first refuses it); the attempts of its unfinished model requests start over (``_operations``).
7. **After a run.** Only a failure holds what is queued behind it: a run that ran and ended ``failed`` (any reason
   but ``reset``, whose follow-ups run in the new context, and ``orphaned``, a run someone aborted:
   :func:`~._run_rules.holds_queue`) leaves what was queued behind it as its conversation's ``after_failed_run``
   says, in the commit that ended it. ``wait`` (the default): its queued runs stay ``queued`` with the reason
   ``held`` and are not admitted, until the conversation's next input, continue or retry releases them (in that
   request's commit, the oldest first: the new input queues behind them, whatever its ``when_busy`` or
   ``when_idle``; a continue joins the oldest). ``withdraw``: their inputs, and the inputs that waited to steer it,
   settle ``unanswered`` with the reason ``run_failed``, and the queued runs end ``cancelled``; resets and writes keep
   waiting for the next run. ``continue``, and after every other end (an answer, a cancel, a reset, an orphaned
   run): the queued runs are admitted at once, the next placing first what this one left; inputs that waited to
   steer it (it answered before they could be placed, or ended first), with no run queued behind, get a run of
   their own (the oldest steer's).

A run is created ``queued``; its status changes only as :data:`RUN_TRANSITIONS` allows, checked on every
:meth:`Runs.put` (an illegal transition raises :class:`~._checks.IllegalTransition`: a bug, never bad input).
``docs/runs.md`` prints the table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import attrs

from protocol import (
    RESERVED_ENTRY_PREFIX,
    AbortTask,
    CancelRun,
    ConversationRecord,
    CreateTask,
    ErrorCode,
    Frame,
    JsonValue,
    LeaseRef,
    ReadRun,
    ReadRuns,
    Record,
    RetryRun,
    RunRecord,
    RunReply,
    RunsReply,
    SetTaskState,
    Submit,
    TaskRecord,
    WaitRun,
)

from ._checks import Refusal, check_limit, check_move
from ._inbox import INPUT_KIND, Inbox
from ._output import Outbox, PeerId, fit_page
from ._peers import Waits
from ._ports import RunStore, TaskReads
from ._run_rules import (
    AGENT_KIND_PREFIX,
    BUSY,
    EXTERNAL_KIND_PREFIX,
    HELD,
    MAX_INPUT_BYTES,
    RUN_FAILED,
    RUN_TRANSITIONS,
    SETTLED,
    TERMINAL,
    TOOL_KIND_PREFIX,
    RunEvent,
    admissible,
    holds_queue,
    is_held,
    queued_run,
    run_task_id,
    user_entry_id,
)
from ._run_status import answer_of, derive, run_error
from ._tasks import TaskEngine
from ._unit import Journal, UnitOfWork


class Runs:
    """The live runs of one store, their conversations' queues, and admission. See the module docstring."""

    def __init__(
        self,
        store: RunStore,
        tasks: TaskEngine,
        journal: Journal,
        waits: Waits,
        outbox: Outbox,
        reset_attempts: Callable[[str, int, int], list[Record]],
        inbox: Inbox,
        *,
        stored_tasks: TaskReads,
        max_concurrent_runs: int,
    ) -> None:
        self._store = store
        self._stored_tasks = stored_tasks
        self._tasks = tasks
        self._journal = journal
        self._waits = waits
        self._outbox = outbox
        self._reset_attempts = reset_attempts
        self._inbox = inbox
        """Rule 6: the attempts of a retried run's unfinished model requests start over (``_operations``)."""
        self.max_concurrent_runs = max_concurrent_runs
        self.live: dict[str, RunRecord] = {}
        """Runs that are not terminal, by id (changed only through ``_live_set`` / ``_live_pop``)."""
        self._busy = 0
        """How many live runs are ``pending``, ``running`` or ``retry_wait`` (global capacity taken)."""
        self._queues: dict[str, list[str]] = {}
        """Each conversation's live runs in creation order: the first may be active, the rest are queued."""
        self._by_task: dict[str, str] = {}
        """The live run of each run task."""
        self._dirty: dict[str, None] = {}
        """Runs whose status settling derives again."""
        self._admit_due = False
        self._cancels: list[tuple[PeerId, int, str]] = []
        """``cancel_run`` requests of this batch, answered once it has settled, with the run as it is then."""
        self.ended: list[RunRecord] | None = None
        """With telemetry on (``OwnerCore.observe``): the runs that ended in this batch, for the shell to take."""
        self._waiting: set[str] = set()
        """Runs whose task was last seen waiting (on its tool calls): when it stops, a tool round ended, a boundary
        where the inbox places a steer (``_inbox``)."""
        for record in store.live_runs():
            self._add(record)
            if record.status != "queued":
                self._dirty[record.run_id] = None
            task = None if record.task_id is None else tasks.record(record.task_id)
            if task is not None and task.status == "waiting":
                self._waiting.add(record.run_id)
        self._admit_due = bool(self.live)

    # ------------------------------------------------------------------------------------------ inspection

    def needs_settle(self) -> bool:
        """Whether settling has runs to derive again, or a queued run it may admit now."""
        if self._dirty:
            return True
        if not self._admit_due or not self._has_capacity():
            return False
        return any(admissible(self.live[queue[0]]) for queue in self._queues.values())

    def active_run(self, conversation_id: str) -> RunRecord | None:
        """The conversation's run that is not terminal and first in its queue, if any (queued included)."""
        queue = self._queues.get(conversation_id)
        return None if not queue else self.live[queue[0]]

    def held(self, conversation_id: str) -> RunRecord | None:
        """The conversation's oldest run, if it is held after a failed run (rule 7)."""
        run = self.active_run(conversation_id)
        return run if run is not None and is_held(run) else None

    def queued_run_ids(self, conversation_id: str) -> list[str]:
        """The conversation's runs still ``queued``, oldest first."""
        return [run_id for run_id in self._queues.get(conversation_id, ()) if self.live[run_id].status == "queued"]

    def queued_tail(self, conversation_id: str) -> RunRecord | None:
        """The conversation's last run, if it is still ``queued`` and was never admitted (follow-ups with
        ``follow_ups="all"`` join it; a retried run's inputs were placed at its first admission)."""
        queue = self._queues.get(conversation_id)
        run = None if not queue else self.live[queue[-1]]
        if run is None or run.status != "queued" or self._tasks.record(run_task_id(run.run_id, 1)) is not None:
            return None
        return run

    def run_of_task(self, record: TaskRecord) -> str | None:
        """The live run a task belongs to: its run task, or a tool / external task it owns (transitively)."""
        run_id = self._by_task.get(record.task_id)
        if run_id is not None or not record.kind.startswith((TOOL_KIND_PREFIX, EXTERNAL_KIND_PREFIX)):
            return run_id
        owner = record.owner_task_id
        while owner is not None:
            run_id = self._by_task.get(owner)
            if run_id is not None:
                return run_id
            owner_record = self._tasks.record(owner)
            owner = None if owner_record is None else owner_record.owner_task_id
        return None

    # ---------------------------------------------------------------------------------------------- changes

    def created(self, record: RunRecord, input_text: JsonValue) -> None:
        """A submission created a queued run (in the request's commit); ``input_text`` is its user entry's, once
        admitted."""
        self._store.insert_run(record, input_text)
        self._remember(record)
        self._add(record)
        self._admit_due = True

    def check_input(self, request: Submit, conversation: ConversationRecord) -> RunRecord | None:
        """Check an ``input`` submission (before anything is written) and return the conversation's live run, if
        any: refused for a conversation with no agent, a payload that is not a text of the allowed size, an unknown
        ``when_busy`` or ``when_idle``, ``when_busy="reject"`` while a run is live and ``when_idle="reject"`` while
        none is."""
        if conversation.agent is None:
            message = (
                f"conversation {conversation.conversation_id} is not bound to an agent, so an input has no run to "
                "start; bind one with create_conversation(agent=...), or submit another kind; nothing was written"
            )
            raise Refusal(ErrorCode.INVALID, message)
        payload = request.payload
        if not isinstance(payload, str) or not 1 <= len(payload.encode()) <= MAX_INPUT_BYTES:
            raise Refusal(ErrorCode.INVALID, f"an input's payload is a text of 1 byte to {MAX_INPUT_BYTES} bytes")
        if request.when_busy not in ("follow_up", "steer", "reject"):
            message = f"when_busy must be follow_up, steer or reject, not {request.when_busy!r}; nothing was written"
            raise Refusal(ErrorCode.INVALID, message)
        if request.when_idle not in ("start", "reject"):
            message = f"when_idle must be start or reject, not {request.when_idle!r}; nothing was written"
            raise Refusal(ErrorCode.INVALID, message)
        active = self.active_run(conversation.conversation_id)
        if active is not None and is_held(active):
            return active  # rule 7: not busy, yet it queues behind the held runs whatever it asked
        if request.when_busy == "reject" and active is not None:
            message = (
                f"conversation {conversation.conversation_id} has an active run ({active.run_id}, {active.status}) "
                "and this submission asked to be refused while busy; nothing was written. Submit with "
                "when_busy='follow_up' to queue a run after it, when_busy='steer' to join it, or wait for it"
            )
            raise Refusal(ErrorCode.CONFLICT, message)
        if request.when_idle == "reject" and active is None:
            message = (
                f"conversation {conversation.conversation_id} has no run going and this input asked to be refused "
                "while idle (when_idle='reject': it may only join or follow a run); nothing was written"
            )
            raise Refusal(ErrorCode.CONFLICT, message)
        return active

    def new_continue(self, request: Submit, conversation: ConversationRecord, seq: int, now_ms: int) -> RunRecord:
        """The run a ``continue`` starts: on the context as it is, with no user entry of its own (what a failed run
        left queued is placed first, at its admission). Refused while a run of the conversation is live: whether
        there is anything to continue depends on how that run ends, so a continue is never queued."""
        self.check_continue(request, conversation)
        active = self.active_run(conversation.conversation_id)
        if active is not None and not is_held(active):
            message = (
                f"conversation {conversation.conversation_id} has a run going ({active.run_id}, {active.status}): a "
                "continue is never queued (whether anything is left to answer depends on how that run ends); "
                "nothing was written"
            )
            raise Refusal(ErrorCode.CONFLICT, message)
        return self.new_run(request, conversation, seq, now_ms)

    def check_continue(self, request: Submit, conversation: ConversationRecord) -> None:
        if conversation.agent is None:
            message = f"conversation {conversation.conversation_id} is not bound to an agent: nothing to continue"
            raise Refusal(ErrorCode.INVALID, message)
        if request.payload is not None:
            raise Refusal(ErrorCode.INVALID, "a continue carries no payload (it runs on the context as it is)")

    def release_held(self, conversation_id: str, seq: int, now_ms: int) -> list[RunRecord]:
        """Rule 7: the runs held in the conversation are admissible again (oldest first, as they were queued); their
        records, for the request's commit."""
        released = []
        for run_id in self.queued_run_ids(conversation_id):
            run = self.live[run_id]
            if run.reason == HELD:
                new = attrs.evolve(run, reason=None, seq=seq, updated_at_ms=now_ms)
                self.put(run, new, "release")
                released.append(new)
        if released:
            self._admit_due = True
        return released

    def _after_run(self, run: RunRecord, seq: int, now_ms: int, changed: dict[str, RunRecord]) -> None:
        """Rule 7, in the commit that ended ``run`` (it ran: it had a task)."""
        conversation_id = run.conversation_id
        queued = self.queued_run_ids(conversation_id)
        if holds_queue(run):
            mode = self._inbox.config.mode(conversation_id, "after_failed_run")
            if mode == "wait":
                for run_id in queued:
                    old = self.live[run_id]
                    held = attrs.evolve(old, reason=HELD, seq=seq, updated_at_ms=now_ms)
                    self.put(old, held, "hold")
                    changed[run_id] = held
                return
            if mode == "withdraw":
                for record in list(self._inbox.queued.get(conversation_id, ())):
                    if record.kind == INPUT_KIND:
                        self._inbox.withdraw(record, seq, RUN_FAILED)
                for run_id in queued:
                    old = self.live[run_id]
                    self._inbox.withdraw_own(old, seq, RUN_FAILED)
                    cancelled = attrs.evolve(old, status="cancelled", reason=RUN_FAILED, seq=seq, updated_at_ms=now_ms)
                    self.put(old, cancelled, "cancel")
                    changed[run_id] = cancelled
                return
        if queued:
            return  # admitted as after an answer: the next run places what this one left first
        waiting = [record for record in self._inbox.queued.get(conversation_id, ()) if record.kind == INPUT_KIND]
        if waiting:  # steers the run never reached, with no run behind to place them: a run of their own
            new = queued_run(waiting[0].submission_id, conversation_id, run.agent, seq, now_ms)
            self.created(new, JsonValue(None))  # its input is placed as what the run left (``_inbox`` rule 3)
            changed[new.run_id] = new

    def new_run(self, request: Submit, conversation: ConversationRecord, seq: int, now_ms: int) -> RunRecord:
        """The queued run an ``input`` submission admits (checked by :meth:`check_input`, stored by
        :meth:`created`). A run takes its submission's id (rule 4)."""
        assert conversation.agent is not None, "check_input() first"
        return queued_run(request.submission_id, conversation.conversation_id, conversation.agent, seq, now_ms)

    def tasks_changed(self, records: Iterable[Record]) -> None:
        """Task records a commit or a settle changed: their runs' statuses are derived again."""
        for record in records:
            if isinstance(record, TaskRecord):
                run_id = self.run_of_task(record)
                if run_id is not None:
                    self._dirty[run_id] = None

    def requirement_changed(self, conversation_id: str) -> None:
        """The conversation's configured model changed: its active run's task may be placed again (``_config`` rule
        4), and its status derived again (``no_model``)."""
        run = self.active_run(conversation_id)
        if run is not None and run.task_id is not None:
            self._tasks.requirement_changed(run.task_id)
            self._dirty[run.run_id] = None

    def workers_changed(self) -> None:
        """Workers came or went: a pending run's blocked reason may have changed, and whether the tool calls of a
        run whose task waits can run (``tool_missing``, which ranks above an approval: a ``waiting`` run too).
        Every admitted live run is derived again (a queued one has no task to derive from)."""
        for run in self.live.values():
            if run.task_id is not None:
                self._dirty[run.run_id] = None

    def put(self, previous: RunRecord, record: RunRecord, event: RunEvent, *, unanswered: str | None = None) -> None:
        """Store a run's next record, which ``event`` made of ``previous`` (refused loudly if :data:`RUN_TRANSITIONS`
        forbids it), and keep the indexes in step (a terminal run leaves memory, its inputs settle: ``unanswered``
        says why, where that is not its reason); inside a request, what it changed in memory is put back if the
        request is refused."""
        check_move(RUN_TRANSITIONS, "run", previous.run_id, previous.status, event, record.status)
        self._store.update_run(record)
        self._remember(record)
        old = self.live.get(record.run_id)
        if record.status in TERMINAL:
            ended = self.ended
            if ended is not None:
                ended.append(record)
                self._journal.undo(lambda: ended.remove(record))
            self._inbox.run_ended(record, record.seq, unanswered)
            self._waiting.discard(record.run_id)
            self._live_pop(record.run_id)
            queue = self._queues.get(record.conversation_id, [])
            if record.run_id in queue:
                queue.remove(record.run_id)
                if not queue:
                    del self._queues[record.conversation_id]
            if record.task_id is not None:
                self._by_task.pop(record.task_id, None)
            self._admit_due = True
        else:
            self._live_set(record)
            if record.task_id is not None:
                if old is not None and old.task_id is not None and old.task_id != record.task_id:
                    self._by_task.pop(old.task_id, None)
                self._by_task[record.task_id] = record.run_id
            if old is not None and old.status in BUSY and record.status not in BUSY:
                self._admit_due = True

    def _remember(self, record: RunRecord) -> None:
        """Inside a request, journal how memory holds ``record``'s run now (the run, its conversation's queue, the
        runs of its tasks, whether admission is due), to put it back if the request is refused."""
        if not self._journal.open:
            return
        run_id = record.run_id
        conversation_id = record.conversation_id
        old = self.live.get(run_id)
        queue = self._queues.get(conversation_id)
        queue = None if queue is None else list(queue)
        tasks = {task_id for task_id in (record.task_id, None if old is None else old.task_id) if task_id is not None}
        by_task = {task_id: self._by_task.get(task_id) for task_id in tasks}
        admit_due = self._admit_due

        def undo() -> None:
            if old is None:
                self._live_pop(run_id)
            else:
                self._live_set(old)
            if queue is None:
                self._queues.pop(conversation_id, None)
            else:
                self._queues[conversation_id] = queue
            for task_id, owner in by_task.items():
                if owner is None:
                    self._by_task.pop(task_id, None)
                else:
                    self._by_task[task_id] = owner
            self._admit_due = admit_due

        self._journal.undo(undo)

    def _live_set(self, record: RunRecord) -> None:
        """Every change of :attr:`live` goes through here and :meth:`_live_pop`, which keep the busy count."""
        old = self.live.get(record.run_id)
        self._busy += (record.status in BUSY) - (old is not None and old.status in BUSY)
        self.live[record.run_id] = record

    def _live_pop(self, run_id: str) -> None:
        old = self.live.pop(run_id, None)
        if old is not None and old.status in BUSY:
            self._busy -= 1

    def _add(self, record: RunRecord) -> None:
        self._live_set(record)
        self._queues.setdefault(record.conversation_id, []).append(record.run_id)
        if record.task_id is not None:
            self._by_task[record.task_id] = record.run_id

    # --------------------------------------------------------------------------------------------- settling

    def refresh(self, seq: int, now_ms: int, changed: dict[str, RunRecord]) -> None:
        """Derive the status of every dirty run again; a run whose record changes is stored and put in ``changed``."""
        dirty, self._dirty = self._dirty, {}
        for run_id in dirty:
            run = self.live.get(run_id)
            if run is None or run.task_id is None:
                continue
            task = self._tasks.record(run.task_id)
            assert task is not None, f"run {run_id}'s task {run.task_id} is not stored"
            if task.status == "waiting":
                self._waiting.add(run_id)
            elif run_id in self._waiting:
                self._waiting.discard(run_id)
                if task.status in ("pending", "running"):  # its tool round ended: a boundary
                    self._inbox.boundary(run, seq, now_ms)
            derived = derive(task, self._tasks, self._stored_tasks)
            new = attrs.evolve(
                run,
                status=derived.status,
                reason=derived.reason,
                error=derived.error,
                operation_id=derived.operation_id,
                version=task.version,
                answer=answer_of(task) or run.answer,
            )
            if new != run:
                new = attrs.evolve(new, seq=seq, updated_at_ms=now_ms)
                self.put(run, new, "derive", unanswered=derived.unanswered)
                changed[run_id] = new
                if new.status in TERMINAL:
                    self._after_run(new, seq, now_ms, changed)

    def _has_capacity(self) -> bool:
        return self._busy < self.max_concurrent_runs

    def admit(self, seq: int, now_ms: int, changed: dict[str, RunRecord], records: list[Record]) -> None:
        """Admit queued runs at the head of idle conversations, oldest first, within global capacity (rule 2).
        Appends their user entries and task records to ``records``."""
        if not self._admit_due:
            return
        self._admit_due = False
        busy = self._busy
        heads = [self.live[queue[0]] for queue in self._queues.values()]
        # A queued run's seq is its creating commit's, or its release's (rule 7): it waits from then on.
        heads = sorted((run for run in heads if admissible(run)), key=lambda run: (run.seq, run.run_id))
        for run in heads:
            if busy >= self.max_concurrent_runs:
                self._admit_due = True  # capacity frees later: a run leaving a busy status sets it again
                break
            self._admit_one(run, seq, now_ms, changed, records)
            busy += 1

    def _admit_one(
        self, run: RunRecord, seq: int, now_ms: int, changed: dict[str, RunRecord], records: list[Record]
    ) -> None:
        # Its n-th admission (after n - 1 retries): only the first appends the user entry.
        attempt = 1
        while self._tasks.record(run_task_id(run.run_id, attempt)) is not None:
            attempt += 1
        task_id = run_task_id(run.run_id, attempt)
        write = CreateTask(
            task_id=task_id,
            kind=AGENT_KIND_PREFIX + run.agent,
            version=run.version,
            # The n-th task of a run says so (after retry_run): its worker then knows the journal holds the earlier
            # tasks' operations, and reads it instead of guessing that an intent is the first.
            input=JsonValue({"run_id": run.run_id} if attempt == 1 else {"run_id": run.run_id, "attempt": attempt}),
            conversation_id=run.conversation_id,
        )
        try:
            task = self._tasks.create_task(write, seq, now_ms, f"run {run.run_id}")
        except Refusal as refusal:  # the conversation's owner task can own no new work: the run cannot start
            error = run_error(f"the run could not be admitted: {refusal.message}")
            new = attrs.evolve(run, status="failed", reason="not_admitted", error=error, seq=seq, updated_at_ms=now_ms)
            self.put(run, new, "refuse")
            changed[run.run_id] = new
            return
        records.append(task)
        new = attrs.evolve(run, status="pending", task_id=task_id, seq=seq, updated_at_ms=now_ms)
        self.put(run, new, "admit")
        changed[run.run_id] = new
        self._dirty[run.run_id] = None  # derived once settled: whether an attached worker announces its agent
        if attempt > 1:
            return
        text = self._store.run_input(run.run_id)
        placed = self._inbox.admitted(run, text, seq, now_ms, user_entry_id(run.run_id))
        records[len(records) - 1 : len(records) - 1] = placed

    # ------------------------------------------------------------------------------------ entries and retries

    def check_run_entry(self, conversation_id: str, kind: str, lease: LeaseRef | None, where: str) -> None:
        """Refuse an entry of a kind under ``tether.`` (what a model reads) unless it is committed under the current
        lease of a live run's task, or of a tool task it owns, in that run's conversation (the lease itself was
        checked with the commit). The owner writes ``tether.user`` itself, at admission; a client, a worker under
        no lease or another run's, could otherwise forge a turn of the transcript."""
        task = None if lease is None else self._tasks.live(lease.task_id)
        run_id = None if task is None else self.run_of_task(task)
        run = None if run_id is None else self.live.get(run_id)
        if run is None or run.conversation_id != conversation_id:
            message = (
                f"{where}.kind {kind!r}: entry kinds under {RESERVED_ENTRY_PREFIX!r} are the runtime's (what a model "
                "reads): only a run's own task or tool task writes them, in the run's conversation, under its lease; "
                "nothing of the commit was written. Give an entry of your own a kind outside that prefix (such as "
                "'app.note'), or submit an input to start a run"
            )
            raise Refusal(ErrorCode.INVALID, message)

    def apply_set_state(self, unit: UnitOfWork, write: SetTaskState, where: str, lease: LeaseRef | None) -> int:
        """A task's next state (the task engine's ``set_task_state``). A run's task completing with a
        ``steer_checkpoint`` while its conversation has a steer queued (it came after the last tool round) goes on
        at that checkpoint instead, the steer placed after the answer (``_inbox``, rule 3): the same run answers it."""
        if (
            write.status == "terminal"
            and write.steer_checkpoint is not None
            and write.outcome is not None
            and write.outcome.status == "completed"
        ):
            run = self.live.get(self._by_task.get(write.task_id, ""))
            if run is not None and run.task_id == write.task_id and self._inbox.boundary(run, unit.seq, unit.now_ms):
                write = attrs.evolve(
                    write,
                    status="running",
                    checkpoint=write.steer_checkpoint,
                    outcome=None,
                    steer_checkpoint=JsonValue(None),
                )
                self._inbox.flush(unit)
        return self._tasks.apply_set_state(unit, write, where, lease)

    def retry_run(self, run_id: str, seq: int, now_ms: int) -> tuple[RunRecord, list[Record]]:
        """Re-attempt a run. A run not ended (``needs_attention`` included): a no-op returning its record (it goes
        on, or resumes by itself once a worker with the agent or tool version attaches, or once its tool call is
        resolved). ``failed``: refused once a later run of its
        conversation has started; otherwise the attempts of its unfinished model requests reset (committed results
        stay) and the run is ``queued`` again at the head of its conversation's queue, which it blocks: admission
        gives it a new task (same run id, its bound version, no second user entry) within ``max_concurrent_runs``,
        like any run, so a retry never takes capacity the bound does not have."""
        run = self.require(run_id)
        if run.status not in TERMINAL:
            # Nothing to re-attempt: it goes on, or resumes by itself once its cause is settled. A no-op, so that
            # "attach the worker, then retry" holds however fast the run resumed after the worker attached.
            return run, []
        if run.status != "failed":
            message = f"run {run_id} ended {run.status}: only a failed run is retried (one still going is left as is)"
            raise Refusal(ErrorCode.CONFLICT, message)
        if self._store.later_run_started(run_id):
            message = f"a later run of conversation {run.conversation_id} has started: run {run_id} is not retried"
            raise Refusal(ErrorCode.CONFLICT, message)
        records = self._reset_attempts(run_id, seq, now_ms)
        new = attrs.evolve(
            run,
            status="queued",
            reason=None,
            error=None,
            operation_id=None,
            task_id=None,
            seq=seq,
            updated_at_ms=now_ms,
        )
        records += self.release_held(run.conversation_id, seq, now_ms)  # rule 7: they follow it again
        self.put(run, new, "retry")  # journals the queue below with the rest
        self._inbox.run_retried(new, seq)
        self._queues.setdefault(run.conversation_id, []).insert(0, run_id)
        self._admit_due = True
        records.append(new)
        return new, records

    # -------------------------------------------------------------------------------------------- requests

    def require(self, run_id: str) -> RunRecord:
        """A run, live or ended; refused ``not_found`` if there is none."""
        run = self.live.get(run_id) or self._store.run(run_id)
        if run is None:
            raise Refusal(ErrorCode.NOT_FOUND, f"run {run_id} does not exist")
        return run

    def on_read_run(self, peer: PeerId, call_id: int, request: ReadRun, now_ms: int) -> Frame:
        return RunReply(run=self.require(request.run_id))

    def on_read_runs(self, peer: PeerId, call_id: int, request: ReadRuns, now_ms: int) -> Frame:
        """A page of runs in creation order (the commit that created each: a subagent's run, whose id is derived,
        in its place), keyed by the last run of the page before."""
        check_limit(request.limit)
        after = request.after_run_id
        if after is not None and after not in self.live and self._store.run(after) is None:
            message = (
                f"after_run_id {after!r} names no run: read the first page without it, then pass the "
                "next_after_run_id each page gives"
            )
            raise Refusal(ErrorCode.NOT_FOUND, message)
        runs, more = self._store.run_page(request.conversation_id, request.status, request.after_run_id, request.limit)
        runs, more = fit_page(runs, more, lambda one: RunsReply(runs=(one,)))
        next_after = runs[-1].run_id if more else None
        return RunsReply(runs=tuple(runs), next_after_run_id=next_after)

    def on_wait_run(self, peer: PeerId, call_id: int, request: WaitRun, now_ms: int) -> Frame | None:
        run = self.require(request.run_id)
        if run.status in SETTLED:
            return RunReply(run=run)
        self._waits.add("run", run.run_id, peer, call_id)
        return None

    def on_cancel_run(self, unit: UnitOfWork, request: CancelRun) -> Frame | None:
        """Cancel a run: a queued one ends ``cancelled`` now; an active one has its task aborted (bottom-up, by the
        engine) and ends ``cancelled`` once that is terminal. Cancelling a cancelled run again is a no-op; a run that
        ended otherwise is a ``conflict``. The reply is the run as it is once this batch has settled the mark:
        ``cancelled`` if nothing had to run first, otherwise its status with reason ``cancelling``."""
        run = self.require(request.run_id)
        if run.status in TERMINAL:
            if run.status == "cancelled":
                return RunReply(run=run)
            raise Refusal(ErrorCode.CONFLICT, f"run {run.run_id} already ended {run.status}: nothing to cancel")
        if run.task_id is None:
            cancelled = attrs.evolve(run, status="cancelled", seq=unit.seq, updated_at_ms=unit.now_ms)
            self.put(run, cancelled, "cancel")
            unit.records.append(cancelled)
            self._inbox.flush(unit)
            unit.then(lambda: self._answer_waits(cancelled))
            return RunReply(run=cancelled)
        record, _ = self._tasks.abort_task(AbortTask(task_id=run.task_id), unit.seq, unit.now_ms, "run")
        unit.records.append(record)
        self.tasks_changed((record,))
        peer, call_id, run_id = unit.peer, unit.call_id, run.run_id
        assert call_id is not None
        unit.then(lambda: self._cancels.append((peer, call_id, run_id)))  # answered once the batch has settled
        return None

    def abort_active(self, conversation_id: str, unit: UnitOfWork) -> RunRecord | None:
        """``abort_conversation``: the conversation's queued runs end ``cancelled`` (their inputs were withdrawn
        first) and its active run's task is aborted (it ends ``cancelled`` once that is terminal, rule 5). Returns the
        active run as the mark left it, if there was one."""
        active = None
        for run_id in list(self._queues.get(conversation_id, ())):
            run = self.live[run_id]
            if run.task_id is None:
                self.cancel_queued(run_id, unit)
            else:
                record, _ = self._tasks.abort_task(AbortTask(task_id=run.task_id), unit.seq, unit.now_ms, "run")
                unit.records.append(record)
                self.tasks_changed((record,))
                active = run
        return active

    def cancel_queued(self, run_id: str, unit: UnitOfWork) -> None:
        """A queued run's input was withdrawn: the run ends ``cancelled`` (rule 5), in the request's commit."""
        run = self.live.get(run_id)
        if run is None or run.status != "queued":
            return
        cancelled = attrs.evolve(run, status="cancelled", seq=unit.seq, updated_at_ms=unit.now_ms)
        self.put(run, cancelled, "cancel")
        unit.records.append(cancelled)
        unit.then(lambda: self._answer_waits(cancelled))

    def on_retry_run(self, unit: UnitOfWork, request: RetryRun) -> Frame:
        run, records = self.retry_run(request.run_id, unit.seq, unit.now_ms)
        unit.records += records
        self._inbox.flush(unit)
        self.tasks_changed(records)
        return RunReply(run=run)

    @property
    def has_cancels(self) -> bool:
        """Whether ``cancel_run`` requests of this batch wait for its settle to be answered."""
        return bool(self._cancels)

    def answer_settled(self, changed: Iterable[RunRecord]) -> None:
        """Once a settling commit is logged: the calls waiting on the runs it changed, and the batch's cancels."""
        for run in changed:
            self._answer_waits(run)
        if self._cancels:
            cancels, self._cancels = self._cancels, []
            for peer, call_id, run_id in cancels:
                self._outbox.reply(peer, call_id, RunReply(run=self.require(run_id)))

    def _answer_waits(self, run: RunRecord) -> None:
        if run.status in SETTLED:
            for peer, call_id in self._waits.take("run", run.run_id):
                self._outbox.reply(peer, call_id, RunReply(run=run))
