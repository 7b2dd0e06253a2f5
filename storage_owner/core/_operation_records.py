"""The operation journal's records and their tables, sans-IO: the one way an operation or an interaction record
changes once stored (checked against :data:`OPERATION_TRANSITIONS` and :data:`INTERACTION_TRANSITIONS`, which
``docs/runs.md`` prints), and what the owner does to them outside a request of their room: a cut-off phase's open
operations become ``interrupted`` (a phase given back by a close: its open model request is withdrawn), an ended
task's open ones ``failed``, a retried run's unfinished model requests start over. The rules are numbered as in
:mod:`._operations`, which applies the requests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

import attrs

from protocol import (
    TOOL_TASK_PREFIX,
    CreateTask,
    InteractionRecord,
    JsonValue,
    OperationRecord,
    OperationStatus,
    Record,
    Retry,
    TaskOutcome,
    TaskRecord,
    ended_code,
    retry_delay_ms,
)

from ._checks import check_move
from ._ports import OperationStore, TaskReads
from ._run_rules import attention_task_id
from ._run_status import ATTENTION_KIND
from ._task_settle import CutOffRule

InteractionStatus = Literal["open", "answered", "cancelled"]
"""An interaction record's ``status`` (its field's type on the wire)."""
OperationEvent = Literal["finish", "interrupt", "attempt", "resolve", "reset", "report", "withdraw", "limit"]
InteractionEvent = Literal["answer", "close"]

OPERATION_TRANSITIONS: Final[Mapping[tuple[OperationStatus, OperationEvent], frozenset[OperationStatus]]] = {
    ("started", "finish"): frozenset({"completed", "failed"}),  # 2
    ("started", "interrupt"): frozenset({"interrupted"}),  # 3
    ("failed", "attempt"): frozenset({"started"}),  # 1 (a model request with attempts left)
    ("interrupted", "attempt"): frozenset({"started"}),  # 1 (a model request, a safe or idempotent tool call)
    ("interrupted", "resolve"): frozenset({"resolved"}),  # 5
    ("interrupted", "report"): frozenset({"failed"}),  # 2 (a report tool call, not run again)
    ("interrupted", "limit"): frozenset({"failed"}),  # 3 (a tool call whose task reached its restart limit)
    ("started", "reset"): frozenset({"interrupted"}),  # 6
    ("interrupted", "reset"): frozenset({"interrupted"}),  # 6
    ("failed", "reset"): frozenset({"interrupted"}),  # 6
    ("started", "withdraw"): frozenset({"interrupted"}),  # 7 (a model request its worker's close stopped)
}
"""The operation state machine: from a status, on an event, the statuses an operation may take; see the module
docstring for the rules each row follows. Nothing leaves ``completed`` or ``resolved``."""

INTERACTION_TRANSITIONS: Final[Mapping[tuple[InteractionStatus, InteractionEvent], frozenset[InteractionStatus]]] = {
    ("open", "answer"): frozenset({"answered"}),  # 4
    ("open", "close"): frozenset({"cancelled"}),  # 4
}
"""The interaction state machine (rule 4): answered once, or closed when its approval ended unanswered."""


class OperationRecords:
    """The one way an operation or an interaction record changes once stored: checked against its table, then stored;
    and the changes the owner makes to them outside a request of their room (rules 3 and 6)."""

    def __init__(self, store: OperationStore, stored_tasks: TaskReads) -> None:
        self._store = store
        self._stored_tasks = stored_tasks

    def get(self, operation_id: str) -> OperationRecord | None:
        """An operation's record (the store keeps those it wrote lately: an intent read back by its result's commit
        costs no read of the database)."""
        return self._store.operation(operation_id)

    def insert(self, record: OperationRecord) -> None:
        """Store a new operation (raises :class:`StoreConflict` if its id exists)."""
        self._store.insert_operation(record)

    def put(self, previous: OperationRecord, record: OperationRecord, event: OperationEvent) -> None:
        """Store an operation's next record, which ``event`` made of ``previous``: refused loudly if the table
        forbids it."""
        check_move(OPERATION_TRANSITIONS, "operation", previous.operation_id, previous.status, event, record.status)
        self._store.update_operation(record)

    def put_interaction(self, previous: InteractionRecord, record: InteractionRecord, event: InteractionEvent) -> None:
        """Store an interaction's next record, which ``event`` made of ``previous``: refused loudly if the table
        forbids it."""
        key = previous.interaction_id
        check_move(INTERACTION_TRANSITIONS, "interaction", key, previous.status, event, record.status)
        self._store.update_interaction(record)

    def cut_off(
        self, task: TaskRecord, seq: int, now_ms: int, changed: list[Record], closing: bool = False
    ) -> CutOffRule | None:
        """The task engine's cut-off hook for the run families (an ``agent:`` run task, a ``tool:`` task), rule 3:
        the open operations of ``task`` become ``interrupted`` (added to ``changed``, which the settling commit
        logs), and the owner decides what the task does next:

        - a model request with attempts left: ``backoff`` until now + :func:`retry_delay_ms` (``retry_wait``); past
          its last attempt the task fails, reason ``model_retries_exhausted`` (a crash consumes an attempt);
        - a ``manual`` tool call: the task waits on a new ``tether.attention`` task (``needs_attention``);
        - a ``report`` tool call: a restart as usual, whose lease settles it ``failed`` without running it again;
        - a ``safe`` / ``idempotent`` tool call: a restart as usual; the next attempt reuses the operation id; at the
          task's restart limit (the engine ends it ``faulted``, ``restart_limit``) the call is ``failed`` instead,
          with code ``restart_limit``: its error result.

        A ``manual`` or ``report`` call never runs its handler again, so the work its handler left (its nested calls
        and what they own, its questions, a foreground subagent's run) is abandoned in the same commit (the engine's
        rule 11: marked for abort, reason ``restart``), before any of it runs again.

        ``closing``: the phase was given back by its worker's close (rule 7), not cut off by a crash: an open model
        request is withdrawn instead (``interrupted`` at the attempt before it, so that the next intent takes the same
        number: a close consumes no attempt, and the task goes on at once, no back-off); a tool call is interrupted as
        above (it may have partially run), a manual one waits for a person.
        """
        rule: CutOffRule | None = None
        if not closing and self._at_restart_limit(task, seq, now_ms, changed):  # a close counts no restart
            return None  # the engine ends the task ``faulted`` (``restart_limit``) in this commit
        for op in self._store.open_operations(task.task_id):
            if closing and op.kind == "model":
                changed.append(self.withdraw(op, seq, now_ms))
                continue
            interrupted = attrs.evolve(op, status="interrupted", error="interrupted", seq=seq, updated_at_ms=now_ms)
            self.put(op, interrupted, "interrupt")
            changed.append(interrupted)
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
                rule = CutOffRule("attention", attention=attention, abandon=True)
            elif op.policy == "report":
                rule = CutOffRule("restart", abandon=True)  # run again only to settle it failed: it never reruns
        return rule

    def withdraw(self, op: OperationRecord, seq: int, now_ms: int) -> OperationRecord:
        """Rule 7: a model request's open attempt that its worker's close stopped is withdrawn: ``interrupted`` at the
        attempt before it (what it counts as spent), its error saying which attempt was stopped and why, so that the
        request is sent again as that same attempt."""
        error = (
            f"withdrawn: attempt {op.attempt} was stopped by its worker's close (a stop or a supervised restart, "
            f"not a crash); it is sent again as attempt {op.attempt}, not charged to the retry policy"
        )
        withdrawn = attrs.evolve(
            op, status="interrupted", attempt=op.attempt - 1, error=error, seq=seq, updated_at_ms=now_ms
        )
        self.put(op, withdrawn, "withdraw")
        return withdrawn

    def _at_restart_limit(self, task: TaskRecord, seq: int, now_ms: int, changed: list[Record]) -> bool:
        """Rule 3: a tool task (not ``manual``) cut off as many times as its restart limit: the engine ends it, and its
        call is not run again: its result is an error coded ``restart_limit`` (rule 2c), whether its attempt was
        open (``started``) or had been cut off before (``interrupted``, its next attempt not started yet)."""
        restarts = task.restarts + 1
        if not task.kind.startswith(TOOL_TASK_PREFIX) or task.restart_limit is None or restarts < task.restart_limit:
            return False
        calls = list(self._store.open_operations(task.task_id))
        input_value, _ = self._stored_tasks.task_data(task.task_id)
        named = input_value.get("operation_id") if isinstance(input_value, dict) else None
        found = self._store.operation(named) if isinstance(named, str) else None
        if found is not None and found.status == "interrupted" and found.task_id == task.task_id:
            calls.append(found)
        if any(op.kind != "tool" or op.policy == "manual" for op in calls):
            return False  # a manual call cut off waits for a person (the hook's rule), whatever the count
        error = f"cut off {restarts} times (the restart limit is {task.restart_limit})"
        for op in calls:
            failed = attrs.evolve(
                op,
                status="failed",
                result=JsonValue(error),
                is_error=True,
                error=error,
                code="restart_limit",
                seq=seq,
                updated_at_ms=now_ms,
            )
            self.put(op, failed, "finish" if op.status == "started" else "limit")
            changed.append(failed)
        return True

    def settle_open(self, task_id: str, outcome: TaskOutcome, seq: int, now_ms: int) -> list[Record]:
        """Rule 2b: the operations ``task_id`` left open when it ended ``outcome`` (not completed) become ``failed``
        with its error (a tool call's result is then that error, as the model read it)."""
        error = f"its task ended {outcome.status}" + (f" ({outcome.reason})" if outcome.reason else "")
        if outcome.error:
            error += f": {outcome.error}"
        settled: list[Record] = []
        for op in self._store.open_operations(task_id):
            tool = op.kind == "tool"
            failed = attrs.evolve(
                op,
                status="failed",
                result=JsonValue(error) if tool else op.result,
                is_error=True,
                error=error,
                code=ended_code(outcome) if tool else None,
                seq=seq,
                updated_at_ms=now_ms,
            )
            self.put(op, failed, "finish")
            settled.append(failed)
        return settled

    def reset_attempts(self, run_id: str, seq: int, now_ms: int) -> list[Record]:
        """Rule 6, for ``retry_run``: what it changed, in journal order."""
        records: list[Record] = []
        operations, _ = self._store.operation_page(run_id, 0, 1 << 30)
        for op in operations:
            if op.kind == "model" and op.status in ("started", "interrupted", "failed"):
                reset = attrs.evolve(op, status="interrupted", attempt=0, seq=seq, updated_at_ms=now_ms)
                self.put(op, reset, "reset")
                records.append(reset)
        return records
