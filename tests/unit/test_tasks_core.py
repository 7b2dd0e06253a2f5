"""The task engine, sans-IO: OwnerCore over a real SqliteStore on a temp file, driven batch by batch as the shell
drives it (``store.begin(); core.handle(...) for each frame; core.settle(now); store.commit(); core.take_output()``),
with workers simulated as peers that announce capabilities, take ``Lease`` / ``CancelLease`` events and answer with
commits under their lease or ``Release`` frames.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import pytest

from protocol import (
    SUPPORTED_VERSIONS,
    AbortTask,
    AdvanceClock,
    Announce,
    AppendEntry,
    CancelLease,
    Capability,
    ClockReply,
    Commit,
    Committed,
    CreateConversation,
    CreateTask,
    Error,
    ErrorCode,
    Frame,
    Hello,
    JsonValue,
    Lease,
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
    Welcome,
    Write,
)
from storage_owner.core import Output, OwnerCore, PeerId
from storage_owner.store import SqliteStore

TOKEN = "test-token"
INSTANCE = "01890a5d-0000-7000-8000-00000000abcd"
START_MS = 1_700_000_000_000
KIND = "demo.job"
MAX_DRAIN_BATCHES = 100

FrameT = TypeVar("FrameT")

_ids = itertools.count(1)
_calls = itertools.count(1)


def fresh_id() -> str:
    """A new canonical id, unique within the test run (deterministic, unlike ``new_id``)."""
    return f"00000000-0000-7000-8000-{next(_ids):012x}"


def call() -> int:
    return next(_calls)


def expect(frame: object, kind: type[FrameT]) -> FrameT:
    assert isinstance(frame, kind), frame
    return frame


def error_code(frame: object) -> str:
    return expect(frame, Error).code


# ------------------------------------------------------------------------------------------- write builders


def child(owner_task_id: str, *, kind: str = KIND, background: bool = False, task_id: str | None = None) -> CreateTask:
    return CreateTask(
        task_id=task_id or fresh_id(),
        kind=kind,
        input=JsonValue({"owner": owner_task_id}),
        owner_task_id=owner_task_id,
        background=background,
    )


def advance(task_id: str, checkpoint: Any) -> SetTaskState:
    return SetTaskState(task_id=task_id, status="running", checkpoint=JsonValue(checkpoint))


def waiting(
    task_id: str,
    on: Sequence[str],
    policy: Literal["all_settled", "fail_fast"] = "all_settled",
    checkpoint: Any = None,
) -> SetTaskState:
    return SetTaskState(
        task_id=task_id,
        status="waiting",
        on=tuple(on),
        policy=policy,
        checkpoint=JsonValue({"phase": "after_wait"} if checkpoint is None else checkpoint),
    )


def sleeping(task_id: str, until_ms: int, checkpoint: Any = None) -> SetTaskState:
    return SetTaskState(
        task_id=task_id,
        status="sleeping",
        until_ms=until_ms,
        checkpoint=JsonValue({"phase": "after_sleep"} if checkpoint is None else checkpoint),
    )


def ended(task_id: str, status: Literal["completed", "failed", "aborted", "faulted"], **outcome: Any) -> SetTaskState:
    return SetTaskState(task_id=task_id, status="terminal", outcome=TaskOutcome(status=status, **outcome))


def completed(task_id: str, result: Any = None) -> SetTaskState:
    return ended(task_id, "completed", result=JsonValue(result))


def failed(task_id: str, error: str = "boom") -> SetTaskState:
    return ended(task_id, "failed", error=error)


def aborted(task_id: str) -> SetTaskState:
    return ended(task_id, "aborted")


# ------------------------------------------------------------------------------------------------- driver


class Worker:
    """A simulated worker peer: the leases it holds now, the cancellations it was sent, every lease it got."""

    def __init__(self, sim: OwnerSim, peer: PeerId, name: str) -> None:
        self.sim = sim
        self.peer = peer
        self.name = name
        self.leases: dict[str, Lease] = {}
        self.cancelled: dict[str, CancelLease] = {}
        self.granted: list[Lease] = []
        self.gone = False

    def lease(self, task_id: str) -> Lease:
        assert task_id in self.leases, f"{self.name} holds no lease on {task_id}: {sorted(self.leases)}"
        return self.leases[task_id]

    def holds(self, task_id: str) -> bool:
        return task_id in self.leases

    def commit(self, task_id: str, *writes: Write, lease: LeaseRef | None = None) -> Frame:
        """Commit ``writes`` under this worker's lease on ``task_id`` (or ``lease``); the reply."""
        ref = lease if lease is not None else self.lease(task_id).lease
        reply = self.sim.request(self.peer, Commit(call_id=call(), writes=writes, lease=ref))
        if isinstance(reply, Committed) and any(
            isinstance(write, SetTaskState) and write.task_id == ref.task_id for write in writes
        ):
            self._lease_ended(ref)
        return reply

    def ok(self, task_id: str, *writes: Write) -> Committed:
        return expect(self.commit(task_id, *writes), Committed)

    def release(self, task_id: str, migration_error: str | None = None) -> Frame:
        ref = self.lease(task_id).lease
        reply = self.sim.request(self.peer, Release(call_id=call(), lease=ref, migration_error=migration_error))
        if isinstance(reply, Ok):
            self._lease_ended(ref)
        return reply

    def leave(self, *, settle: bool = True) -> None:
        """The connection ends (crash, kill, heartbeat timeout); the next batch settles its cut-off leases."""
        self.sim.core.detach(self.peer)
        self.gone = True
        self.leases.clear()
        self.cancelled.clear()
        self.sim.workers.pop(self.peer, None)
        if settle:
            self.sim.batch()

    def _lease_ended(self, ref: LeaseRef) -> None:
        held = self.leases.get(ref.task_id)
        if held is not None and held.lease == ref:  # a new lease granted in the same batch stays
            del self.leases[ref.task_id]
            self.cancelled.pop(ref.task_id, None)


class OwnerSim:
    """One OwnerCore over one SqliteStore, driven like the shell: every batch settles, and batches run while the
    core says it needs settling (as the commit loop does)."""

    def __init__(self, path: Path, *, clock: Literal["wall", "manual"] = "wall", orphan_blocked: bool = True) -> None:
        self.path = path
        self.clock: Literal["wall", "manual"] = clock
        self._peer_ids = itertools.count(1)
        self.store = SqliteStore.open(str(path))
        self.core = OwnerCore(self.store, token=TOKEN, instance=INSTANCE, clock=clock, orphan_blocked=orphan_blocked)
        self.now_ms = START_MS if clock == "wall" else self.core.stored_clock_ms()
        self.workers: dict[PeerId, Worker] = {}
        self.granted: list[Lease] = []
        """Every lease granted, in order, across owner restarts."""
        self.client = self.connect("client")

    # ------------------------------------------------------------------ lifecycle

    def restart(self, *, orphan_blocked: bool = True, settle: bool = True) -> None:
        """A new owner process on the same database: every peer of the old one is gone."""
        for worker in list(self.workers.values()):
            worker.gone = True
            worker.leases.clear()
        self.workers.clear()
        self.store.close()
        self.store = SqliteStore.open(str(self.path))
        self.core = OwnerCore(
            self.store, token=TOKEN, instance=INSTANCE, clock=self.clock, orphan_blocked=orphan_blocked
        )
        if self.clock == "manual":
            self.now_ms = self.core.stored_clock_ms()
        self.client = self.connect("client")
        if settle:
            self.batch()

    def close(self) -> None:
        self.store.close()

    def connect(self, role: str, name: str = "") -> PeerId:
        answer = self.core.hello(Hello(protocol_version=SUPPORTED_VERSIONS[-1], token=TOKEN, role=role))
        assert isinstance(answer, Welcome), answer
        peer = next(self._peer_ids)
        self.core.attach(peer, role, peer_name=name, now_ms=self.now_ms)
        return peer

    def worker(
        self,
        kinds: Sequence[str] = (KIND,),
        *,
        version: int = 1,
        migrates: bool = False,
        restart_limit: int = 5,
        max_leases: int = 64,
        name: str | None = None,
    ) -> Worker:
        """Attach a worker that announces ``kinds``; leases granted by the same batch are already dispatched."""
        name = name or f"worker-{next(_ids)}"
        peer = self.connect("worker", name)
        worker = Worker(self, peer, name)
        self.workers[peer] = worker
        capabilities = tuple(
            Capability(kind="task", name=kind, version=version, migrates=migrates, restart_limit=restart_limit)
            for kind in kinds
        )
        announce = Announce(
            call_id=call(), pid=1000 + peer, host="test", app="tests", capabilities=capabilities, max_leases=max_leases
        )
        expect(self.request(peer, announce), Ok)
        return worker

    # ------------------------------------------------------------------ batches

    def batch(self, *items: tuple[PeerId, Frame], now_ms: int | None = None, drain: bool = True) -> list[Output]:
        """Run one batch (and, with ``drain``, the batches the core asks for next); everything they sent."""
        if now_ms is not None:
            self.now_ms = now_ms
        out = self._one_batch(items)
        for _ in range(MAX_DRAIN_BATCHES):
            if not drain or not self.core.needs_settle(self.now_ms):
                return out
            out.extend(self._one_batch(()))
        raise AssertionError("the core never stopped asking for batches")

    def _one_batch(self, items: Sequence[tuple[PeerId, Frame]]) -> list[Output]:
        self.store.begin()
        for peer, frame in items:
            self.core.handle(peer, frame, self.now_ms)
        self.core.settle(self.now_ms)
        self.store.commit()
        out, effects = self.core.take_output()
        if effects.clock_ms is not None:
            self.now_ms = effects.clock_ms
        self._dispatch(out)
        return out

    def _dispatch(self, out: list[Output]) -> None:
        for peer, frame in out:
            worker = self.workers.get(peer)
            if isinstance(frame, Lease):
                assert worker is not None, f"lease {frame} sent to a peer that is no worker"
                worker.leases[frame.lease.task_id] = frame
                worker.cancelled.pop(frame.lease.task_id, None)
                worker.granted.append(frame)
                self.granted.append(frame)
            elif isinstance(frame, CancelLease):
                assert worker is not None
                worker.cancelled[frame.lease.task_id] = frame

    def request(self, peer: PeerId, frame: Frame) -> Frame:
        """Run ``frame`` alone in a batch and return its one reply."""
        return reply_to(self.batch((peer, frame)), peer, frame)

    # ------------------------------------------------------------------ client requests

    def commit(self, *writes: Write) -> Frame:
        return self.request(self.client, Commit(call_id=call(), writes=writes))

    def new_conversation(self, owner_task_id: str | None = None) -> str:
        conversation_id = fresh_id()
        expect(self.commit(CreateConversation(conversation_id=conversation_id, owner_task_id=owner_task_id)), Committed)
        return conversation_id

    def create_task(
        self,
        kind: str = KIND,
        input: Any = None,
        *,
        conversation_id: str | None = None,
        version: int = 0,
        background: bool = False,
        abandon_on_restart: bool = False,
    ) -> str:
        """A task owned by ``conversation_id`` (a new conversation when ``None``), created by the client."""
        if conversation_id is None:
            conversation_id = self.new_conversation()
        task_id = fresh_id()
        write = CreateTask(
            task_id=task_id,
            kind=kind,
            version=version,
            input=JsonValue({"n": 1} if input is None else input),
            conversation_id=conversation_id,
            background=background,
            abandon_on_restart=abandon_on_restart,
        )
        expect(self.commit(write), Committed)
        return task_id

    def abort(self, task_id: str) -> Committed:
        return expect(self.commit(AbortTask(task_id=task_id)), Committed)

    def graph(self) -> dict[str, TaskNode]:
        reply = expect(self.request(self.client, ReadTaskGraph(call_id=call())), TaskGraphReply)
        return {node.task.task_id: node for node in reply.nodes}

    def outcomes(self, *task_ids: str) -> tuple[TaskOutcome | None, ...]:
        return expect(self.request(self.client, ReadOutcomes(call_id=call(), task_ids=task_ids)), OutcomesReply).outcomes

    # ------------------------------------------------------------------ inspection

    def task(self, task_id: str) -> TaskRecord:
        """The stored record, checked against the core's memory (a live task) or its absence (a terminal one)."""
        stored = self.store.task(task_id)
        assert stored is not None, f"task {task_id} is not stored"
        live = self.core.tasks.live(task_id)
        if stored.status == "terminal":
            assert live is None, live
        else:
            assert live == stored, (live, stored)
        return stored

    def status(self, task_id: str) -> str:
        return self.task(task_id).status

    def outcome(self, task_id: str) -> TaskOutcome:
        record = self.task(task_id)
        assert record.status == "terminal" and record.outcome is not None, record
        return record.outcome

    def holder(self, task_id: str) -> Worker | None:
        holders = [worker for worker in self.workers.values() if worker.holds(task_id)]
        assert len(holders) <= 1, holders
        return holders[0] if holders else None


def reply_to(out: list[Output], peer: PeerId, frame: Frame) -> Frame:
    call_id = getattr(frame, "call_id", None)
    matching = [
        sent
        for to, sent in out
        if to == peer and not isinstance(sent, Lease | CancelLease) and getattr(sent, "call_id", None) == call_id
    ]
    assert len(matching) == 1, out
    return matching[0]


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[OwnerSim]:
    opened = OwnerSim(tmp_path / "tasks.db")
    yield opened
    opened.close()


@pytest.fixture
def manual_sim(tmp_path: Path) -> Iterator[OwnerSim]:
    opened = OwnerSim(tmp_path / "manual.db", clock="manual")
    yield opened
    opened.close()


# ---------------------------------------------------------------------------------------------- lifecycle


def test_created_task_is_leased_at_epoch_1_and_completes(sim: OwnerSim) -> None:
    worker = sim.worker()
    task_id = sim.create_task(input={"order": 7})
    lease = worker.lease(task_id)
    assert lease.lease == LeaseRef(task_id=task_id, epoch=1)
    assert (lease.mode, lease.kind, lease.version, lease.checkpoint) == ("phase", KIND, 1, None)
    assert lease.input == {"order": 7}
    assert (lease.restarts, lease.abort, lease.owner_task_id) == (0, None, None)
    record = sim.task(task_id)
    assert (record.status, record.epoch, record.version, record.restart_limit) == ("running", 1, 1, 5)
    assert sim.graph()[task_id].leased_to == worker.name

    wait = WaitTask(call_id=call(), task_id=task_id)
    out = sim.batch((sim.client, wait))
    assert not [frame for peer, frame in out if peer == sim.client], "wait_task answered before the task ended"
    assert sim.outcomes(task_id) == (None,)

    reply = worker.commit(task_id, completed(task_id, {"receipt": 1}))
    assert isinstance(reply, Committed)
    answered = [frame for peer, frame in sim.core.take_output()[0] if peer == sim.client]
    assert answered == []  # everything was taken with the batch
    record = sim.task(task_id)
    assert record.status == "terminal"
    assert record.outcome == TaskOutcome(status="completed", result=JsonValue({"receipt": 1}))
    assert record.seq == reply.seq
    assert sim.core.tasks.live(task_id) is None
    assert not worker.leases


def test_wait_task_is_answered_in_the_batch_that_ends_the_task(sim: OwnerSim) -> None:
    worker = sim.worker()
    task_id = sim.create_task()
    wait = WaitTask(call_id=call(), task_id=task_id)
    sim.batch((sim.client, wait))
    end = Commit(call_id=call(), writes=(completed(task_id, 5),), lease=worker.lease(task_id).lease)
    out = sim.batch((worker.peer, end))
    answer = expect(reply_to(out, sim.client, wait), TaskReply)
    assert answer.task.status == "terminal"
    assert answer.task.outcome == TaskOutcome(status="completed", result=JsonValue(5))
    assert answer.input == {"n": 1}
    # Asked again once terminal: answered at once.
    again = expect(sim.request(sim.client, WaitTask(call_id=call(), task_id=task_id)), TaskReply)
    assert again.task == answer.task
    assert error_code(sim.request(sim.client, WaitTask(call_id=call(), task_id=fresh_id()))) == ErrorCode.NOT_FOUND


def test_read_task_outcomes_and_graph_reply(sim: OwnerSim) -> None:
    worker = sim.worker()
    task_id = sim.create_task(input={"x": [1, 2]})
    worker.ok(task_id, advance(task_id, {"phase": "two", "k": 1}))
    read = expect(sim.request(sim.client, ReadTask(call_id=call(), task_id=task_id)), TaskReply)
    assert read.input == {"x": [1, 2]}
    assert read.checkpoint == {"phase": "two", "k": 1}
    assert read.task == sim.task(task_id)
    assert read.task.phase == "two"
    node = sim.graph()[task_id]
    assert (node.blocked, node.leased_to, node.task.status) == (None, worker.name, "running")

    worker.ok(task_id, failed(task_id, "no stock"))
    assert sim.outcomes(task_id) == (TaskOutcome(status="failed", error="no stock"),)
    assert task_id not in sim.graph()
    read = expect(sim.request(sim.client, ReadTask(call_id=call(), task_id=task_id)), TaskReply)
    assert read.checkpoint == {"phase": "two", "k": 1}  # an end keeps the last checkpoint
    unknown = fresh_id()
    assert error_code(sim.request(sim.client, ReadTask(call_id=call(), task_id=unknown))) == ErrorCode.NOT_FOUND
    missing = ReadOutcomes(call_id=call(), task_ids=(task_id, unknown))
    assert error_code(sim.request(sim.client, missing)) == ErrorCode.NOT_FOUND


# ------------------------------------------------------------------------------------------- leases, epochs


def test_advance_stores_the_checkpoint_and_leases_again_at_the_next_epoch(sim: OwnerSim) -> None:
    worker = sim.worker()
    task_id = sim.create_task()
    first = worker.lease(task_id)
    reply = worker.ok(task_id, advance(task_id, {"phase": "b"}))
    second = worker.lease(task_id)
    assert second.lease == LeaseRef(task_id=task_id, epoch=2)
    assert second.checkpoint == {"phase": "b"}
    assert second.mode == "phase"
    record = sim.task(task_id)
    assert (record.status, record.phase, record.epoch) == ("running", "b", 2)
    assert record.seq == reply.seq + 1  # granted by the settling commit, logged after the request's

    head = sim.core.head_seq
    stored = sim.store.task(task_id)
    log_before = sim.store.read_log(0, None, 1000)
    stale = worker.commit(task_id, completed(task_id), lease=first.lease)
    assert error_code(stale) == ErrorCode.STALE_LEASE
    stale = worker.commit(task_id, child(task_id), advance(task_id, {"phase": "z"}), lease=first.lease)
    assert error_code(stale) == ErrorCode.STALE_LEASE
    assert sim.core.head_seq == head == sim.store.head_seq()
    assert sim.store.task(task_id) == stored
    assert sim.store.read_log(0, None, 1000) == log_before
    assert sim.core.tasks.live_count == 1
    assert expect(sim.request(sim.client, ReadTask(call_id=call(), task_id=task_id)), TaskReply).checkpoint == {
        "phase": "b"
    }
    # The current lease still commits.
    worker.ok(task_id, completed(task_id))
    assert sim.outcome(task_id).status == "completed"


def test_two_commits_under_one_lease_in_one_batch_the_second_is_stale(sim: OwnerSim) -> None:
    worker = sim.worker()
    task_id = sim.create_task()
    ref = worker.lease(task_id).lease
    first = Commit(call_id=call(), writes=(advance(task_id, {"phase": "b"}),), lease=ref)
    second = Commit(call_id=call(), writes=(completed(task_id),), lease=ref)
    out = sim.batch((worker.peer, first), (worker.peer, second))
    assert isinstance(reply_to(out, worker.peer, first), Committed)
    assert error_code(reply_to(out, worker.peer, second)) == ErrorCode.STALE_LEASE
    assert sim.task(task_id).status == "running"
    assert worker.lease(task_id).lease.epoch == 2


def test_commits_under_a_lease_that_is_not_the_peers_own_are_refused(sim: OwnerSim) -> None:
    one = sim.worker()
    task_id = sim.create_task()
    other_task = sim.create_task()
    two = sim.worker()
    assert one.holds(task_id) and one.holds(other_task)
    ref = one.lease(task_id).lease
    stored = sim.store.task(task_id)
    head = sim.core.head_seq

    # Another worker under one's lease.
    assert error_code(two.commit(task_id, completed(task_id), lease=ref)) == ErrorCode.STALE_LEASE
    # A client under a lease.
    stolen = Commit(call_id=call(), writes=(completed(task_id),), lease=ref)
    assert error_code(sim.request(sim.client, stolen)) == ErrorCode.NOT_ALLOWED
    # A state without a lease.
    assert error_code(sim.commit(completed(task_id))) == ErrorCode.NOT_ALLOWED
    assert error_code(sim.request(one.peer, Commit(call_id=call(), writes=(completed(task_id),)))) == (
        ErrorCode.NOT_ALLOWED
    )
    # A state of another task, even one this worker holds too.
    assert error_code(one.commit(task_id, completed(other_task))) == ErrorCode.NOT_ALLOWED
    # Releasing someone else's lease.
    foreign_release = Release(call_id=call(), lease=ref)
    assert error_code(sim.request(two.peer, foreign_release)) == ErrorCode.STALE_LEASE

    assert sim.core.head_seq == head
    assert sim.store.task(task_id) == stored
    assert one.holds(task_id) and one.holds(other_task)
    one.ok(task_id, completed(task_id))
    one.ok(other_task, completed(other_task))


@pytest.mark.xfail(
    strict=True, reason="BUG: two SetTaskState of the leased task in one commit raise KeyError out of the core"
)
def test_two_states_of_the_leased_task_in_one_commit_are_refused(sim: OwnerSim) -> None:
    worker = sim.worker()
    task_id = sim.create_task()
    head = sim.core.head_seq
    reply = worker.commit(task_id, advance(task_id, {"phase": "b"}), completed(task_id))
    assert error_code(reply) in (ErrorCode.INVALID, ErrorCode.NOT_ALLOWED)
    assert sim.core.head_seq == head
    assert sim.task(task_id).status == "running"
    worker.ok(task_id, completed(task_id))


# -------------------------------------------------------------------------------------------------- waiting


def test_parent_waits_all_settled_and_resumes_only_when_every_child_is_terminal(sim: OwnerSim) -> None:
    worker = sim.worker()
    parent = sim.create_task()
    first, second = child(parent), child(parent)
    worker.ok(parent, first, second, waiting(parent, [first.task_id, second.task_id], checkpoint={"phase": "sum"}))
    record = sim.task(parent)
    assert (record.status, record.on, record.policy, record.phase) == (
        "waiting",
        (first.task_id, second.task_id),
        "all_settled",
        "sum",
    )
    assert not worker.holds(parent)
    lease = worker.lease(first.task_id)
    assert (lease.owner_task_id, lease.conversation_id) == (parent, record.conversation_id)
    assert sim.task(first.task_id).conversation_id == record.conversation_id

    worker.ok(first.task_id, completed(first.task_id, 1))
    assert sim.status(parent) == "waiting"
    assert not worker.holds(parent)
    worker.ok(second.task_id, failed(second.task_id, "no"))
    resumed = worker.lease(parent)
    assert resumed.lease.epoch == 2
    assert resumed.checkpoint == {"phase": "sum"}
    assert sim.outcomes(first.task_id, second.task_id) == (
        TaskOutcome(status="completed", result=JsonValue(1)),
        TaskOutcome(status="failed", error="no"),
    )
    worker.ok(parent, completed(parent))
    assert sim.outcome(parent).status == "completed"


def test_wait_on_nothing_or_on_ended_tasks_resumes_at_once(sim: OwnerSim) -> None:
    worker = sim.worker()
    parent = sim.create_task()
    worker.ok(parent, waiting(parent, [], checkpoint={"phase": "again"}))
    assert worker.lease(parent).lease.epoch == 2
    assert worker.lease(parent).checkpoint == {"phase": "again"}
    assert sim.status(parent) == "running"

    done = child(parent)
    worker.ok(parent, done)
    worker.ok(done.task_id, completed(done.task_id))
    worker.ok(parent, waiting(parent, [done.task_id], checkpoint={"phase": "third"}))
    assert worker.lease(parent).lease.epoch == 3
    assert worker.lease(parent).checkpoint == {"phase": "third"}


def test_bad_waits_are_refused_and_leave_the_lease_valid(sim: OwnerSim) -> None:
    worker = sim.worker()
    root = sim.create_task()
    middle = child(root)
    worker.ok(root, middle)
    leaf = child(middle.task_id)
    worker.ok(middle.task_id, leaf)
    stranger = sim.create_task()
    sibling = child(middle.task_id)
    worker.ok(middle.task_id, sibling)
    head = sim.core.head_seq
    stored = sim.store.task(leaf.task_id)

    def refused(on: Sequence[str], policy: Literal["all_settled", "fail_fast"] = "all_settled") -> str:
        return error_code(worker.commit(leaf.task_id, waiting(leaf.task_id, on, policy)))

    assert refused([leaf.task_id]) == ErrorCode.INVALID  # itself
    assert refused([middle.task_id]) == ErrorCode.INVALID  # its owner
    assert refused([stranger, root]) == ErrorCode.INVALID  # its owner's owner
    assert refused([fresh_id()]) == ErrorCode.NOT_FOUND
    assert refused(["not-an-id"]) == ErrorCode.INVALID
    assert refused([sibling.task_id], "fail_fast") == ErrorCode.INVALID  # not its own
    assert refused([stranger], "fail_fast") == ErrorCode.INVALID
    # The owner may not fail_fast on its grandchild either.
    assert error_code(worker.commit(root, waiting(root, [leaf.task_id], "fail_fast"))) == ErrorCode.INVALID
    assert sim.core.head_seq == head
    assert sim.store.task(leaf.task_id) == stored
    # all_settled over tasks it does not own is fine.
    worker.ok(leaf.task_id, waiting(leaf.task_id, [sibling.task_id, stranger]))
    assert sim.status(leaf.task_id) == "waiting"


def test_fail_fast_aborts_the_rest_and_resumes_once_all_are_terminal(sim: OwnerSim) -> None:
    worker = sim.worker()
    parent = sim.create_task()
    kids = [child(parent) for _ in range(3)]
    ids = [kid.task_id for kid in kids]
    worker.ok(parent, *kids, waiting(parent, ids, "fail_fast", {"phase": "decide"}))
    first, second, third = ids
    assert all(worker.holds(task_id) for task_id in ids)

    reply = worker.ok(first, failed(first, "card declined"))
    for task_id in (second, third):
        record = sim.task(task_id)
        assert record.abort == "abort", record
        assert record.seq == reply.seq + 1  # the marks are the settling commit's
        assert worker.cancelled[task_id].lease == worker.lease(task_id).lease
    assert sim.status(parent) == "waiting"
    # A cancelled phase may not commit any more.
    assert error_code(worker.commit(second, completed(second))) == ErrorCode.STALE_LEASE

    expect(worker.release(second), Ok)
    handler = worker.lease(second)
    assert (handler.mode, handler.abort, handler.lease.epoch) == ("abort", "abort", 2)
    assert error_code(worker.commit(second, advance(second, {"phase": "x"}))) == ErrorCode.INVALID
    assert error_code(worker.commit(second, completed(second))) == ErrorCode.INVALID
    worker.ok(second, aborted(second))
    assert sim.status(parent) == "waiting"
    assert not worker.holds(parent)

    expect(worker.release(third), Ok)
    assert worker.lease(third).mode == "abort"
    worker.ok(third, aborted(third))
    assert worker.lease(parent).checkpoint == {"phase": "decide"}
    assert [outcome.status if outcome else None for outcome in sim.outcomes(*ids)] == ["failed", "aborted", "aborted"]
    assert all(sim.task(task_id).restarts == 0 for task_id in ids)


def test_fail_fast_over_a_child_that_already_failed_aborts_the_others_at_once(sim: OwnerSim) -> None:
    worker = sim.worker()
    parent = sim.create_task()
    early, late = child(parent), child(parent)
    worker.ok(parent, early, late)
    worker.ok(early.task_id, failed(early.task_id))
    worker.ok(parent, waiting(parent, [early.task_id, late.task_id], "fail_fast"))
    assert sim.task(late.task_id).abort == "abort"
    assert late.task_id in worker.cancelled
    worker.release(late.task_id)
    worker.ok(late.task_id, aborted(late.task_id))
    assert worker.lease(parent).lease.epoch == 2  # creating children under a lease does not end the phase


def test_fail_fast_where_every_child_completes_aborts_nothing(sim: OwnerSim) -> None:
    worker = sim.worker()
    parent = sim.create_task()
    kids = [child(parent) for _ in range(2)]
    worker.ok(parent, *kids, waiting(parent, [kid.task_id for kid in kids], "fail_fast"))
    for kid in kids:
        worker.ok(kid.task_id, completed(kid.task_id))
    assert not worker.cancelled
    assert all(sim.task(kid.task_id).abort is None for kid in kids)
    assert worker.holds(parent)


# --------------------------------------------------------------------------------------------------- abort


def abort_leases(sim: OwnerSim) -> list[str]:
    return [lease.lease.task_id for lease in sim.granted if lease.mode == "abort"]


def test_abort_runs_bottom_up_and_leaves_background_work_alone(sim: OwnerSim) -> None:
    worker = sim.worker()
    root = sim.create_task()
    middle, background = child(root), child(root, background=True)
    worker.ok(root, middle, background)
    leaf = child(middle.task_id)
    worker.ok(middle.task_id, leaf)
    tree = [root, middle.task_id, leaf.task_id]
    assert all(worker.holds(task_id) for task_id in [*tree, background.task_id])

    mark = sim.abort(root)
    assert mark.results == (1,)
    assert sim.abort(root).results == (0,)  # already marked
    assert sim.task(root).seq == mark.seq
    for task_id in tree[1:]:
        assert sim.task(task_id).abort == "abort"
        assert sim.task(task_id).seq == mark.seq + 1  # cascaded by the settling commit
    for task_id in tree:
        assert worker.cancelled[task_id].lease == worker.lease(task_id).lease
    assert sim.task(background.task_id).abort is None
    assert background.task_id not in worker.cancelled

    # The owners give their phases back first: nothing is handed out while they own live ordinary work.
    worker.release(root)
    worker.release(middle.task_id)
    assert abort_leases(sim) == []
    assert sim.status(root) == sim.status(middle.task_id) == "pending"
    worker.release(leaf.task_id)
    assert abort_leases(sim) == [leaf.task_id]
    assert worker.lease(leaf.task_id).abort == "abort"
    worker.ok(leaf.task_id, aborted(leaf.task_id))
    assert abort_leases(sim) == [leaf.task_id, middle.task_id]
    worker.ok(middle.task_id, aborted(middle.task_id))
    assert abort_leases(sim) == [leaf.task_id, middle.task_id, root]
    worker.ok(root, aborted(root))
    # The root ends although its background child still runs.
    assert sim.outcome(root).status == "aborted"
    assert sim.status(background.task_id) == "running"
    worker.ok(background.task_id, completed(background.task_id))
    assert sim.outcome(background.task_id).status == "completed"
    assert [sim.outcome(task_id).status for task_id in tree] == ["aborted"] * 3
    assert all(sim.task(task_id).restarts == 0 for task_id in tree)


def test_abort_of_waiting_owners_cancels_only_running_phases(sim: OwnerSim) -> None:
    worker = sim.worker()
    root = sim.create_task()
    middle = child(root)
    worker.ok(root, middle, waiting(root, [middle.task_id]))
    leaf = child(middle.task_id)
    worker.ok(middle.task_id, leaf, waiting(middle.task_id, [leaf.task_id]))
    sim.abort(root)
    assert set(worker.cancelled) == {leaf.task_id}
    assert sim.status(root) == sim.status(middle.task_id) == "waiting"
    worker.release(leaf.task_id)
    worker.ok(leaf.task_id, aborted(leaf.task_id))
    # The middle's wait is over and its mark is due: its handler runs, never its next phase.
    lease = worker.lease(middle.task_id)
    assert (lease.mode, lease.checkpoint) == ("abort", {"phase": "after_wait"})
    worker.ok(middle.task_id, ended(middle.task_id, "faulted", error="handler gave up"))
    assert worker.lease(root).mode == "abort"
    worker.ok(root, aborted(root))
    assert abort_leases(sim) == [leaf.task_id, middle.task_id, root]
    assert sim.outcome(middle.task_id).status == "faulted"


def test_abort_of_a_pending_task_leases_its_handler_and_never_a_phase(sim: OwnerSim) -> None:
    sim.worker(max_leases=1)
    busy = sim.create_task()
    queued = sim.create_task()
    worker = next(iter(sim.workers.values()))
    assert worker.holds(busy) and not worker.holds(queued)
    assert sim.status(queued) == "pending"
    sim.abort(queued)
    worker.ok(busy, completed(busy))
    lease = worker.lease(queued)
    assert (lease.mode, lease.checkpoint, lease.lease.epoch) == ("abort", None, 1)
    worker.ok(queued, aborted(queued))
    assert sim.outcome(queued).status == "aborted"


def test_abort_of_a_terminal_or_unknown_task(sim: OwnerSim) -> None:
    worker = sim.worker()
    task_id = sim.create_task()
    worker.ok(task_id, completed(task_id))
    stored = sim.store.task(task_id)
    assert sim.abort(task_id).results == (0,)
    assert sim.store.task(task_id) == stored
    assert error_code(sim.commit(AbortTask(task_id=fresh_id()))) == ErrorCode.NOT_FOUND


# ----------------------------------------------------------------------------------------------- completing


def test_completing_holds_the_outcome_until_owned_work_ends(sim: OwnerSim) -> None:
    worker = sim.worker()
    parent = sim.create_task()
    kid = child(parent)
    wait = WaitTask(call_id=call(), task_id=parent)
    sim.batch((sim.client, wait))
    worker.ok(parent, kid, completed(parent, "done"))
    record = sim.task(parent)
    assert record.status == "completing"
    assert record.held == TaskOutcome(status="completed", result=JsonValue("done"))
    assert record.outcome is None
    assert sim.outcomes(parent) == (None,)
    assert sim.task(kid.task_id).abort is None  # a completed held outcome aborts nothing
    end = Commit(call_id=call(), writes=(completed(kid.task_id),), lease=worker.lease(kid.task_id).lease)
    out = sim.batch((worker.peer, end))
    answer = expect(reply_to(out, sim.client, wait), TaskReply)
    assert answer.task.status == "terminal"
    assert answer.task.outcome == TaskOutcome(status="completed", result=JsonValue("done"))
    assert sim.outcome(parent) == answer.task.outcome
    assert sim.task(parent).held is None


def test_a_held_failure_aborts_the_owned_work(sim: OwnerSim) -> None:
    worker = sim.worker()
    parent = sim.create_task()
    kid = child(parent)
    worker.ok(parent, kid)
    worker.ok(parent, failed(parent, "gave up"))
    assert sim.status(parent) == "completing"
    assert sim.task(kid.task_id).abort == "abort"
    assert kid.task_id in worker.cancelled
    worker.release(kid.task_id)
    assert worker.lease(kid.task_id).mode == "abort"
    assert sim.status(parent) == "completing"
    worker.ok(kid.task_id, aborted(kid.task_id))
    assert sim.outcome(parent) == TaskOutcome(status="failed", error="gave up")
    assert sim.outcome(kid.task_id).status == "aborted"


def test_no_new_work_under_a_completing_marked_or_terminal_owner(sim: OwnerSim) -> None:
    worker = sim.worker()
    completing = sim.create_task()
    kid = child(completing)
    worker.ok(completing, kid, completed(completing))
    assert sim.status(completing) == "completing"
    marked = sim.create_task()
    sim.abort(marked)  # its phase is being cancelled
    ended_task = sim.create_task()
    worker.ok(ended_task, completed(ended_task))
    head = sim.core.head_seq
    for owner_id in (completing, marked, ended_task, fresh_id()):
        assert error_code(worker.commit(kid.task_id, child(owner_id))) == ErrorCode.CONFLICT
        assert error_code(sim.commit(child(owner_id))) == ErrorCode.CONFLICT
        owned = CreateConversation(conversation_id=fresh_id(), owner_task_id=owner_id)
        assert error_code(sim.commit(owned)) == ErrorCode.CONFLICT
    assert sim.core.head_seq == head
    assert sim.core.tasks.live_count == 3
