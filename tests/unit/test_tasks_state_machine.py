"""A Hypothesis state machine over the task engine: random creates, phases, aborts, departing workers, clock moves
and owner restarts, driven through OwnerCore over the memory store exactly as the shell drives it (see
``test_tasks_core.py`` for the driver), with the engine's rules checked against both the core's memory and the
store after every batch:

- nothing is terminal while it owns live ordinary (non-background) work, and nothing is completing without;
- an abort handler is leased only once every ordinary descendant of its task is terminal (post-order), and no
  phase starts below an owner marked for abort;
- restart counts stay below the restart limit while a task runs (one that reached it ends, or holds that end);
- every live task is in exactly one consistent state, and its stored row is its record in memory and in the graph;
- a task is leased to at most one worker at a time, never twice at one epoch (checked by the driver);
- a terminal task never changes again; abort marks are never taken back, and a restart mark never replaces an
  explicit one; a fail_fast wait whose task did not complete has the rest marked;
- after a batch (and those it asked for) the owner needs no other one: it never spins.
"""

from __future__ import annotations

from typing import Literal

import attrs
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from protocol import (
    AbortTask,
    CancelLease,
    Commit,
    Committed,
    CreateConversation,
    CreateTask,
    Error,
    ErrorCode,
    Lease,
    LeaseRef,
    Ok,
    SetTaskState,
    TaskRecord,
    Write,
)
from storage_owner.core import ORPHAN_GRACE_MS, Output
from tests.unit.test_tasks_core import (
    KIND,
    OwnerSim,
    Worker,
    advance,
    child,
    ended,
    fresh_id,
    reply_to,
    restart_ids,
    sent,
    sleeping,
    waiting,
)

OTHER_KIND = "aux.job"
UNRUN_KIND = "nobody.runs.this"
"""No worker ever announces it: such tasks stay blocked until aborted, then end orphaned."""
FREED_OWNER_KIND = "owner.of.a.freed.conversation"
"""Only the worker of :meth:`TaskMachine.a_conversation_whose_owner_ended` runs it."""
NEXT_STATES = ["advance", "wait", "fail_fast", "sleep", "complete", "fail", "fail", "fault"]
"""What a phase may commit next (failures twice as likely: they drive fail_fast, held failures and aborts)."""
RESTART_LIMIT = 3
MAX_WORKERS = 3

picks = st.integers(min_value=0, max_value=1 << 16)


@attrs.frozen
class Family:
    """Children a phase creates in one commit."""

    lease: int
    kind: str
    count: int
    background: bool
    in_owned_conversation: bool
    then_wait: Literal["all_settled", "fail_fast"] | None


@attrs.frozen
class Move:
    """The next state a running phase commits; ``wait_on`` picks the tasks of a wait."""

    lease: int
    step: str
    wait_on: tuple[int, ...]


families = st.builds(
    Family,
    lease=picks,
    kind=st.sampled_from([KIND, KIND, OTHER_KIND, UNRUN_KIND]),
    count=st.integers(min_value=1, max_value=3),
    background=st.booleans(),
    in_owned_conversation=st.booleans(),
    then_wait=st.sampled_from([None, "all_settled", "fail_fast"]),
)
moves = st.builds(Move, lease=picks, step=st.sampled_from(NEXT_STATES), wait_on=st.lists(picks, max_size=3).map(tuple))


def pick(items: list[str], index: int) -> str:
    return items[index % len(items)]


class TaskMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        restart_ids()
        self.sim = OwnerSim()
        self.sim.after_batch = self._after_batch
        self.known: list[str] = []
        """Every task ever created, oldest first."""
        self.conversation_owner: dict[str, str] = {}
        """Conversations created owned by a task."""
        self.top_level: set[str] = set()
        """Tasks created in a conversation whose owner task had ended: owned by nobody (the conversation is free)."""
        self.marks: dict[str, str] = {}
        """The abort mark last seen on each task."""
        self.ended: dict[str, TaskRecord] = {}
        """Terminal records as first seen: they must never change."""
        self.checked_leases = 0
        self.add_worker(2)

    def teardown(self) -> None:
        self.sim.close()

    # ------------------------------------------------------------------------------------- model helpers

    def stored(self) -> dict[str, TaskRecord]:
        """Every task's stored row: those acknowledged so far, and any live one (created by the running batch)."""
        records = {record.task_id: record for record in self.sim.store.live_tasks()}
        for task_id in self.known:
            if task_id not in records:
                record = self.sim.store.task(task_id)
                assert record is not None, f"task {task_id} was acknowledged but is not stored"
                records[task_id] = record
        return records

    def owned_by(self, records: dict[str, TaskRecord], owner_id: str) -> list[TaskRecord]:
        """The tasks ``owner_id`` owns directly or through a conversation it owns (background ones included)."""
        return [record for record in records.values() if self.owner_of(record) == owner_id]

    def ordinary_descendants(self, records: dict[str, TaskRecord], task_id: str) -> list[TaskRecord]:
        found: list[TaskRecord] = []
        stack = [task_id]
        while stack:
            for owned in self.owned_by(records, stack.pop()):
                if not owned.background:
                    found.append(owned)
                    stack.append(owned.task_id)
        return found

    def owner_of(self, record: TaskRecord) -> str | None:
        if record.owner_task_id is not None:
            return record.owner_task_id
        if record.task_id in self.top_level:
            return None
        return self.conversation_owner.get(record.conversation_id)

    def add_worker(self, max_leases: int) -> None:
        self.sim.worker([KIND, OTHER_KIND], restart_limit=RESTART_LIMIT, max_leases=max_leases)

    def live_workers(self) -> list[Worker]:
        return list(self.sim.workers.values())

    def phase_leases(self) -> list[tuple[Worker, str]]:
        """Leases a worker may commit a next state under: phases not being cancelled."""
        return [
            (worker, task_id)
            for worker in self.live_workers()
            for task_id, lease in sorted(worker.leases.items())
            if lease.mode == "phase" and task_id not in worker.cancelled
        ]

    def abort_leases(self) -> list[tuple[Worker, str]]:
        return [
            (worker, task_id)
            for worker in self.live_workers()
            for task_id, lease in sorted(worker.leases.items())
            if lease.mode == "abort"
        ]

    def cancelled(self) -> list[tuple[Worker, str]]:
        return [(worker, task_id) for worker in self.live_workers() for task_id in sorted(worker.cancelled)]

    def commit_under_lease(self, worker: Worker, task_id: str, *writes: Write) -> None:
        """A worker's commit: accepted whole, or refused with nothing written."""
        head = self.sim.core.head_seq
        before = self.sim.store.task(task_id)
        reply = worker.commit(task_id, *writes)
        if isinstance(reply, Committed):
            for write in writes:
                if isinstance(write, CreateTask):
                    self.known.append(write.task_id)
                elif isinstance(write, CreateConversation) and write.owner_task_id is not None:
                    self.conversation_owner[write.conversation_id] = write.owner_task_id
        else:
            assert isinstance(reply, Error), reply
            assert self.sim.core.head_seq == head, "a refused commit took a seq"
            assert self.sim.store.task(task_id) == before
            assert worker.holds(task_id), "a refused commit ended the lease"

    # -------------------------------------------------------------------------------------- per batch

    def _after_batch(self, out: list[Output]) -> None:
        """Leases granted by this batch: abort handlers in post-order, and no phase below a marked owner."""
        granted = self.sim.granted[self.checked_leases :]
        self.checked_leases = len(self.sim.granted)
        if not granted:
            return
        records = self.stored()
        cancelled = {frame.lease for _, _, frame in out if isinstance(frame, CancelLease)}
        for lease in granted:
            self.check_lease_order(records, lease, cancelled)

    def check_lease_order(self, records: dict[str, TaskRecord], lease: Lease, cancelled: set[LeaseRef]) -> None:
        task_id = lease.lease.task_id
        record = records[task_id]
        if lease.mode == "abort":
            assert record.abort is not None, f"an abort handler leased for unmarked task {task_id}"
            live = [
                owned.task_id for owned in self.ordinary_descendants(records, task_id) if owned.status != "terminal"
            ]
            assert not live, f"abort handler of {task_id} leased while its ordinary work {live} still lives"
            return
        # A mark that reached the task after its grant in the same batch (a fail_fast sibling orphaned by the
        # settling that follows the grants) cancels the new phase at once; a mark before the grant is a bug.
        marked = [record] if record.abort is not None else []
        current = record
        while not current.background:
            owner_id = self.owner_of(current)
            if owner_id is None:
                break
            current = records[owner_id]
            if current.abort is not None:
                marked.append(current)
        if marked:
            assert lease.lease in cancelled, (
                f"a phase of {task_id} was leased below tasks marked for abort: {[m.task_id for m in marked]}"
            )

    # ------------------------------------------------------------------------------------------- rules

    @initialize(kinds=st.lists(st.sampled_from([KIND, KIND, OTHER_KIND, UNRUN_KIND]), min_size=1, max_size=3))
    def some_root_tasks(self, kinds: list[str]) -> None:
        for kind in kinds:
            self.known.append(self.sim.create_task(kind))

    @initialize()
    def a_conversation_whose_owner_ended(self) -> None:
        """A task owned a conversation and ended (a subagent's owner that returned): the conversation is free from
        the start, so that work created in it later (a rule below) is explored in every example. Its own worker,
        gone once it committed, runs it."""
        worker = self.sim.worker([FREED_OWNER_KIND])
        owner_id = self.sim.create_task(FREED_OWNER_KIND)
        conversation_id = fresh_id()
        create = CreateConversation(conversation_id=conversation_id, owner_task_id=owner_id)
        self.commit_under_lease(worker, owner_id, create, ended(owner_id, "completed"))
        worker.leave()
        self.known.append(owner_id)
        assert self.freed_conversations() == [conversation_id]

    @rule(
        kind=st.sampled_from([KIND, KIND, KIND, OTHER_KIND, UNRUN_KIND]),
        abandon_on_restart=st.booleans(),
    )
    def create_root_task(self, kind: str, abandon_on_restart: bool) -> None:
        self.known.append(self.sim.create_task(kind, abandon_on_restart=abandon_on_restart))

    # Hypothesis draws rules with fewer arguments more often, so the two rules that make the most progress take
    # one argument each: a frozen description of what to do.

    @precondition(lambda self: bool(self.phase_leases()))
    @rule(family=families)
    def a_phase_creates_children(self, family: Family) -> None:
        """A phase creates children (or a conversation it owns and tasks in it), and may wait on them at once."""
        leases = self.phase_leases()
        worker, task_id = leases[family.lease % len(leases)]
        writes: list[Write] = []
        created: list[CreateTask] = []
        conversation_id = fresh_id() if family.in_owned_conversation else None
        if conversation_id is not None:
            writes.append(CreateConversation(conversation_id=conversation_id, owner_task_id=task_id))
        for _ in range(family.count):
            kind, background = family.kind, family.background
            if conversation_id is None:
                created.append(child(task_id, kind=kind, background=background))
            else:
                created.append(
                    CreateTask(task_id=fresh_id(), kind=kind, conversation_id=conversation_id, background=background)
                )
        writes.extend(created)
        if family.then_wait is not None:
            writes.append(waiting(task_id, [create.task_id for create in created], family.then_wait))
        self.commit_under_lease(worker, task_id, *writes)

    @precondition(lambda self: bool(self.phase_leases()))
    @rule(moves=st.lists(moves, min_size=1, max_size=3))
    def a_few_phases_end(self, moves: list[Move]) -> None:
        """Running phases commit their next state, one commit each."""
        for move in moves:
            leases = self.phase_leases()
            if not leases:
                return
            worker, task_id = leases[move.lease % len(leases)]
            self.commit_under_lease(worker, task_id, self.next_state(task_id, move))

    def next_state(self, task_id: str, move: Move) -> SetTaskState:
        step, wait_on = move.step, move.wait_on
        if step == "advance":
            return advance(task_id, {"phase": "next", "n": fresh_id()})
        if step == "wait":
            return waiting(task_id, [pick(self.known, target) for target in wait_on])
        if step == "fail_fast":  # on (some of) its own children
            own = sorted(record.task_id for record in self.owned_by(self.stored(), task_id))
            on = [pick(own, target) for target in wait_on] if own and wait_on else own
            return waiting(task_id, on, "fail_fast")
        if step == "sleep":
            return sleeping(task_id, self.sim.now_ms + move.lease % 3_000)
        if step == "complete":
            return ended(task_id, "completed")
        if step == "fail":
            return ended(task_id, "failed", error="boom")
        return ended(task_id, "faulted", reason="phase_error", error="raised")

    @precondition(lambda self: bool(self.abort_leases()))
    @rule(index=picks, outcome=st.sampled_from(["aborted", "aborted", "faulted"]))
    def abort_handler_ends(self, index: int, outcome: Literal["aborted", "faulted"]) -> None:
        worker, task_id = self.abort_leases()[index % len(self.abort_leases())]
        self.commit_under_lease(worker, task_id, ended(task_id, outcome))

    @precondition(lambda self: bool(self.known))
    @rule(index=picks, kind=st.sampled_from([KIND, OTHER_KIND, UNRUN_KIND]), in_owned_conversation=st.booleans())
    def client_creates_owned_work(self, index: int, kind: str, in_owned_conversation: bool) -> None:
        """A client adds work under a task (whatever its state), or in a conversation a live task owns."""
        if in_owned_conversation:
            live = {record.task_id for record in self.sim.store.live_tasks()}
            conversations = sorted(c for c, owner in self.conversation_owner.items() if owner in live)
            if not conversations:
                return
            create = CreateTask(task_id=fresh_id(), kind=kind, conversation_id=pick(conversations, index))
        else:
            create = child(pick(self.known, index), kind=kind)
        head = self.sim.core.head_seq
        reply = self.sim.commit(create)
        if isinstance(reply, Committed):
            self.known.append(create.task_id)
        else:
            assert isinstance(reply, Error), reply
            assert self.sim.core.head_seq == head and self.sim.store.task(create.task_id) is None

    def freed_conversations(self) -> list[str]:
        """Conversations whose owner task ended: free again."""
        return sorted(
            conversation_id
            for conversation_id, owner_id in self.conversation_owner.items()
            if (owner := self.sim.store.task(owner_id)) is not None and owner.status == "terminal"
        )

    @precondition(lambda self: bool(self.freed_conversations()))
    @rule(index=picks, kind=st.sampled_from([KIND, OTHER_KIND, UNRUN_KIND]))
    def client_creates_work_in_a_freed_conversation(self, index: int, kind: str) -> None:
        """A client adds work in a conversation whose owner task ended: accepted, as a top-level task (the
        reference's rule), which the ended owner never has to wait for or abort."""
        create = CreateTask(task_id=fresh_id(), kind=kind, conversation_id=pick(self.freed_conversations(), index))
        self.top_level.add(create.task_id)  # before the batch, whose lease grants are checked as it ends
        reply = self.sim.commit(create)
        assert isinstance(reply, Committed), reply
        self.known.append(create.task_id)

    @precondition(lambda self: bool(self.phase_leases()) and bool(self.known))
    @rule(
        index=picks,
        victim=picks,
        step=st.sampled_from(["advance", "complete", "fail", "child"]),
        abort_first=st.booleans(),
    )
    def abort_races_a_commit(self, index: int, victim: int, step: str, abort_first: bool) -> None:
        """One batch holds a client's abort and a worker's commit, in either order."""
        worker, task_id = self.phase_leases()[index % len(self.phase_leases())]
        created = child(task_id)
        choices: dict[str, tuple[Write, ...]] = {
            "advance": (advance(task_id, {"phase": "raced", "n": fresh_id()}),),
            "complete": (ended(task_id, "completed"),),
            "fail": (ended(task_id, "failed", error="raced"),),
            "child": (created, waiting(task_id, [created.task_id])),
        }
        writes = choices[step]
        ref = worker.lease(task_id).lease
        work = sent(Commit(writes=writes, lease=ref))
        self.sim.ends_lease[work.call_id] = (worker, ref)
        abort = sent(Commit(writes=(AbortTask(task_id=pick(self.known, victim)),)))
        items = [(self.sim.client, abort), (worker.peer, work)]
        out = self.sim.batch(*(items if abort_first else reversed(items)))
        assert isinstance(reply_to(out, self.sim.client, abort), Committed)
        if isinstance(reply_to(out, worker.peer, work), Committed) and step == "child":
            self.known.append(created.task_id)

    @precondition(lambda self: bool(self.known))
    @rule(index=picks, phases_stop_at_once=st.booleans())
    def abort_a_task(self, index: int, phases_stop_at_once: bool) -> None:
        """A client aborts a task; the phases it cancels may stop (release their lease) at once."""
        task_id = pick(self.known, index)
        before = self.sim.store.task(task_id)
        assert before is not None
        cancelled = set(self.cancelled())
        reply = self.sim.commit(AbortTask(task_id=task_id))
        assert isinstance(reply, Committed), reply
        assert reply.results == ((1,) if before.status != "terminal" and before.abort != "abort" else (0,))
        if phases_stop_at_once:
            for worker, cancelled_id in self.cancelled():
                if (worker, cancelled_id) not in cancelled:
                    assert isinstance(worker.release(cancelled_id), Ok)

    @precondition(lambda self: bool(self.cancelled()))
    @rule(index=picks, step=st.sampled_from(["advance", "complete", "child"]))
    def a_cancelled_phase_tries_to_commit(self, index: int, step: str) -> None:
        """A phase cancelled for an abort may not commit anything any more (it has not stopped yet)."""
        worker, task_id = self.cancelled()[index % len(self.cancelled())]
        choices: dict[str, tuple[Write, ...]] = {
            "advance": (advance(task_id, {"phase": "late"}),),
            "complete": (ended(task_id, "completed"),),
            "child": (child(task_id),),
        }
        writes = choices[step]
        head = self.sim.core.head_seq
        reply = worker.commit(task_id, *writes)
        assert isinstance(reply, Error) and reply.code == ErrorCode.STALE_LEASE, reply
        assert self.sim.core.head_seq == head

    @precondition(lambda self: bool(self.cancelled()))
    @rule(index=picks)
    def release_a_cancelled_lease(self, index: int) -> None:
        worker, task_id = self.cancelled()[index % len(self.cancelled())]
        assert isinstance(worker.release(task_id), Ok)

    @precondition(lambda self: bool(self.live_workers()))
    @rule(index=picks, replacements=st.integers(min_value=0, max_value=2), max_leases=st.integers(1, 3))
    def a_worker_leaves(self, index: int, replacements: int, max_leases: int) -> None:
        """A worker's connection ends (crash, kill, silence); others may attach (at most three stay attached)."""
        workers = self.live_workers()
        workers[index % len(workers)].leave()
        for _ in range(replacements if self.live_workers() else max(1, replacements)):
            if len(self.sim.workers) < MAX_WORKERS:
                self.add_worker(max_leases)

    @rule(by_ms=st.integers(min_value=1, max_value=2_000))
    def advance_the_clock(self, by_ms: int) -> None:
        """Time passes: due sleepers wake, and a restarted owner's grace for its workers to attach is over."""
        self.sim.batch(now_ms=self.sim.now_ms + by_ms)
        deadline = self.sim.core.next_deadline_ms()
        assert deadline is None or deadline > self.sim.now_ms, "a due sleeper was left sleeping"

    @rule(workers=st.integers(min_value=1, max_value=2), grace=st.booleans())
    def restart_the_owner(self, workers: int, grace: bool) -> None:
        """A new owner on the same database; with ``grace`` it orphans nothing until its workers had time to
        attach (as the real owner does for its first seconds)."""
        self.sim.restart(orphan_grace_ms=ORPHAN_GRACE_MS if grace else 0)
        for _ in range(workers):
            self.add_worker(2)

    # -------------------------------------------------------------------------------------- invariants

    @invariant()
    def memory_and_store_agree(self) -> None:
        records = self.stored()
        live_in_store = {record.task_id for record in self.sim.store.live_tasks()}
        assert live_in_store == {task_id for task_id, record in records.items() if record.status != "terminal"}
        assert self.sim.core.tasks.live_count == len(live_in_store)
        nodes = self.sim.graph()
        assert set(nodes) == live_in_store
        for task_id, record in records.items():
            assert self.sim.core.tasks.live(task_id) == (None if record.status == "terminal" else record)
            if record.status != "terminal":
                assert nodes[task_id].task == record
                holder = self.sim.holder(task_id)
                leased_to = nodes[task_id].leased_to
                assert (record.status == "running") == (leased_to is not None), (record, leased_to)
                assert leased_to == (None if holder is None else holder.name)
                if holder is not None:
                    assert holder.lease(task_id).lease.epoch == record.epoch

    @invariant()
    def every_live_task_is_in_one_consistent_state(self) -> None:
        for record in self.stored().values():
            status = record.status
            assert (record.held is not None) == (status == "completing"), record
            assert (record.outcome is not None) == (status == "terminal"), record
            assert record.abort in (None, "abort", "restart"), record
            if status == "terminal":
                continue
            assert (record.until_ms is not None) == (status == "sleeping"), record
            if status == "waiting":
                assert record.on and record.policy is not None, record
            elif status in ("running", "sleeping"):
                assert record.on == () and record.policy is None, record

    @invariant()
    def nothing_terminal_owns_live_ordinary_work(self) -> None:
        records = self.stored()
        for record in records.values():
            if record.status in ("terminal", "completing"):
                live = [
                    owned.task_id
                    for owned in self.owned_by(records, record.task_id)
                    if not owned.background and owned.status != "terminal"
                ]
                if record.status == "terminal":
                    assert not live, f"{record.task_id} is terminal but owns live work {live}"
                elif not live:
                    raise AssertionError(f"{record.task_id} is completing but owns no live work")

    @invariant()
    def restart_counts_stay_below_the_limit(self) -> None:
        for record in self.stored().values():
            if record.status in ("terminal", "completing"):  # a task that reached its limit ends (or holds its end)
                assert record.restarts <= record.restart_limit, record
            else:
                assert record.restarts < record.restart_limit, record

    @invariant()
    def terminal_tasks_never_change(self) -> None:
        for task_id, record in self.stored().items():
            if task_id in self.ended:
                assert record == self.ended[task_id], f"terminal task {task_id} changed"
            elif record.status == "terminal":
                self.ended[task_id] = record

    @invariant()
    def abort_marks_only_grow(self) -> None:
        """A mark is never taken back, and only an explicit abort replaces a restart mark (never the reverse)."""
        for task_id, record in self.stored().items():
            before = self.marks.get(task_id)
            if before is not None:
                assert record.abort is not None, f"the {before} mark of {task_id} was taken back"
                assert not (before == "abort" and record.abort == "restart"), f"{task_id}: restart replaced abort"
            if record.abort is not None:
                self.marks[task_id] = record.abort
            if record.outcome is not None and record.outcome.reason == "restart":
                assert self.marks.get(task_id) == "restart", record

    @invariant()
    def fail_fast_aborts_the_rest_once_one_did_not_complete(self) -> None:
        records = self.stored()
        for record in records.values():
            if record.status != "waiting" or record.policy != "fail_fast":
                continue
            outcomes = [records[task_id].outcome for task_id in record.on]
            if any(outcome is not None and outcome.status != "completed" for outcome in outcomes):
                unmarked = [
                    task_id
                    for task_id in record.on
                    if records[task_id].status not in ("terminal", "completing") and records[task_id].abort != "abort"
                ]
                assert not unmarked, f"{record.task_id} fails fast, yet {unmarked} are not marked for abort"

    @invariant()
    def the_owner_needs_no_more_batches(self) -> None:
        assert not self.sim.core.needs_settle(self.sim.now_ms)


# About 550 steps in all (examples end early): a second or two. The "ci" profile (tests/conftest.py) this inherits
# from makes CI explore the same examples every run.
TaskMachine.TestCase.settings = settings(
    max_examples=20,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_task_state_machine = TaskMachine.TestCase
