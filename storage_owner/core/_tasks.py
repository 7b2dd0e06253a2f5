"""The task engine's transitions, sans-IO: the task state machine, the request handlers that change a task, and
settling. Its two helpers open alone: :mod:`._task_records` (the live records and the indexes derived from them)
and :mod:`._task_placement` (workers, leases, the ready and blocked queues, blocked reasons).

The task state machine is :data:`TRANSITIONS`, ``(status, event) -> status``, checked on every save of a task's
record (an illegal transition raises :class:`IllegalTransition`: a bug, never bad input). Its rules:

1. ``grant``: a runnable task is leased to a worker and its phase runs. A task marked for abort is runnable
   (its abort handler then runs) from ``pending``, ``waiting`` or ``sleeping`` once its owned ordinary work is
   terminal; an unmarked one only from ``pending``.
2. A phase ends by committing its next state under its lease: ``advance`` (``pending`` at a new checkpoint, also a
   wait on nothing), ``wait``, ``sleep``, ``end`` (terminal) or ``hold`` (``completing``: it decided its outcome
   while it owns live ordinary work).
3. ``stop``: a phase stops without committing (released after a cancel, its worker cut off, the owner restarted);
   the task is ``pending`` again (a restart counted unless it was cancelled). At its restart limit it ends
   (``end`` or ``hold``, ``faulted`` / ``restart_limit``) instead.
4. ``resume``: a waiter whose tasks are all terminal is ``pending``; ``wake``: a sleeper whose deadline passed is.
5. ``end`` from ``completing``: a task holding an outcome becomes terminal once its owned ordinary work is.
6. ``end`` from ``pending``, ``waiting`` or ``sleeping``: a task marked for abort that no attached worker can run
   (past the orphan grace) ends ``orphaned``.
7. ``mark``: an abort mark (a request, a cascade, fail_fast, abandon_on_restart) keeps the status.
8. Nothing leaves ``terminal``; a task is created ``pending``.
9. A cut-off phase (rule 3) of a task whose family has a :data:`CutOffHook` (given to the engine where it is built:
   a run's task and a tool task, see :mod:`._operations`) ends as the hook decides instead: ``backoff``
   (``sleeping`` until a deadline: a model request's durable retry), ``interrupt`` (``waiting`` on a
   ``tether.attention`` task the owner creates: a manual tool call), ``end`` / ``hold`` (``failed``: retries
   exhausted), or rule 3 as usual.
10. Tasks of ``tether.`` kinds (:data:`EXTERNAL_PREFIX`: approvals, attention) are never leased nor shown blocked;
    an abort mark ends them ``aborted`` at once (``end`` from ``pending``); they complete only through owner
    requests (``resolve``, ``respond``: ``end`` from ``pending``), and ``resolve`` ends the tool task that waited on
    one with the output a person gave (``end`` from ``waiting``, once it owns no live work).

Two kinds of change reach the engine:

- **Requests** (inside a request's unit of work, :mod:`._unit`): ``create_task``, ``abort_task``, ``set_state`` apply
  the request's own change, nothing else, and mark the tasks they touched *dirty*.
- **Settling** (once per batch, after its requests): :meth:`TaskEngine.settle` reconciles every dirty task until
  nothing changes: cascades abort marks down the ownership graph, ends ``completing`` tasks whose owned work is
  terminal, resumes waiters and due sleepers, counts restarts of cut-off phases, orphans what nobody can run, and
  grants leases on runnable tasks to workers that can run them. Everything settling changed is one commit (within
  a :class:`ChangeBudget`), logged after the requests'.

``docs/tasks.md`` states the behaviour for users and quotes the table.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final, Literal

import attrs

from protocol import (
    AbortTask,
    CancelLease,
    Capability,
    CreateTask,
    ErrorCode,
    Frame,
    Lease,
    LeaseRef,
    Ok,
    OutcomesReply,
    ReadOutcomes,
    ReadTask,
    ReadTaskGraph,
    Record,
    Release,
    SetTaskState,
    TaskGraphReply,
    TaskNode,
    TaskOutcome,
    TaskRecord,
    TaskReply,
    TaskStatus,
    WaitTask,
    phase_of,
)

from ._checks import MAX_READ_LIMIT, Refusal, check_id, check_limit, check_name, no_conversation
from ._output import READ_BUDGET_BYTES, Outbox, fit_page, fitting
from ._peers import Peers, Waits
from ._ports import (
    NO_CHANGE,
    Store,
    StoreConflict,
)
from ._task_placement import EXTERNAL_PREFIX, HeldLease, Mode, PeerId, Placement
from ._task_records import TaskRecords, decided, describe_state
from ._unit import Head, Journal, UnitOfWork

MAX_WAIT_ON: Final = 10_000
MAX_SETTLE_CHANGES: Final = 1000
"""Task records one settling commit changes at most; what is left is settled by the next batch, at once."""
MAX_UNTIL_MS: Final = (1 << 62) - 1
ORPHAN_GRACE_MS: Final = 2_000
"""How long, on the owner's clock, a task marked for abort that no attached worker can run waits for one before it
ends ``orphaned``: after the owner starts (its workers are still reconnecting), and after the last worker that ran
its kind left (a supervisor restarts a crashed worker within a second or two), so a restart does not skip the
abort handler, the compensation."""
ABORT: Final = "abort"
RESTART: Final = "restart"
PHASE_OUTCOMES: Final = frozenset({"completed", "failed", "faulted"})
ABORT_OUTCOMES: Final = frozenset({"aborted", "faulted"})

TaskEvent = Literal[
    "grant", "advance", "wait", "sleep", "end", "hold", "stop", "resume", "wake", "mark", "backoff", "interrupt"
]

TRANSITIONS: Final[Mapping[tuple[TaskStatus, TaskEvent], TaskStatus]] = {
    ("pending", "grant"): "running",  # 1
    ("waiting", "grant"): "running",  # 1 (an abort handler)
    ("sleeping", "grant"): "running",  # 1 (an abort handler)
    ("running", "advance"): "pending",  # 2
    ("running", "wait"): "waiting",  # 2
    ("running", "sleep"): "sleeping",  # 2
    ("running", "end"): "terminal",  # 2, 3
    ("running", "hold"): "completing",  # 2, 3
    ("running", "stop"): "pending",  # 3
    ("waiting", "resume"): "pending",  # 4
    ("sleeping", "wake"): "pending",  # 4
    ("completing", "end"): "terminal",  # 5
    ("pending", "end"): "terminal",  # 6
    ("waiting", "end"): "terminal",  # 6
    ("sleeping", "end"): "terminal",  # 6
    ("pending", "mark"): "pending",  # 7
    ("running", "mark"): "running",  # 7
    ("waiting", "mark"): "waiting",  # 7
    ("sleeping", "mark"): "sleeping",  # 7
    ("completing", "mark"): "completing",  # 7
    ("running", "backoff"): "sleeping",  # 9
    ("running", "interrupt"): "waiting",  # 9
}
"""The task state machine; see the module docstring for the rules each row follows."""


@attrs.frozen
class CutOffRule:
    """What a cut-off phase becomes (rule 9): ``restart`` (rule 3), ``backoff`` (sleep until ``until_ms``), ``fail``
    (end with ``outcome``) or ``attention`` (wait on the task ``attention`` creates)."""

    action: Literal["restart", "backoff", "fail", "attention"]
    until_ms: int | None = None
    outcome: TaskOutcome | None = None
    attention: CreateTask | None = None


CutOffHook = Callable[[TaskRecord, int, int, list[Record]], CutOffRule | None]
"""Called with a task whose phase was cut off (counting a restart), the settling commit's ``seq`` and ``now_ms``, and
the list where it adds the records of its family it changed (logged in the settling commit); ``None`` keeps rule 3."""


class IllegalTransition(Exception):
    """A save that the transition table forbids: a bug in the engine. Raised, not asserted, so it holds under
    ``python -O``; never caught in the core (the owner fails closed and restarts from the last commit)."""

    def __init__(self, task_id: str, status: str, event: str, to: str) -> None:
        super().__init__(f"task {task_id}: no transition from {status} on {event} to {to}")
        self.task_id = task_id
        self.status = status
        self.event = event
        self.to = to


def check_transition(old: TaskRecord, event: TaskEvent, new: TaskRecord) -> None:
    """Raise :class:`IllegalTransition` unless the table lets ``event`` take ``old`` to ``new`` (a dict lookup)."""
    if TRANSITIONS.get((old.status, event)) != new.status:
        raise IllegalTransition(old.task_id, old.status, event, new.status)


@attrs.define
class ChangeBudget:
    """The settling commit being built: its ``seq`` and time, the task records it changed so far, and whether it
    holds as many as one commit should (the rest waits for the next batch, at once: no commit grows past about a
    megabyte, and no batch holds up the commit loop for long)."""

    seq: int = 0
    now_ms: int = 0
    limit: int = MAX_SETTLE_CHANGES
    changed: dict[str, TaskRecord] = attrs.Factory(dict)

    def full(self) -> bool:
        return len(self.changed) >= self.limit

    def add(self, record: TaskRecord) -> None:
        self.changed[record.task_id] = record


@attrs.frozen
class SettleResult:
    records: list[TaskRecord]
    ended: list[TaskRecord]
    """Tasks that became terminal in this batch (requests included), for ``wait_task`` replies."""
    cut_off: list[Record]
    """What the families' cut-off hooks changed (rule 9: interrupted operations), logged before the task records."""


class TaskEngine:
    """The live tasks of one store and the workers that run them. See the module docstring."""

    def __init__(
        self,
        store: Store,
        outbox: Outbox,
        journal: Journal,
        waits: Waits,
        head: Head,
        peers: Peers,
        *,
        orphan_grace_ms: int = ORPHAN_GRACE_MS,
        cut_off_hooks: Mapping[str, CutOffHook] = MappingProxyType({}),
    ) -> None:
        self._store = store
        self._journal = journal
        self._outbox = outbox
        self._emit = outbox.push
        self._waits = waits
        self._head = head
        self._peers = peers
        self._cut_off_hooks = dict(cut_off_hooks)
        """Rule 9: each family's hook, by the kind prefix that names the family (``agent:``, ``tool:``)."""
        self._cut_off_records: list[Record] = []
        self._orphan_grace_ms = orphan_grace_ms
        self._started_grace_until_ms: int | None = None
        """The end of the grace after this owner started (set by the first call that tells the time)."""
        self._kind_grace_until_ms: dict[str, int] = {}
        """The end of the grace after a worker that ran the kind left."""
        self._kinds_left: set[str] = set()
        """Task kinds of workers that left since the last settle (their grace starts at its ``now_ms``)."""
        self._orphans_due: dict[str, int] = {}
        """Tasks marked for abort that no attached worker can run, by the end of the grace they wait out."""
        self._records = TaskRecords(store, journal)
        self._tasks = self._records.tasks
        self._placement = Placement(self._records)
        self._budget = ChangeBudget()
        """The settling commit being built (a new one per :meth:`settle`)."""
        self._was_running: list[str] = []
        """Tasks stored ``running`` when this owner started: their phases were cut off."""
        self._abandoned: list[str] = []
        """Live ``abandon_on_restart`` tasks found when this owner started."""
        self._cut_off: list[tuple[str, int, bool]] = []
        """Leases of workers that left: (task id, epoch, whether the cut-off counts as a restart)."""
        self._released: list[str] = []
        self._fail_fast_checks: dict[str, None] = {}
        """Tasks that began a ``fail_fast`` wait: settling checks the outcomes that were already decided."""
        self._load(store)

    def _load(self, store: Store) -> None:
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
                self._abandoned.append(task_id)
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
                self._was_running.append(task_id)
            elif status == "waiting":
                for other in record.on:
                    waiters.setdefault(other, set()).add(task_id)
                if record.policy == "fail_fast":
                    self._fail_fast_checks[task_id] = None  # marks a cut-short settle had not written yet
            elif status == "sleeping" and record.until_ms is not None:
                sleepers.append((record.until_ms, task_id))
                if record.abort is None:
                    continue
            dirty[task_id] = None
        heapq.heapify(sleepers)
        self._placement.place = bool(ready)

    # ------------------------------------------------------------------------------------------ inspection

    def live(self, task_id: str) -> TaskRecord | None:
        return self._tasks.get(task_id)

    def record(self, task_id: str) -> TaskRecord | None:
        """A task's record, live or terminal."""
        return self._records.record(task_id)

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
                )
            )
        return nodes, more

    def end_by_owner(self, task_id: str, outcome: TaskOutcome, seq: int, now_ms: int) -> TaskRecord:
        """Rule 10, inside a request: end a live ``pending`` external task, or a ``waiting`` task that owns no live
        work, with ``outcome`` (the caller checked which it may end). Settling then resumes its waiters."""
        record = self._tasks[task_id]
        assert record.status in ("pending", "waiting") and not self._records.owns_live_work(task_id), record
        changed = attrs.evolve(
            record,
            status="terminal",
            outcome=outcome,
            on=(),
            policy=None,
            until_ms=None,
            seq=seq,
            updated_at_ms=now_ms,
        )
        self._save(record, changed, "end")
        return changed

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

    def _clock_seen(self, now_ms: int) -> None:
        """The first time the engine learns the time, the owner's start grace begins."""
        if self._started_grace_until_ms is None:
            self._started_grace_until_ms = now_ms + self._orphan_grace_ms

    def _orphan_grace_until_ms(self, kind: str) -> int:
        """When a task of ``kind`` marked for abort that no attached worker can run may end ``orphaned``."""
        started = self._started_grace_until_ms
        return max(started if started is not None else 0, self._kind_grace_until_ms.get(kind, 0))

    def needs_settle(self, now_ms: int) -> bool:
        """Whether :meth:`settle` has anything to do at ``now_ms`` (the shell then runs a batch)."""
        self._clock_seen(now_ms)
        records = self._records
        if self._recovering or records.dirty or records.finalize or self._cut_off or self._released:
            return True
        if self._kinds_left or self._fail_fast_checks:
            return True
        if self._placement.place and self._placement.ready and self._placement.has_capacity():
            return True
        deadline = self.next_deadline_ms()
        return deadline is not None and deadline <= now_ms

    def next_deadline_ms(self) -> int | None:
        """The earliest stored sleep deadline or end of an orphan grace, for the shell's timer."""
        sleep_ms = self._records.next_sleep_ms()
        orphan_ms = min(self._orphans_due.values(), default=None)
        if sleep_ms is None or orphan_ms is None:
            return orphan_ms if sleep_ms is None else sleep_ms
        return min(sleep_ms, orphan_ms)

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
            if self._store.conversation(conversation_id) is None:
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
            self._store.insert_task(record, write.input, None)
        except StoreConflict as exc:
            raise Refusal(ErrorCode.DUPLICATE, f"{where}: task id {exc.key} already exists") from exc
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
            stored = self._store.task(write.task_id)
            if stored is None:
                raise Refusal(ErrorCode.NOT_FOUND, f"{where}: task {write.task_id} does not exist")
            return stored, 0
        if record.abort == ABORT:
            return record, 0
        marked = attrs.evolve(record, abort=ABORT, seq=seq, updated_at_ms=now_ms)
        self._save(record, marked, "mark")
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
                    self._fail_fast_checks[record.task_id] = None
                    self._journal.undo(lambda: self._fail_fast_checks.pop(record.task_id, None))
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
        self._save(record, changed, event, checkpoint=checkpoint)
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
            self._cut_off.append((task_id, lease.epoch, not lease.cancelling))
        if self._orphan_grace_ms:
            self._kinds_left.update(worker.capabilities)

    def release(self, peer: PeerId, lease: LeaseRef, migration_error: str | None) -> None:
        """A worker gave a lease back: its cancelled phase stopped, or it could not migrate the task."""
        current = self._placement.current_lease(peer, lease)
        if migration_error is not None:
            self._placement.migration_failed[(lease.task_id, current.version)] = migration_error
        self._placement.end_lease(lease.task_id)
        self._released.append(lease.task_id)

    # ---------------------------------------------------------------------------------- commit writes, reads

    def apply_create(self, unit: UnitOfWork, write: CreateTask, where: str, lease: LeaseRef | None) -> int:
        unit.records.append(self.create_task(write, unit.seq, unit.now_ms, where))
        return 0

    def apply_set_state(self, unit: UnitOfWork, write: SetTaskState, where: str, lease: LeaseRef | None) -> int:
        unit.records.append(self.set_state(write, lease, unit.seq, unit.now_ms, where))
        return 0

    def apply_abort(self, unit: UnitOfWork, write: AbortTask, where: str, lease: LeaseRef | None) -> int:
        record, result = self.abort_task(write, unit.seq, unit.now_ms, where)
        unit.records.append(record)
        return result

    def on_release(self, unit: UnitOfWork, request: Release) -> Frame:
        self._peers.require_worker(unit.peer, "only workers hold leases: a release is a worker's (nothing changed)")
        self.release(unit.peer, request.lease, request.migration_error)
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
        input_value, checkpoint = self._store.task_data(record.task_id)
        return TaskReply(task=record, input=input_value, checkpoint=checkpoint)

    # -------------------------------------------------------------------------------------------- settling

    def settle(self, seq: int, now_ms: int) -> SettleResult:
        """Reconcile everything that changed; see the module docstring. Every record it changes carries ``seq``."""
        self._budget = ChangeBudget(seq=seq, now_ms=now_ms)
        self._clock_seen(now_ms)
        for kind in self._kinds_left:
            self._kind_grace_until_ms[kind] = now_ms + self._orphan_grace_ms
        self._kinds_left.clear()
        self._end_orphan_graces(now_ms)
        if self._recovering:
            self._recover()
        for task_id, epoch, counts in self._cut_off:  # at most the leases of the workers that left
            self._phase_cut_off(task_id, epoch, counts=counts)
        self._cut_off.clear()
        for task_id in self._released:
            record = self._tasks.get(task_id)
            if record is not None and record.status == "running":
                self._change(record, "stop", status="pending")
        self._released.clear()
        self._wake_sleepers(now_ms)
        checks, self._fail_fast_checks = self._fail_fast_checks, {}
        for task_id in checks:
            self._check_fail_fast(task_id)  # one a full commit cuts short is listed again
        self._reconcile_all()
        if self._placement.place and not self._settling_left():
            # Only once everything is settled: a cascade cut short must reach a task before it may start a phase.
            self._placement.grant_leases(self._budget.full, self._grant)
            self._reconcile_all()  # an orphaned abort may have ended something
        ended = list(self._records.ended.values())
        self._records.ended.clear()
        changed = list(self._budget.changed.values())
        self._budget = ChangeBudget()
        cut_off, self._cut_off_records = self._cut_off_records, []
        return SettleResult(records=changed, ended=ended, cut_off=cut_off)

    @property
    def _recovering(self) -> bool:
        """Whether the first settling commits after a start still have cut-off phases or abandoned tasks to write."""
        return bool(self._was_running or self._abandoned)

    def _settling_left(self) -> bool:
        return self._recovering or bool(self._records.dirty or self._records.finalize)

    def _recover(self) -> None:
        """After an owner start: running phases were cut off; abandon_on_restart work is marked for abort. Written
        over as many settling commits as it takes; nothing is leased before it is done."""
        while self._was_running and not self._budget.full():
            task_id = self._was_running.pop()
            self._phase_cut_off(task_id, self._tasks[task_id].epoch, counts=True)
        while self._abandoned and not self._budget.full():
            abandoned = self._tasks.get(self._abandoned.pop())
            if abandoned is not None and abandoned.abort is None:
                self._change(abandoned, "mark", abort=RESTART)

    def _phase_cut_off(self, task_id: str, epoch: int, *, counts: bool) -> None:
        """A phase stopped without committing; it counts a restart unless it had been cancelled for an abort."""
        record = self._tasks.get(task_id)
        if record is None or record.status != "running" or record.epoch != epoch:
            return
        if not counts:
            self._change(record, "stop", status="pending")
            return
        hook = None if record.abort is not None else self._cut_off_hook(record.kind)
        rule = None if hook is None else hook(record, self._budget.seq, self._budget.now_ms, self._cut_off_records)
        if rule is not None and rule.action != "restart":
            self._apply_cut_off_rule(record, rule)
            return
        restarts = record.restarts + 1
        if restarts >= record.restart_limit:
            outcome = TaskOutcome(
                status="faulted",
                reason="restart_limit",
                error=f"cut off {restarts} times (the restart limit is {record.restart_limit})",
            )
            self._finish(record, outcome, restarts=restarts)
        else:
            self._change(record, "stop", status="pending", restarts=restarts)

    def _cut_off_hook(self, kind: str) -> CutOffHook | None:
        """The cut-off hook of the family ``kind`` belongs to, if it has one (rule 9)."""
        for prefix, hook in self._cut_off_hooks.items():
            if kind.startswith(prefix):
                return hook
        return None

    def _apply_cut_off_rule(self, record: TaskRecord, rule: CutOffRule) -> None:
        """Rule 9: a cut-off phase ends as its family's hook decided."""
        if rule.action == "backoff":
            assert rule.until_ms is not None
            self._change(record, "backoff", status="sleeping", until_ms=rule.until_ms, on=(), policy=None)
        elif rule.action == "fail":
            assert rule.outcome is not None
            self._finish(record, rule.outcome)
        else:
            assert rule.attention is not None
            attention = self.create_task(rule.attention, self._budget.seq, self._budget.now_ms, "cut-off")
            self._budget.add(attention)
            on = (attention.task_id,)
            self._change(record, "interrupt", status="waiting", on=on, policy="all_settled", until_ms=None)

    def _end_orphan_graces(self, now_ms: int) -> None:
        """Tasks whose orphan grace is over are reconciled again: orphaned if still nobody can run them."""
        due = [task_id for task_id, until_ms in self._orphans_due.items() if until_ms <= now_ms]
        for task_id in due:
            del self._orphans_due[task_id]
            if task_id in self._tasks:
                self._records.dirty[task_id] = None
        for kind in [kind for kind, until_ms in self._kind_grace_until_ms.items() if until_ms <= now_ms]:
            del self._kind_grace_until_ms[kind]

    def _wake_sleepers(self, now_ms: int) -> None:
        while not self._budget.full():
            record = self._records.pop_due_sleeper(now_ms)
            if record is None:
                return
            self._change(record, "wake", status="pending", until_ms=None)

    def _reconcile_all(self) -> None:
        while (self._records.dirty or self._records.finalize) and not self._budget.full():
            while self._records.finalize:
                task_id = next(iter(self._records.finalize))
                self._after_end(self._records.finalize.pop(task_id))
            if self._records.dirty:
                task_id = next(iter(self._records.dirty))
                del self._records.dirty[task_id]
                record = self._tasks.get(task_id)
                if record is not None:
                    self._reconcile(record)

    def _check_fail_fast(self, task_id: str) -> None:
        waiter = self._tasks.get(task_id)
        if waiter is None or waiter.status != "waiting" or waiter.policy != "fail_fast":
            return
        for other in waiter.on:
            other_record = self._records.record(other)
            outcome = None if other_record is None else decided(other_record)
            if outcome is not None and outcome.status != "completed":
                self._fail_fast(waiter)
                return

    def _reconcile(self, record: TaskRecord) -> None:
        task_id = record.task_id
        status = record.status
        if record.kind.startswith(EXTERNAL_PREFIX):  # rule 10: nobody runs it; an abort ends it at once
            if record.abort is not None:
                self._finish(record, TaskOutcome(status="aborted"))
            return
        if record.abort is not None:
            self._cascade(record, record.abort)
        if status == "completing":
            assert record.held is not None
            if not self._records.owns_live_work(task_id):
                self._finish(record, record.held)
            elif record.held.status != "completed":
                self._cascade(record, ABORT)
                self._signal_fail_fast(record)
            return
        if status == "running":
            lease = self._placement.leases.get(task_id)
            if record.abort is not None and lease is not None and lease.mode == "phase" and not lease.cancelling:
                lease.cancelling = True
                reason = "the task was aborted" if record.abort == ABORT else "the task is abandoned after a restart"
                self._emit(lease.peer, CancelLease(lease=LeaseRef(task_id=task_id, epoch=lease.epoch), reason=reason))
            return
        if status == "waiting" and not any(other in self._tasks for other in record.on):
            record = self._change(record, "resume", status="pending", on=(), policy=None)
            status = "pending"
        if record.abort is not None:
            if self._records.owns_live_work(task_id):
                self._placement.unready(record)
                return
            blocked = self._placement.blocked_reason(record)
            if blocked is None:
                self._placement.make_ready(record)
            elif record.abort != ABORT:
                self._placement.block(record)  # a restart mark waits for a worker, so its abort handler can clean up
            else:
                grace_until_ms = self._orphan_grace_until_ms(record.kind)
                if self._budget.now_ms >= grace_until_ms:
                    self._orphans_due.pop(task_id, None)
                    outcome = TaskOutcome(status="orphaned", reason=blocked.reason, error=blocked.detail)
                    self._finish(record, outcome)
                else:  # a worker that can run it may still (re)attach: the grace's end settles it again
                    self._placement.block(record)
                    self._orphans_due[task_id] = grace_until_ms
            return
        if status == "pending" and not self._placement.is_blocked(record):
            self._placement.make_ready(record)

    def _cascade(self, record: TaskRecord, reason: str) -> None:
        """Mark the ordinary work ``record`` owns for abort with ``reason`` (an explicit abort replaces a restart
        mark; a restart mark reaches only unmarked work)."""
        for owned_id in list(self._records.owned_ordinary(record.task_id)):  # marking changes the sets walked
            owned = self._tasks[owned_id]
            if owned.abort is None or (reason == ABORT and owned.abort == RESTART):
                if self._budget.full():
                    self._records.dirty[record.task_id] = None  # the next settling commit marks the rest
                    return
                self._change(owned, "mark", abort=reason)

    def _grant(self, record: TaskRecord, peer: PeerId, capability: Capability) -> None:
        """Lease ``record`` to ``peer`` (its phase, or its abort handler once marked): a transition, then the
        ``Lease`` event (sent once the settling commit has committed)."""
        task_id = record.task_id
        mode: Mode = "phase" if record.abort is None else "abort"
        epoch = record.epoch + 1
        version = record.version or capability.version
        record = self._change(
            record,
            "grant",
            status="running",
            epoch=epoch,
            version=version,
            restart_limit=capability.restart_limit,
            on=(),
            policy=None,
            until_ms=None,
        )
        self._placement.add_lease(
            task_id, peer, HeldLease(peer=peer, epoch=epoch, mode=mode, version=capability.version)
        )
        input_value, checkpoint = self._store.task_data(task_id)
        self._emit(
            peer,
            Lease(
                lease=LeaseRef(task_id=task_id, epoch=epoch),
                mode=mode,
                kind=record.kind,
                version=version,
                input=input_value,
                checkpoint=checkpoint,
                conversation_id=record.conversation_id,
                owner_task_id=record.owner_task_id,
                restarts=record.restarts,
                abort=record.abort,
                now_ms=self._budget.now_ms,
            ),
        )

    # ------------------------------------------------------------------------------------------ transitions

    def _finish(self, record: TaskRecord, outcome: TaskOutcome, **changes: Any) -> None:
        """End a task with ``outcome``, or hold it (``completing``) while it owns live ordinary work."""
        changes |= {"on": (), "policy": None, "until_ms": None}
        if self._records.owns_live_work(record.task_id):
            self._change(record, "hold", status="completing", held=outcome, **changes)
        else:
            self._change(record, "end", status="terminal", outcome=outcome, held=None, **changes)

    def _change(self, record: TaskRecord, event: TaskEvent, **changes: Any) -> TaskRecord:
        """A change made while settling: saved, logged with the settling commit, and reconciled again."""
        changed = attrs.evolve(record, seq=self._budget.seq, updated_at_ms=self._budget.now_ms, **changes)
        self._save(record, changed, event)
        self._budget.add(changed)
        return changed

    def _save(self, old: TaskRecord, record: TaskRecord, event: TaskEvent, *, checkpoint: object = NO_CHANGE) -> None:
        """Store a task's next record, which ``event`` made of ``old``: refused loudly if the table forbids it."""
        check_transition(old, event, record)
        if checkpoint is NO_CHANGE:
            self._store.update_task(record)
        else:
            self._store.update_task(record, checkpoint=checkpoint)
        self._records.put(record)

    def _after_end(self, record: TaskRecord) -> None:
        """A task became terminal: its owner, waiters and owned conversations are reconsidered."""
        task_id = record.task_id
        self._records.touch_owner(record)
        self._placement.forget(record)
        for waiter in self._records.waiters.get(task_id, ()):
            self._records.dirty[waiter] = None
        self._signal_fail_fast(record)
        self._records.forget_owned_conversations(task_id)

    def _signal_fail_fast(self, record: TaskRecord) -> None:
        """``record`` decided an outcome (it is terminal or ``completing``): one other than ``completed`` makes its
        ``fail_fast`` waiters mark the others they wait on, at once (not when its own work has ended)."""
        outcome = decided(record)
        if outcome is None or outcome.status == "completed":
            return
        for waiter in self._records.waiters.get(record.task_id, ()):
            waiting = self._tasks.get(waiter)
            if waiting is not None and waiting.policy == "fail_fast":
                self._fail_fast(waiting)

    def _fail_fast(self, waiter: TaskRecord) -> None:
        """One of the tasks a ``fail_fast`` waiter waits on did not complete: the others still live are marked for
        abort (those a full settling commit could not take, by the next one)."""
        for other in waiter.on:
            record = self._tasks.get(other)
            if record is not None and record.abort != ABORT and record.status != "completing":
                if self._budget.full():
                    self._fail_fast_checks[waiter.task_id] = None
                    return
                self._change(record, "mark", abort=ABORT)

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
