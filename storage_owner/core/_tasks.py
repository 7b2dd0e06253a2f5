"""The task engine's transitions, sans-IO: the task state machine, the request handlers that change a task, and
settling. Its two helpers open alone: :mod:`._task_records` (the live records, the indexes derived from them, the
undo journal) and :mod:`._task_placement` (workers, leases, the ready and blocked queues, blocked reasons).

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

Two kinds of change reach the engine:

- **Requests** (inside a request's savepoint): ``create_task``, ``abort_task``, ``set_state`` apply the request's
  own change, nothing else, and mark the tasks they touched *dirty*.
- **Settling** (once per batch, after its requests): :meth:`TaskEngine.settle` reconciles every dirty task until
  nothing changes: cascades abort marks down the ownership graph, ends ``completing`` tasks whose owned work is
  terminal, resumes waiters and due sleepers, counts restarts of cut-off phases, orphans what nobody can run, and
  grants leases on runnable tasks to workers that can run them. Everything settling changed is one commit (within
  a :class:`ChangeBudget`), logged after the requests'.

docs/tasks.md states the behaviour (and quotes the table); ``SEMANTICS-NOTES.md`` in the design folder (outside this
repository) lists the rules it follows.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Final, Literal

import attrs

from protocol import (
    AbortTask,
    CancelLease,
    Capability,
    CreateTask,
    ErrorCode,
    Frame,
    JsonValue,
    Lease,
    LeaseRef,
    SetTaskState,
    TaskNode,
    TaskOutcome,
    TaskRecord,
    TaskStatus,
)

from ._checks import Refusal, check_id, check_name, missing_conversation
from ._ports import (
    NO_CHANGE,
    Store,
    StoreConflict,
)

PeerId = int
Mode = Literal["phase", "abort"]

MAX_WAIT_ON: Final = 10_000
READY_LOOKAHEAD: Final = 64
"""How far past tasks whose workers are busy the owner looks for one another (idle) worker could run: a task of a
version only a busy worker has does not hold up the rest of its kind, without the whole queue being scanned."""
READY_CHUNK: Final = 256
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

TaskEvent = Literal["grant", "advance", "wait", "sleep", "end", "hold", "stop", "resume", "wake", "mark"]

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
}
"""The task state machine; see the module docstring for the rules each row follows."""


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


ABORT_OUTCOMES: Final = frozenset({"aborted", "faulted"})


@attrs.define(eq=False)
class _Lease:
    peer: PeerId
    epoch: int
    mode: Mode
    version: int
    """The definition version the worker runs (the task's version once it commits)."""
    cancelling: bool = False


@attrs.define(eq=False)
class _Worker:
    name: str
    capabilities: dict[str, Capability]
    max_leases: int
    leases: set[str] = attrs.Factory(set)


@attrs.frozen
class Blocked:
    reason: str
    detail: str


@attrs.frozen
class SettleResult:
    records: list[TaskRecord]
    ended: list[TaskRecord]
    """Tasks that became terminal in this batch (requests included), for ``wait_task`` replies."""


class _LiveTasks:
    """Live task records by id. The plain pending tasks found at start are only listed (:attr:`unread`) until a
    record is first needed, then read from the store: most of them are not looked at before they are leased. Only
    what the engine needs is here, so nothing can walk the records and miss the unread ones: :meth:`ids` lists
    every live task without reading it."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._records: dict[str, TaskRecord] = {}
        self.unread: set[str] = set()

    def __getitem__(self, task_id: str) -> TaskRecord:
        record = self.get(task_id)
        if record is None:
            raise KeyError(task_id)
        return record

    def get(self, task_id: str) -> TaskRecord | None:
        record = self._records.get(task_id)
        if record is None and task_id in self.unread:
            self.unread.discard(task_id)
            record = self._store.task(task_id)
            assert record is not None, f"live task {task_id} is not stored"
            self._records[task_id] = record
        return record

    def __setitem__(self, task_id: str, record: TaskRecord) -> None:
        self._records[task_id] = record

    def __contains__(self, task_id: str) -> bool:
        return task_id in self._records or task_id in self.unread

    def __len__(self) -> int:
        return len(self._records) + len(self.unread)

    def pop(self, task_id: str) -> None:
        self.unread.discard(task_id)
        self._records.pop(task_id, None)

    def ids(self) -> Iterator[str]:
        """Every live task's id, reading no record."""
        return itertools.chain(self._records, self.unread)

    def abort_mark(self, task_id: str) -> str | None:
        """A live task's abort mark, without reading an unread record (those have none)."""
        return None if task_id in self.unread else self._records[task_id].abort


class TaskEngine:
    """The live tasks of one store and the workers that run them. See the module docstring."""

    def __init__(
        self, store: Store, emit: Callable[[PeerId, Frame], None], *, orphan_grace_ms: int = ORPHAN_GRACE_MS
    ) -> None:
        self._store = store
        self._emit = emit
        self._orphan_grace_ms = orphan_grace_ms
        self._started_grace_until_ms: int | None = None
        """The end of the grace after this owner started (set by the first call that tells the time)."""
        self._kind_grace_until_ms: dict[str, int] = {}
        """The end of the grace after a worker that ran the kind left."""
        self._kinds_left: set[str] = set()
        """Task kinds of workers that left since the last settle (their grace starts at its ``now_ms``)."""
        self._orphans_due: dict[str, int] = {}
        """Tasks marked for abort that no attached worker can run, by the end of the grace they wait out."""
        self._tasks = _LiveTasks(store)
        self._was_running: list[str] = []
        """Tasks stored ``running`` when this owner started: their phases were cut off."""
        self._abandoned: list[str] = []
        """Live ``abandon_on_restart`` tasks found when this owner started."""
        self._children: dict[str, set[str]] = {}
        """Live tasks by their owner task."""
        self._conversation_tasks: dict[str, set[str]] = {}
        """Live tasks owned directly by a conversation."""
        self._conversation_owner: dict[str, str] = {}
        """Conversations owned by a live task."""
        self._owned_conversations: dict[str, set[str]] = {}
        self._waiters: dict[str, set[str]] = {}
        """Waiting tasks by each task they wait on."""
        self._sleepers: list[tuple[int, str]] = []
        """A heap of (until_ms, task id); entries of tasks that no longer sleep until then are skipped."""
        self._dirty: dict[str, None] = {}
        self._ready: dict[str, dict[str, None]] = {}
        """Tasks that may be leased now, by kind, in the order they became runnable."""
        self._blocked: dict[str, dict[str, None]] = {}
        """Runnable tasks that no attached worker can run, by kind (their reason is derived when shown)."""
        self._leases: dict[str, _Lease] = {}
        self._workers: dict[PeerId, _Worker] = {}
        self._migration_failed: dict[tuple[str, int], str] = {}
        self._cut_off: list[tuple[str, int, bool]] = []
        """Leases of workers that left: (task id, epoch, whether the cut-off counts as a restart)."""
        self._released: list[str] = []
        self._ended: dict[str, TaskRecord] = {}
        """Tasks that became terminal in this batch, for ``wait_task`` replies."""
        self._finalize: dict[str, TaskRecord] = {}
        """Tasks that became terminal and whose owner, waiters and conversations settling has not yet revisited."""
        self._fail_fast_checks: dict[str, None] = {}
        """Tasks that began a ``fail_fast`` wait: settling checks the outcomes that were already decided."""
        self._place = True
        self._journal: list[Callable[[], None]] | None = None
        self._changed: dict[str, TaskRecord] = {}
        self._settle_seq = 0
        self._now_ms = 0
        self._load(store)
        for conversation_id, owner in store.task_owned_conversations():
            self._conversation_owner[conversation_id] = owner
            self._owned_conversations.setdefault(owner, set()).add(conversation_id)

    def _load(self, store: Store) -> None:
        """Index every live task. The stored state was settled by the batch that wrote it, so a plain pending task
        needs only a worker (its record is read when first needed), a sleeping one only its deadline; the rest are
        reconciled by the first settle, which also counts the restart of every task that was running. Written for
        speed: an owner restarting with many live tasks leases nothing until this is done."""
        unread = self._tasks.unread
        children = self._children
        conversation_tasks = self._conversation_tasks
        ready = self._ready
        for task_id, kind, conversation_id, owner, status, abort, abandon_on_restart in store.live_task_rows():
            if owner is not None:
                children.setdefault(owner, set()).add(task_id)
            else:
                conversation_tasks.setdefault(conversation_id, set()).add(task_id)
            if abandon_on_restart:
                self._abandoned.append(task_id)
            if status == "pending" and abort is None:
                unread.add(task_id)
                ready.setdefault(kind, {})[task_id] = None
        for record in store.live_tasks(unsettled_only=True):
            task_id = record.task_id
            self._tasks[task_id] = record
            status = record.status
            if status == "running":
                self._was_running.append(task_id)
            elif status == "waiting":
                for other in record.on:
                    self._waiters.setdefault(other, set()).add(task_id)
                if record.policy == "fail_fast":
                    self._fail_fast_checks[task_id] = None  # marks a cut-short settle had not written yet
            elif status == "sleeping" and record.until_ms is not None:
                self._sleepers.append((record.until_ms, task_id))
                if record.abort is None:
                    continue
            self._dirty[task_id] = None
        heapq.heapify(self._sleepers)
        self._place = bool(ready)

    # ------------------------------------------------------------------------------------------ inspection

    def live(self, task_id: str) -> TaskRecord | None:
        return self._tasks.get(task_id)

    def record(self, task_id: str) -> TaskRecord | None:
        """A task's record, live or terminal."""
        return self._tasks.get(task_id) or self._store.task(task_id)

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
            blocked = self._blocked_reason(record) if self._runnable(record) else None
            lease = self._leases.get(task_id)
            worker = None if lease is None else self._workers.get(lease.peer)
            nodes.append(
                TaskNode(
                    task=record,
                    blocked=None if blocked is None else blocked.reason,
                    blocked_detail=None if blocked is None else blocked.detail,
                    leased_to=None if worker is None else worker.name,
                )
            )
        return nodes, more

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
        if self._recovering or self._dirty or self._finalize or self._cut_off or self._released or self._kinds_left:
            return True
        if self._fail_fast_checks:
            return True
        if self._place and self._ready and self._has_capacity():
            return True
        deadline = self.next_deadline_ms()
        return deadline is not None and deadline <= now_ms

    def next_deadline_ms(self) -> int | None:
        """The earliest stored sleep deadline or end of an orphan grace, for the shell's timer."""
        orphan_ms = min(self._orphans_due.values(), default=None)
        sleepers = self._sleepers
        while sleepers:
            until_ms, task_id = sleepers[0]
            record = self._tasks.get(task_id)
            if record is not None and record.status == "sleeping" and record.until_ms == until_ms:
                return until_ms if orphan_ms is None else min(until_ms, orphan_ms)
            heapq.heappop(sleepers)
        return orphan_ms

    # -------------------------------------------------------------------------------------- request journal

    def begin(self) -> None:
        """Start journaling changes to memory, for :meth:`rollback` if the request is refused."""
        self._journal = []

    def commit(self) -> None:
        self._journal = None

    def rollback(self) -> None:
        journal, self._journal = self._journal, None
        assert journal is not None
        for undo in reversed(journal):
            undo()

    def _undo(self, action: Callable[[], None]) -> None:
        if self._journal is not None:
            self._journal.append(action)

    # --------------------------------------------------------------------------------------------- requests

    def check_lease(self, peer: PeerId, lease: LeaseRef) -> None:
        """Refuse a commit whose lease is not the current grant to ``peer``, or whose phase is being cancelled."""
        if self._current_lease(peer, lease).cancelling:
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
                raise missing_conversation(conversation_id)
            conversation_owner = self._conversation_owner.get(conversation_id)
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
        self._put(record)
        return record

    def check_conversation_owner(self, owner_task_id: str, where: str) -> None:
        """A conversation may be created owned by a live task that may still own new work."""
        check_id(owner_task_id, f"{where}.owner_task_id")
        self._require_owner(owner_task_id, where)

    def conversation_created(self, conversation_id: str, owner_task_id: str) -> None:
        self._conversation_owner[conversation_id] = owner_task_id
        self._owned_conversations.setdefault(owner_task_id, set()).add(conversation_id)

        def undo() -> None:
            del self._conversation_owner[conversation_id]
            self._owned_conversations[owner_task_id].discard(conversation_id)

        self._undo(undo)

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
        current = self._leases.get(write.task_id)
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
            changed = attrs.evolve(record, status="pending", phase=_phase_of(write.checkpoint), **common)
        elif write.status == "waiting":
            on = self._check_wait(record, write, where)
            if on:
                common |= {"on": on, "policy": write.policy}
                if write.policy == "fail_fast":
                    self._fail_fast_checks[record.task_id] = None
                    self._undo(lambda: self._fail_fast_checks.pop(record.task_id, None))
            event = "wait" if on else "advance"
            changed = attrs.evolve(
                record, status="waiting" if on else "pending", phase=_phase_of(write.checkpoint), **common
            )
        elif write.status == "sleeping":
            if write.until_ms is None or not 0 <= write.until_ms <= MAX_UNTIL_MS:
                raise Refusal(ErrorCode.INVALID, f"{where}.until_ms must be a time in ms on the owner's clock")
            common["until_ms"] = write.until_ms
            event = "sleep"
            changed = attrs.evolve(record, status="sleeping", phase=_phase_of(write.checkpoint), **common)
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
            if self._owns_live_work(record.task_id):
                event = "hold"
                changed = attrs.evolve(record, status="completing", held=outcome, **common)
            else:
                event = "end"
                changed = attrs.evolve(record, status="terminal", outcome=outcome, **common)
        self._end_lease(write.task_id)
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
            if self._owner_of(other) != record.task_id:  # directly, or through a conversation it owns
                if chain is None:
                    chain = set(self._owner_chain(record.task_id))
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
        worker = self._workers.get(peer)
        tasks = {capability.name: capability for capability in capabilities if capability.kind == "task"}
        if worker is None:
            self._workers[peer] = _Worker(name=name, capabilities=tasks, max_leases=max_leases)
        else:
            worker.capabilities = tasks
            worker.max_leases = max_leases
        for lease in held:
            current = self._leases.get(lease.task_id)
            if current is None or current.peer != peer or current.epoch != lease.epoch:
                reason = "this lease ended while the worker was away (the task was given to another worker)"
                self._emit(peer, CancelLease(lease=lease, reason=reason))
        for key in list(self._migration_failed):
            failed = self._tasks.get(key[0])
            if failed is None or failed.kind in tasks:
                del self._migration_failed[key]  # a worker that announces again may migrate them now
        for kind in tasks:
            queue = self._blocked.pop(kind, None)
            if queue:
                self._ready.setdefault(kind, {}).update(queue)
        self._place = True

    def peer_left(self, peer: PeerId) -> None:
        """A connection ended: every lease it held is cut off (settled in the next batch)."""
        worker = self._workers.pop(peer, None)
        if worker is None:
            return
        for task_id in sorted(worker.leases):
            lease = self._leases.pop(task_id)
            self._cut_off.append((task_id, lease.epoch, not lease.cancelling))
        if self._orphan_grace_ms:
            self._kinds_left.update(worker.capabilities)
        self._place = True

    def release(self, peer: PeerId, lease: LeaseRef, migration_error: str | None) -> None:
        """A worker gave a lease back: its cancelled phase stopped, or it could not migrate the task."""
        current = self._current_lease(peer, lease)
        if migration_error is not None:
            self._migration_failed[(lease.task_id, current.version)] = migration_error
        self._end_lease(lease.task_id)
        self._released.append(lease.task_id)

    def _current_lease(self, peer: PeerId, lease: LeaseRef) -> _Lease:
        """The grant ``lease`` names, if it is current and ``peer``'s; refused as stale otherwise."""
        current = self._leases.get(lease.task_id)
        if current is None or current.epoch != lease.epoch or current.peer != peer:
            record = self.record(lease.task_id)
            now = "" if record is None else f" (the task is {_describe_state(record)}, at epoch {record.epoch})"
            raise Refusal(
                ErrorCode.STALE_LEASE,
                f"the lease on task {lease.task_id} at epoch {lease.epoch} is no longer valid{now}; "
                "nothing was written",
            )
        return current

    # -------------------------------------------------------------------------------------------- settling

    def settle(self, seq: int, now_ms: int) -> SettleResult:
        """Reconcile everything that changed; see the module docstring. Every record it changes carries ``seq``."""
        self._settle_seq = seq
        self._now_ms = now_ms
        self._changed = {}
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
        if self._place and not self._settling_left():
            # Only once everything is settled: a cascade cut short must reach a task before it may start a phase.
            self._grant_leases(now_ms)
            self._reconcile_all()  # an orphaned abort may have ended something
        ended = list(self._ended.values())
        self._ended.clear()
        changed = list(self._changed.values())
        self._changed = {}
        return SettleResult(records=changed, ended=ended)

    def _full(self) -> bool:
        """Whether this settling commit holds as many changes as one commit should (the rest waits for the next
        batch: no commit grows past about a megabyte, and no batch holds up the commit loop for long)."""
        return len(self._changed) >= MAX_SETTLE_CHANGES

    @property
    def _recovering(self) -> bool:
        """Whether the first settling commits after a start still have cut-off phases or abandoned tasks to write."""
        return bool(self._was_running or self._abandoned)

    def _settling_left(self) -> bool:
        return self._recovering or bool(self._dirty or self._finalize)

    def _recover(self) -> None:
        """After an owner start: running phases were cut off; abandon_on_restart work is marked for abort. Written
        over as many settling commits as it takes; nothing is leased before it is done."""
        while self._was_running and not self._full():
            task_id = self._was_running.pop()
            self._phase_cut_off(task_id, self._tasks[task_id].epoch, counts=True)
        while self._abandoned and not self._full():
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

    def _end_orphan_graces(self, now_ms: int) -> None:
        """Tasks whose orphan grace is over are reconciled again: orphaned if still nobody can run them."""
        due = [task_id for task_id, until_ms in self._orphans_due.items() if until_ms <= now_ms]
        for task_id in due:
            del self._orphans_due[task_id]
            if task_id in self._tasks:
                self._dirty[task_id] = None
        for kind in [kind for kind, until_ms in self._kind_grace_until_ms.items() if until_ms <= now_ms]:
            del self._kind_grace_until_ms[kind]

    def _wake_sleepers(self, now_ms: int) -> None:
        sleepers = self._sleepers
        while sleepers and sleepers[0][0] <= now_ms and not self._full():
            until_ms, task_id = heapq.heappop(sleepers)
            record = self._tasks.get(task_id)
            if record is not None and record.status == "sleeping" and record.until_ms == until_ms:
                self._change(record, "wake", status="pending", until_ms=None)

    def _reconcile_all(self) -> None:
        while (self._dirty or self._finalize) and not self._full():
            while self._finalize:
                task_id = next(iter(self._finalize))
                self._after_end(self._finalize.pop(task_id))
            if self._dirty:
                task_id = next(iter(self._dirty))
                del self._dirty[task_id]
                record = self._tasks.get(task_id)
                if record is not None:
                    self._reconcile(record)

    def _check_fail_fast(self, task_id: str) -> None:
        waiter = self._tasks.get(task_id)
        if waiter is None or waiter.status != "waiting" or waiter.policy != "fail_fast":
            return
        for other in waiter.on:
            decided = self._tasks.get(other) or self._store.task(other)
            outcome = None if decided is None else _decided(decided)
            if outcome is not None and outcome.status != "completed":
                self._fail_fast(waiter)
                return

    def _reconcile(self, record: TaskRecord) -> None:
        task_id = record.task_id
        status = record.status
        if record.abort is not None:
            self._cascade(record, record.abort)
        if status == "completing":
            assert record.held is not None
            if not self._owns_live_work(task_id):
                self._finish(record, record.held)
            elif record.held.status != "completed":
                self._cascade(record, ABORT)
                self._signal_fail_fast(record)
            return
        if status == "running":
            lease = self._leases.get(task_id)
            if record.abort is not None and lease is not None and lease.mode == "phase" and not lease.cancelling:
                lease.cancelling = True
                reason = "the task was aborted" if record.abort == ABORT else "the task is abandoned after a restart"
                self._emit(lease.peer, CancelLease(lease=LeaseRef(task_id=task_id, epoch=lease.epoch), reason=reason))
            return
        if status == "waiting" and not any(other in self._tasks for other in record.on):
            record = self._change(record, "resume", status="pending", on=(), policy=None)
            status = "pending"
        if record.abort is not None:
            if self._owns_live_work(task_id):
                self._unready(record)
                return
            blocked = self._blocked_reason(record)
            if blocked is None:
                self._make_ready(record)
            elif record.abort != ABORT:
                self._block(record)  # a restart mark waits for a worker, so its abort handler can clean up
            else:
                grace_until_ms = self._orphan_grace_until_ms(record.kind)
                if self._now_ms >= grace_until_ms:
                    self._orphans_due.pop(task_id, None)
                    outcome = TaskOutcome(status="orphaned", reason=blocked.reason, error=blocked.detail)
                    self._finish(record, outcome)
                else:  # a worker that can run it may still (re)attach: the grace's end settles it again
                    self._block(record)
                    self._orphans_due[task_id] = grace_until_ms
            return
        if status == "pending" and not self._is_blocked(record):
            self._make_ready(record)

    def _cascade(self, record: TaskRecord, reason: str) -> None:
        """Mark the ordinary work ``record`` owns for abort with ``reason`` (an explicit abort replaces a restart
        mark; a restart mark reaches only unmarked work)."""
        for owned_id in list(self._owned_ordinary(record.task_id)):  # marking changes the sets walked
            owned = self._tasks[owned_id]
            if owned.abort is None or (reason == ABORT and owned.abort == RESTART):
                if self._full():
                    self._dirty[record.task_id] = None  # the next settling commit marks the rest
                    return
                self._change(owned, "mark", abort=reason)

    def _grant_leases(self, now_ms: int) -> None:
        """Lease ready tasks, oldest first per kind, to the least busy worker able to run each; move those no
        attached worker can run to the blocked tasks."""
        self._place = False
        for kind in list(self._ready):
            queue = self._ready[kind]
            if not any(kind in worker.capabilities for worker in self._workers.values()):
                del self._ready[kind]  # nobody runs this kind: the whole queue is blocked at once
                self._blocked.setdefault(kind, {}).update(queue)
                for task_id in queue:
                    if self._tasks.abort_mark(task_id) is not None:
                        self._dirty[task_id] = None  # orphaned (or left waiting) by the reconcile that follows
                continue
            if not self._has_capacity():
                return  # every worker is busy: a lease that ends brings us back
            self._grant_from(queue, kind, now_ms)
            if not queue:
                self._ready.pop(kind, None)

    def _grant_from(self, queue: dict[str, None], kind: str, now_ms: int) -> None:
        """Grant what can be granted from one kind's queue, in order. Tasks whose able workers are busy keep their
        place; past ``READY_LOOKAHEAD`` of them the rest waits too (a queue is never scanned whole for nothing)."""
        waiting = 0
        while waiting <= READY_LOOKAHEAD:
            chunk = list(itertools.islice(queue, waiting + READY_CHUNK))[waiting:]
            if not chunk:
                return
            for task_id in chunk:
                if self._full():
                    self._place = True  # the next batch grants the rest
                    return
                record = self._tasks.get(task_id)
                if record is None or not self._runnable(record):
                    del queue[task_id]
                    continue
                choice = self._choose_worker(record)
                if choice is None:
                    waiting += 1
                    if waiting > READY_LOOKAHEAD:
                        return
                    continue
                del queue[task_id]
                if isinstance(choice, Blocked):
                    self._blocked.setdefault(kind, {})[task_id] = None
                    if record.abort is not None:
                        self._dirty[task_id] = None
                    continue
                peer, capability = choice
                self._grant(record, peer, capability, "phase" if record.abort is None else "abort", now_ms)

    def _grant(self, record: TaskRecord, peer: PeerId, capability: Capability, mode: Mode, now_ms: int) -> None:
        task_id = record.task_id
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
        worker = self._workers[peer]
        worker.leases.add(task_id)
        self._leases[task_id] = _Lease(peer=peer, epoch=epoch, mode=mode, version=capability.version)
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
                now_ms=now_ms,
            ),
        )

    def _runnable(self, record: TaskRecord) -> bool:
        if record.abort is None:
            return record.status == "pending"
        return record.status in ("pending", "waiting", "sleeping") and not self._owns_live_work(record.task_id)

    def _choose_worker(self, record: TaskRecord) -> tuple[PeerId, Capability] | Blocked | None:
        """The least busy worker that can run ``record`` now; ``None`` if all such are busy; why it is blocked."""
        best: tuple[PeerId, Capability] | None = None
        best_load = 0
        able = False
        for peer, worker in self._workers.items():
            capability = worker.capabilities.get(record.kind)
            if capability is None or not self._can_run(record, capability):
                continue
            able = True
            load = len(worker.leases)
            if load < worker.max_leases and (best is None or load < best_load):
                best, best_load = (peer, capability), load
        if best is not None:
            return best
        if able:
            return None
        blocked = self._blocked_reason(record)
        assert blocked is not None
        return blocked

    def _can_run(self, record: TaskRecord, capability: Capability) -> bool:
        stored = record.version
        if stored == 0 or capability.version == stored:
            return True
        if capability.version < stored or not capability.migrates:
            return False
        return (record.task_id, capability.version) not in self._migration_failed

    def _blocked_reason(self, record: TaskRecord) -> Blocked | None:
        """Why no attached worker can run ``record`` (busy workers do not count as blocking), or ``None``."""
        versions = []
        for worker in self._workers.values():
            capability = worker.capabilities.get(record.kind)
            if capability is not None:
                if self._can_run(record, capability):
                    return None
                versions.append(capability)
        stored = record.version
        if not versions:
            return Blocked("missing_task", f"no attached worker has task kind {record.kind}")
        newer = [capability for capability in versions if capability.version > stored]
        if newer:
            failure = next(
                (self._migration_failed.get((record.task_id, c.version)) for c in newer if c.migrates),
                None,
            )
            newest = max(capability.version for capability in newer)
            if failure is not None:
                return Blocked("migration_failed", f"migrating from version {stored} to {newest} failed: {failure}")
            return Blocked(
                "migration_failed", f"version {newest} has no migrate() for tasks stored at version {stored}"
            )
        newest = max(capability.version for capability in versions)
        return Blocked(
            "task_too_old",
            f"stored at version {stored}; the attached workers' definitions are older (version {newest} at most)",
        )

    def _has_capacity(self) -> bool:
        return any(len(worker.leases) < worker.max_leases for worker in self._workers.values())

    def _make_ready(self, record: TaskRecord) -> None:
        _discard_id(self._blocked, record.kind, record.task_id)
        queue = self._ready.setdefault(record.kind, {})
        if record.task_id not in queue:
            queue[record.task_id] = None
            self._place = True

    def _unready(self, record: TaskRecord) -> None:
        _discard_id(self._ready, record.kind, record.task_id)

    def _block(self, record: TaskRecord) -> None:
        self._unready(record)
        self._blocked.setdefault(record.kind, {})[record.task_id] = None

    def _is_blocked(self, record: TaskRecord) -> bool:
        queue = self._blocked.get(record.kind)
        return queue is not None and record.task_id in queue

    # ------------------------------------------------------------------------------------------ transitions

    def _finish(self, record: TaskRecord, outcome: TaskOutcome, **changes: Any) -> None:
        """End a task with ``outcome``, or hold it (``completing``) while it owns live ordinary work."""
        changes |= {"on": (), "policy": None, "until_ms": None}
        if self._owns_live_work(record.task_id):
            self._change(record, "hold", status="completing", held=outcome, **changes)
        else:
            self._change(record, "end", status="terminal", outcome=outcome, held=None, **changes)

    def _change(self, record: TaskRecord, event: TaskEvent, **changes: Any) -> TaskRecord:
        """A change made while settling: saved, logged with the settling commit, and reconciled again."""
        changed = attrs.evolve(record, seq=self._settle_seq, updated_at_ms=self._now_ms, **changes)
        self._save(record, changed, event)
        self._changed[changed.task_id] = changed
        return changed

    def _save(self, old: TaskRecord, record: TaskRecord, event: TaskEvent, *, checkpoint: object = NO_CHANGE) -> None:
        """Store a task's next record, which ``event`` made of ``old``: refused loudly if the table forbids it."""
        check_transition(old, event, record)
        if checkpoint is NO_CHANGE:
            self._store.update_task(record)
        else:
            self._store.update_task(record, checkpoint=checkpoint)
        self._put(record)

    def _put(self, record: TaskRecord) -> None:
        """Replace a task's record in memory (journaled), keeping every index in step."""
        task_id = record.task_id
        old = self._tasks.get(task_id)
        self._set(task_id, old, record)
        self._undo(lambda: self._set(task_id, record, old))

    def _set(self, task_id: str, old: TaskRecord | None, new: TaskRecord | None) -> None:
        if old is not None:
            self._unindex(old)
        if new is None or new.status == "terminal":
            self._tasks.pop(task_id)
            if new is not None:
                self._ended[task_id] = new
                self._finalize[task_id] = new
        else:
            self._tasks[task_id] = new
            self._index(new)
            if old is not None and old.status == "terminal":  # undoing an end
                self._ended.pop(task_id, None)
                self._finalize.pop(task_id, None)
        self._dirty[task_id] = None

    def _index(self, record: TaskRecord) -> None:
        if record.owner_task_id is not None:
            self._children.setdefault(record.owner_task_id, set()).add(record.task_id)
        else:
            self._conversation_tasks.setdefault(record.conversation_id, set()).add(record.task_id)
        if record.status == "waiting":
            for other in record.on:
                self._waiters.setdefault(other, set()).add(record.task_id)
        if record.status == "sleeping" and record.until_ms is not None:
            heapq.heappush(self._sleepers, (record.until_ms, record.task_id))
        self._touch_owner(record)

    def _unindex(self, record: TaskRecord) -> None:
        if record.owner_task_id is not None:
            _discard(self._children, record.owner_task_id, record.task_id)
        else:
            _discard(self._conversation_tasks, record.conversation_id, record.task_id)
        if record.status == "waiting":
            for other in record.on:
                _discard(self._waiters, other, record.task_id)

    def _touch_owner(self, record: TaskRecord) -> None:
        owner = self._owner_of(record)
        if owner is not None:
            self._dirty[owner] = None

    def _after_end(self, record: TaskRecord) -> None:
        """A task became terminal: its owner, waiters and owned conversations are reconsidered."""
        task_id = record.task_id
        self._touch_owner(record)
        self._unready(record)
        _discard_id(self._blocked, record.kind, task_id)
        for waiter in self._waiters.get(task_id, ()):
            self._dirty[waiter] = None
        self._signal_fail_fast(record)
        for conversation_id in self._owned_conversations.pop(task_id, ()):
            self._conversation_owner.pop(conversation_id, None)

    def _signal_fail_fast(self, record: TaskRecord) -> None:
        """``record`` decided an outcome (it is terminal or ``completing``): one other than ``completed`` makes its
        ``fail_fast`` waiters mark the others they wait on, at once (not when its own work has ended)."""
        outcome = _decided(record)
        if outcome is None or outcome.status == "completed":
            return
        for waiter in self._waiters.get(record.task_id, ()):
            waiting = self._tasks.get(waiter)
            if waiting is not None and waiting.policy == "fail_fast":
                self._fail_fast(waiting)

    def _fail_fast(self, waiter: TaskRecord) -> None:
        """One of the tasks a ``fail_fast`` waiter waits on did not complete: the others still live are marked for
        abort (those a full settling commit could not take, by the next one)."""
        for other in waiter.on:
            record = self._tasks.get(other)
            if record is not None and record.abort != ABORT and record.status != "completing":
                if self._full():
                    self._fail_fast_checks[waiter.task_id] = None
                    return
                self._change(record, "mark", abort=ABORT)

    def _end_lease(self, task_id: str) -> None:
        lease = self._leases.pop(task_id)
        worker = self._workers.get(lease.peer)
        if worker is not None:
            worker.leases.discard(task_id)
        self._place = True

        def undo() -> None:
            self._leases[task_id] = lease
            if worker is not None:
                worker.leases.add(task_id)

        self._undo(undo)

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
                f"{where}: owner task {owner_task_id} is {_describe_state(owner)}: it can own no new work",
            )
        return owner

    def _owner_of(self, record: TaskRecord) -> str | None:
        if record.owner_task_id is not None:
            return record.owner_task_id
        return self._conversation_owner.get(record.conversation_id)

    def _owner_chain(self, task_id: str) -> list[str]:
        chain = []
        record = self._tasks.get(task_id)
        while record is not None:
            owner = self._owner_of(record)
            if owner is None or owner in chain:
                break
            chain.append(owner)
            record = self._tasks.get(owner)
        return chain

    def _owned_ordinary(self, task_id: str) -> Iterator[str]:
        """Live tasks ``task_id`` owns, directly or through conversations it owns, that are not background."""
        owned = itertools.chain(
            self._children.get(task_id, ()),
            *(
                self._conversation_tasks.get(conversation, ())
                for conversation in self._owned_conversations.get(task_id, ())
            ),
        )
        return (owned_id for owned_id in owned if not self._tasks[owned_id].background)

    def _owns_live_work(self, task_id: str) -> bool:
        return next(self._owned_ordinary(task_id), None) is not None


def _phase_of(checkpoint: JsonValue) -> str | None:
    if isinstance(checkpoint, dict):
        phase = checkpoint.get("phase")
        if isinstance(phase, str):
            return phase
    return None


def _decided(record: TaskRecord) -> TaskOutcome | None:
    """The outcome a task decided: its final one, or the one it holds while ``completing``."""
    return record.outcome if record.status == "terminal" else record.held


def _describe_state(record: TaskRecord) -> str:
    if record.status == "terminal" and record.outcome is not None:
        return f"terminal ({record.outcome.status})"
    if record.abort is not None:
        return f"{record.status}, marked for abort"
    return record.status


def _discard(index: dict[str, set[str]], key: str, value: str) -> None:
    members = index.get(key)
    if members is not None:
        members.discard(value)
        if not members:
            del index[key]


def _discard_id(queues: dict[str, dict[str, None]], kind: str, task_id: str) -> None:
    queue = queues.get(kind)
    if queue is not None:
        queue.pop(task_id, None)
        if not queue:
            del queues[kind]
