"""The task engine, sans-IO: the tasks room. :class:`TaskEngine` holds the live tasks of one store and the workers
that run them, and handles the requests about tasks. Its helpers open alone, in this order:
:mod:`._task_records` (the task state machine and its rules, the live records and the indexes derived from them),
:mod:`._task_placement` (workers, leases, the ready and blocked queues, blocked reasons) and :mod:`._task_settle`
(settling).

Two kinds of change reach the engine:

- **Requests** (inside a request's unit of work, :mod:`._unit`): ``create_task``, ``abort_task``, ``set_state`` (a
  commit's writes), ``release`` (``closing``: given back by a worker that stops, which counts no restart), and the
  owner's own ``end_by_owner`` (``respond``, ``resolve``) apply the request's
  own change, nothing else, and mark the tasks they touched *dirty*.
- **Settling** (once per batch, after its requests): :meth:`TaskEngine.settle` reconciles every dirty task until
  nothing changes (:mod:`._task_settle`). Everything settling changed is one commit, logged after the requests'.

``docs/tasks.md`` states the behaviour for users and prints the table.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final

import attrs

from protocol import (
    AbortTask,
    CancelLease,
    Capability,
    ConfirmLease,
    CreateTask,
    ErrorCode,
    Frame,
    LeaseRef,
    Ok,
    OutcomesReply,
    ReadOutcomes,
    ReadTask,
    ReadTaskGraph,
    Release,
    SetTaskState,
    TaskGraphReply,
    TaskNode,
    TaskOutcome,
    TaskRecord,
    TaskReply,
    WaitTask,
    phase_of,
)

from ._checks import MAX_READ_LIMIT, Refusal, check_id, check_limit, check_name, no_conversation
from ._output import READ_BUDGET_BYTES, Outbox, fit_page, fitting
from ._peers import Peers, Waits
from ._ports import NO_CHANGE, ConversationReads, StoreConflict, TaskStore
from ._task_data import TaskData
from ._task_placement import PeerId, Placement
from ._task_records import ABORT, EXTERNAL_PREFIX, RESTART, TaskEvent, TaskRecords, describe_state
from ._task_settle import MODEL_GRACE_MS, ORPHAN_GRACE_MS, CutOffHook, SettleResult, Settling
from ._unit import Head, Journal, UnitOfWork

MAX_WAIT_ON: Final = 10_000
MAX_UNTIL_MS: Final = (1 << 62) - 1
PHASE_OUTCOMES: Final = frozenset({"completed", "failed", "faulted"})
ABORT_OUTCOMES: Final = frozenset({"aborted", "faulted"})


class TaskEngine:
    """The live tasks of one store and the workers that run them. See the module docstring."""

    def __init__(
        self,
        store: TaskStore,
        outbox: Outbox,
        journal: Journal,
        waits: Waits,
        head: Head,
        peers: Peers,
        *,
        stored_conversations: ConversationReads,
        orphan_grace_ms: int = ORPHAN_GRACE_MS,
        model_grace_ms: int = MODEL_GRACE_MS,
        cut_off_hooks: Mapping[str, CutOffHook] = MappingProxyType({}),
        requires: Callable[[TaskRecord], str | None] | None = None,
        ends_owned: tuple[str, ...] = (),
    ) -> None:
        self._store = store
        self._stored_conversations = stored_conversations
        self._journal = journal
        self._outbox = outbox
        self._emit = outbox.push
        self._waits = waits
        self._head = head
        self._peers = peers
        self._ends_owned = ends_owned
        """Rule 12: kind prefixes of the families whose tasks abort what they own directly when their phase ends."""
        self._records = TaskRecords(store, journal)
        self._tasks = self._records.tasks
        self._placement = Placement(self._records)
        if requires is not None:
            self._placement.requires = requires
        self._settling = Settling(
            store,
            self._records,
            self._placement,
            self._emit,
            self.create_task,
            orphan_grace_ms=orphan_grace_ms,
            model_grace_ms=model_grace_ms,
            cut_off_hooks=cut_off_hooks,
        )
        self._load(store)

    def _load(self, store: TaskStore) -> None:
        """Index every live task. The stored state was settled by the batch that wrote it, so a plain pending task
        needs only a worker (its record is read when first needed), a sleeping one only its deadline; the rest are
        reconciled by the first settle, which also counts the restart of every task that was running. Written for
        speed: an owner restarting with many live tasks leases nothing until this is done."""
        unread = self._tasks.unread
        children = self._records.children
        conversation_tasks = self._records.conversation_tasks
        ready = self._placement.ready
        # The order of TASK_ROW_FIELDS.
        for task_id, kind, conversation_id, owner, status, abort, abandon_on_restart in store.live_task_rows():
            if owner is not None:
                children.setdefault(owner, set()).add(task_id)
            else:
                conversation_tasks.setdefault(conversation_id, set()).add(task_id)
            if abandon_on_restart:
                self._settling.abandoned.append(task_id)
            if status == "pending" and abort is None:
                unread.add(task_id)
                if not kind.startswith(EXTERNAL_PREFIX):
                    ready.setdefault(kind, {})[task_id] = None
        waiters = self._records.waiters
        sleepers = self._records.sleepers
        dirty = self._records.dirty
        for record in store.live_tasks(unsettled_only=True):
            task_id = record.task_id
            self._tasks[task_id] = record
            status = record.status
            if status == "running":
                self._settling.was_running.append(task_id)
            elif status == "waiting":
                for other in record.on:
                    waiters.setdefault(other, set()).add(task_id)
                if record.policy == "fail_fast":
                    self._settling.fail_fast_checks[task_id] = None  # marks a cut-short settle had not written yet
            elif status == "sleeping" and record.until_ms is not None:
                sleepers.append((record.until_ms, task_id))
                if record.abort is None:
                    continue
            dirty[task_id] = None
        heapq.heapify(sleepers)
        self._placement.place = bool(ready)
        # Popped from the end: owners are cut off first (a caller abandoning its nested calls marks them first).
        self._settling.was_running = self._settling.owners_first(self._settling.was_running)[::-1]

    # ------------------------------------------------------------------------------------------ inspection

    def write_saved(self) -> None:
        """Store the task records this batch saved (each once); see :meth:`TaskRecords.write_saved`."""
        self._records.write_saved()

    @property
    def data(self) -> TaskData:
        """The stored input and checkpoint of tasks (those written lately kept in memory, :mod:`._task_data`)."""
        return self._records.data

    def live(self, task_id: str) -> TaskRecord | None:
        return self._tasks.get(task_id)

    def record(self, task_id: str) -> TaskRecord | None:
        """A task's record, live or terminal."""
        return self._records.record(task_id)

    def live_roots(self, conversation_id: str) -> list[TaskRecord]:
        """The live tasks the conversation owns directly (no owner task), in creation order: a scan of every live
        task, for requests a person makes (``abort_conversation``), never on a hot path."""
        live = self._tasks
        found = (live[task_id] for task_id in list(live.ids()))
        return [r for r in found if r.conversation_id == conversation_id and r.owner_task_id is None]

    @property
    def live_count(self) -> int:
        return len(self._tasks)

    def graph(self, after_task_id: str | None = None, limit: int | None = None) -> tuple[list[TaskNode], bool]:
        """Live tasks in id order after ``after_task_id``, at most ``limit``, and whether more follow."""
        ids = self._tasks.ids()
        if after_task_id is not None:
            ids = (task_id for task_id in ids if task_id > after_task_id)
        # The page's ids without sorting (or reading) every live task: a graph is read page by page.
        page = sorted(ids) if limit is None else heapq.nsmallest(limit + 1, ids)
        more = limit is not None and len(page) > limit
        nodes = []
        for task_id in page[:limit]:
            record = self._tasks[task_id]
            # Derived here, from the workers attached now, for every task that waits only for a worker.
            runnable = self._placement.runnable(record) and not record.kind.startswith(EXTERNAL_PREFIX)  # rule 10
            blocked = self._placement.blocked_reason(record) if runnable else None
            nodes.append(
                TaskNode(
                    task=record,
                    blocked=None if blocked is None else blocked.reason,
                    blocked_detail=None if blocked is None else blocked.detail,
                    leased_to=self._placement.leased_to(task_id),
                    conversation_owner_task_id=(
                        self._records.conversation_owner.get(record.conversation_id)
                        if record.owner_task_id is None
                        else None
                    ),
                )
            )
        return nodes, more

    def end_by_owner(self, task_id: str, outcome: TaskOutcome, seq: int, now_ms: int) -> TaskRecord:
        """Rule 10, inside a request: end a live ``pending`` external task, or a ``waiting`` task, with ``outcome``
        (the caller checked which it may end); a waiting task that still owns live work (abandoned nested calls,
        being aborted) holds it (``completing``) until that work is terminal. Settling then resumes its waiters."""
        record = self._tasks[task_id]
        holds = self._records.owns_live_work(task_id)
        assert record.status == "waiting" or (record.status == "pending" and not holds), record
        common: dict[str, Any] = {"on": (), "policy": None, "until_ms": None, "seq": seq, "updated_at_ms": now_ms}
        if holds:
            changed = attrs.evolve(record, status="completing", held=outcome, **common)
            self._records.save(record, changed, "hold")
        else:
            changed = attrs.evolve(record, status="terminal", outcome=outcome, **common)
            self._records.save(record, changed, "end")
        return changed

    def abandon_owned(self, task_id: str, seq: int, now_ms: int) -> list[TaskRecord]:
        """Rule 11, inside a request (``resolve``): the live ordinary work ``task_id`` owns that is not marked yet is
        marked for abort with the reason ``restart`` (abandoned); what it owns is reached by the cascade."""
        marked: list[TaskRecord] = []
        for owned_id in list(self._records.owned_ordinary(task_id)):
            owned = self._tasks[owned_id]
            if owned.abort is None:
                changed = attrs.evolve(owned, abort=RESTART, seq=seq, updated_at_ms=now_ms)
                self._records.save(owned, changed, "mark")
                marked.append(changed)
        return marked

    def requirement_changed(self, task_id: str) -> None:
        """What a live task needs of its worker changed (its conversation's model): if it was blocked, placement
        looks again."""
        self._settling.forget_model_grace(task_id)
        record = self._records.get(task_id)
        if record is not None and self._placement.is_blocked(record):
            self._placement.make_ready(record)

    def blocked_reason_of(self, record: TaskRecord) -> str | None:
        """Why no attached worker can run a runnable task now (``None``: one can, or it is not runnable)."""
        if not self._placement.runnable(record):
            return None
        blocked = self._placement.blocked_reason(record)
        return None if blocked is None else blocked.reason

    def live_descendants(self, task_id: str) -> list[TaskRecord]:
        """The live tasks ``task_id`` owns, directly or through tasks it owns (not through conversations)."""
        found: list[TaskRecord] = []
        stack = list(self._records.children.get(task_id, ()))
        while stack:
            record = self._tasks.get(stack.pop())
            if record is not None:
                found.append(record)
                stack.extend(self._records.children.get(record.task_id, ()))
        return found

    # --------------------------------------------------------------------------------------------- requests

    def check_lease(self, peer: PeerId, lease: LeaseRef) -> None:
        """Refuse a commit whose lease is not the current grant to ``peer``, or whose phase is being cancelled."""
        if self._placement.current_lease(peer, lease).cancelling:
            raise Refusal(
                ErrorCode.STALE_LEASE,
                f"task {lease.task_id} is marked for abort: its phase is being cancelled and may not commit; "
                "nothing of this commit was written",
            )

    def create_task(self, write: CreateTask, seq: int, now_ms: int, where: str) -> TaskRecord:
        check_id(write.task_id, f"{where}.task_id")
        check_name(write.kind, f"{where}.kind")
        if write.version < 0:
            raise Refusal(ErrorCode.INVALID, f"{where}.version must be 0 (any) or more, not {write.version}")
        owner_task_id = write.owner_task_id
        if owner_task_id is not None:
            check_id(owner_task_id, f"{where}.owner_task_id")
            owner = self._require_owner(owner_task_id, where)
            conversation_id = owner.conversation_id
            if write.conversation_id is not None and write.conversation_id != conversation_id:
                raise Refusal(
                    ErrorCode.INVALID,
                    f"{where}: a task owned by task {owner_task_id} belongs to its conversation {conversation_id}, "
                    f"not {write.conversation_id}",
                )
        elif write.conversation_id is not None:
            conversation_id = write.conversation_id
            check_id(conversation_id, f"{where}.conversation_id")
            if self._stored_conversations.conversation(conversation_id) is None:
                raise Refusal(ErrorCode.NOT_FOUND, no_conversation(conversation_id))
            conversation_owner = self._records.conversation_owner.get(conversation_id)
            if conversation_owner is not None and conversation_owner in self._tasks:
                # A live owner must still be able to own new work; once it ended, the conversation is free and a
                # task created in it is a top-level task.
                self._require_owner(conversation_owner, where)
        else:
            raise Refusal(ErrorCode.INVALID, f"{where}: a task needs an owner: conversation_id or owner_task_id")
        record = TaskRecord(
            task_id=write.task_id,
            kind=write.kind,
            version=write.version,
            conversation_id=conversation_id,
            owner_task_id=owner_task_id,
            background=write.background,
            abandon_on_restart=write.abandon_on_restart,
            status="pending",
            phase=None,
            seq=seq,
            created_at_ms=now_ms,
            updated_at_ms=now_ms,
        )
        try:
            input_bytes = self._store.insert_task(record, write.input, None)
        except StoreConflict as exc:
            raise Refusal(ErrorCode.DUPLICATE, f"{where}: task id {exc.key} already exists") from exc
        self._records.data.created(record.task_id, write.input, input_bytes)
        self._records.put(record)
        return record

    def check_conversation_owner(self, owner_task_id: str, where: str) -> None:
        """A conversation may be created owned by a live task that may still own new work."""
        check_id(owner_task_id, f"{where}.owner_task_id")
        self._require_owner(owner_task_id, where)

    def conversation_created(self, conversation_id: str, owner_task_id: str) -> None:
        self._records.conversation_created(conversation_id, owner_task_id)

    def abort_task(self, write: AbortTask, seq: int, now_ms: int, where: str) -> tuple[TaskRecord, int]:
        """Mark a task for abort; the result is 1 if this marked it, 0 if it was already marked or terminal."""
        check_id(write.task_id, f"{where}.task_id")
        record = self._tasks.get(write.task_id)
        if record is None:
            stored = self._records.record(write.task_id)
            if stored is None:
                raise Refusal(ErrorCode.NOT_FOUND, f"{where}: task {write.task_id} does not exist")
            return stored, 0
        if record.abort == ABORT:
            return record, 0
        marked = attrs.evolve(record, abort=ABORT, seq=seq, updated_at_ms=now_ms)
        self._records.save(record, marked, "mark")
        return marked, 1

    def set_state(self, write: SetTaskState, lease: LeaseRef | None, seq: int, now_ms: int, where: str) -> TaskRecord:
        """End the leased phase with the task's next state. The commit's lease was checked already."""
        if lease is None or write.task_id != lease.task_id:
            raise Refusal(
                ErrorCode.NOT_ALLOWED,
                f"{where}: a task's state is set only by a commit under that task's own lease",
            )
        current = self._placement.leases.get(write.task_id)
        if current is None:  # an earlier write of this commit ended the phase already
            raise Refusal(ErrorCode.INVALID, f"{where}: a commit holds at most one new state of its task")
        record = self._tasks[write.task_id]
        common: dict[str, Any] = {
            "version": current.version,
            "restarts": 0,
            "seq": seq,
            "updated_at_ms": now_ms,
            "on": (),
            "policy": None,
            "until_ms": None,
        }
        if current.mode == "abort" and write.status != "terminal":
            raise Refusal(ErrorCode.INVALID, f"{where}: an abort handler ends only with an aborted or faulted outcome")
        checkpoint: object = write.checkpoint
        event: TaskEvent
        if write.status == "running":
            event = "advance"
            changed = attrs.evolve(record, status="pending", phase=phase_of(write.checkpoint), **common)
        elif write.status == "waiting":
            on = self._check_wait(record, write, where)
            if on:
                common |= {"on": on, "policy": write.policy}
                if write.policy == "fail_fast":
                    checks = self._settling.fail_fast_checks
                    checks[record.task_id] = None
                    self._journal.undo(lambda: checks.pop(record.task_id, None))
            event = "wait" if on else "advance"
            changed = attrs.evolve(
                record, status="waiting" if on else "pending", phase=phase_of(write.checkpoint), **common
            )
        elif write.status == "sleeping":
            if write.until_ms is None or not 0 <= write.until_ms <= MAX_UNTIL_MS:
                raise Refusal(ErrorCode.INVALID, f"{where}.until_ms must be a time in ms on the owner's clock")
            common["until_ms"] = write.until_ms
            event = "sleep"
            changed = attrs.evolve(record, status="sleeping", phase=phase_of(write.checkpoint), **common)
        else:
            outcome = write.outcome
            allowed = ABORT_OUTCOMES if current.mode == "abort" else PHASE_OUTCOMES
            if outcome is None or outcome.status not in allowed:
                got = None if outcome is None else outcome.status
                raise Refusal(
                    ErrorCode.INVALID,
                    f"{where}: a {'phase' if current.mode == 'phase' else 'abort handler'} ends with an outcome of "
                    f"{', '.join(sorted(allowed))}, not {got}",
                )
            if current.mode == "abort" and outcome.status == "aborted" and record.abort == RESTART:
                outcome = attrs.evolve(outcome, reason=RESTART)
            checkpoint = NO_CHANGE
            if self._records.owns_live_work(record.task_id):
                event = "hold"
                changed = attrs.evolve(record, status="completing", held=outcome, **common)
            else:
                event = "end"
                changed = attrs.evolve(record, status="terminal", outcome=outcome, **common)
        self._placement.end_lease(write.task_id)
        self._records.save(record, changed, event, checkpoint=checkpoint)
        return changed

    def _check_wait(self, record: TaskRecord, write: SetTaskState, where: str) -> tuple[str, ...]:
        on = tuple(dict.fromkeys(write.on))
        if len(on) > MAX_WAIT_ON:
            raise Refusal(ErrorCode.INVALID, f"{where}.on names more than {MAX_WAIT_ON} tasks")
        if write.policy not in ("all_settled", "fail_fast"):
            raise Refusal(ErrorCode.INVALID, f"{where}.policy must be all_settled or fail_fast, not {write.policy!r}")
        chain: set[str] | None = None  # walked only if needed: a task the waiter owns cannot be on its chain
        for index, task_id in enumerate(on):
            check_id(task_id, f"{where}.on[{index}]")
            other = self.record(task_id) if task_id != record.task_id else record
            if other is None:
                raise Refusal(ErrorCode.NOT_FOUND, f"{where}.on[{index}]: task {task_id} does not exist")
            if self._records.owner_of(other) != record.task_id:  # directly, or through a conversation it owns
                if chain is None:
                    chain = set(self._records.owner_chain(record.task_id))
                if task_id == record.task_id or task_id in chain:
                    raise Refusal(
                        ErrorCode.INVALID,
                        f"{where}.on[{index}]: a task may not wait on itself or a task that owns it ({task_id})",
                    )
                if write.policy == "fail_fast":
                    raise Refusal(
                        ErrorCode.INVALID,
                        f"{where}.on[{index}]: fail_fast waits only on tasks the waiter owns; {task_id} is not its own",
                    )
        return on

    # ---------------------------------------------------------------------------------------------- workers

    def worker_announced(
        self,
        peer: PeerId,
        name: str,
        capabilities: Iterable[Capability],
        max_leases: int,
        held: Iterable[LeaseRef],
    ) -> None:
        """A worker (re)announced what it runs. Leases it says it still runs that are not its own are cancelled."""
        for lease in held:
            if not self._placement.is_current(peer, lease):
                reason = "this lease ended while the worker was away (the task was given to another worker)"
                self._emit(peer, CancelLease(lease=lease, reason=reason))
        self._placement.announce(peer, name, capabilities, max_leases)

    def peer_left(self, peer: PeerId) -> None:
        """A connection ended: every lease it held is cut off (settled in the next batch)."""
        left = self._placement.remove_worker(peer)
        if left is None:
            return
        worker, leases = left
        for task_id, lease in leases:
            self._settling.cut_off.append((task_id, lease.epoch, not lease.cancelling))
        if self._settling.orphan_grace_ms:
            self._settling.kinds_left.update(worker.capabilities)

    def release(self, peer: PeerId, lease: LeaseRef, migration_error: str | None, *, closing: bool = False) -> None:
        """A worker gave a lease back: its cancelled phase stopped, or it could not migrate the task, or it stopped the
        phase because it is closing (``closing``: no restart is counted, and its family's cut-off hook decides what an
        operation left open becomes, as for a close)."""
        current = self._placement.current_lease(peer, lease)
        if migration_error is not None:
            self._placement.migration_failed[(lease.task_id, current.version)] = migration_error
        self._placement.end_lease(lease.task_id)
        self._settling.released.append((lease.task_id, closing and not current.cancelling))

    # ---------------------------------------------------------------------------------- commit writes, reads

    def apply_create(self, unit: UnitOfWork, write: CreateTask, where: str, lease: LeaseRef | None) -> int:
        unit.records.append(self.create_task(write, unit.seq, unit.now_ms, where))
        return 0

    def apply_set_state(self, unit: UnitOfWork, write: SetTaskState, where: str, lease: LeaseRef | None) -> int:
        record = self.set_state(write, lease, unit.seq, unit.now_ms, where)
        unit.records.append(record)
        if record.status in ("terminal", "completing") and record.kind.startswith(self._ends_owned):
            unit.records += self._abort_left_running(record, unit.seq, unit.now_ms)
        return 0

    def _abort_left_running(self, record: TaskRecord, seq: int, now_ms: int) -> list[TaskRecord]:
        """Rule 12: a task of a family whose owned work may not outlive it decided its outcome while ordinary tasks
        it owns directly are live (a tool call's nested calls and questions it left running, its own or an earlier
        attempt's): those not marked yet are marked for abort in its commit, and it is ``completing`` until they
        are terminal."""
        marked: list[TaskRecord] = []
        for owned_id in sorted(self._records.children.get(record.task_id, ())):
            owned = self._tasks[owned_id]
            if owned.background or owned.abort is not None:
                continue
            changed = attrs.evolve(owned, abort=ABORT, seq=seq, updated_at_ms=now_ms)
            self._records.save(owned, changed, "mark")
            marked.append(changed)
        return marked

    def apply_abort(self, unit: UnitOfWork, write: AbortTask, where: str, lease: LeaseRef | None) -> int:
        record, result = self.abort_task(write, unit.seq, unit.now_ms, where)
        unit.records.append(record)
        return result

    def on_release(self, unit: UnitOfWork, request: Release) -> Frame:
        self._peers.require_worker(unit.peer, "only workers hold leases: a release is a worker's (nothing changed)")
        self.release(unit.peer, request.lease, request.migration_error, closing=request.closing)
        return Ok()

    def on_confirm_lease(self, peer: PeerId, call_id: int, request: ConfirmLease, now_ms: int) -> Frame:
        """``ok`` while ``request.lease`` is the current grant to this connection and not being cancelled;
        ``stale_lease`` otherwise (what a commit under it would meet). Reads only."""
        self._peers.require_worker(peer, "only workers hold leases: a lease is confirmed by its worker")
        self.check_lease(peer, request.lease)
        return Ok()

    def on_read_task(self, peer: PeerId, call_id: int, request: ReadTask, now_ms: int) -> Frame:
        record = self.record(request.task_id)
        if record is None:
            raise Refusal(ErrorCode.NOT_FOUND, _no_task(request.task_id))
        return self._task_reply(record)

    def on_read_outcomes(self, peer: PeerId, call_id: int, request: ReadOutcomes, now_ms: int) -> Frame:
        if len(request.task_ids) > MAX_READ_LIMIT:
            message = f"read at most {MAX_READ_LIMIT} outcomes at once, not {len(request.task_ids)}"
            raise Refusal(ErrorCode.INVALID, message)
        outcomes: list[TaskOutcome | None] = []
        for task_id in request.task_ids:
            record = self.record(task_id)
            if record is None:
                raise Refusal(ErrorCode.NOT_FOUND, _no_task(task_id))
            outcomes.append(record.outcome if record.status == "terminal" else None)
        # The first outcomes that fit the read budget (one at least): the client asks again for the rest.
        count = fitting(outcomes, lambda outcome: OutcomesReply(outcomes=(outcome,)), READ_BUDGET_BYTES)
        return OutcomesReply(outcomes=tuple(outcomes[:count]))

    def on_wait_task(self, peer: PeerId, call_id: int, request: WaitTask, now_ms: int) -> Frame | None:
        record = self.record(request.task_id)
        if record is None:
            raise Refusal(ErrorCode.NOT_FOUND, _no_task(request.task_id))
        if record.status == "terminal":
            return self._task_reply(record)
        self._waits.add("task", request.task_id, peer, call_id)
        return None

    def on_read_task_graph(self, peer: PeerId, call_id: int, request: ReadTaskGraph, now_ms: int) -> Frame:
        check_limit(request.limit)
        nodes, more = self.graph(request.after_task_id, request.limit)
        nodes, more = fit_page(nodes, more, lambda one: TaskGraphReply(seq=0, nodes=(one,)))
        next_after = nodes[-1].task.task_id if more else None
        return TaskGraphReply(seq=self._head.seq, nodes=tuple(nodes), next_after_task_id=next_after)

    def answer_waits(self, ended: Iterable[TaskRecord]) -> None:
        """Once a settling commit is logged: the ``wait_task`` calls of the tasks that ended in its batch."""
        for record in ended:
            waits = self._waits.take("task", record.task_id)
            if waits:
                reply = self._task_reply(record)
                for peer, call_id in waits:
                    self._outbox.reply(peer, call_id, reply)

    def _task_reply(self, record: TaskRecord) -> TaskReply:
        input_value, checkpoint = self._records.data.task_data(record.task_id)
        return TaskReply(task=record, input=input_value, checkpoint=checkpoint)

    # -------------------------------------------------------------------------------------------- settling

    def queue_depths(self) -> tuple[int, int, int, int]:
        """The tasks ready for a worker, blocked (runnable by no attached worker), leased, and the workers attached:
        what the owner's telemetry reads (``storage_owner.io._telemetry``)."""
        placement = self._placement
        ready = sum(len(tasks) for tasks in placement.ready.values())
        blocked = sum(len(tasks) for tasks in placement.blocked.values())
        return ready, blocked, len(placement.leases), len(placement.workers)

    def needs_settle(self, now_ms: int) -> bool:
        """Whether :meth:`settle` has anything to do at ``now_ms`` (the shell then runs a batch)."""
        return self._settling.needs_settle(now_ms)

    def next_deadline_ms(self) -> int | None:
        """The earliest stored sleep deadline, end of an orphan grace or of a model grace, for the shell's timer."""
        return self._settling.next_deadline_ms()

    def settle(self, seq: int, now_ms: int) -> SettleResult:
        """Reconcile everything that changed (:mod:`._task_settle`). Every record it changes carries ``seq``."""
        return self._settling.settle(seq, now_ms)

    # ---------------------------------------------------------------------------------------------- graph

    def _require_owner(self, owner_task_id: str, where: str) -> TaskRecord:
        owner = self._tasks.get(owner_task_id)
        if owner is None:
            if self._store.task(owner_task_id) is None:
                raise Refusal(ErrorCode.NOT_FOUND, f"{where}: owner task {owner_task_id} does not exist")
            message = f"{where}: owner task {owner_task_id} is terminal: it can own no new work"
            raise Refusal(ErrorCode.CONFLICT, message)
        if owner.status == "completing" or owner.abort is not None:
            raise Refusal(
                ErrorCode.CONFLICT,
                f"{where}: owner task {owner_task_id} is {describe_state(owner)}: it can own no new work",
            )
        return owner


def _no_task(task_id: str) -> str:
    return f"task {task_id} does not exist"
