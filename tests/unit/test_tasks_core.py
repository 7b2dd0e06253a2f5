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
