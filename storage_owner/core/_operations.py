"""The operation journal and interactions, sans-IO: the intents and results of a run's model requests and tool
calls, the approvals and questions its tools ask, and what the owner decides when a phase with an operation in flight
is cut off (docs/runs.md, "The operation journal", "Approvals", "Interrupted operations").

1. **Intent** (``start_operation``), under the lease of the run's task or of a tool task it owns: attempt 1 creates
   the record; a later attempt is the next one, on an operation without a committed result or an open attempt. The
   policy (tools) and retry (models) of the first intent win; a tool call's arguments never change; a manual tool
   call whose attempt was interrupted takes no new intent (only ``resolve`` settles it). A model request's intent is
   checked against the run's budgets first (``_usage`` rule 4).
   1b. A tool call's intent may instead be committed by the run's task, in the commit of its model's result, for a
   tool task created earlier in that commit (``task_id``, never leased): its attempt 1, the operation that task's, so
   its lease runs the call with no commit before it. A worker does so only for a ``safe`` or ``idempotent`` call that
   asks no approval: cut off before it ran, such a call is re-run, as if it had been.
2. **Result** (``finish_operation``): ``completed`` or ``failed``, once per attempt, under the lease that started it;
   its usage is added exactly once (``_usage`` rule 2). A committed result is final (:func:`protocol.has_result`).
   A task that ends otherwise than ``completed`` with an operation still open (its phase raised after the intent,
   such as a tool whose result was too large to commit) settles it ``failed`` with the task's error, in that commit
   (:meth:`Operations.settle_open`). So does a run's task or tool task that the engine ends (aborted bottom-up, before
   its lease or while it ran), in the settling commit (:meth:`Operations.settle_ended`).
   An interrupted tool call under the ``report`` policy is not run again: its tool task, leased again, settles it
   ``failed`` (the error the model reads says it was interrupted and may have partially run).
   2c. A tool call's result carries its channels besides the output: an error result's ``code``
   (:data:`~protocol.ToolErrorCode`); a result's ``structured`` value, or why it was ``dropped``. An operation a task
   left open is settled with the code its task's end gives (``restart_limit``, ``aborted``, ``orphaned``,
   ``faulted``).
3. **Cut off** (the task engine's rule 9, :meth:`OperationRecords.cut_off`): a phase of a run's task or tool task
   cut off with operations in flight: they become ``interrupted`` in the settling commit, and the task backs off (a
   model request with attempts left), fails (past its last), waits on a new ``tether.attention`` task (a manual tool
   call) or restarts as usual (a safe, idempotent or report one).
4. **Interactions** (``create_interaction``, under a tool task's lease): the interaction and its ``tether.approval``
   task, once per operation (a replay gets the first; other arguments are a ``conflict``). ``respond`` answers it
   once; an approval task that ends unanswered (aborted, in a settling commit) closes its interaction ``cancelled``
   in that commit (:meth:`Operations.close_interactions`).
5. ``resolve`` settles an interrupted manual tool call once: the operation is ``resolved`` with the output, and its
   attention task and then its tool task complete; a question the call left open ends ``aborted`` (its interaction
   ``cancelled``). Its nested calls were abandoned when it was cut off (the engine's rule 11); those still ending
   (and any not marked yet, which it marks) keep its tool task ``completing`` until they are terminal.
6. A retried run's unfinished model requests (``started``, ``interrupted``, ``failed``) are ``interrupted`` at attempt
   0: their attempts start over, under the same operation ids (``_runs`` rule 6).
7. **Given back by a close** (a ``release`` with ``closing``: the worker stopped the phase at its drain's deadline, task
   rule 3): no restart is counted. A model request left open is withdrawn (``interrupted`` at the attempt before it,
   its error naming the stopped attempt): the next intent takes the same attempt number, so a close consumes no
   attempt of its retry policy, and the task is ``pending`` at once. A tool call left open is interrupted as in rule
   3 (it may have partially run): a manual one waits for a person, the others run again (the next attempt).

An operation is created ``started`` (attempt 1), an interaction ``open``; their statuses change only as
:data:`OPERATION_TRANSITIONS` and :data:`INTERACTION_TRANSITIONS` allow, checked on every put of
:class:`OperationRecords` (an illegal transition raises :class:`~._checks.IllegalTransition`: a bug, never bad
input). ``docs/runs.md`` prints both tables.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import attrs

from protocol import (
    AGENT_TASK_PREFIX,
    MAX_TOOL_DIAGNOSTIC_CHARS,
    RERUN_POLICIES,
    TOOL_TASK_PREFIX,
    CreateInteraction,
    CreateTask,
    ErrorCode,
    FinishOperation,
    Frame,
    InteractionAnswer,
    InteractionRecord,
    InteractionReply,
    InteractionsReply,
    JsonValue,
    LeaseRef,
    OperationRecord,
    OperationReply,
    OperationsReply,
    ReadInteractions,
    ReadOperation,
    ReadOperations,
    Record,
    Resolve,
    Respond,
    Retry,
    RunRecord,
    RunUsage,
    StartOperation,
    TaskOutcome,
    TaskRecord,
    approval_task_id,
    has_result,
    question_task_id,
)

from ._answers import check_question, check_response, short_json
from ._checks import MAX_CURSOR, MAX_READ_LIMIT, Refusal, check_id, check_limit, check_name, same_json
from ._operation_records import OperationRecords
from ._output import PeerId, fit_page
from ._ports import OperationStore, RunReads, StoreConflict, TaskReads
from ._run_rules import attention_task_id
from ._run_status import APPROVAL_KIND, INTERACTION_KINDS, QUESTION_KIND
from ._runs import Runs
from ._tasks import TaskEngine
from ._unit import UnitOfWork
from ._usage import Usage, add_usage, check_usage

TOOL_KIND_PREFIX: Final = TOOL_TASK_PREFIX
_JOURNAL_WRITERS: Final = (AGENT_TASK_PREFIX, TOOL_TASK_PREFIX)
"""The kinds of task whose leases write a run's journal: its run task and its tool tasks."""


def _check_channels(write: FinishOperation, op: OperationRecord, where: str) -> None:
    """Rule 2c: a result's ``code`` only on a tool call's error result; its ``structured`` value and why one was
    ``dropped`` only on a tool call's result that is not an error, the reason at most
    :data:`MAX_TOOL_DIAGNOSTIC_CHARS` characters."""
    tool_error = op.kind == "tool" and write.is_error
    if write.code is not None and not tool_error:
        raise Refusal(ErrorCode.INVALID, f"{where}.code goes only with a tool call's error result (is_error)")
    if (write.structured is not None or write.dropped is not None) and (op.kind != "tool" or write.is_error):
        message = f"{where}: structured and dropped go only with a tool call's result that is not an error"
        raise Refusal(ErrorCode.INVALID, message)
    if write.dropped is not None and not 1 <= len(write.dropped) <= MAX_TOOL_DIAGNOSTIC_CHARS:
        message = f"{where}.dropped says why in 1 to {MAX_TOOL_DIAGNOSTIC_CHARS} characters, not {len(write.dropped)}"
        raise Refusal(ErrorCode.INVALID, message)


class Operations:
    """The operation journal and interactions of one store's runs. See the module docstring."""

    def __init__(
        self,
        store: OperationStore,
        records: OperationRecords,
        tasks: TaskEngine,
        runs: Runs,
        usage: Usage,
        *,
        stored_runs: RunReads,
        stored_tasks: TaskReads,
    ) -> None:
        self._store = store
        self._stored_runs = stored_runs
        self._stored_tasks = stored_tasks
        self._records = records
        self._tasks = tasks
        self._runs = runs
        self._usage = usage

    # ---------------------------------------------------------------------------------------- commit writes

    def apply_start(self, unit: UnitOfWork, write: StartOperation, where: str, lease: LeaseRef | None) -> int:
        unit.records.append(self.start_operation(write, lease, unit.seq, unit.now_ms, where))
        return 0

    def apply_interaction(self, unit: UnitOfWork, write: CreateInteraction, where: str, lease: LeaseRef | None) -> int:
        records = self.create_interaction(write, lease, unit.seq, unit.now_ms, where)
        unit.records += records
        return len(records) // 2  # 1: asked (its task and itself), 0: asked before (itself, as stored)

    def _writer(self, run_id: str, lease: LeaseRef | None, where: str) -> tuple[RunRecord, TaskRecord]:
        """The live run and the task whose lease writes its journal (its run task, or a tool task it owns)."""
        if lease is None:
            message = f"{where}: the operation journal is written only under the lease of the run's task or its tools"
            raise Refusal(ErrorCode.NOT_ALLOWED, message)
        check_id(run_id, f"{where}.run_id")
        run = self._runs.live.get(run_id)
        if run is None:
            if self._stored_runs.run(run_id) is None:
                raise Refusal(ErrorCode.NOT_FOUND, f"{where}: run {run_id} does not exist")
            raise Refusal(ErrorCode.CONFLICT, f"{where}: run {run_id} has ended; its journal takes no new writes")
        task = self._tasks.live(lease.task_id)
        if task is None or self._runs.run_of_task(task) != run_id:
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
            if write.retry is not None or write.policy not in ("manual", "safe", "idempotent", "report"):
                message = f"{where}: a tool call names a policy (manual, safe, idempotent or report) and no retry"
                raise Refusal(ErrorCode.INVALID, message)
        elif (
            write.policy is not None
            or write.tool_call_id is not None
            or write.parent_operation_id is not None
            or write.task_id is not None
        ):
            message = (
                f"{where}: a model request names a retry, no policy, tool_call_id, parent_operation_id nor task_id"
            )
            raise Refusal(ErrorCode.INVALID, message)
        if write.task_id is not None:
            task = self._created_tool_task(write, task, seq, where)
        if write.parent_operation_id is not None:
            check_id(write.parent_operation_id, f"{where}.parent_operation_id")
            parent = self._records.get(write.parent_operation_id)
            if parent is None or parent.run_id != run.run_id or parent.kind != "tool":
                message = (
                    f"{where}.parent_operation_id: {write.parent_operation_id} is not a tool call of run {run.run_id}"
                )
                raise Refusal(ErrorCode.INVALID, message)
        retry = write.retry if write.kind == "tool" else (write.retry or Retry())
        if retry is not None and (retry.attempts < 1 or retry.first_delay_ms < 0 or retry.max_delay_ms < 0):
            raise Refusal(ErrorCode.INVALID, f"{where}.retry: attempts 1 or more, delays 0 or more")
        # A tool call's first intent is written at once (a second one is refused by the store, and read below): no
        # read of the journal before it. A model request's is checked against the budgets first, only when new.
        first_tool_intent = write.kind == "tool" and write.attempt == 1
        existing = None if first_tool_intent else self._records.get(write.operation_id)
        what = f"{where}: operation {write.operation_id}"
        if existing is None:
            if write.attempt != 1:
                raise Refusal(ErrorCode.CONFLICT, f"{what} has no attempt yet: the first is attempt 1")
            if write.kind == "model":  # only once a new attempt is about to be written
                self._usage.check_budget(run, task, write.name, lease)
            record = OperationRecord(
                operation_id=write.operation_id,
                run_id=run.run_id,
                conversation_id=run.conversation_id,
                task_id=task.task_id,
                kind=write.kind,
                name=write.name,
                version=write.version,
                tool_call_id=write.tool_call_id,
                parent_operation_id=write.parent_operation_id,
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
            try:
                self._records.insert(record)
                return record
            except StoreConflict:
                existing = self._records.get(write.operation_id)
                assert existing is not None and first_tool_intent, "only a tool call's first intent skips the read"
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
            self._usage.check_budget(run, task, write.name, lease)
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
        self._records.put(existing, record, "attempt")
        return record

    def _created_tool_task(self, write: StartOperation, writer: TaskRecord, seq: int, where: str) -> TaskRecord:
        """Rule 1b: the tool task a run's task names for a call's intent in the commit of its model's result. It must
        have been created earlier in this very commit (never leased), owned by the committing task, and run this
        tool: the intent is its attempt 1, and the operation is its own, as if its lease had committed it."""
        assert write.task_id is not None
        check_id(write.task_id, f"{where}.task_id")
        named = self._tasks.live(write.task_id)
        if (
            named is None
            or named.seq != seq
            or named.epoch != 0
            or named.owner_task_id != writer.task_id
            or named.kind != TOOL_KIND_PREFIX + write.name
        ):
            message = (
                f"{where}.task_id: {write.task_id} is not a task of kind {TOOL_KIND_PREFIX}{write.name} created "
                f"earlier in this commit by task {writer.task_id}; nothing was written"
            )
            raise Refusal(ErrorCode.INVALID, message)
        if write.attempt != 1 or write.policy not in RERUN_POLICIES:
            message = (
                f"{where}: an intent committed with its tool task is the attempt 1 of a safe or idempotent call (a "
                "manual or report call commits its own, right before it runs); nothing was written"
            )
            raise Refusal(ErrorCode.INVALID, message)
        return named

    def finish_operation(
        self, write: FinishOperation, lease: LeaseRef | None, seq: int, now_ms: int, where: str
    ) -> tuple[OperationRecord, RunRecord | None]:
        """Commit an operation's result, once, under the lease that started it; its usage is added to the run's,
        the conversation's and the model's, exactly once (a second result is a ``conflict``). An operation's own
        ``usage`` sums its attempts', so a run's usage is the sum of its operations'."""
        check_id(write.operation_id, f"{where}.operation_id")
        op = self._records.get(write.operation_id)
        if op is None:
            raise Refusal(ErrorCode.NOT_FOUND, f"{where}: operation {write.operation_id} does not exist")
        run, _ = self._writer(op.run_id, lease, where)
        reported = op.status == "interrupted" and op.policy == "report" and write.status == "failed"
        if op.status != "started" and not reported:
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
        _check_channels(write, op, where)
        usage = None if write.usage is None else self._usage.priced(op.kind, op.name, write.usage)
        record = attrs.evolve(
            op,
            status=write.status,
            result=write.result,
            is_error=write.is_error,
            error=write.error,
            code=write.code,
            structured=write.structured,
            dropped=write.dropped,
            usage=op.usage if usage is None else add_usage(op.usage or RunUsage(), usage),
            seq=seq,
            updated_at_ms=now_ms,
        )
        self._records.put(op, record, "report" if reported else "finish")
        if usage is None:
            return record, None
        task = self._tasks.record(op.task_id)
        assert task is not None
        self._usage.add(run, task, op.kind, op.name, usage)
        new = attrs.evolve(run, usage=add_usage(run.usage, usage), seq=seq, updated_at_ms=now_ms)
        self._runs.put(run, new, "account")
        return record, new

    # --------------------------------------------------------------------------------------------- interactions

    def create_interaction(
        self, write: CreateInteraction, lease: LeaseRef | None, seq: int, now_ms: int, where: str
    ) -> list[Record]:
        """Ask a person under a tool task's lease; the records: the interaction's task, then the interaction. An
        approval: its ``tether.approval`` task (owned by the tool task, id :func:`approval_task_id`), which the same
        commit's wait names; again for the same operation, the first is kept and returned alone (result 0), so a
        replay never asks twice; other arguments than the first's are a ``conflict`` (the approved arguments are the
        only ones ever executed). A question: its ``tether.question`` task (id :func:`question_task_id`), which the
        handler waits for; again with the same interaction id, the first is kept (another text or schema there is a
        ``conflict``)."""
        run, task = self._writer(write.run_id, lease, where)
        check_id(write.interaction_id, f"{where}.interaction_id")
        check_id(write.operation_id, f"{where}.operation_id")
        if not task.kind.startswith(TOOL_KIND_PREFIX):
            raise Refusal(ErrorCode.NOT_ALLOWED, f"{where}: an interaction is asked under a tool task's lease")
        if write.kind == "approval":
            existing = self._store.operation_interaction(write.operation_id)
            task_id, kind, what = approval_task_id(write.operation_id), APPROVAL_KIND, "about other arguments"
        elif write.kind == "question":
            check_question(write.args, f"{where}.args")
            existing = self._store.interaction(write.interaction_id)
            task_id, kind, what = question_task_id(write.interaction_id), QUESTION_KIND, "another question"
        else:
            raise Refusal(ErrorCode.INVALID, f"{where}.kind must be approval or question, not {write.kind!r}")
        if existing is not None:
            if (
                existing.digest != write.digest
                or existing.run_id != run.run_id
                or existing.operation_id != write.operation_id
                or existing.kind != write.kind
            ):
                message = (
                    f"{where}: operation {write.operation_id} already asked interaction {existing.interaction_id} "
                    f"{what} there; nothing was written"
                )
                raise Refusal(ErrorCode.CONFLICT, message)
            return [existing]
        external = CreateTask(
            task_id=task_id,
            kind=kind,
            input=JsonValue({"operation_id": write.operation_id, "interaction_id": write.interaction_id}),
            owner_task_id=task.task_id,
        )
        asking = self._tasks.create_task(external, seq, now_ms, where)
        record = InteractionRecord(
            interaction_id=write.interaction_id,
            run_id=run.run_id,
            conversation_id=run.conversation_id,
            operation_id=write.operation_id,
            tool=task.kind.removeprefix(TOOL_KIND_PREFIX),
            task_id=asking.task_id,
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
        return [asking, record]

    def respond(self, request: Respond, seq: int, now_ms: int) -> tuple[InteractionRecord, list[Record]]:
        """Answer an interaction once: its task completes (an approval's with ``{approve, note}``, a question's with
        ``{answer}``) and the tool call waiting on it resumes. The same answer again changes nothing (no records);
        another answer is a ``conflict``; an answer of the wrong shape (an approval without ``approve``, a question
        without an ``answer`` its schema accepts) is ``invalid``."""
        interaction = self._store.interaction(request.interaction_id)
        if interaction is None:
            raise Refusal(ErrorCode.NOT_FOUND, f"interaction {request.interaction_id} does not exist")
        check_response(interaction, request)
        if interaction.answer is not None:
            given = interaction.answer
            if (
                given.approve == request.approve
                and given.note == request.note
                and same_json(given.value, request.answer)
            ):
                return interaction, []
            said = (
                f"answer={short_json(given.value)}"
                if interaction.kind == "question"
                else f"approve={given.approve}, note={given.note!r}"
            )
            message = (
                f"interaction {interaction.interaction_id} was already answered ({said}); an answer is accepted once"
            )
            raise Refusal(ErrorCode.CONFLICT, message)
        task = self._tasks.live(interaction.task_id)
        if task is None or task.status != "pending" or task.abort is not None:
            message = f"interaction {interaction.interaction_id} is no longer awaited (its run was cancelled or ended)"
            raise Refusal(ErrorCode.CONFLICT, message)
        answer = InteractionAnswer(
            approve=request.approve,
            note=request.note,
            responded_by=request.responded_by,
            at_ms=now_ms,
            value=request.answer,
        )
        answered = attrs.evolve(interaction, status="answered", answer=answer, seq=seq, updated_at_ms=now_ms)
        self._records.put_interaction(interaction, answered, "answer")
        if interaction.kind == "question":
            result = JsonValue({"answer": request.answer})
        else:
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
        owned = [task for task in self._tasks.live_descendants(tool.task_id) if task.task_id != attention_id]
        questions = [task for task in owned if task.kind == QUESTION_KIND]
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
        self._records.put(op, resolved, "resolve")
        done = TaskOutcome(status="completed", result=JsonValue({"operation_id": op.operation_id}))
        attention_ended = self._tasks.end_by_owner(attention_id, done, seq, now_ms)
        records: list[Record] = [resolved, attention_ended]
        unread = TaskOutcome(status="aborted", error="its tool call was resolved by a person")
        for asked in questions:  # asked before the call was cut off: nobody will read the answer now
            if asked.owner_task_id == tool.task_id and asked.abort is None:
                ended = self._tasks.end_by_owner(asked.task_id, unread, seq, now_ms)
                records += [ended, *self.close_interactions([ended], seq, now_ms)]
        # Its nested calls were abandoned when it was cut off (still ending, bottom-up); any left unmarked (a call cut
        # off before this owner's rule) are abandoned now. The call completes once they are terminal.
        records += self._tasks.abandon_owned(tool.task_id, seq, now_ms)
        if not any(self._tasks.live(other) is not None for other in tool.on):
            outcome = TaskOutcome(status="completed", result=request.output)
            records.append(self._tasks.end_by_owner(tool.task_id, outcome, seq, now_ms))
        return resolved, records

    def close_interactions(self, changed: Iterable[Record], seq: int, now_ms: int) -> list[Record]:
        """An approval task ended without an answer (its run was cancelled, or its tool call or run ended otherwise):
        its interaction, still ``open``, becomes ``cancelled`` in the settling commit, so ``interactions(status=
        "open")`` lists only what a person can still answer. That is the commit that ended the approval task: an
        abort mark ends one in the settling commit of its batch (the engine's rule 10), and the only request that
        ends one in its own commit, ``respond``, answers the interaction in that commit (skipped here)."""
        closed: list[Record] = []
        for task in changed:
            if not isinstance(task, TaskRecord) or task.kind not in INTERACTION_KINDS or task.status != "terminal":
                continue
            input_value, _ = self._stored_tasks.task_data(task.task_id)
            if not isinstance(input_value, dict) or not isinstance(input_value.get("interaction_id"), str):
                continue
            interaction = self._store.interaction(input_value["interaction_id"])
            if interaction is None or interaction.status != "open":
                continue
            cancelled = attrs.evolve(interaction, status="cancelled", seq=seq, updated_at_ms=now_ms)
            self._records.put_interaction(interaction, cancelled, "close")
            closed.append(cancelled)
        return closed

    # -------------------------------------------------------------------------------------------- requests

    def settle_open(self, task_id: str, outcome: TaskOutcome, seq: int, now_ms: int) -> list[Record]:
        """Rule 2b (:meth:`OperationRecords.settle_open`), for the commit that ended ``task_id``."""
        return self._records.settle_open(task_id, outcome, seq, now_ms)

    def settle_ended(self, ended: Iterable[TaskRecord], seq: int, now_ms: int) -> list[Record]:
        """Rule 2b for the tasks a settle ended otherwise than ``completed`` (the engine's abort, not a commit of their
        own): a run's task or tool task's operations left open become ``failed``, such as the intent of a tool task
        aborted before its lease, which the model result's commit wrote (rule 1b)."""
        records: list[Record] = []
        for task in ended:
            outcome = task.outcome
            if outcome is None or outcome.status == "completed" or not task.kind.startswith(_JOURNAL_WRITERS):
                continue
            records += self._records.settle_open(task.task_id, outcome, seq, now_ms)
        return records

    def on_resolve(self, unit: UnitOfWork, request: Resolve) -> Frame:
        operation, records = self.resolve(request, unit.seq, unit.now_ms)
        unit.records += records
        self._runs.tasks_changed(records)
        return OperationReply(operation=operation)

    def on_respond(self, unit: UnitOfWork, request: Respond) -> Frame:
        interaction, records = self.respond(request, unit.seq, unit.now_ms)
        unit.records += records
        self._runs.tasks_changed(records)
        return InteractionReply(interaction=interaction)

    def on_read_operations(self, peer: PeerId, call_id: int, request: ReadOperations, now_ms: int) -> Frame:
        if not 1 <= request.limit <= MAX_READ_LIMIT or not 0 <= request.cursor <= MAX_CURSOR:
            message = f"limit must be between 1 and {MAX_READ_LIMIT} and cursor 0 or more"
            raise Refusal(ErrorCode.INVALID, message)
        self._runs.require(request.run_id)
        operations, more = self._store.operation_page(request.run_id, request.cursor, request.limit)
        operations, more = fit_page(operations, more, lambda one: OperationsReply(operations=(one,)))
        next_cursor = request.cursor + len(operations) if more else None
        return OperationsReply(operations=tuple(operations), next_cursor=next_cursor)

    def on_read_operation(self, peer: PeerId, call_id: int, request: ReadOperation, now_ms: int) -> Frame:
        operation = self._store.operation(request.operation_id)
        if operation is None:
            raise Refusal(ErrorCode.NOT_FOUND, f"operation {request.operation_id} does not exist")
        return OperationReply(operation=operation)

    def on_read_interactions(self, peer: PeerId, call_id: int, request: ReadInteractions, now_ms: int) -> Frame:
        check_limit(request.limit)
        found, more = self._store.interaction_page(
            request.status, request.run_id, request.after_interaction_id, request.limit
        )
        found, more = fit_page(found, more, lambda one: InteractionsReply(interactions=(one,)))
        next_after = found[-1].interaction_id if more else None
        return InteractionsReply(interactions=tuple(found), next_after_interaction_id=next_after)
