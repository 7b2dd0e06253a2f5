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
3. **Status** is derived by :func:`run_status` from the run's task and the live tasks it owns, and written to the
   run's row in the commit that changed it; never set independently (a queued run's cancellation aside, which has
   no task to derive from).
4. Ids the owner mints are derived from the run id (uuid5), so a settle that runs again after a crash writes the
   same ids, and no clock or randomness enters the core: a run's id is its submission's id (one id to correlate a
   submit with its run), its n-th task is ``uuid5(run_id, "task/n")``, its user entry ``uuid5(run_id, "user")``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Final

import attrs

from protocol import (
    AGENT_TASK_PREFIX,
    MAX_RUN_ERROR_CHARS,
    RESERVED_ENTRY_PREFIX,
    RUN_ACTIVE,
    RUN_TERMINAL,
    TOOL_TASK_PREFIX,
    USER_ENTRY,
    CreateInteraction,
    CreateTask,
    EntryRecord,
    ErrorCode,
    FinishOperation,
    InteractionAnswer,
    InteractionRecord,
    JsonValue,
    LeaseRef,
    OperationRecord,
    Record,
    Resolve,
    Respond,
    Retry,
    RunAnswer,
    RunRecord,
    RunStatus,
    RunUsage,
    StartOperation,
    TaskOutcome,
    TaskRecord,
    approval_task_id,
    retry_delay_ms,
)

from ._checks import Refusal, check_id, check_name, same_json
from ._ports import Store, StoreConflict
from ._tasks import CutOffRule, TaskEngine
from ._unit import Journal
from ._usage import Accounting, check_usage

DEFAULT_MAX_CONCURRENT_RUNS: Final = 64
AGENT_KIND_PREFIX: Final = AGENT_TASK_PREFIX
TOOL_KIND_PREFIX: Final = TOOL_TASK_PREFIX
EXTERNAL_KIND_PREFIX: Final = "tether."
ATTENTION_KIND: Final = "tether.attention"
APPROVAL_KIND: Final = "tether.approval"
USER_ENTRY_KIND: Final = USER_ENTRY
BUSY: Final = frozenset({"pending", "running", "retry_wait"})
"""Statuses that take global capacity (``max_concurrent_runs``)."""
ACTIVE: Final = frozenset(RUN_ACTIVE)
TERMINAL: Final = frozenset(RUN_TERMINAL)
SETTLED: Final = frozenset({*RUN_TERMINAL, "needs_attention"})
"""Statuses that answer ``wait_run``."""
_RUN_IDS: Final = uuid.UUID("9f1c3c1e-5a0e-4c43-9a53-0e5f2f1d7a10")


def run_task_id(run_id: str, attempt: int) -> str:
    """The id of a run's ``attempt``-th task (1 for its admission, more after ``retry_run``)."""
    return str(uuid.uuid5(_RUN_IDS, f"{run_id}/task/{attempt}"))


def user_entry_id(run_id: str) -> str:
    return str(uuid.uuid5(_RUN_IDS, f"{run_id}/user"))


def attention_task_id(operation_id: str, attempt: int) -> str:
    """The ``tether.attention`` task the owner creates when attempt ``attempt`` of a manual tool call is cut off."""
    return str(uuid.uuid5(_RUN_IDS, f"{operation_id}/attention/{attempt}"))


def has_result(op: OperationRecord) -> bool:
    """Whether an operation's result is committed, so that no new intent may start it again: ``completed`` and
    ``resolved`` always; ``failed`` for a tool (the error is its result, which the model sees) and for a model
    request past its last attempt (a failed model attempt with attempts left is retried under the same id)."""
    if op.status in ("completed", "resolved"):
        return True
    if op.status == "failed":
        return op.kind == "tool" or op.attempt >= (op.retry or Retry()).attempts
    return False


def add_usage(total: RunUsage, more: RunUsage) -> RunUsage:
    cost = total.cost if more.cost is None else (total.cost or 0.0) + more.cost
    return RunUsage(
        input_tokens=total.input_tokens + more.input_tokens,
        output_tokens=total.output_tokens + more.output_tokens,
        cached_tokens=total.cached_tokens + more.cached_tokens,
        reasoning_tokens=total.reasoning_tokens + more.reasoning_tokens,
        cost=cost,
        unpriced_tokens=total.unpriced_tokens + more.unpriced_tokens,
    )


@attrs.frozen
class Derived:
    status: RunStatus
    reason: str | None = None
    operation_id: str | None = None
    error: str | None = None
    """Why a ``failed`` run failed: its task's error text, cut at :data:`MAX_RUN_ERROR_CHARS`."""


def run_error(text: str | None) -> str | None:
    """``text`` as a run record's ``error``: at most :data:`MAX_RUN_ERROR_CHARS` characters, a cut one ending in
    ``…`` (the task's outcome keeps the whole text)."""
    if text is None or len(text) <= MAX_RUN_ERROR_CHARS:
        return text
    return text[: MAX_RUN_ERROR_CHARS - 1] + "…"


def run_status(
    task: TaskRecord | None,
    *,
    blocked: str | None = None,
    attention: str | None = None,
    tool_missing: str | None = None,
    approval: str | None = None,
) -> Derived:
    """A run's status, from its task (``None``: not admitted yet) and what it owns. Rules, first match wins:

    ====================================  =========================================  ===============================
    run task                              what else                                  run status (reason)
    ====================================  =========================================  ===============================
    none                                                                             ``queued``
    terminal ``completed``                                                           ``completed``
    terminal ``aborted`` (or marked                                                  ``cancelled``
    ``abort`` and terminal otherwise)
    terminal otherwise                                                               ``failed`` (outcome's reason,
                                                                                     else its status)
    marked ``abort`` (being cancelled)                                               ``retry_wait`` if sleeping,
                                                                                     ``pending`` if pending, else
                                                                                     ``running`` (``cancelling``)
    ``sleeping``                                                                     ``retry_wait``
    ``running``, ``completing``                                                      ``running``
    ``pending``                           blocked ``task_too_old`` or                ``needs_attention``
                                          ``migration_failed``                       (``agent_version_missing``)
    ``pending``                           blocked ``missing_task``                   ``pending`` (``agent_missing``)
    ``pending``                           otherwise                                  ``pending``
    ``waiting``                           a live ``tether.attention`` it owns        ``needs_attention``
                                                                                     (``tool_interrupted``, its op)
    ``waiting``                           a pending tool task it owns blocked        ``needs_attention``
                                          ``task_too_old`` / ``migration_failed``    (``tool_missing``, its op)
    ``waiting``                           a live ``tether.approval`` it owns         ``waiting`` (its operation)
    ``waiting``                           otherwise (its tools run)                  ``running``
    ====================================  =========================================  ===============================

    ``agent_missing`` (no attached worker announces the agent) keeps the run ``pending``, holding its capacity: it
    goes on by itself once one attaches, as at an owner's start before its workers are back.

    ``blocked`` is the run task's blocked reason (derived from the attached workers), ``attention`` and
    ``approval`` the operation ids of the live external tasks it owns (transitively), if any, ``tool_missing`` the
    operation id of a pending tool task it owns that no attached worker can run.
    """
    if task is None:
        return Derived("queued")
    status = task.status
    if status == "terminal":
        outcome = task.outcome
        assert outcome is not None
        if outcome.status == "completed":
            return Derived("completed")
        if outcome.status == "aborted" or task.abort == "abort":
            return Derived("cancelled")
        return Derived("failed", outcome.reason or outcome.status, error=run_error(outcome.error))
    if task.abort == "abort":
        # Being cancelled: nobody is asked anything any more; it ends ``cancelled`` once its task is terminal.
        return Derived(
            "retry_wait" if status == "sleeping" else "pending" if status == "pending" else "running", "cancelling"
        )
    if status == "sleeping":
        return Derived("retry_wait")
    if status in ("running", "completing"):
        return Derived("running")
    if status == "pending":
        if blocked in ("task_too_old", "migration_failed"):
            return Derived("needs_attention", "agent_version_missing")
        if blocked == "missing_task":
            return Derived("pending", "agent_missing")
        return Derived("pending")
    if attention is not None:
        return Derived("needs_attention", "tool_interrupted", attention)
    if tool_missing is not None:
        return Derived("needs_attention", "tool_missing", tool_missing)
    if approval is not None:
        return Derived("waiting", None, approval)
    return Derived("running")


def answer_of(task: TaskRecord) -> RunAnswer | None:
    """A completed run's answer: its task's result ``{"text": ...}``, at the seq of the commit that completed it
    (the commit that also appended the final assistant entry)."""
    outcome = task.outcome
    if task.status != "terminal" or outcome is None or outcome.status != "completed":
        return None
    result = outcome.result
    if isinstance(result, dict) and isinstance(result.get("text"), str):
        return RunAnswer(seq=task.seq, text=result["text"])
    return None


class Runs:
    """The live runs of one store, their conversations' queues, and admission. See the module docstring."""

    def __init__(self, store: Store, tasks: TaskEngine, journal: Journal, *, max_concurrent_runs: int) -> None:
        self._store = store
        self._tasks = tasks
        self._journal = journal
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
        self.accounting = Accounting(store, tasks, self._first_task)
        """Prices, roll-ups and budgets (``_usage``)."""
        self._closing: dict[str, None] = {}
        """Approval tasks that ended: settling closes their interactions if still open (``cancelled``)."""
        self.settle_records: list[Record] = []
        """Operation records settling changed (cut-off operations), logged with the settling commit."""
        tasks.cut_off_hook = self.cut_off
        for record in store.live_runs():
            self._add(record)
            if record.status != "queued":
                self._dirty[record.run_id] = None
        self._admit_due = bool(self.live)

    # ------------------------------------------------------------------------------------------ inspection

    def needs_settle(self) -> bool:
        """Whether settling has runs to derive again, or a queued run it may admit now."""
        if self._dirty or self._closing:
            return True
        if not self._admit_due or not self._has_capacity():
            return False
        return any(self.live[queue[0]].status == "queued" for queue in self._queues.values())

    def active_run(self, conversation_id: str) -> RunRecord | None:
        """The conversation's run that is not terminal and first in its queue, if any (queued included)."""
        queue = self._queues.get(conversation_id)
        return None if not queue else self.live[queue[0]]

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

    def created(self, record: RunRecord) -> None:
        """A submission created a queued run (in the request's commit)."""
        self._remember(record)
        self._add(record)
        self._admit_due = True

    def tasks_changed(self, records: Iterable[Record]) -> None:
        """Task records a commit or a settle changed: their runs' statuses are derived again."""
        for record in records:
            if isinstance(record, TaskRecord):
                if record.kind == APPROVAL_KIND and record.status == "terminal":
                    self._closing[record.task_id] = None
                run_id = self.run_of_task(record)
                if run_id is not None:
                    self._dirty[run_id] = None

    def workers_changed(self) -> None:
        """Workers came or went: a pending run's blocked reason may have changed, and whether the tool calls of a
        run whose task waits can run (``tool_missing``, which ranks above an approval: a ``waiting`` run too).
        Every admitted live run is derived again (a queued one has no task to derive from)."""
        for run in self.live.values():
            if run.task_id is not None:
                self._dirty[run.run_id] = None

    def put(self, record: RunRecord) -> None:
        """Store a run's next record and keep the indexes in step (a terminal run leaves memory); inside a request,
        what it changed in memory is put back if the request is refused."""
        self._store.update_run(record)
        self._remember(record)
        old = self.live.get(record.run_id)
        if record.status in TERMINAL:
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
        """Derive the status of every dirty run again; a run whose record changes is stored and put in ``changed``.
        Close the interactions whose approval task ended unanswered first."""
        if self._closing:
            self._close_interactions(seq, now_ms)
        dirty, self._dirty = self._dirty, {}
        for run_id in dirty:
            run = self.live.get(run_id)
            if run is None or run.task_id is None:
                continue
            task = self._tasks.record(run.task_id)
            assert task is not None, f"run {run_id}'s task {run.task_id} is not stored"
            derived = self._derive(task)
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
                self.put(new)
                changed[run_id] = new

    def _close_interactions(self, seq: int, now_ms: int) -> None:
        """An approval task ended without an answer (its run was cancelled, or its tool call or run ended otherwise):
        its interaction, still ``open``, becomes ``cancelled`` in the settling commit, so ``interactions(status=
        "open")`` lists only what a person can still answer. That is the commit that ended the approval task: an
        abort mark ends one in the settling commit of its batch (the engine's rule 10), and the only request that
        ends one in its own commit, ``respond``, answers the interaction in that commit (skipped here)."""
        closing, self._closing = self._closing, {}
        for task_id in closing:
            input_value, _ = self._store.task_data(task_id)
            if not isinstance(input_value, dict) or not isinstance(input_value.get("interaction_id"), str):
                continue
            interaction = self._store.interaction(input_value["interaction_id"])
            if interaction is None or interaction.status != "open":
                continue
            closed = attrs.evolve(interaction, status="cancelled", seq=seq, updated_at_ms=now_ms)
            self._store.update_interaction(closed)
            self.settle_records.append(closed)

    def _derive(self, task: TaskRecord) -> Derived:
        blocked = None
        attention = tool_missing = approval = None
        if task.status == "pending":
            blocked = self._tasks.blocked_reason_of(task)
        elif task.status == "waiting":
            for owned in self._tasks.live_descendants(task.task_id):
                if owned.kind == ATTENTION_KIND and attention is None:
                    attention = self._operation_of(owned)
                elif owned.kind == APPROVAL_KIND and approval is None:
                    approval = self._operation_of(owned)
                elif tool_missing is None and self._tool_missing(owned):
                    tool_missing = self._operation_of(owned)
        return run_status(task, blocked=blocked, attention=attention, tool_missing=tool_missing, approval=approval)

    def _tool_missing(self, owned: TaskRecord) -> bool:
        """Whether ``owned`` is a pending tool call stored at a tool version no attached worker can run: newer than
        every attached definition of the tool, or one without a migration (``task_too_old`` / ``migration_failed``).
        With no worker for the tool at all (``missing_task``) the workers are coming back, as for an agent: not a
        cause for attention (a split deployment whose tool workers reattach after its agent workers would otherwise
        free capacity for a moment and overrun ``max_concurrent_runs`` once they are back)."""
        if not owned.kind.startswith(TOOL_KIND_PREFIX) or owned.status != "pending" or owned.abort is not None:
            return False
        return self._tasks.blocked_reason_of(owned) in ("task_too_old", "migration_failed")

    def _operation_of(self, external: TaskRecord) -> str:
        """The operation an external task is about (its input's ``operation_id``)."""
        input_value, _ = self._store.task_data(external.task_id)
        if isinstance(input_value, dict) and isinstance(input_value.get("operation_id"), str):
            return str(input_value["operation_id"])
        return external.task_id

    def _has_capacity(self) -> bool:
        return self._busy < self.max_concurrent_runs

    def admit(self, seq: int, now_ms: int, changed: dict[str, RunRecord], records: list[Record]) -> set[str]:
        """Admit queued runs at the head of idle conversations, oldest first, within global capacity (rule 2).
        Appends their user entries and task records to ``records``; returns the conversations whose transcript
        grew."""
        grown: set[str] = set()
        if not self._admit_due:
            return grown
        self._admit_due = False
        busy = self._busy
        heads = [self.live[queue[0]] for queue in self._queues.values()]
        # A queued run's seq is its creating commit's (nothing changes a queued run but its end).
        heads = sorted((run for run in heads if run.status == "queued"), key=lambda run: (run.seq, run.run_id))
        for run in heads:
            if busy >= self.max_concurrent_runs:
                self._admit_due = True  # capacity frees later: a run leaving a busy status sets it again
                break
            self._admit_one(run, seq, now_ms, changed, records)
            grown.add(run.conversation_id)
            busy += 1
        return grown

    def _first_task(self, task: TaskRecord) -> str:
        """The first task of the run whose (later) task ``task`` is, so that a run's tasks are one task tree
        (``_usage``, rule 3); ``task`` itself when it is no run's task."""
        if not task.kind.startswith(AGENT_KIND_PREFIX):
            return task.task_id
        input_value, _ = self._store.task_data(task.task_id)
        run_id = input_value.get("run_id") if isinstance(input_value, dict) else None
        if not isinstance(run_id, str):
            return task.task_id
        # Its tasks are 1, 2, ... with no gap (one per admission): a task merely naming the run is not one of them.
        attempt = 2
        while (later := run_task_id(run_id, attempt)) != task.task_id:
            if self._tasks.record(later) is None:
                return task.task_id
            attempt += 1
        return run_task_id(run_id, 1)

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
            self.put(new)
            changed[run.run_id] = new
            return
        store = self._store
        records.append(task)
        new = attrs.evolve(run, status="pending", task_id=task_id, seq=seq, updated_at_ms=now_ms)
        self.put(new)
        changed[run.run_id] = new
        self._dirty[run.run_id] = None  # derived once settled: whether an attached worker announces its agent
        if attempt > 1:
            return
        position = store.next_entry_position(run.conversation_id)
        assert position is not None
        entry = EntryRecord(
            entry_id=user_entry_id(run.run_id),
            conversation_id=run.conversation_id,
            position=position,
            seq=seq,
            kind=USER_ENTRY_KIND,
            data=JsonValue({"text": store.run_input(run.run_id), "run_id": run.run_id}),
            created_at_ms=now_ms,
        )
        store.insert_entry(entry)
        records.insert(len(records) - 1, entry)

    # ------------------------------------------------------------------------------------ operation journal

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

    def _writer(self, run_id: str, lease: LeaseRef | None, where: str) -> tuple[RunRecord, TaskRecord]:
        """The live run and the task whose lease writes its journal (its run task, or a tool task it owns)."""
        if lease is None:
            message = f"{where}: the operation journal is written only under the lease of the run's task or its tools"
            raise Refusal(ErrorCode.NOT_ALLOWED, message)
        check_id(run_id, f"{where}.run_id")
        run = self.live.get(run_id)
        if run is None:
            if self._store.run(run_id) is None:
                raise Refusal(ErrorCode.NOT_FOUND, f"{where}: run {run_id} does not exist")
            raise Refusal(ErrorCode.CONFLICT, f"{where}: run {run_id} has ended; its journal takes no new writes")
        task = self._tasks.live(lease.task_id)
        if task is None or self.run_of_task(task) != run_id:
            raise Refusal(
                ErrorCode.NOT_ALLOWED,
                f"{where}: task {lease.task_id} is not run {run_id}'s task nor one of its tool tasks",
            )
        return run, task

    def start_operation(
        self, write: StartOperation, lease: LeaseRef | None, seq: int, now_ms: int, where: str
    ) -> OperationRecord:
        """Commit an operation's intent. Refused (``conflict``) when its result is committed, when ``attempt`` is
        not the next, for a manual tool call whose last attempt was interrupted (only ``resolve`` settles it), and
        when it names another policy, retry or (tools) arguments than the first intent stored: those never change."""
        run, task = self._writer(write.run_id, lease, where)
        check_id(write.operation_id, f"{where}.operation_id")
        check_name(write.name, f"{where}.name")
        if write.kind not in ("model", "tool"):
            raise Refusal(ErrorCode.INVALID, f"{where}.kind must be model or tool, not {write.kind!r}")
        if write.attempt < 1 or write.turn < 0 or write.version < 0:
            raise Refusal(ErrorCode.INVALID, f"{where}: attempt must be 1 or more, turn and version 0 or more")
        if write.kind == "tool":
            if write.retry is not None or write.policy not in ("manual", "safe", "idempotent"):
                message = f"{where}: a tool call names a policy (manual, safe or idempotent) and no retry"
                raise Refusal(ErrorCode.INVALID, message)
        elif write.policy is not None or write.tool_call_id is not None:
            raise Refusal(ErrorCode.INVALID, f"{where}: a model request names a retry, no policy nor tool_call_id")
        retry = write.retry if write.kind == "tool" else (write.retry or Retry())
        if retry is not None and (retry.attempts < 1 or retry.first_delay_ms < 0 or retry.max_delay_ms < 0):
            raise Refusal(ErrorCode.INVALID, f"{where}.retry: attempts 1 or more, delays 0 or more")
        existing = self._store.operation(write.operation_id)
        what = f"{where}: operation {write.operation_id}"
        if existing is None:
            if write.attempt != 1:
                raise Refusal(ErrorCode.CONFLICT, f"{what} has no attempt yet: the first is attempt 1")
            if write.kind == "model":  # only once a new attempt is about to be written
                self.accounting.check_budget(run, task, write.name, lease)
            record = OperationRecord(
                operation_id=write.operation_id,
                run_id=run.run_id,
                conversation_id=run.conversation_id,
                task_id=task.task_id,
                kind=write.kind,
                name=write.name,
                version=write.version,
                tool_call_id=write.tool_call_id,
                turn=write.turn,
                attempt=1,
                policy=write.policy,
                retry=retry,
                arguments=write.arguments,
                digest=write.digest,
                status="started",
                seq=seq,
                created_at_ms=now_ms,
                updated_at_ms=now_ms,
            )
            self._store.insert_operation(record)
            return record
        if existing.run_id != run.run_id or existing.kind != write.kind or existing.name != write.name:
            raise Refusal(ErrorCode.CONFLICT, f"{what} is another run's or another {existing.kind}'s")
        if has_result(existing):
            message = f"{what} already has its result ({existing.status}): use the committed result, never run it again"
            raise Refusal(ErrorCode.CONFLICT, message)
        if existing.status == "started":
            raise Refusal(ErrorCode.CONFLICT, f"{what}: attempt {existing.attempt} is still open")
        if existing.kind == "tool" and existing.policy == "manual":
            message = f"{what} was interrupted under the manual policy: only resolve(operation_id, output) settles it"
            raise Refusal(ErrorCode.CONFLICT, message)
        if write.attempt != existing.attempt + 1:
            message = f"{what}: the next attempt is {existing.attempt + 1}, not {write.attempt}"
            raise Refusal(ErrorCode.CONFLICT, message)
        if write.policy != existing.policy or (write.retry is not None and write.retry != existing.retry):
            message = (
                f"{what} was started under policy {existing.policy}, retry {existing.retry}: the stored policy wins "
                "over a later registration; nothing was written"
            )
            raise Refusal(ErrorCode.CONFLICT, message)
        if existing.kind == "tool" and write.digest != existing.digest:
            raise Refusal(ErrorCode.CONFLICT, f"{what}: a tool call's arguments never change between attempts")
        if write.kind == "model":  # only once a new attempt is about to be written
            self.accounting.check_budget(run, task, write.name, lease)
        record = attrs.evolve(
            existing,
            task_id=task.task_id,
            turn=write.turn,
            attempt=write.attempt,
            digest=write.digest,
            status="started",
            error=None,
            seq=seq,
            updated_at_ms=now_ms,
        )
        self._store.update_operation(record)
        return record

    def finish_operation(
        self, write: FinishOperation, lease: LeaseRef | None, seq: int, now_ms: int, where: str
    ) -> tuple[OperationRecord, RunRecord | None]:
        """Commit an operation's result, once, under the lease that started it; its usage is added to the run's,
        the conversation's and the model's, exactly once (a second result is a ``conflict``). An operation's own
        ``usage`` sums its attempts', so a run's usage is the sum of its operations'."""
        check_id(write.operation_id, f"{where}.operation_id")
        op = self._store.operation(write.operation_id)
        if op is None:
            raise Refusal(ErrorCode.NOT_FOUND, f"{where}: operation {write.operation_id} does not exist")
        run, _ = self._writer(op.run_id, lease, where)
        if op.status != "started":
            message = (
                f"{where}: operation {op.operation_id} is {op.status}: its attempt {op.attempt} has no open intent"
            )
            raise Refusal(ErrorCode.CONFLICT, message)
        assert lease is not None
        if lease.task_id != op.task_id:
            message = f"{where}: operation {op.operation_id} was started under task {op.task_id}'s lease, not this one"
            raise Refusal(ErrorCode.NOT_ALLOWED, message)
        if write.status not in ("completed", "failed"):
            raise Refusal(ErrorCode.INVALID, f"{where}.status must be completed or failed, not {write.status!r}")
        check_usage(write.usage, where)
        usage = None if write.usage is None else self.accounting.priced(op.kind, op.name, write.usage)
        record = attrs.evolve(
            op,
            status=write.status,
            result=write.result,
            is_error=write.is_error,
            error=write.error,
            usage=op.usage if usage is None else add_usage(op.usage or RunUsage(), usage),
            seq=seq,
            updated_at_ms=now_ms,
        )
        self._store.update_operation(record)
        if usage is None:
            return record, None
        task = self._tasks.record(op.task_id)
        assert task is not None
        self.accounting.add(run, task, op.kind, op.name, usage)
        new = attrs.evolve(run, usage=add_usage(run.usage, usage), seq=seq, updated_at_ms=now_ms)
        self.put(new)
        return record, new

    def cut_off(self, task: TaskRecord, seq: int, now_ms: int) -> CutOffRule | None:
        """The engine's cut-off hook (its rule 9): the open operations of a run's task or tool task become
        ``interrupted``, and the owner decides what the task does next:

        - a model request with attempts left: ``backoff`` until now + :func:`retry_delay_ms` (``retry_wait``); past
          its last attempt the task fails, reason ``model_retries_exhausted`` (a crash consumes an attempt);
        - a ``manual`` tool call: the task waits on a new ``tether.attention`` task (``needs_attention``);
        - a ``safe`` / ``idempotent`` tool call: a restart as usual; the next attempt reuses the operation id.
        """
        if not task.kind.startswith((AGENT_KIND_PREFIX, TOOL_KIND_PREFIX)):
            return None
        rule: CutOffRule | None = None
        for op in self._store.open_operations(task.task_id):
            interrupted = attrs.evolve(op, status="interrupted", error="interrupted", seq=seq, updated_at_ms=now_ms)
            self._store.update_operation(interrupted)
            self.settle_records.append(interrupted)
            if op.kind == "model":
                retry = op.retry or Retry()
                if op.attempt < retry.attempts:
                    rule = CutOffRule("backoff", until_ms=now_ms + retry_delay_ms(retry, op.attempt))
                else:
                    error = f"the model request was interrupted at its last attempt ({op.attempt} of {retry.attempts})"
                    outcome = TaskOutcome(status="failed", reason="model_retries_exhausted", error=error)
                    rule = CutOffRule("fail", outcome=outcome)
            elif op.policy == "manual":
                attention = CreateTask(
                    task_id=attention_task_id(op.operation_id, op.attempt),
                    kind=ATTENTION_KIND,
                    input=JsonValue({"operation_id": op.operation_id, "run_id": op.run_id}),
                    owner_task_id=task.task_id,
                )
                rule = CutOffRule("attention", attention=attention)
        return rule

    # --------------------------------------------------------------------------------------- owner decisions

    def create_interaction(
        self, write: CreateInteraction, lease: LeaseRef | None, seq: int, now_ms: int, where: str
    ) -> tuple[Record, int]:
        """Ask for an approval under a tool task's lease: the interaction and its ``tether.approval`` task (owned by
        the tool task, id :func:`approval_task_id`), which the same commit's wait names. Again for the same
        operation: the first is kept and returned (result 0), so a replay never asks twice; other arguments than
        the first's are a ``conflict`` (the approved arguments are the only ones ever executed)."""
        run, task = self._writer(write.run_id, lease, where)
        check_id(write.interaction_id, f"{where}.interaction_id")
        check_id(write.operation_id, f"{where}.operation_id")
        if not task.kind.startswith(TOOL_KIND_PREFIX):
            raise Refusal(ErrorCode.NOT_ALLOWED, f"{where}: an interaction is asked under a tool task's lease")
        if write.kind not in ("approval", "question"):
            raise Refusal(ErrorCode.INVALID, f"{where}.kind must be approval or question, not {write.kind!r}")
        existing = self._store.operation_interaction(write.operation_id)
        if existing is not None:
            if existing.digest != write.digest or existing.run_id != run.run_id:
                message = (
                    f"{where}: operation {write.operation_id} already asked interaction {existing.interaction_id} "
                    "about other arguments; nothing was written"
                )
                raise Refusal(ErrorCode.CONFLICT, message)
            return existing, 0
        approval = CreateTask(
            task_id=approval_task_id(write.operation_id),
            kind=APPROVAL_KIND,
            input=JsonValue({"operation_id": write.operation_id, "interaction_id": write.interaction_id}),
            owner_task_id=task.task_id,
        )
        approval_task = self._tasks.create_task(approval, seq, now_ms, where)
        record = InteractionRecord(
            interaction_id=write.interaction_id,
            run_id=run.run_id,
            conversation_id=run.conversation_id,
            operation_id=write.operation_id,
            tool=task.kind.removeprefix(TOOL_KIND_PREFIX),
            task_id=approval_task.task_id,
            kind=write.kind,
            status="open",
            args=write.args,
            digest=write.digest,
            seq=seq,
            created_at_ms=now_ms,
            updated_at_ms=now_ms,
        )
        try:
            self._store.insert_interaction(record)
        except StoreConflict as exc:
            raise Refusal(ErrorCode.DUPLICATE, f"{where}: interaction id {exc.key} already exists") from exc
        return record, 1

    def respond(self, request: Respond, seq: int, now_ms: int) -> tuple[InteractionRecord, list[Record]]:
        """Answer an interaction once: the approval task completes with ``{approve, note}`` and the tool task waiting
        on it resumes. The same answer again changes nothing (no records); another answer is a ``conflict``."""
        interaction = self._store.interaction(request.interaction_id)
        if interaction is None:
            raise Refusal(ErrorCode.NOT_FOUND, f"interaction {request.interaction_id} does not exist")
        if interaction.answer is not None:
            if interaction.answer.approve == request.approve and interaction.answer.note == request.note:
                return interaction, []
            message = (
                f"interaction {interaction.interaction_id} was already answered (approve={interaction.answer.approve}, "
                f"note={interaction.answer.note!r}); an answer is accepted once"
            )
            raise Refusal(ErrorCode.CONFLICT, message)
        task = self._tasks.live(interaction.task_id)
        if task is None or task.status != "pending" or task.abort is not None:
            message = f"interaction {interaction.interaction_id} is no longer awaited (its run was cancelled or ended)"
            raise Refusal(ErrorCode.CONFLICT, message)
        answer = InteractionAnswer(
            approve=request.approve, note=request.note, responded_by=request.responded_by, at_ms=now_ms
        )
        answered = attrs.evolve(interaction, status="answered", answer=answer, seq=seq, updated_at_ms=now_ms)
        self._store.update_interaction(answered)
        result = JsonValue({"approve": request.approve, "note": request.note})
        ended = self._tasks.end_by_owner(task.task_id, TaskOutcome(status="completed", result=result), seq, now_ms)
        return answered, [answered, ended]

    def resolve(self, request: Resolve, seq: int, now_ms: int) -> tuple[OperationRecord, list[Record]]:
        """Settle an interrupted manual tool call: the operation becomes ``resolved`` with the output (who and when
        kept), its attention task and then its tool task complete (the output is the tool's result), and the run
        continues. The same output again changes nothing; another output is a ``conflict``."""
        check_id(request.operation_id, "operation_id")
        op = self._store.operation(request.operation_id)
        if op is None:
            raise Refusal(ErrorCode.NOT_FOUND, f"operation {request.operation_id} does not exist")
        if op.status == "resolved":
            if same_json(op.result, request.output):
                return op, []
            raise Refusal(ErrorCode.CONFLICT, f"operation {op.operation_id} was already resolved with another output")
        attention_id = attention_task_id(op.operation_id, op.attempt)
        attention = self._tasks.live(attention_id)
        tool = self._tasks.live(op.task_id)
        if op.status != "interrupted" or op.policy != "manual" or attention is None or tool is None:
            message = (
                f"operation {op.operation_id} is {op.status} ({op.kind}, policy {op.policy}): only an interrupted "
                "manual tool call whose run needs attention is resolved"
            )
            raise Refusal(ErrorCode.CONFLICT, message)
        if attention.abort is not None or tool.abort is not None or tool.status != "waiting":
            raise Refusal(ErrorCode.CONFLICT, f"operation {op.operation_id}'s run is being cancelled")
        resolved = attrs.evolve(
            op,
            status="resolved",
            result=request.output,
            error=None,
            resolved_by=request.resolved_by,
            resolved_at_ms=now_ms,
            seq=seq,
            updated_at_ms=now_ms,
        )
        self._store.update_operation(resolved)
        done = TaskOutcome(status="completed", result=JsonValue({"operation_id": op.operation_id}))
        attention_ended = self._tasks.end_by_owner(attention_id, done, seq, now_ms)
        records: list[Record] = [resolved, attention_ended]
        if not any(self._tasks.live(other) is not None for other in tool.on):
            outcome = TaskOutcome(status="completed", result=request.output)
            records.append(self._tasks.end_by_owner(tool.task_id, outcome, seq, now_ms))
        return resolved, records

    def retry_run(self, run_id: str, seq: int, now_ms: int) -> tuple[RunRecord, list[Record]]:
        """Re-attempt a run. A run not ended (``needs_attention`` included): a no-op returning its record (it goes
        on, or resumes by itself once a worker with the agent or tool version attaches, or once its tool call is
        resolved). ``failed``: refused once a later run of its
        conversation has started; otherwise the attempts of its unfinished model requests reset (committed results
        stay) and the run is ``queued`` again at the head of its conversation's queue, which it blocks: admission
        gives it a new task (same run id, its bound version, no second user entry) within ``max_concurrent_runs``,
        like any run, so a retry never takes capacity the bound does not have."""
        run = self.live.get(run_id) or self._store.run(run_id)
        if run is None:
            raise Refusal(ErrorCode.NOT_FOUND, f"run {run_id} does not exist")
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
        records: list[Record] = []
        operations, _ = self._store.operation_page(run_id, 0, 1 << 30)
        for op in operations:
            if op.kind == "model" and op.status in ("started", "interrupted", "failed"):
                reset = attrs.evolve(op, status="interrupted", attempt=0, seq=seq, updated_at_ms=now_ms)
                self._store.update_operation(reset)
                records.append(reset)
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
        self._store.update_run(new)
        self._remember(new)
        self._live_set(new)
        self._queues.setdefault(run.conversation_id, []).insert(0, run_id)
        self._admit_due = True
        records.append(new)
        return new, records
