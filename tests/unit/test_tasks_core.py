"""The task engine, sans-IO: OwnerCore over the memory store, driven batch by batch as the shell
drives it (``store.begin(); core.run_batch(frames, now); store.commit(); core.take_output()``),
with workers simulated as peers that announce capabilities, take ``Lease`` / ``CancelLease`` events and answer with
commits under their lease or ``Release`` frames.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import attrs
import pytest

from protocol import (
    MAX_LEASES_PER_WORKER,
    MAX_RESTART_LIMIT,
    REPLY_TYPES,
    REQUEST_TYPES,
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
    ProtocolError,
    ReadOutcomes,
    ReadTask,
    ReadTaskGraph,
    Received,
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
    decode_frame,
    encode_frame,
)
from storage_owner.core import TASK_ROW_FIELDS, Output, OwnerCore, PeerId
from storage_owner.core._task_data import MAX_CACHED_BYTES, MAX_CACHED_TASKS, MAX_CACHED_VALUE_BYTES
from storage_owner.core._task_records import TRANSITIONS, IllegalTransition, check_transition
from storage_owner.core._task_settle import MAX_SETTLE_CHANGES
from storage_owner.store import MemoryStore
from tests.unit._stores import StoreUnderTest, reopened

TOKEN = "test-token"
INSTANCE = "01890a5d-0000-7000-8000-00000000abcd"
ROOT = Path(__file__).resolve().parents[2]
START_MS = 1_700_000_000_000
KIND = "demo.job"
MAX_DRAIN_BATCHES = 100
GRACE_MS = 2_000

FrameT = TypeVar("FrameT")

_ids = itertools.count(1)
_calls = itertools.count(1)


def fresh_id() -> str:
    """A new canonical id, unique within the test run (deterministic, unlike ``new_id``)."""
    return f"00000000-0000-7000-8000-{next(_ids):012x}"


def restart_ids() -> None:
    """Make the ids of a new database start over: a Hypothesis example that runs again then sees the same ids (the
    engine keeps tasks in sets, so their iteration order, and with it who gets leased first, follows the ids)."""
    global _ids
    _ids = itertools.count(1)


def call() -> int:
    return next(_calls)


def sent(frame: Frame) -> Received:
    """``frame`` as a request under a fresh call id, for :func:`reply_to`."""
    return Received(call(), frame)


def envelope(frame: Frame | Received) -> Received:
    """What the shell hands the core: a request under a fresh call id, anything else under none."""
    if isinstance(frame, Received):
        return frame
    return Received(call() if type(frame) in REQUEST_TYPES + REPLY_TYPES else None, frame)


def expect(frame: object, kind: type[FrameT]) -> FrameT:
    assert isinstance(frame, kind), frame
    return frame


def data(value: object) -> Any:
    """An application value (``JsonValue``) as a plain value to compare."""
    return value


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
        request = sent(Commit(writes=writes, lease=ref))
        if any(isinstance(write, SetTaskState) and write.task_id == ref.task_id for write in writes):
            self.sim.ends_lease[request.call_id] = (self, ref)  # if it is committed
        return self.sim.request(self.peer, request)

    def ok(self, task_id: str, *writes: Write) -> Committed:
        return expect(self.commit(task_id, *writes), Committed)

    def release(self, task_id: str, migration_error: str | None = None, *, closing: bool = False) -> Frame:
        ref = self.lease(task_id).lease
        request = sent(Release(lease=ref, migration_error=migration_error, closing=closing))
        self.sim.ends_lease[request.call_id] = (self, ref)
        return self.sim.request(self.peer, request)

    def leave(self, *, settle: bool = True) -> None:
        """The connection ends (crash, kill, heartbeat timeout); the next batch settles its cut-off leases."""
        self.sim.core.detach(self.peer)
        self.gone = True
        self.leases.clear()
        self.cancelled.clear()
        self.sim.workers.pop(self.peer, None)
        if settle:
            self.sim.batch()

    def lease_ended(self, ref: LeaseRef) -> None:
        held = self.leases.get(ref.task_id)
        if held is not None and held.lease == ref:  # a new lease granted in the same batch stays
            del self.leases[ref.task_id]
            self.cancelled.pop(ref.task_id, None)


class OwnerSim:
    """One OwnerCore over one store (a new memory store unless one is given), driven like the shell: every batch
    settles, and batches run while the core says it needs settling (as the commit loop does)."""

    def __init__(
        self,
        store: StoreUnderTest | None = None,
        *,
        clock: Literal["wall", "manual"] = "wall",
        orphan_grace_ms: int = 0,
    ) -> None:
        self.clock: Literal["wall", "manual"] = clock
        self._peer_ids = itertools.count(1)
        self.store: StoreUnderTest = MemoryStore() if store is None else store
        self.core = OwnerCore(self.store, token=TOKEN, instance=INSTANCE, clock=clock, orphan_grace_ms=orphan_grace_ms)
        self.now_ms = START_MS if clock == "wall" else self.core.stored_clock_ms()
        self.workers: dict[PeerId, Worker] = {}
        self.granted: list[Lease] = []
        """Every lease granted, in order, across owner restarts."""
        self.epochs: dict[str, int] = {}
        """The newest epoch granted per task, across owner restarts."""
        self.ends_lease: dict[int, tuple[Worker, LeaseRef]] = {}
        """Calls that end a worker's lease if they succeed (a commit of its next state, a release), by call id:
        applied in the order of the output, so a lease granted again by the same batch is seen after the end."""
        self.after_batch: Callable[[list[Output]], None] | None = None
        """Called after every batch with what it sent (the state machine checks its invariants there)."""
        self.client = self.connect("client")

    # ------------------------------------------------------------------ lifecycle

    def restart(self, *, orphan_grace_ms: int = 0, settle: bool = True) -> None:
        """A new owner process on the same database: every peer of the old one is gone."""
        for worker in list(self.workers.values()):
            worker.gone = True
            worker.leases.clear()
            worker.cancelled.clear()
        self.workers.clear()
        self.store.close()
        self.store = reopened(self.store)
        self.core = OwnerCore(
            self.store, token=TOKEN, instance=INSTANCE, clock=self.clock, orphan_grace_ms=orphan_grace_ms
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
        restart_limit: int | None = 5,
        max_leases: int = 64,
        name: str | None = None,
    ) -> Worker:
        """Attach a worker that announces ``kinds``; leases granted by the same batch are already dispatched."""
        worker = self.attach_worker(name)
        capabilities = tuple(
            Capability(kind="task", name=kind, version=version, migrates=migrates, restart_limit=restart_limit)
            for kind in kinds
        )
        announce = Announce(pid=1000, host="test", app="tests", capabilities=capabilities, max_leases=max_leases)
        expect(self.request(worker.peer, announce), Ok)
        return worker

    def attach_worker(self, name: str | None = None) -> Worker:
        """A worker connection that has not announced anything yet."""
        name = name or f"worker-{next(_ids)}"
        worker = Worker(self, self.connect("worker", name), name)
        self.workers[worker.peer] = worker
        return worker

    # ------------------------------------------------------------------ batches

    def batch(
        self, *items: tuple[PeerId, Frame | Received], now_ms: int | None = None, drain: bool = True
    ) -> list[Output]:
        """Run one batch (and, with ``drain``, the batches the core asks for next); everything they sent."""
        if now_ms is not None:
            self.now_ms = now_ms
        out = self._one_batch(items)
        for _ in range(MAX_DRAIN_BATCHES):
            if not drain or not self.core.needs_settle(self.now_ms):
                return out
            out.extend(self._one_batch(()))
        raise AssertionError("the core never stopped asking for batches")

    def _one_batch(self, items: Sequence[tuple[PeerId, Frame | Received]]) -> list[Output]:
        self.store.begin()
        self.core.run_batch([(peer, envelope(frame)) for peer, frame in items], self.now_ms)
        self.store.commit()
        out, effects = self.core.take_output()
        if effects.clock_ms is not None:
            self.now_ms = effects.clock_ms
        self._dispatch(out)
        if self.after_batch is not None:
            self.after_batch(out)
        return out

    def _dispatch(self, out: list[Output]) -> None:
        for peer, call_id, frame in out:
            worker = self.workers.get(peer)
            if isinstance(frame, Lease):
                assert worker is not None, f"lease {frame} sent to a peer that is no worker"
                task_id = frame.lease.task_id
                holders = [
                    other.name for other in self.workers.values() if other is not worker and other.holds(task_id)
                ]
                assert not holders, f"{task_id} leased to {worker.name} while {holders} still hold it"
                assert frame.lease.epoch > self.epochs.get(task_id, 0), f"epoch granted twice: {frame}"
                self.epochs[task_id] = frame.lease.epoch
                worker.leases[task_id] = frame
                worker.cancelled.pop(frame.lease.task_id, None)
                worker.granted.append(frame)
                self.granted.append(frame)
            elif isinstance(frame, CancelLease):
                assert worker is not None
                worker.cancelled[frame.lease.task_id] = frame
            else:
                ending = self.ends_lease.pop(call_id, None) if call_id is not None else None
                if ending is not None and isinstance(frame, Committed | Ok):
                    ending[0].lease_ended(ending[1])

    def request(self, peer: PeerId, frame: Frame | Received) -> Frame:
        """Run ``frame`` alone in a batch (under a fresh call id unless it has one) and return its one reply."""
        request = envelope(frame)
        return reply_to(self.batch((peer, request)), peer, request)

    # ------------------------------------------------------------------ client requests

    def commit(self, *writes: Write) -> Frame:
        return self.request(self.client, Commit(writes=writes))

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
        """Every live task's node, read page by page."""
        nodes: dict[str, TaskNode] = {}
        after: str | None = None
        while True:
            request = ReadTaskGraph(after_task_id=after, limit=50)
            reply = expect(self.request(self.client, request), TaskGraphReply)
            nodes.update((node.task.task_id, node) for node in reply.nodes)
            after = reply.next_after_task_id
            if after is None:
                return nodes

    def outcomes(self, *task_ids: str) -> tuple[TaskOutcome | None, ...]:
        return expect(self.request(self.client, ReadOutcomes(task_ids=task_ids)), OutcomesReply).outcomes

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


def reply_to(out: list[Output], peer: PeerId, request: Received) -> Frame:
    matching = [
        frame
        for to, call_id, frame in out
        if to == peer and not isinstance(frame, Lease | CancelLease) and call_id == request.call_id
    ]
    assert len(matching) == 1, out
    return matching[0]


@pytest.fixture
def sim() -> Iterator[OwnerSim]:
    opened = OwnerSim()
    yield opened
    opened.close()


@pytest.fixture
def manual_sim() -> Iterator[OwnerSim]:
    opened = OwnerSim(clock="manual")
    yield opened
    opened.close()


# ---------------------------------------------------------------------------------------------- lifecycle


def test_created_task_is_leased_at_epoch_1_and_completes(sim: OwnerSim) -> None:
    worker = sim.worker()
    task_id = sim.create_task(input={"order": 7})
    lease = worker.lease(task_id)
    assert lease.lease == LeaseRef(task_id=task_id, epoch=1)
    assert (lease.mode, lease.kind, lease.version, data(lease.checkpoint)) == ("phase", KIND, 1, None)
    assert data(lease.input) == {"order": 7}
    assert (lease.restarts, lease.abort, lease.owner_task_id) == (0, None, None)
    record = sim.task(task_id)
    assert (record.status, record.epoch, record.version, record.restart_limit) == ("running", 1, 1, 5)
    assert sim.graph()[task_id].leased_to == worker.name

    wait = sent(WaitTask(task_id=task_id))
    out = sim.batch((sim.client, wait))
    assert not [frame for peer, _, frame in out if peer == sim.client], "wait_task answered before the task ended"
    assert sim.outcomes(task_id) == (None,)

    reply = worker.commit(task_id, completed(task_id, {"receipt": 1}))
    assert isinstance(reply, Committed)
    record = sim.task(task_id)
    assert record.status == "terminal"
    assert record.outcome == TaskOutcome(status="completed", result=JsonValue({"receipt": 1}))
    assert record.seq == reply.seq
    assert sim.core.tasks.live(task_id) is None
    assert not worker.leases


def test_wait_task_is_answered_in_the_batch_that_ends_the_task(sim: OwnerSim) -> None:
    worker = sim.worker()
    task_id = sim.create_task()
    wait = sent(WaitTask(task_id=task_id))
    sim.batch((sim.client, wait))
    end = sent(Commit(writes=(completed(task_id, 5),), lease=worker.lease(task_id).lease))
    out = sim.batch((worker.peer, end))
    answer = expect(reply_to(out, sim.client, wait), TaskReply)
    assert answer.task.status == "terminal"
    assert answer.task.outcome == TaskOutcome(status="completed", result=JsonValue(5))
    assert data(answer.input) == {"n": 1}
    # Asked again once terminal: answered at once.
    again = expect(sim.request(sim.client, WaitTask(task_id=task_id)), TaskReply)
    assert again.task == answer.task
    assert error_code(sim.request(sim.client, WaitTask(task_id=fresh_id()))) == ErrorCode.NOT_FOUND


def test_a_wait_is_forgotten_with_its_connection_and_only_its_own(sim: OwnerSim) -> None:
    worker = sim.worker()
    task_id = sim.create_task()
    other = sim.connect("client")
    leaving = sim.connect("client")
    wait = sent(WaitTask(task_id=task_id))
    sim.batch((other, wait), (leaving, sent(WaitTask(task_id=task_id))), (leaving, sent(WaitTask(task_id=task_id))))
    sim.core.detach(leaving)
    out = sim.batch((worker.peer, sent(Commit(writes=(completed(task_id, 5),), lease=worker.lease(task_id).lease))))
    assert expect(reply_to(out, other, wait), TaskReply).task.status == "terminal"
    assert not [frame for peer, _, frame in out if peer == leaving]
    assert sim.core.waits._waits == {
        "task": {},
        "run": {},
        "submission": {},
    }  # nothing is left behind for the connection that ended


def test_read_task_outcomes_and_graph_reply(sim: OwnerSim) -> None:
    worker = sim.worker()
    task_id = sim.create_task(input={"x": [1, 2]})
    worker.ok(task_id, advance(task_id, {"phase": "two", "k": 1}))
    read = expect(sim.request(sim.client, ReadTask(task_id=task_id)), TaskReply)
    assert data(read.input) == {"x": [1, 2]}
    assert data(read.checkpoint) == {"phase": "two", "k": 1}
    assert read.task == sim.task(task_id)
    assert read.task.phase == "two"
    node = sim.graph()[task_id]
    assert (node.blocked, node.leased_to, node.task.status) == (None, worker.name, "running")

    worker.ok(task_id, failed(task_id, "no stock"))
    assert sim.outcomes(task_id) == (TaskOutcome(status="failed", error="no stock"),)
    assert task_id not in sim.graph()
    read = expect(sim.request(sim.client, ReadTask(task_id=task_id)), TaskReply)
    assert data(read.checkpoint) == {"phase": "two", "k": 1}  # an end keeps the last checkpoint
    unknown = fresh_id()
    assert error_code(sim.request(sim.client, ReadTask(task_id=unknown))) == ErrorCode.NOT_FOUND
    missing = ReadOutcomes(task_ids=(task_id, unknown))
    assert error_code(sim.request(sim.client, missing)) == ErrorCode.NOT_FOUND


def test_the_task_graph_is_read_in_pages_by_task_id(sim: OwnerSim) -> None:
    tasks = sorted(sim.create_task() for _ in range(7))
    pages: list[list[str]] = []
    after: str | None = None
    while True:
        reply = expect(sim.request(sim.client, ReadTaskGraph(after_task_id=after, limit=3)), TaskGraphReply)
        pages.append([node.task.task_id for node in reply.nodes])
        after = reply.next_after_task_id
        if after is None:
            break
        assert after == pages[-1][-1]
    assert pages == [tasks[:3], tasks[3:6], tasks[6:]]
    assert error_code(sim.request(sim.client, ReadTaskGraph(limit=0))) == ErrorCode.INVALID


def test_create_task_needs_one_consistent_owner(sim: OwnerSim) -> None:
    worker = sim.worker()
    parent = sim.create_task()
    other_conversation = sim.new_conversation()
    mismatched = CreateTask(task_id=fresh_id(), kind=KIND, owner_task_id=parent, conversation_id=other_conversation)
    assert error_code(sim.commit(mismatched)) == ErrorCode.INVALID
    assert error_code(sim.commit(CreateTask(task_id=fresh_id(), kind=KIND))) == ErrorCode.INVALID
    nowhere = CreateTask(task_id=fresh_id(), kind=KIND, conversation_id=fresh_id())
    assert error_code(sim.commit(nowhere)) == ErrorCode.NOT_FOUND
    duplicate = CreateTask(task_id=parent, kind=KIND, conversation_id=other_conversation)
    assert error_code(sim.commit(duplicate)) == ErrorCode.DUPLICATE
    assert error_code(sim.commit(CreateTask(task_id=fresh_id(), kind="", conversation_id=other_conversation))) == (
        ErrorCode.INVALID
    )
    assert sim.core.tasks.live_count == 1
    assert worker.holds(parent)


# ------------------------------------------------------------------------------------------- leases, epochs


def test_advance_stores_the_checkpoint_and_leases_again_at_the_next_epoch(sim: OwnerSim) -> None:
    worker = sim.worker()
    task_id = sim.create_task()
    first = worker.lease(task_id)
    reply = worker.ok(task_id, advance(task_id, {"phase": "b"}))
    second = worker.lease(task_id)
    assert second.lease == LeaseRef(task_id=task_id, epoch=2)
    assert data(second.checkpoint) == {"phase": "b"}
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
    read = expect(sim.request(sim.client, ReadTask(task_id=task_id)), TaskReply)
    assert data(read.checkpoint) == {"phase": "b"}
    # The current lease still commits.
    worker.ok(task_id, completed(task_id))
    assert sim.outcome(task_id).status == "completed"


def test_leases_carry_what_is_stored_and_the_kept_input_and_checkpoint_stay_within_their_bound(
    sim: OwnerSim,
) -> None:
    """The owner keeps the input and checkpoint of the tasks written lately (``_task_data``): every lease still
    carries what the store holds, and what is kept stays within its count and its size, past both bounds."""
    worker = sim.worker()
    conversation_id = sim.new_conversation()
    large = "x" * (MAX_CACHED_VALUE_BYTES + 1)  # never kept
    sizable = "y" * (MAX_CACHED_VALUE_BYTES // 2)  # kept; enough of them pass the bound in bytes
    count = MAX_CACHED_TASKS + 50
    inputs = [{"n": n, "pad": large if n == 0 else sizable if n % 7 == 0 else ""} for n in range(count)]
    writes = [
        CreateTask(task_id=fresh_id(), kind="other.kind", input=JsonValue(value), conversation_id=conversation_id)
        for value in inputs
    ]
    expect(sim.commit(*writes), Committed)
    kept = sim.core.tasks.data
    assert len(kept) == MAX_CACHED_TASKS
    assert kept.size_bytes <= MAX_CACHED_BYTES
    assert writes[0].task_id not in kept and writes[-1].task_id in kept
    for write, value in zip(writes, inputs, strict=True):
        assert kept.task_data(write.task_id) == (value, None) == sim.store.task_data(write.task_id)

    task_id = sim.create_task(input={"pad": large})
    assert data(worker.lease(task_id).input) == {"pad": large}
    worker.ok(task_id, advance(task_id, {"phase": "b"}))
    assert data(worker.lease(task_id).checkpoint) == {"phase": "b"}
    task_id = sim.create_task(input={"n": 2})
    worker.ok(task_id, advance(task_id, {"phase": "large", "pad": large}))  # its entry is dropped, not left stale
    assert data(worker.lease(task_id).checkpoint) == {"phase": "large", "pad": large}
    assert task_id not in kept
    worker.ok(task_id, advance(task_id, {"phase": "c"}))
    assert data(worker.lease(task_id).checkpoint) == {"phase": "c"}
    for lease in worker.granted:
        assert data(lease.input) == sim.store.task_data(lease.lease.task_id)[0]
    assert len(kept) <= MAX_CACHED_TASKS
    assert kept.size_bytes <= MAX_CACHED_BYTES


def test_a_refused_commit_puts_back_the_checkpoint_it_would_have_kept(sim: OwnerSim) -> None:
    worker = sim.worker()
    task_id = sim.create_task()
    worker.ok(task_id, advance(task_id, {"phase": "b"}))
    taken = sim.create_task()
    refused = worker.commit(task_id, advance(task_id, {"phase": "z"}), child(task_id, task_id=taken))
    assert error_code(refused) == ErrorCode.DUPLICATE
    refused = worker.commit(task_id, child(task_id, task_id=taken))  # a create put back too
    assert error_code(refused) == ErrorCode.DUPLICATE
    assert sim.core.tasks.data.task_data(task_id) == sim.store.task_data(task_id) == ({"n": 1}, {"phase": "b"})
    expect(worker.release(task_id), Ok)
    assert data(worker.lease(task_id).checkpoint) == {"phase": "b"}


def test_a_task_changed_twice_in_a_batch_is_stored_once_as_the_batch_leaves_it(sim: OwnerSim) -> None:
    """A phase's new state and the lease granted again in the same batch's settle are one write of the task's row,
    stored with the batch; inside the batch, what reads the task sees its newest record."""
    worker = sim.worker()
    task_id = sim.create_task()
    writes: list[str] = []
    update_task = sim.store.update_task

    def counted(record: TaskRecord, **changes: Any) -> int:
        writes.append(record.task_id)
        return update_task(record, **changes)

    sim.store.update_task = counted  # type: ignore[method-assign]
    worker.ok(task_id, advance(task_id, {"phase": "b"}))
    assert writes == [task_id]  # advanced (pending) and granted (running): one UPDATE
    stored = sim.store.task(task_id)
    assert stored == sim.task(task_id)
    assert (stored.status, stored.phase, stored.epoch) == ("running", "b", 2)
    assert sim.store.task_data(task_id) == ({"n": 1}, {"phase": "b"})

    ref = worker.lease(task_id).lease
    end = sent(Commit(writes=(completed(task_id, "done"),), lease=ref))
    abort = sent(Commit(writes=(AbortTask(task_id=task_id),)))
    read = sent(ReadTask(task_id=task_id))
    out = sim.batch((worker.peer, end), (sim.client, abort), (sim.client, read))
    assert expect(reply_to(out, sim.client, abort), Committed).results == (0,)  # it ended already
    task = expect(reply_to(out, sim.client, read), TaskReply).task
    assert (task.status, task.outcome) == ("terminal", TaskOutcome(status="completed", result=JsonValue("done")))
    assert sim.store.task(task_id) == task


def test_two_commits_under_one_lease_in_one_batch_the_second_is_stale(sim: OwnerSim) -> None:
    worker = sim.worker()
    task_id = sim.create_task()
    ref = worker.lease(task_id).lease
    first = sent(Commit(writes=(advance(task_id, {"phase": "b"}),), lease=ref))
    second = sent(Commit(writes=(completed(task_id),), lease=ref))
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
    stolen = Commit(writes=(completed(task_id),), lease=ref)
    assert error_code(sim.request(sim.client, stolen)) == ErrorCode.NOT_ALLOWED
    # A state without a lease.
    assert error_code(sim.commit(completed(task_id))) == ErrorCode.NOT_ALLOWED
    assert error_code(sim.request(one.peer, Commit(writes=(completed(task_id),)))) == (ErrorCode.NOT_ALLOWED)
    # A state of another task, even one this worker holds too.
    assert error_code(one.commit(task_id, completed(other_task))) == ErrorCode.NOT_ALLOWED
    # Releasing someone else's lease.
    foreign_release = Release(lease=ref)
    assert error_code(sim.request(two.peer, foreign_release)) == ErrorCode.STALE_LEASE

    assert sim.core.head_seq == head
    assert sim.store.task(task_id) == stored
    assert one.holds(task_id) and one.holds(other_task)
    one.ok(task_id, completed(task_id))
    one.ok(other_task, completed(other_task))


def test_a_commit_holds_at_most_one_state_of_its_task(sim: OwnerSim) -> None:
    # A second state used to raise KeyError out of the core (the owner would have died of it).
    worker = sim.worker()
    task_id = sim.create_task()
    head = sim.core.head_seq
    for writes in (
        (advance(task_id, {"phase": "b"}), completed(task_id)),
        (waiting(task_id, []), sleeping(task_id, START_MS)),
        (completed(task_id), advance(task_id, {"phase": "b"})),
        (failed(task_id), completed(task_id)),
    ):
        assert error_code(worker.commit(task_id, *writes)) == ErrorCode.INVALID
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
    assert data(resumed.checkpoint) == {"phase": "sum"}
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
    assert data(worker.lease(parent).checkpoint) == {"phase": "again"}
    assert sim.status(parent) == "running"

    done = child(parent)
    worker.ok(parent, done)
    worker.ok(done.task_id, completed(done.task_id))
    worker.ok(parent, waiting(parent, [done.task_id], checkpoint={"phase": "third"}))
    assert worker.lease(parent).lease.epoch == 3
    assert data(worker.lease(parent).checkpoint) == {"phase": "third"}


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
    assert data(worker.lease(parent).checkpoint) == {"phase": "decide"}
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
    assert (lease.mode, data(lease.checkpoint)) == ("abort", {"phase": "after_wait"})
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
    assert (lease.mode, data(lease.checkpoint), lease.lease.epoch) == ("abort", None, 1)
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
    wait = sent(WaitTask(task_id=parent))
    sim.batch((sim.client, wait))
    worker.ok(parent, kid, completed(parent, "done"))
    record = sim.task(parent)
    assert record.status == "completing"
    assert record.held == TaskOutcome(status="completed", result=JsonValue("done"))
    assert record.outcome is None
    assert sim.outcomes(parent) == (None,)
    assert sim.task(kid.task_id).abort is None  # a completed held outcome aborts nothing
    end = sent(Commit(writes=(completed(kid.task_id),), lease=worker.lease(kid.task_id).lease))
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


def test_background_work_does_not_keep_its_owner_completing(sim: OwnerSim) -> None:
    worker = sim.worker()
    parent = sim.create_task()
    background = child(parent, background=True)
    worker.ok(parent, background, failed(parent, "no"))
    assert sim.outcome(parent).status == "failed"  # ended at once, and its held failure aborts nothing
    assert sim.task(background.task_id).abort is None
    assert worker.holds(background.task_id)


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
    for owner_id, code in (
        (completing, ErrorCode.CONFLICT),
        (marked, ErrorCode.CONFLICT),
        (ended_task, ErrorCode.CONFLICT),
        (fresh_id(), ErrorCode.NOT_FOUND),
    ):
        assert error_code(worker.commit(kid.task_id, child(owner_id))) == code
        assert error_code(sim.commit(child(owner_id))) == code
        owned = CreateConversation(conversation_id=fresh_id(), owner_task_id=owner_id)
        assert error_code(sim.commit(owned)) == code
    assert sim.core.head_seq == head
    assert sim.core.tasks.live_count == 3


# ----------------------------------------------------------------------------------- conversations owned by tasks


def owned_conversation_with_a_task(sim: OwnerSim, worker: Worker) -> tuple[str, str, str]:
    """A task that owns a conversation holding a task of its own: ``(owner, conversation, task in it)``."""
    owner_id = sim.create_task()
    conversation_id = fresh_id()
    inner = CreateTask(task_id=fresh_id(), kind=KIND, conversation_id=conversation_id)
    worker.ok(owner_id, CreateConversation(conversation_id=conversation_id, owner_task_id=owner_id), inner)
    assert sim.task(inner.task_id).owner_task_id is None
    assert worker.holds(inner.task_id)
    return owner_id, conversation_id, inner.task_id


def test_a_task_in_a_conversation_the_task_owns_keeps_it_completing(sim: OwnerSim) -> None:
    worker = sim.worker()
    owner_id, conversation_id, inner = owned_conversation_with_a_task(sim, worker)
    assert error_code(worker.commit(inner, waiting(inner, [owner_id]))) == ErrorCode.INVALID  # its owner
    worker.ok(owner_id, completed(owner_id, 1))
    assert sim.status(owner_id) == "completing"
    late = CreateTask(task_id=fresh_id(), kind=KIND, conversation_id=conversation_id)
    assert error_code(sim.commit(late)) == ErrorCode.CONFLICT
    worker.ok(inner, completed(inner))
    assert sim.outcome(owner_id) == TaskOutcome(status="completed", result=JsonValue(1))


def test_a_task_in_a_conversation_the_task_owns_is_aborted_first(sim: OwnerSim) -> None:
    worker = sim.worker()
    owner_id, conversation_id, inner = owned_conversation_with_a_task(sim, worker)
    background = CreateTask(task_id=fresh_id(), kind=KIND, conversation_id=conversation_id, background=True)
    expect(sim.commit(background), Committed)
    sim.abort(owner_id)
    assert sim.task(inner).abort == "abort"
    assert sim.task(background.task_id).abort is None
    assert set(worker.cancelled) == {owner_id, inner}
    worker.release(owner_id)
    worker.release(inner)
    assert abort_leases(sim) == [inner]
    worker.ok(inner, aborted(inner))
    assert abort_leases(sim) == [inner, owner_id]
    worker.ok(owner_id, aborted(owner_id))
    assert sim.outcome(owner_id).status == "aborted"
    assert sim.status(background.task_id) == "running"


def test_a_task_joining_a_conversation_whose_owner_task_ended_in_the_same_batch_is_top_level(sim: OwnerSim) -> None:
    # The reference: once a subagent's owner task is terminal, a later task in its conversation is a top-level node.
    worker = sim.worker()
    owner_id, conversation_id, inner = owned_conversation_with_a_task(sim, worker)
    worker.ok(inner, completed(inner))
    end = sent(Commit(writes=(completed(owner_id),), lease=worker.lease(owner_id).lease))
    late = sent(Commit(writes=(CreateTask(task_id=fresh_id(), kind=KIND, conversation_id=conversation_id),)))
    out = sim.batch((worker.peer, end), (sim.client, late))
    assert isinstance(reply_to(out, worker.peer, end), Committed)
    assert isinstance(reply_to(out, sim.client, late), Committed)
    assert sim.outcome(owner_id).status == "completed"


def test_a_task_joining_a_conversation_whose_owner_task_ended_is_top_level(sim: OwnerSim) -> None:
    worker = sim.worker()
    owner_id, conversation_id, inner = owned_conversation_with_a_task(sim, worker)
    worker.ok(inner, completed(inner))
    worker.ok(owner_id, completed(owner_id))
    assert sim.outcome(owner_id).status == "completed"
    late = CreateTask(task_id=fresh_id(), kind=KIND, conversation_id=conversation_id)
    assert isinstance(sim.commit(late), Committed)
    assert sim.task(late.task_id).owner_task_id is None


def test_a_task_may_not_join_a_conversation_whose_owner_task_is_marked_for_abort(sim: OwnerSim) -> None:
    worker = sim.worker()
    owner_id, conversation_id, _ = owned_conversation_with_a_task(sim, worker)
    sim.commit(AbortTask(task_id=owner_id))
    late = CreateTask(task_id=fresh_id(), kind=KIND, conversation_id=conversation_id)
    assert error_code(sim.commit(late)) == ErrorCode.CONFLICT


def test_fail_fast_over_a_task_in_a_conversation_the_waiter_owns(sim: OwnerSim) -> None:
    worker = sim.worker()
    owner_id, conversation_id, inner = owned_conversation_with_a_task(sim, worker)
    other = CreateTask(task_id=fresh_id(), kind=KIND, conversation_id=conversation_id)
    worker.ok(owner_id, other, waiting(owner_id, [inner, other.task_id], "fail_fast"))
    worker.ok(inner, failed(inner))
    assert sim.task(other.task_id).abort == "abort"


# ------------------------------------------------------------------------------------------- worker restarts


def test_a_worker_that_leaves_costs_its_tasks_a_restart(sim: OwnerSim) -> None:
    first = sim.worker()
    task_id = sim.create_task()
    idle = sim.create_task()
    first.ok(idle, waiting(idle, [task_id]))
    second = sim.worker()
    assert first.holds(task_id) and not second.holds(task_id)
    first.leave(settle=False)
    assert sim.core.needs_settle(sim.now_ms)
    assert sim.store.task(task_id) == sim.core.tasks.live(task_id)  # nothing is written before the batch
    sim.batch()
    lease = second.lease(task_id)
    assert (lease.lease.epoch, lease.restarts, data(lease.checkpoint)) == (2, 1, None)
    record = sim.task(task_id)
    assert (record.status, record.restarts, record.epoch) == ("running", 1, 2)
    assert sim.task(idle).restarts == 0  # not running: not cut off
    second.ok(task_id, advance(task_id, {"phase": "b"}))
    assert sim.task(task_id).restarts == 0  # a new committed state resets the count


def test_the_restart_limit_faults_the_task(sim: OwnerSim) -> None:
    workers = [sim.worker(restart_limit=2) for _ in range(3)]
    task_id = sim.create_task()
    wait = sent(WaitTask(task_id=task_id))
    sim.batch((sim.client, wait))
    holder = sim.holder(task_id)
    assert holder is not None
    assert sim.task(task_id).restart_limit == 2
    holder.leave()
    assert sim.task(task_id).restarts == 1
    holder = sim.holder(task_id)
    assert holder is not None
    holder.leave(settle=False)
    out = sim.batch()
    outcome = sim.outcome(task_id)
    assert outcome.status == "faulted" and outcome.reason == "restart_limit"
    assert sim.task(task_id).restarts == 2
    answer = expect(reply_to(out, sim.client, wait), TaskReply)
    assert answer.task.outcome == outcome
    assert all(not worker.holds(task_id) for worker in workers if not worker.gone)


def test_a_task_without_a_restart_limit_is_never_ended_for_its_restarts(sim: OwnerSim) -> None:
    for _ in range(7):
        sim.worker(restart_limit=None)
    task_id = sim.create_task()
    for _ in range(6):  # past the default limit of 5
        holder = sim.holder(task_id)
        assert holder is not None
        holder.leave()
    sim.restart()  # an owner restart counts one more, and the limit (none) is read back from the store
    record = sim.task(task_id)
    assert (record.status, record.restarts, record.restart_limit, record.outcome) == ("pending", 7, None, None)


def test_an_announced_restart_limit_is_1_to_its_bound_or_none(sim: OwnerSim) -> None:
    peer = sim.attach_worker("bounds").peer
    for limit in (0, MAX_RESTART_LIMIT + 1):
        capability = Capability(kind="task", name=KIND, version=1, restart_limit=limit)
        refusal = sim.request(peer, Announce(pid=1, host="h", app="a", capabilities=(capability,)))
        assert isinstance(refusal, Error) and refusal.code == "invalid" and "restart_limit of 1 to" in refusal.message
    limits = (1, MAX_RESTART_LIMIT, None)
    capabilities = tuple(
        Capability(kind="task", name=f"k.n{n}", version=1, restart_limit=x) for n, x in enumerate(limits)
    )
    expect(sim.request(peer, Announce(pid=1, host="h", app="a", capabilities=capabilities)), Ok)


def test_a_phase_cancelled_for_an_abort_does_not_count_when_its_worker_leaves(sim: OwnerSim) -> None:
    first = sim.worker()
    task_id = sim.create_task()
    second = sim.worker()
    sim.abort(task_id)
    assert task_id in first.cancelled
    first.leave()
    record = sim.task(task_id)
    assert record.restarts == 0
    lease = second.lease(task_id)
    assert (lease.mode, lease.restarts) == ("abort", 0)
    # An abort handler cut off does count.
    third = sim.worker()
    second.leave()
    assert sim.task(task_id).restarts == 1
    assert (third.lease(task_id).mode, third.lease(task_id).restarts) == ("abort", 1)
    third.ok(task_id, aborted(task_id))
    assert sim.outcome(task_id).status == "aborted"


def test_a_task_faulted_by_its_restart_limit_while_owning_work_is_completing_and_aborts_it(sim: OwnerSim) -> None:
    parents = sim.worker(["parent.job"], restart_limit=1)
    children = sim.worker()
    parent = sim.create_task("parent.job")
    kid = child(parent)
    parents.ok(parent, kid)
    assert children.holds(kid.task_id)
    parents.leave()
    record = sim.task(parent)
    assert record.status == "completing"
    assert record.held is not None and record.held.reason == "restart_limit"
    assert record.restarts == 1
    assert sim.task(kid.task_id).abort == "abort"
    children.release(kid.task_id)
    children.ok(kid.task_id, aborted(kid.task_id))
    outcome = sim.outcome(parent)
    assert (outcome.status, outcome.reason) == ("faulted", "restart_limit")


# --------------------------------------------------------------------------------------------- owner restart


def test_an_owner_restart_counts_a_restart_for_every_running_task(sim: OwnerSim) -> None:
    worker = sim.worker()
    running = sim.create_task()
    parked = sim.create_task()
    worker.ok(parked, sleeping(parked, START_MS + 60_000))
    head = sim.core.head_seq
    sim.restart(settle=False)
    assert sim.core.needs_settle(sim.now_ms)
    stored = sim.store.task(running)
    assert stored is not None and stored.status == "running"  # nothing is written before the first batch
    sim.batch(drain=False)
    record = sim.task(running)
    assert (record.status, record.restarts, record.epoch) == ("pending", 1, 1)
    assert record.seq == head + 1 == sim.core.head_seq == sim.store.head_seq()
    logged = sim.store.read_log(head, None, 10)
    assert [commit.seq for commit in logged] == [head + 1]
    assert record in logged[0].records
    assert sim.task(parked).restarts == 0 and sim.status(parked) == "sleeping"
    assert sim.graph()[running].blocked == "missing_task"  # no worker yet: blocked, not ended
    assert not sim.core.needs_settle(sim.now_ms)

    fresh = sim.worker()
    lease = fresh.lease(running)
    assert (lease.lease.epoch, lease.restarts) == (2, 1)  # epochs continue from the stored one
    fresh.ok(running, completed(running))
    assert sim.task(running).restarts == 0


def test_an_owner_restart_at_the_restart_limit_faults_the_task(sim: OwnerSim) -> None:
    sim.worker(restart_limit=1)
    task_id = sim.create_task()
    sim.restart()
    outcome = sim.outcome(task_id)
    assert (outcome.status, outcome.reason) == ("faulted", "restart_limit")


def test_abandon_on_restart_marks_cascade_only_to_unmarked_work(sim: OwnerSim) -> None:
    worker = sim.worker()
    parent = sim.create_task(abandon_on_restart=True)
    plain, marked, background = child(parent), child(parent), child(parent, background=True)
    worker.ok(parent, plain, marked, background, waiting(parent, [plain.task_id, marked.task_id]))
    sim.abort(marked.task_id)
    worker.release(marked.task_id)
    assert worker.lease(marked.task_id).mode == "abort"  # its handler runs when the owner goes
    bystander = sim.create_task()

    sim.restart(settle=False)
    worker = sim.worker()  # attaches in the batch that recovers
    assert sim.task(parent).abort == "restart"
    assert sim.task(plain.task_id).abort == "restart"
    assert sim.task(marked.task_id).abort == "abort"
    assert sim.task(background.task_id).abort is None
    assert sim.task(bystander).abort is None
    assert [sim.task(task_id).restarts for task_id in (parent, plain.task_id, marked.task_id)] == [0, 1, 1]
    assert (worker.lease(plain.task_id).mode, worker.lease(plain.task_id).abort) == ("abort", "restart")
    assert (worker.lease(marked.task_id).mode, worker.lease(marked.task_id).abort) == ("abort", "abort")
    assert worker.lease(background.task_id).mode == "phase"
    assert worker.lease(bystander).mode == "phase"
    assert not worker.holds(parent)

    worker.ok(plain.task_id, aborted(plain.task_id))
    worker.ok(marked.task_id, aborted(marked.task_id))
    assert (worker.lease(parent).mode, worker.lease(parent).abort) == ("abort", "restart")
    worker.ok(parent, aborted(parent))
    assert sim.outcome(plain.task_id) == TaskOutcome(status="aborted", reason="restart")
    assert sim.outcome(marked.task_id) == TaskOutcome(status="aborted")
    assert sim.outcome(parent) == TaskOutcome(status="aborted", reason="restart")
    assert sim.status(background.task_id) == "running"


def test_a_restart_marked_task_nobody_can_run_waits_until_an_explicit_abort(sim: OwnerSim) -> None:
    sim.worker()
    task_id = sim.create_task(abandon_on_restart=True)
    sim.restart()
    record = sim.task(task_id)
    assert (record.status, record.abort, record.restarts) == ("pending", "restart", 1)
    node = sim.graph()[task_id]
    assert node.blocked == "missing_task" and node.blocked_detail is not None and KIND in node.blocked_detail
    sim.batch()
    assert sim.status(task_id) == "pending"
    assert sim.abort(task_id).results == (1,)  # an explicit abort replaces the restart mark
    outcome = sim.outcome(task_id)
    assert (outcome.status, outcome.reason) == ("orphaned", "missing_task")


def test_a_restart_marked_task_is_cleaned_up_by_a_worker_that_attaches_later(sim: OwnerSim) -> None:
    sim.worker()
    task_id = sim.create_task(abandon_on_restart=True)
    sim.restart()
    assert sim.graph()[task_id].blocked == "missing_task"
    worker = sim.worker()
    lease = worker.lease(task_id)
    assert (lease.mode, lease.abort, lease.restarts) == ("abort", "restart", 1)
    worker.ok(task_id, aborted(task_id))
    assert sim.outcome(task_id) == TaskOutcome(status="aborted", reason="restart")


def test_a_worker_announcing_leases_it_no_longer_holds_is_told_to_cancel_them(sim: OwnerSim) -> None:
    worker = sim.worker()
    task_id = sim.create_task()
    old_ref = worker.lease(task_id).lease
    sim.restart()
    returning = sim.attach_worker("back")
    peer = returning.peer
    capabilities = (Capability(kind="task", name=KIND, version=1),)
    announce = Announce(pid=7, host="h", app="a", capabilities=capabilities, leases=(old_ref,))
    out = sim.batch((peer, announce))
    cancels = [frame for to, _, frame in out if to == peer and isinstance(frame, CancelLease)]
    assert [cancel.lease for cancel in cancels] == [old_ref]
    lease = returning.lease(task_id)
    assert (lease.lease.epoch, lease.restarts) == (2, 1)


# --------------------------------------------------------------------------------------------------- blocked


def blocked(sim: OwnerSim, task_id: str) -> tuple[str | None, str]:
    node = sim.graph()[task_id]
    assert node.leased_to is None
    return node.blocked, node.blocked_detail or ""


def test_a_task_no_worker_announces_is_blocked_until_one_attaches(sim: OwnerSim) -> None:
    sim.worker(["other.kind"])
    parent = sim.create_task("other.kind")
    parents = next(iter(sim.workers.values()))
    task_id = sim.create_task()
    reason, detail = blocked(sim, task_id)
    assert reason == "missing_task" and KIND in detail
    assert sim.status(task_id) == "pending"
    assert sim.store.task(task_id) is not None and sim.task(task_id).status == "pending"
    # A blocked task keeps its waiters waiting.
    parents.ok(parent, waiting(parent, [task_id]))
    sim.batch()
    assert sim.status(parent) == "waiting"
    worker = sim.worker()
    assert worker.lease(task_id).lease.epoch == 1
    assert sim.graph()[task_id].blocked is None


def test_a_task_stored_newer_than_every_worker_is_too_old_for_them(sim: OwnerSim) -> None:
    sim.worker(version=1)
    task_id = sim.create_task(version=2)
    reason, detail = blocked(sim, task_id)
    assert reason == "task_too_old" and "version 2" in detail
    newer = sim.worker(version=2)
    assert newer.lease(task_id).version == 2


def test_a_newer_worker_without_migrate_cannot_run_an_older_task(sim: OwnerSim) -> None:
    sim.worker(version=2)
    task_id = sim.create_task(version=1)
    reason, detail = blocked(sim, task_id)
    assert reason == "migration_failed" and "migrate" in detail
    same = sim.worker(version=1)
    assert same.lease(task_id).version == 1


def test_a_failed_migration_blocks_the_task_until_a_worker_announces(sim: OwnerSim) -> None:
    migrating = sim.worker(version=2, migrates=True)
    task_id = sim.create_task(version=1)
    lease = migrating.lease(task_id)
    assert (lease.version, lease.mode) == (1, "phase")
    assert sim.task(task_id).version == 1
    expect(migrating.release(task_id, migration_error="KeyError: 'cards'"), Ok)
    reason, detail = blocked(sim, task_id)
    assert reason == "migration_failed" and "KeyError: 'cards'" in detail
    assert not migrating.leases
    assert sim.task(task_id).restarts == 0
    # A worker of another kind changes nothing; one that announces the kind gets the migration tried again.
    sim.worker(["other.kind"])
    assert blocked(sim, task_id)[0] == "migration_failed"
    sim.worker(version=2, migrates=True)
    holder = sim.holder(task_id)
    assert holder is not None
    assert holder.lease(task_id).lease.epoch == 2
    holder.ok(task_id, advance(task_id, {"phase": "migrated"}))
    assert sim.task(task_id).version == 2  # the version of the worker that committed
    holder = sim.holder(task_id)
    assert holder is not None and holder.lease(task_id).version == 2


def test_aborting_a_blocked_task_orphans_it_with_the_blocked_reason(sim: OwnerSim) -> None:
    migrating = sim.worker(version=2, migrates=True)
    lost = sim.create_task("missing.kind")
    unmigratable = sim.create_task(version=1)
    migrating.release(unmigratable, migration_error="ValueError: bad")
    sim.abort(lost)
    assert sim.outcome(lost) == TaskOutcome(
        status="orphaned", reason="missing_task", error="no attached worker has task kind missing.kind"
    )
    sim.abort(unmigratable)
    outcome = sim.outcome(unmigratable)
    assert outcome.status == "orphaned" and outcome.reason == "migration_failed"
    assert outcome.error is not None and "ValueError: bad" in outcome.error


def test_a_blocked_owner_is_orphaned_only_after_its_work_ended(sim: OwnerSim) -> None:
    parents = sim.worker(["parent.job"])
    children = sim.worker()
    parent = sim.create_task("parent.job")
    kid = child(parent)
    parents.ok(parent, kid, waiting(parent, [kid.task_id]))
    parents.leave()
    sim.abort(parent)
    assert sim.status(parent) == "waiting"  # its child still runs
    children.release(kid.task_id)
    children.ok(kid.task_id, aborted(kid.task_id))
    assert sim.outcome(parent).status == "orphaned"


def test_after_the_owner_starts_an_aborted_blocked_task_waits_the_grace_for_a_worker() -> None:
    sim = OwnerSim(orphan_grace_ms=GRACE_MS)
    started_ms = sim.now_ms
    try:
        lost = sim.create_task()
        rescued = sim.create_task("rescue.kind")
        sim.abort(lost)
        sim.abort(rescued)
        for task_id in (lost, rescued):
            record = sim.task(task_id)
            assert (record.status, record.abort) == ("pending", "abort")
            assert blocked(sim, task_id)[0] == "missing_task"
        assert not sim.core.needs_settle(sim.now_ms)
        assert sim.core.next_deadline_ms() == started_ms + GRACE_MS
        sim.worker(["other.kind"])
        assert sim.status(lost) == "pending"
        # A worker that attaches within the grace runs the abort handler.
        rescuer = sim.worker(["rescue.kind"])
        assert rescuer.lease(rescued).mode == "abort"
        rescuer.ok(rescued, aborted(rescued))
        assert sim.outcome(rescued).status == "aborted"
        # The grace is over on the owner's clock: what nobody can run is orphaned.
        assert not sim.core.needs_settle(started_ms + GRACE_MS - 1)
        assert sim.core.needs_settle(started_ms + GRACE_MS)
        sim.batch(now_ms=started_ms + GRACE_MS)
        assert sim.outcome(lost) == TaskOutcome(
            status="orphaned", reason="missing_task", error=f"no attached worker has task kind {KIND}"
        )
    finally:
        sim.close()


# ----------------------------------------------------------------------------------------------------- sleep


def test_a_sleeping_task_wakes_exactly_at_its_deadline(sim: OwnerSim) -> None:
    worker = sim.worker()
    task_id = sim.create_task()
    until_ms = START_MS + 1_000
    worker.ok(task_id, sleeping(task_id, until_ms, {"phase": "wake"}))
    record = sim.task(task_id)
    assert (record.status, record.until_ms, record.phase) == ("sleeping", until_ms, "wake")
    assert sim.core.next_deadline_ms() == until_ms
    assert not sim.core.needs_settle(until_ms - 1)
    assert sim.core.needs_settle(until_ms)
    sim.batch(now_ms=until_ms - 1)
    assert sim.status(task_id) == "sleeping"
    assert not worker.holds(task_id)
    sim.batch(now_ms=until_ms)
    lease = worker.lease(task_id)
    assert (lease.lease.epoch, data(lease.checkpoint), lease.now_ms) == (2, {"phase": "wake"}, until_ms)
    assert sim.task(task_id).until_ms is None
    assert sim.core.next_deadline_ms() is None


def test_a_sleep_deadline_survives_an_owner_restart(sim: OwnerSim) -> None:
    worker = sim.worker()
    early, late = sim.create_task(), sim.create_task()
    worker.ok(late, sleeping(late, START_MS + 2_000))
    worker.ok(early, sleeping(early, START_MS + 1_000))
    sim.restart()
    worker = sim.worker()
    assert sim.core.next_deadline_ms() == START_MS + 1_000
    sim.batch(now_ms=START_MS + 1_500)
    assert worker.holds(early) and not worker.holds(late)
    assert sim.core.next_deadline_ms() == START_MS + 2_000
    assert sim.task(early).restarts == 0  # sleeping is not running: nothing was cut off


def test_aborting_a_sleeping_task_runs_its_handler_before_the_deadline(sim: OwnerSim) -> None:
    worker = sim.worker()
    task_id = sim.create_task()
    worker.ok(task_id, sleeping(task_id, START_MS + 10_000))
    sim.abort(task_id)
    assert worker.lease(task_id).mode == "abort"
    worker.ok(task_id, aborted(task_id))
    assert sim.core.next_deadline_ms() is None


def test_a_manual_clock_wakes_sleepers_only_when_advanced(manual_sim: OwnerSim) -> None:
    sim = manual_sim
    assert sim.now_ms == 0
    worker = sim.worker()
    task_id = sim.create_task()
    assert worker.lease(task_id).now_ms == 0
    worker.ok(task_id, sleeping(task_id, 500))
    assert sim.core.next_deadline_ms() == 500
    reply = expect(sim.request(sim.client, AdvanceClock(by_ms=499)), ClockReply)
    assert reply.now_ms == 499 == sim.now_ms
    assert sim.status(task_id) == "sleeping"
    advance_clock = sent(AdvanceClock(by_ms=1))
    out = sim.batch((sim.client, advance_clock), drain=False)  # woken by the very batch that moves the clock
    assert expect(reply_to(out, sim.client, advance_clock), ClockReply).now_ms == 500
    lease = worker.lease(task_id)
    assert (lease.now_ms, lease.lease.epoch) == (500, 2)
    assert sim.core.stored_clock_ms() == 500
    # A restarted owner's manual clock goes on from the stored time.
    worker.ok(task_id, sleeping(task_id, 700))
    sim.restart()
    assert sim.now_ms == 500
    worker = sim.worker()
    assert not worker.leases
    sim.request(sim.client, AdvanceClock(by_ms=200))
    assert worker.lease(task_id).now_ms == 700


def test_advance_clock_is_refused_on_a_wall_clock_owner(sim: OwnerSim) -> None:
    assert error_code(sim.request(sim.client, AdvanceClock(by_ms=5))) == ErrorCode.NOT_ALLOWED


# ------------------------------------------------------------------------------------------------ capacity


def test_a_worker_holds_at_most_max_leases(sim: OwnerSim) -> None:
    worker = sim.worker(max_leases=2)
    tasks = [sim.create_task() for _ in range(5)]
    assert sorted(worker.leases) == sorted(tasks[:2])  # oldest first
    nodes = sim.graph()
    assert [nodes[task_id].task.status for task_id in tasks] == ["running"] * 2 + ["pending"] * 3
    assert all(nodes[task_id].blocked is None for task_id in tasks)  # busy is not blocked
    assert not sim.core.needs_settle(sim.now_ms)
    worker.ok(tasks[0], completed(tasks[0]))
    assert sorted(worker.leases) == sorted([tasks[1], tasks[2]])
    worker.ok(tasks[1], advance(tasks[1], {"phase": "b"}))  # ends one lease, asks for another: still two
    assert len(worker.leases) == 2
    extra = sim.worker(max_leases=1)
    assert len(extra.leases) == 1 and len(worker.leases) == 2
    assert {*worker.leases, *extra.leases} <= set(tasks[1:])


def test_an_announce_past_the_lease_bounds_is_invalid(sim: OwnerSim) -> None:
    peer = sim.connect("worker")
    for max_leases in (-1, MAX_LEASES_PER_WORKER + 1):
        announce = Announce(pid=1, host="h", app="a", capabilities=(), max_leases=max_leases)
        assert error_code(sim.request(peer, announce)) == ErrorCode.INVALID
    client_announce = Announce(pid=1, host="h", app="a", capabilities=())
    assert error_code(sim.request(sim.client, client_announce)) == ErrorCode.NOT_ALLOWED


def test_a_draining_worker_keeps_its_leases_and_gets_no_new_one(sim: OwnerSim) -> None:
    """A worker stopping re-announces with ``max_leases=0``: the phases it runs may still commit, it is granted
    nothing more, and what it would have run goes to another worker (or waits for one), never ``blocked``."""
    draining = sim.worker(max_leases=2)
    first, second, third = (sim.create_task() for _ in range(3))
    assert sorted(draining.leases) == sorted([first, second])
    capabilities = (Capability(kind="task", name=KIND, version=1, restart_limit=5),)
    announce = Announce(pid=1000, host="test", app="tests", capabilities=capabilities, max_leases=0)
    expect(sim.request(draining.peer, announce), Ok)
    draining.ok(first, completed(first))  # its running phase still commits
    draining.ok(second, advance(second, {"phase": "b"}))  # and may go on to its next state, not leased again here
    assert sorted(draining.leases) == []
    nodes = sim.graph()
    assert [nodes[task_id].task.status for task_id in (second, third)] == ["pending", "pending"]
    assert all(nodes[task_id].blocked is None for task_id in (second, third))  # a worker has the kind: not blocked
    other = sim.worker(max_leases=2)
    assert sorted(other.leases) == sorted([second, third]) and not draining.leases


def test_a_saturated_worker_does_not_keep_the_owner_settling(sim: OwnerSim) -> None:
    busy = sim.worker(max_leases=1)
    sim.worker(["other.kind"])  # has capacity, but for another kind
    conversation_id = sim.new_conversation()
    for _ in range(2):
        create = CreateTask(task_id=fresh_id(), kind=KIND, conversation_id=conversation_id)
        sim.batch((sim.client, Commit(writes=(create,))), drain=False)
    assert len(busy.leases) == 1
    assert not sim.core.needs_settle(sim.now_ms)  # nothing to do until a lease ends: no idle batches


def test_a_task_another_worker_can_run_is_not_held_up_behind_one_waiting_for_a_busy_worker(sim: OwnerSim) -> None:
    old = sim.worker(version=1, max_leases=1)
    new = sim.worker(version=2)
    running = sim.create_task(version=1)
    assert old.holds(running)
    queued_old = sim.create_task(version=1)  # only the old worker runs it, and that one is busy
    fresh = sim.create_task()  # version 0: the idle new worker can run it
    assert sim.status(queued_old) == "pending"
    assert new.holds(fresh)


# ---------------------------------------------------------------------------------------- refused commits


def test_a_refused_commit_leaves_no_task_behind(sim: OwnerSim) -> None:
    worker = sim.worker()
    conversation_id = sim.new_conversation()
    entry_id = fresh_id()
    expect(
        sim.commit(AppendEntry(conversation_id=conversation_id, entry_id=entry_id, kind="k", data=JsonValue(1))),
        Committed,
    )
    head = sim.core.head_seq
    task_id = fresh_id()
    create = CreateTask(task_id=task_id, kind=KIND, conversation_id=conversation_id)
    duplicate = AppendEntry(conversation_id=conversation_id, entry_id=entry_id, kind="k", data=JsonValue(2))
    assert error_code(sim.commit(create, duplicate)) == ErrorCode.DUPLICATE
    assert sim.store.task(task_id) is None
    assert sim.core.tasks.live(task_id) is None
    assert sim.core.tasks.live_count == 0
    assert task_id not in sim.graph()
    assert not worker.granted
    assert sim.core.head_seq == head == sim.store.head_seq()
    # The id is free again.
    expect(sim.commit(create), Committed)
    assert worker.lease(task_id).lease.epoch == 1


def test_a_refused_commit_under_a_lease_keeps_the_lease_and_the_task_as_they_were(sim: OwnerSim) -> None:
    worker = sim.worker()
    task_id = sim.create_task()
    conversation_id = sim.task(task_id).conversation_id
    entry_id = fresh_id()
    expect(
        sim.commit(AppendEntry(conversation_id=conversation_id, entry_id=entry_id, kind="k", data=JsonValue(1))),
        Committed,
    )
    stored = sim.store.task(task_id)
    duplicate = AppendEntry(conversation_id=conversation_id, entry_id=entry_id, kind="k", data=JsonValue(2))
    kid = child(task_id)
    owned = CreateConversation(conversation_id=fresh_id(), owner_task_id=task_id)
    inner = CreateTask(task_id=fresh_id(), kind=KIND, conversation_id=owned.conversation_id)
    for writes in (
        (kid, completed(task_id), duplicate),
        (owned, inner, waiting(task_id, [inner.task_id]), duplicate),
        (AbortTask(task_id=task_id), duplicate),
        (kid, waiting(task_id, [kid.task_id], "fail_fast"), duplicate),
    ):
        assert error_code(worker.commit(task_id, *writes)) == ErrorCode.DUPLICATE
        assert sim.store.task(task_id) == stored
        assert sim.task(task_id) == stored
        assert sim.store.task(kid.task_id) is None and sim.store.task(inner.task_id) is None
        assert sim.core.tasks.live_count == 1
        assert sim.store.conversation(owned.conversation_id) is None
    assert [lease.lease.task_id for lease in worker.granted] == [task_id]
    # Nothing of the refused commits lingers: the task owns nothing and ends at once.
    worker.ok(task_id, completed(task_id))
    assert sim.outcome(task_id).status == "completed"


# --------------------------------------------------------------------------------------- bounded settling


def settling_commit_sizes(sim: OwnerSim, after_seq: int) -> list[int]:
    return [len(logged.records) for logged in sim.store.read_log(after_seq, None, 1000)]


def test_an_owner_restart_with_many_running_tasks_recovers_in_bounded_commits_before_leasing(sim: OwnerSim) -> None:
    worker = sim.worker(max_leases=5_000)
    parent = sim.create_task()
    kids = [child(parent) for _ in range(MAX_SETTLE_CHANGES + 200)]
    worker.ok(parent, *kids)
    everything = [parent, *(kid.task_id for kid in kids)]
    assert len(worker.leases) == len(everything)
    sim.restart(settle=False)
    head = sim.core.head_seq
    returning = sim.attach_worker("back")
    peer = returning.peer
    capabilities = (Capability(kind="task", name=KIND, version=1),)
    announce = Announce(pid=1, host="h", app="a", capabilities=capabilities, max_leases=5_000)
    sim.batch((peer, announce), drain=False)
    assert settling_commit_sizes(sim, head) == [MAX_SETTLE_CHANGES]
    assert not returning.leases  # nothing is leased before recovery is done
    still_running = [task_id for task_id in everything if sim.task(task_id).status == "running"]
    assert len(still_running) == len(everything) - MAX_SETTLE_CHANGES
    sim.batch()
    assert all(size <= MAX_SETTLE_CHANGES for size in settling_commit_sizes(sim, head))
    assert len(returning.leases) == len(everything)
    assert all((sim.task(task_id).restarts, sim.task(task_id).epoch) == (1, 2) for task_id in everything)


def test_a_cascade_of_abort_marks_is_spread_over_bounded_commits(sim: OwnerSim) -> None:
    worker = sim.worker(max_leases=5_000)
    parent = sim.create_task()
    kids = [child(parent) for _ in range(MAX_SETTLE_CHANGES + 200)]
    worker.ok(parent, *kids)
    head = sim.core.head_seq
    sim.abort(parent)
    assert all(sim.task(kid.task_id).abort == "abort" for kid in kids)
    assert len(worker.cancelled) == len(kids) + 1
    assert all(size <= MAX_SETTLE_CHANGES for size in settling_commit_sizes(sim, head)), settling_commit_sizes(
        sim, head
    )


def test_no_phase_starts_below_an_abort_whose_cascade_spans_several_commits(sim: OwnerSim) -> None:
    parents = sim.worker(["parent.job"])
    parent = sim.create_task("parent.job")
    kids = [child(parent, kind="late.kind") for _ in range(MAX_SETTLE_CHANGES + 200)]
    parents.ok(parent, *kids, waiting(parent, [kid.task_id for kid in kids]))
    assert all(sim.status(kid.task_id) == "pending" for kid in kids)  # nobody runs them yet
    # The abort and the first worker able to run the children arrive in one batch.
    late = sim.attach_worker("late")
    peer = late.peer
    capabilities = (Capability(kind="task", name="late.kind", version=1),)
    announce = Announce(pid=1, host="h", app="a", capabilities=capabilities, max_leases=5_000)
    head = sim.core.head_seq
    sim.batch((sim.client, Commit(writes=(AbortTask(task_id=parent),))), (peer, announce))
    assert all(size <= MAX_SETTLE_CHANGES for size in settling_commit_sizes(sim, head))
    assert [lease.mode for lease in late.granted] == ["abort"] * len(kids)


def test_fail_fast_over_many_children_marks_them_all_in_bounded_commits(sim: OwnerSim) -> None:
    worker = sim.worker(max_leases=5_000)
    parent = sim.create_task()
    kids = [child(parent) for _ in range(MAX_SETTLE_CHANGES + 200)]
    worker.ok(parent, *kids, waiting(parent, [kid.task_id for kid in kids], "fail_fast"))
    head = sim.core.head_seq
    first = kids[0].task_id
    worker.ok(first, failed(first))
    assert all(size <= MAX_SETTLE_CHANGES for size in settling_commit_sizes(sim, head))
    assert all(sim.task(kid.task_id).abort == "abort" for kid in kids[1:])
    assert set(worker.cancelled) == {kid.task_id for kid in kids[1:]}


def test_fail_fast_marks_cut_short_by_an_owner_restart_are_derived_again(sim: OwnerSim) -> None:
    worker = sim.worker(max_leases=5_000)
    parent = sim.create_task()
    kids = [child(parent) for _ in range(MAX_SETTLE_CHANGES + 200)]
    worker.ok(parent, *kids, waiting(parent, [kid.task_id for kid in kids], "fail_fast"))
    first = kids[0].task_id
    end = Commit(writes=(failed(first),), lease=worker.lease(first).lease)
    sim.batch((worker.peer, end), drain=False)  # the owner dies before the batch that would mark the rest
    assert sum(sim.task(kid.task_id).abort == "abort" for kid in kids) < len(kids) - 1
    sim.restart(settle=False, orphan_grace_ms=GRACE_MS)
    returning = sim.worker(max_leases=5_000)  # attaches in the batch that recovers
    assert all(sim.task(kid.task_id).abort == "abort" for kid in kids[1:])
    assert [lease.lease.task_id for lease in returning.granted if lease.mode == "phase"] == []


def test_fail_fast_marks_the_others_once_a_task_decides_to_fail_while_its_own_work_still_runs(sim: OwnerSim) -> None:
    """A task that decided ``failed`` but is ``completing`` (its owned work is still being aborted) is the fail_fast
    signal: its siblings are marked at once, not when its own work ends."""
    worker = sim.worker()
    parent = sim.create_task()
    first, second = child(parent), child(parent)
    worker.ok(parent, first, second, waiting(parent, [first.task_id, second.task_id], "fail_fast"))
    grandchild = child(first.task_id)
    worker.ok(first.task_id, grandchild)
    reply = worker.ok(first.task_id, failed(first.task_id))
    record = sim.task(first.task_id)
    assert (record.status, record.held) == ("completing", TaskOutcome(status="failed", error="boom"))
    assert sim.task(grandchild.task_id).abort == "abort"  # the held failure aborts its own work
    assert sim.task(second.task_id).abort == "abort"
    assert sim.task(second.task_id).seq == reply.seq + 1
    assert second.task_id in worker.cancelled


def test_fail_fast_begun_over_a_task_already_completing_with_a_failure_marks_the_others(sim: OwnerSim) -> None:
    worker = sim.worker()
    parent = sim.create_task()
    first, second = child(parent), child(parent)
    worker.ok(parent, first, second)
    grandchild = child(first.task_id)
    worker.ok(first.task_id, grandchild)
    worker.ok(first.task_id, failed(first.task_id))
    assert sim.status(first.task_id) == "completing"
    worker.ok(parent, waiting(parent, [first.task_id, second.task_id], "fail_fast"))
    assert sim.task(second.task_id).abort == "abort"


def test_a_marked_task_whose_only_able_worker_died_waits_the_grace_for_a_restarted_worker() -> None:
    """The last worker able to run a task marked for abort dies before its phase stopped: the task is not orphaned
    at once (its abort handler, the compensation, would never run) but within the grace, on the owner's clock, a
    restarted worker runs the handler."""
    sim = OwnerSim(orphan_grace_ms=GRACE_MS)
    try:
        sim.batch(now_ms=sim.now_ms + GRACE_MS)  # the owner's own start grace is over
        worker = sim.worker()
        task_id = sim.create_task()
        assert worker.holds(task_id)
        sim.abort(task_id)
        assert task_id in worker.cancelled
        worker.leave()
        left_ms = sim.now_ms
        record = sim.task(task_id)
        assert (record.status, record.abort, record.outcome) == ("pending", "abort", None)
        assert sim.core.next_deadline_ms() == left_ms + GRACE_MS
        sim.batch(now_ms=left_ms + GRACE_MS - 1)
        assert sim.status(task_id) == "pending"
        restarted = sim.worker()
        assert restarted.lease(task_id).mode == "abort"
        restarted.ok(task_id, aborted(task_id))
        assert sim.outcome(task_id).status == "aborted"
    finally:
        sim.close()


def test_a_marked_task_nobody_came_back_for_is_orphaned_when_the_grace_ends_on_the_owner_clock() -> None:
    sim = OwnerSim(orphan_grace_ms=GRACE_MS)
    try:
        sim.batch(now_ms=sim.now_ms + GRACE_MS)
        worker = sim.worker()
        task_id = sim.create_task()
        sim.abort(task_id)
        worker.leave()
        left_ms = sim.now_ms
        assert not sim.core.needs_settle(left_ms + GRACE_MS - 1)
        assert sim.core.needs_settle(left_ms + GRACE_MS)  # the shell wakes for the grace's end
        sim.batch(now_ms=left_ms + GRACE_MS)
        assert sim.outcome(task_id) == TaskOutcome(
            status="orphaned", reason="missing_task", error=f"no attached worker has task kind {KIND}"
        )
    finally:
        sim.close()


# ------------------------------------------------------------------------------------------ state machine table


def test_the_transition_table_in_docs_tasks_md_is_the_engines() -> None:
    text = (ROOT / "docs" / "tasks.md").read_text()
    section = text.split("## The task state machine", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \| `(\w+)` \|", section, flags=re.MULTILINE)
    assert len(rows) == len(set(rows))
    assert {(status, event): to for status, event, to in rows} == TRANSITIONS


def test_an_illegal_transition_raises_an_internal_error_even_under_optimisation(sim: OwnerSim) -> None:
    task_id = sim.create_task()
    record = sim.task(task_id)
    running = attrs.evolve(record, status="running")
    check_transition(record, "grant", running)
    with pytest.raises(IllegalTransition):
        check_transition(record, "wait", attrs.evolve(record, status="waiting"))  # only a running phase waits
    ended = attrs.evolve(record, status="terminal")
    for event in ("grant", "advance", "end", "mark", "stop", "resume", "wake"):
        with pytest.raises(IllegalTransition):
            check_transition(ended, event, attrs.evolve(ended, status="pending"))
    with pytest.raises(IllegalTransition):  # a save through the engine is checked too
        sim.core.tasks._records.save(record, attrs.evolve(record, status="sleeping"), "wake")
    assert sim.task(task_id) == record


def test_a_live_task_row_is_its_records_task_row_fields(sim: OwnerSim) -> None:
    worker = sim.worker()
    parent = sim.create_task(abandon_on_restart=True)
    kid = child(parent)
    worker.ok(parent, kid, waiting(parent, [kid.task_id]))
    sim.abort(kid.task_id)
    rows = list(sim.store.live_task_rows())
    assert len(rows) == 2
    for row in rows:
        record = sim.task(row[0])
        assert row == tuple(getattr(record, name) for name in TASK_ROW_FIELDS)


def test_outcome_and_blocked_reasons_are_closed_sets_on_the_wire() -> None:
    """A fault reason outside ``FaultReason`` / ``OutcomeReason`` is a bad frame, as an unknown status is."""
    good = SetTaskState(
        task_id=fresh_id(), status="terminal", outcome=TaskOutcome(status="faulted", reason="no_progress")
    )
    commit = Commit(writes=(good,), lease=LeaseRef(task_id=good.task_id, epoch=1))
    assert decode_frame(encode_frame(commit, call_id=1)) == commit
    bogus = attrs.evolve(good, outcome=TaskOutcome(status="faulted", reason="bogus"))  # type: ignore[arg-type]
    with pytest.raises(ProtocolError):
        decode_frame(encode_frame(attrs.evolve(commit, writes=(bogus,)), call_id=1))
    node = TaskNode(task=sim_record(), blocked="missing_task")
    reply = TaskGraphReply(seq=1, nodes=(node,))
    assert decode_frame(encode_frame(reply, call_id=1)) == reply
    with pytest.raises(ProtocolError):
        decode_frame(encode_frame(attrs.evolve(reply, nodes=(attrs.evolve(node, blocked="busy"),)), call_id=1))  # type: ignore[arg-type]


def sim_record() -> TaskRecord:
    return TaskRecord(
        task_id=fresh_id(),
        kind=KIND,
        version=1,
        conversation_id=fresh_id(),
        owner_task_id=None,
        background=False,
        abandon_on_restart=False,
        status="pending",
        phase=None,
        seq=1,
        created_at_ms=START_MS,
        updated_at_ms=START_MS,
    )
