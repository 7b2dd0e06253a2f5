"""The task engine's records, sans-IO: the state machine every change of a task's record is checked against, every
live task's record, and the indexes derived from those records.

The task state machine is :data:`TRANSITIONS`, ``(status, event) -> status``, checked on every save of a task's
record (an illegal transition raises :class:`IllegalTransition`: a bug, never bad input). Its rules:

1. ``grant``: a runnable task is leased to a worker and its phase runs. A task marked for abort is runnable
   (its abort handler then runs) from ``pending``, ``waiting`` or ``sleeping`` once its owned ordinary work is
   terminal; an unmarked one only from ``pending``.
2. A phase ends by committing its next state under its lease: ``advance`` (``pending`` at a new checkpoint, also a
   wait on nothing), ``wait``, ``sleep``, ``end`` (terminal) or ``hold`` (``completing``: it decided its outcome
   while it owns live ordinary work).
3. ``stop``: a phase stops without committing (released after a cancel, its worker cut off, the owner restarted,
   or given back by its worker as it closes); the task is ``pending`` again (a restart counted unless it was
   cancelled or given back by a close: a close is not a crash). At its restart limit it ends (``end`` or ``hold``,
   ``faulted`` / ``restart_limit``) instead.
4. ``resume``: a waiter whose tasks are all terminal is ``pending``; ``wake``: a sleeper whose deadline passed is.
5. ``end`` from ``completing``: a task holding an outcome becomes terminal once its owned ordinary work is.
6. ``end`` from ``pending``, ``waiting`` or ``sleeping``: a task marked for abort that no attached worker can run
   (past the orphan grace) ends ``orphaned``; an unmarked ``pending`` task blocked ``missing_model`` past the model
   grace ends ``failed`` (``no_model``).
7. ``mark``: an abort mark (a request, a cascade, fail_fast, abandon_on_restart, rules 11 and 12) keeps the status.
8. Nothing leaves ``terminal``; a task is created ``pending``.
9. A cut-off phase (rule 3) of a task whose family has a :data:`CutOffHook` (given to the engine where it is built:
   a run's task and a tool task, see :mod:`._operations`) ends as the hook decides instead: ``backoff``
   (``sleeping`` until a deadline: a model request's durable retry), ``interrupt`` (``waiting`` on a
   ``tether.attention`` task the owner creates: a manual tool call), ``end`` / ``hold`` (``failed``: retries
   exhausted), or rule 3 as usual. A phase given back by a close ends as the hook decides too, counting no restart:
   ``interrupt`` (a manual tool call the close cut off) or rule 3.
10. Tasks of ``tether.`` kinds (:data:`EXTERNAL_PREFIX`: approvals, attention) are never leased nor shown blocked;
    an abort mark ends them ``aborted`` at once (``end`` from ``pending``); they complete only through owner
    requests (``resolve``, ``respond``: ``end`` from ``pending``), and ``resolve`` ends the tool task that waited on
    one with the output a person gave (``end`` from ``waiting``; ``hold`` while work it abandoned is still live).
11. Abandon: a cut-off phase whose family's hook says its code never runs again as it was (a tool call that is not
    replay-safe: ``manual``, ``report``) has the live ordinary work its task owns marked for abort with the reason
    ``restart`` (``mark``), in the settling commit that decides the cut-off, owners' cut-offs settled before those
    of the tasks they own; ``resolve`` marks any such work not marked yet. It ends bottom-up, as any abort.
12. A task of a family whose owned work may not outlive it (``tool:`` tasks, named to the engine where it is built)
    that decides its outcome (``end``, ``hold``) while ordinary tasks it owns directly are live (nested calls or
    questions its handler left running, its own or an earlier attempt's) marks them for abort (``mark``,
    ``abort``) in that commit, and is ``completing`` until they are terminal.

A terminal task leaves memory with the commit that ends it (its row stays in the store). Every index is derived
from the live records and kept in step by :meth:`TaskRecords.put`, the one way a record changes in memory, so
undoing a refused request is putting back the records it replaced (journaled in the owner's one
:class:`~._unit.Journal`); :meth:`TaskRecords.save` stores a record and puts it, checked against the table. Nothing
here decides anything: the requests (:mod:`._tasks`) and settling (:mod:`._task_settle`) choose each next record,
the placement (:mod:`._task_placement`) who runs it.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Mapping
from typing import Final, Literal

from protocol import TaskOutcome, TaskRecord, TaskStatus

from ._checks import IllegalTransition
from ._ports import NO_CHANGE, TaskStore
from ._task_data import TaskData
from ._unit import Journal

ABORT: Final = "abort"
RESTART: Final = "restart"
EXTERNAL_PREFIX: Final = "tether."
"""Task kinds no worker ever runs (approvals, attention): never leased, never shown blocked (rule 10)."""

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
    ("waiting", "hold"): "completing",  # 10 (resolved while its abandoned nested calls still end)
}
"""The task state machine; see the module docstring for the rules each row follows (``docs/tasks.md`` prints it)."""


def check_transition(old: TaskRecord, event: TaskEvent, new: TaskRecord) -> None:
    """Raise :class:`IllegalTransition` unless the table lets ``event`` take ``old`` to ``new`` (a dict lookup)."""
    if TRANSITIONS.get((old.status, event)) != new.status:
        raise IllegalTransition("task", old.task_id, old.status, event, new.status)


class LiveTasks:
    """Live task records by id. The plain pending tasks found at start are only listed (:attr:`unread`) until a
    record is first needed, then read from the store: most of them are not looked at before they are leased. Only
    what the engine needs is here, so nothing can walk the records and miss the unread ones: :meth:`ids` lists
    every live task without reading it."""

    def __init__(self, store: TaskStore) -> None:
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


class TaskRecords:
    """The live records of one store, their indexes, and what changed since settling last looked."""

    def __init__(self, store: TaskStore, journal: Journal) -> None:
        self.store = store
        self.journal = journal
        """Where a change made inside a request journals its undo (the owner's one journal)."""
        self.tasks = LiveTasks(store)
        self.unwritten: dict[str, tuple[TaskRecord, object]] = {}
        """Records saved in this batch, not yet stored, each with the checkpoint to store with it (``NO_CHANGE``: none):
        :meth:`write_saved` stores each once, as the batch leaves it (a task advanced and leased again in one batch is
        one UPDATE, not two)."""
        self.data = TaskData(store, journal, self.unwritten)
        """The input and checkpoint of the tasks written lately: what a lease carries, read from here."""
        self.children: dict[str, set[str]] = {}
        """Live tasks by their owner task."""
        self.conversation_tasks: dict[str, set[str]] = {}
        """Live tasks owned directly by a conversation."""
        self.conversation_owner: dict[str, str] = {}
        """Conversations owned by a live task."""
        self.owned_conversations: dict[str, set[str]] = {}
        self.waiters: dict[str, set[str]] = {}
        """Waiting tasks by each task they wait on."""
        self.sleepers: list[tuple[int, str]] = []
        """A heap of (until_ms, task id); entries of tasks that no longer sleep until then are skipped."""
        self.dirty: dict[str, None] = {}
        """Tasks settling must reconcile again (their record, or something they depend on, changed)."""
        self.ended: dict[str, TaskRecord] = {}
        """Tasks that became terminal in this batch, for ``wait_task`` replies."""
        self.finalize: dict[str, TaskRecord] = {}
        """Tasks that became terminal and whose owner, waiters and conversations settling has not yet revisited."""
        for conversation_id, owner in store.task_owned_conversations():
            self.conversation_owner[conversation_id] = owner
            self.owned_conversations.setdefault(owner, set()).add(conversation_id)

    def get(self, task_id: str) -> TaskRecord | None:
        """A live task's record."""
        return self.tasks.get(task_id)

    def record(self, task_id: str) -> TaskRecord | None:
        """A task's record, live or terminal (one that ended in this batch is not stored yet)."""
        record = self.tasks.get(task_id)
        if record is not None:
            return record
        unwritten = self.unwritten.get(task_id)
        return self.store.task(task_id) if unwritten is None else unwritten[0]

    # ------------------------------------------------------------------------------------------ changes

    def save(self, old: TaskRecord, record: TaskRecord, event: TaskEvent, *, checkpoint: object = NO_CHANGE) -> None:
        """Save a task's next record, which ``event`` made of ``old``, and put it: refused loudly if the table
        forbids it. It is stored at the batch's end (:meth:`write_saved`); :meth:`record` and :attr:`data` read it
        before."""
        check_transition(old, event, record)
        task_id = record.task_id
        unwritten = self.unwritten
        before = unwritten.get(task_id)
        if checkpoint is NO_CHANGE and before is not None:
            checkpoint = before[1]  # an earlier save of this batch gave it one
        unwritten[task_id] = (record, checkpoint)
        if self.journal.open:
            self.journal.undo(lambda: self._unsave(task_id, before))
        self.put(record)

    def _unsave(self, task_id: str, before: tuple[TaskRecord, object] | None) -> None:
        if before is None:
            del self.unwritten[task_id]
        else:
            self.unwritten[task_id] = before

    def write_saved(self) -> None:
        """Store every record saved since the last call, each once, with its checkpoint; at the end of each batch,
        inside its transaction (so in the same commit of the database as the commit log that names them)."""
        store = self.store
        data = self.data
        for task_id, (record, checkpoint) in self.unwritten.items():
            if checkpoint is NO_CHANGE:
                store.update_task(record)
            else:
                data.advanced(task_id, checkpoint, store.update_task(record, checkpoint=checkpoint))
        self.unwritten.clear()

    def put(self, record: TaskRecord) -> None:
        """Replace a task's record in memory (journaled), keeping every index in step."""
        task_id = record.task_id
        old = self.tasks.get(task_id)
        self._set(task_id, old, record)
        self.journal.undo(lambda: self._set(task_id, record, old))

    def _set(self, task_id: str, old: TaskRecord | None, new: TaskRecord | None) -> None:
        if old is not None:
            self._unindex(old)
        if new is None or new.status == "terminal":
            self.tasks.pop(task_id)
            if new is not None:
                self.ended[task_id] = new
                self.finalize[task_id] = new
        else:
            self.tasks[task_id] = new
            self._index(new)
            if old is not None and old.status == "terminal":  # undoing an end
                self.ended.pop(task_id, None)
                self.finalize.pop(task_id, None)
        self.dirty[task_id] = None

    def _index(self, record: TaskRecord) -> None:
        if record.owner_task_id is not None:
            self.children.setdefault(record.owner_task_id, set()).add(record.task_id)
        else:
            self.conversation_tasks.setdefault(record.conversation_id, set()).add(record.task_id)
        if record.status == "waiting":
            for other in record.on:
                self.waiters.setdefault(other, set()).add(record.task_id)
        if record.status == "sleeping" and record.until_ms is not None:
            heapq.heappush(self.sleepers, (record.until_ms, record.task_id))
        self.touch_owner(record)

    def _unindex(self, record: TaskRecord) -> None:
        if record.owner_task_id is not None:
            discard(self.children, record.owner_task_id, record.task_id)
        else:
            discard(self.conversation_tasks, record.conversation_id, record.task_id)
        if record.status == "waiting":
            for other in record.on:
                discard(self.waiters, other, record.task_id)

    def touch_owner(self, record: TaskRecord) -> None:
        owner = self.owner_of(record)
        if owner is not None:
            self.dirty[owner] = None

    def conversation_created(self, conversation_id: str, owner_task_id: str) -> None:
        self.conversation_owner[conversation_id] = owner_task_id
        self.owned_conversations.setdefault(owner_task_id, set()).add(conversation_id)

        def undo() -> None:
            del self.conversation_owner[conversation_id]
            self.owned_conversations[owner_task_id].discard(conversation_id)

        self.journal.undo(undo)

    def forget_owned_conversations(self, task_id: str) -> None:
        """A task ended: the conversations it owned are owned by nobody now."""
        for conversation_id in self.owned_conversations.pop(task_id, ()):
            self.conversation_owner.pop(conversation_id, None)

    # -------------------------------------------------------------------------------------------- sleepers

    def next_sleep_ms(self) -> int | None:
        """The earliest deadline of a task that still sleeps until it (stale heap entries are dropped)."""
        sleepers = self.sleepers
        while sleepers:
            until_ms, task_id = sleepers[0]
            record = self.tasks.get(task_id)
            if record is not None and record.status == "sleeping" and record.until_ms == until_ms:
                return until_ms
            heapq.heappop(sleepers)
        return None

    def pop_due_sleeper(self, now_ms: int) -> TaskRecord | None:
        """A task whose sleep is due at ``now_ms``, taken off the heap; ``None`` once there is none."""
        sleepers = self.sleepers
        while sleepers and sleepers[0][0] <= now_ms:
            until_ms, task_id = heapq.heappop(sleepers)
            record = self.tasks.get(task_id)
            if record is not None and record.status == "sleeping" and record.until_ms == until_ms:
                return record
        return None

    # ---------------------------------------------------------------------------------------------- graph

    def owner_of(self, record: TaskRecord) -> str | None:
        if record.owner_task_id is not None:
            return record.owner_task_id
        return self.conversation_owner.get(record.conversation_id)

    def owner_chain(self, task_id: str) -> list[str]:
        chain = []
        record = self.tasks.get(task_id)
        while record is not None:
            owner = self.owner_of(record)
            if owner is None or owner in chain:
                break
            chain.append(owner)
            record = self.tasks.get(owner)
        return chain

    def owned_ordinary(self, task_id: str) -> Iterator[str]:
        """Live tasks ``task_id`` owns, directly or through conversations it owns, that are not background."""
        owned = itertools.chain(
            self.children.get(task_id, ()),
            *(
                self.conversation_tasks.get(conversation, ())
                for conversation in self.owned_conversations.get(task_id, ())
            ),
        )
        return (owned_id for owned_id in owned if not self.tasks[owned_id].background)

    def owns_live_work(self, task_id: str) -> bool:
        return next(self.owned_ordinary(task_id), None) is not None


def decided(record: TaskRecord) -> TaskOutcome | None:
    """The outcome a task decided: its final one, or the one it holds while ``completing``."""
    return record.outcome if record.status == "terminal" else record.held


def describe_state(record: TaskRecord) -> str:
    if record.status == "terminal" and record.outcome is not None:
        return f"terminal ({record.outcome.status})"
    if record.abort is not None:
        return f"{record.status}, marked for abort"
    return record.status


def discard(index: dict[str, set[str]], key: str, value: str) -> None:
    members = index.get(key)
    if members is not None:
        members.discard(value)
        if not members:
            del index[key]
