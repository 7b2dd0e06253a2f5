"""The memory a peer can make the owner spend (issue 11), reproduced on the sans-IO core: what one batch produces
for a peer that never reads is bounded while it is produced, watches and waits per connection are bounded, and
one change fed to many watches shares its encoded records."""

from __future__ import annotations

import itertools
import typing
from collections.abc import Iterator

import pytest

from protocol import (
    SUPPORTED_VERSIONS,
    Change,
    Committed,
    CreateTask,
    EntriesReply,
    Error,
    ErrorCode,
    Hello,
    PartialsReply,
    Ping,
    Pong,
    Received,
    Record,
    WaitTask,
    Watching,
    Welcome,
    decode_frame,
    encode_frame,
)
from storage_owner.core import LoggedCommit, OwnerCore, PeerId
from storage_owner.core import _peers as peers_module
from storage_owner.core import _watches as watches_module
from storage_owner.core._output import OutputLedger
from storage_owner.store import MemoryStore
from tests.unit import test_codec
from tests.unit.test_core import (
    INSTANCE,
    START_MS,
    TOKEN,
    append,
    commit,
    create,
    fresh_id,
    read_entries,
    watch,
)

PEER_BUDGET = 4 << 20
TOTAL_BUDGET = 64 << 20
READS = 1024


class Budgeted:
    """A core with explicit output budgets, driven as the shell drives it (it reports nothing sent: a peer that
    never reads)."""

    def __init__(self) -> None:
        self.store = MemoryStore()
        self.core = OwnerCore(
            self.store,
            token=TOKEN,
            instance=INSTANCE,
            peer_output_budget=PEER_BUDGET,
            total_output_budget=TOTAL_BUDGET,
        )
        self._peers = itertools.count(1)
        self._calls = itertools.count(1)
        self.queued: dict[PeerId, int] = {}

    def connect(self, role: str = "client") -> PeerId:
        answer = self.core.hello(Hello(protocol_version=SUPPORTED_VERSIONS[-1], token=TOKEN, role=role))
        assert isinstance(answer, Welcome), answer
        peer = next(self._peers)
        self.core.attach(peer, role)
        return peer

    def batch(self, items: list[tuple[PeerId, object]]) -> list[tuple[PeerId, int | None, object, bytes]]:
        """One batch; its output with each frame's encoded bytes (as the shell queues them), and the shell's report
        of what each peer now holds unsent (nothing was read)."""
        self.store.begin()
        frames = [(peer, Received(next(self._calls), frame)) for peer, frame in items]
        self.core.run_batch(frames, START_MS)  # type: ignore[arg-type]
        self.store.commit()
        out, _ = self.core.take_output()
        return self._queue(out, self.core.take_encoded())

    def catch_up(self) -> list[tuple[PeerId, int | None, object, bytes]]:
        out = self.core.catch_up()
        return self._queue(out, self.core.take_encoded())

    def _queue(self, out: list, encoded: list[bytes]) -> list[tuple[PeerId, int | None, object, bytes]]:
        assert len(encoded) == len(out)
        for (peer, _, _), data in zip(out, encoded, strict=True):
            self.queued[peer] = self.queued.get(peer, 0) + len(data)
        for peer, queued in self.queued.items():
            self.core.set_queued(peer, queued)
        return [(peer, call_id, frame, data) for (peer, call_id, frame), data in zip(out, encoded, strict=True)]

    def read_all(self, peer: PeerId) -> None:
        """The peer read everything it was sent."""
        self.queued[peer] = 0
        self.core.set_queued(peer, 0)


@pytest.fixture
def budgeted() -> Iterator[Budgeted]:
    opened = Budgeted()
    yield opened
    opened.store.close()


def big_conversation(owner: Budgeted, writer: PeerId, *, entries: int = 200, entry_bytes: int = 4000) -> str:
    conversation_id = fresh_id()
    owner.batch([(writer, commit(create(conversation_id)))])
    text = "x" * entry_bytes
    for start in range(0, entries, 100):
        writes = [append(conversation_id, data={"text": text}) for _ in range(min(100, entries - start))]
        [(_, _, reply, _)] = owner.batch([(writer, commit(*writes))])
        assert isinstance(reply, Committed), reply
    return conversation_id


def test_a_batch_of_reads_never_read_is_refused_overloaded_past_the_budget(budgeted: Budgeted) -> None:
    writer = budgeted.connect()
    conversation_id = big_conversation(budgeted, writer)  # ~800 KB: each read of it is ~400 KB
    reader = budgeted.connect("reader")
    out = budgeted.batch([(reader, read_entries(conversation_id, limit=1000)) for _ in range(READS)])
    produced = sum(len(data) for peer, _, _, data in out if peer == reader)
    answered = [frame for _, _, frame, _ in out if isinstance(frame, EntriesReply)]
    refused = [frame for _, _, frame, _ in out if isinstance(frame, Error)]
    # Without a budget this batch produced ~420 MB; now: the budget, plus at most one reply past it, plus the
    # refusals (a few hundred bytes each).
    largest = max(len(data) for _, _, frame, data in out if isinstance(frame, EntriesReply))
    assert produced <= PEER_BUDGET + largest + READS * 512
    assert len(answered) + len(refused) == READS
    assert answered and refused
    assert {error.code for error in refused} == {ErrorCode.OVERLOADED}
    assert str(PEER_BUDGET) in refused[0].message
    # A resubscription and a heartbeat are still answered (small fixed replies the client does not await).
    out = budgeted.batch([(reader, watch(7, conversation_id)), (reader, Ping())])
    assert [type(frame) for _, _, frame, _ in out] == [Watching, Pong]
    # Once the peer has read what it was sent, it is served again.
    budgeted.read_all(reader)
    [(_, _, reply, _)] = budgeted.batch([(reader, read_entries(conversation_id, limit=10))])
    assert isinstance(reply, EntriesReply)


def test_the_total_budget_refuses_every_peer_once_the_owner_holds_too_much() -> None:
    owner = Budgeted()
    owner.core = OwnerCore(
        owner.store, token=TOKEN, instance=INSTANCE, peer_output_budget=PEER_BUDGET, total_output_budget=6 << 20
    )
    try:
        writer = owner.connect()
        conversation_id = big_conversation(owner, writer)
        readers = [owner.connect("reader") for _ in range(4)]
        # Each reader stays under its own budget (2 MB), together past the total (6 MiB).
        for reader in readers:
            owner.batch([(reader, read_entries(conversation_id, limit=1000)) for _ in range(5)])
        assert owner.core.queued_output_bytes <= (6 << 20) + 5 * 500_000
        [(_, _, reply, _)] = owner.batch([(writer, read_entries(conversation_id, limit=1))])
        assert isinstance(reply, Error) and reply.code == ErrorCode.OVERLOADED, reply
        assert "across its peers" in reply.message
        for reader in readers:
            owner.read_all(reader)
        [(_, _, reply, _)] = owner.batch([(writer, read_entries(conversation_id, limit=1))])
        assert isinstance(reply, EntriesReply)
    finally:
        owner.store.close()


def test_a_watch_of_a_peer_past_its_budget_reads_the_log_later_and_misses_nothing(budgeted: Budgeted) -> None:
    writer = budgeted.connect()
    conversation_id = fresh_id()
    budgeted.batch([(writer, commit(create(conversation_id)))])
    reader = budgeted.connect("reader")
    budgeted.batch([(reader, watch(1, conversation_id))])
    budgeted.catch_up()
    # 60 appends of 100 KB in one batch: ~6 MB for the watch, past the 4 MiB budget.
    text = "y" * 100_000
    out = budgeted.batch([(writer, commit(append(conversation_id, data={"text": text}))) for _ in range(60)])
    fed = [frame for peer, _, frame, _ in out if peer == reader and isinstance(frame, Change)]
    produced = sum(len(data) for peer, _, _, data in out if peer == reader)
    assert produced <= PEER_BUDGET + 200_000
    assert 0 < len(fed) < 60
    assert not budgeted.core.has_lagging_watches  # nothing to do for it until it reads
    seqs = [change.seq for change in fed]
    while len(seqs) < 60:
        budgeted.read_all(reader)
        assert budgeted.core.has_lagging_watches
        seqs += [frame.seq for peer, _, frame, _ in budgeted.catch_up() if isinstance(frame, Change)]
    assert seqs == list(range(seqs[0], seqs[0] + 60))  # every commit once, in order


def test_watches_per_connection_are_bounded(budgeted: Budgeted) -> None:
    reader = budgeted.connect("reader")
    limit = watches_module.MAX_WATCHES_PER_PEER
    out = budgeted.batch([(reader, watch(watch_id)) for watch_id in range(limit + 1)])
    errors = [frame for _, _, frame, _ in out if isinstance(frame, Error)]
    assert len(errors) == 1
    assert errors[0].code == ErrorCode.INVALID and str(limit) in errors[0].message
    # Another connection has its own bound.
    other = budgeted.connect("reader")
    [(_, _, reply, _)] = budgeted.batch([(other, watch(1))])
    assert not isinstance(reply, Error)


def test_one_change_to_many_watches_shares_its_encoded_records(budgeted: Budgeted) -> None:
    writer = budgeted.connect()
    conversation_id = fresh_id()
    budgeted.batch([(writer, commit(create(conversation_id)))])
    readers = [budgeted.connect("reader") for _ in range(8)]
    budgeted.batch([(reader, watch(index, conversation_id)) for reader in readers for index in range(4)])
    while budgeted.core.has_lagging_watches:
        budgeted.catch_up()
    out = budgeted.batch([(writer, commit(append(conversation_id, data={"text": "z" * 100_000})))])
    fed = [(frame, data) for _, _, frame, data in out if isinstance(frame, Change)]
    assert len(fed) == 32
    for frame, data in fed:
        assert data == encode_frame(frame)  # byte for byte what encoding it alone gives
        assert decode_frame(data) == frame


def test_pending_waits_per_connection_are_bounded(budgeted: Budgeted) -> None:
    worker = budgeted.connect()
    task_id = fresh_id()
    conversation_id = fresh_id()
    budgeted.batch([(worker, commit(create(conversation_id)))])
    task = CreateTask(task_id=task_id, kind="shop.slow", conversation_id=conversation_id)
    [(_, _, created, _)] = budgeted.batch([(worker, commit(task))])
    assert isinstance(created, Committed), created
    limit = peers_module.MAX_WAITS_PER_PEER
    out = budgeted.batch([(worker, WaitTask(task_id=task_id)) for _ in range(limit + 2)])
    errors = [frame for _, _, frame, _ in out if isinstance(frame, Error)]
    assert len(errors) == 2
    assert all(error.code == ErrorCode.INVALID and str(limit) in error.message for error in errors)


def test_outcomes_of_large_results_come_in_parts_under_the_message_limit() -> None:
    """1,000 tasks with 9 KB results: one ``read_outcomes`` of all of them once made one 9 MB reply (past the
    WebSocket limit: the client was disconnected, and its retry the same, forever). Now each reply answers the first
    ids that fit, and asking again for the rest gets every outcome once."""
    from protocol import MAX_MESSAGE_BYTES, OutcomesReply, ReadOutcomes
    from tests.unit.test_tasks_core import KIND, OwnerSim, completed, expect

    sim = OwnerSim()
    try:
        worker = sim.worker(max_leases=1000)
        conversation_id = sim.new_conversation()
        task_ids = [fresh_id() for _ in range(1000)]
        writes = [CreateTask(task_id=task_id, kind=KIND, conversation_id=conversation_id) for task_id in task_ids]
        expect(sim.commit(*writes), Committed)
        result = {"text": "r" * 9000}
        for task_id in task_ids:
            expect(worker.commit(task_id, completed(task_id, result)), Committed)
        answered: list[object] = []
        while len(answered) < len(task_ids):
            request = Received(
                next(itertools.count(10**6 + len(answered))), ReadOutcomes(task_ids=tuple(task_ids[len(answered) :]))
            )
            out = sim.batch((sim.client, request))
            [(reply, data)] = [
                (frame, encode_frame(frame, call_id=request.call_id))
                for _, call_id, frame in out
                if call_id == request.call_id
            ]
            assert isinstance(reply, OutcomesReply), reply
            assert len(reply.outcomes) >= 1 and len(data) < MAX_MESSAGE_BYTES
            answered.extend(reply.outcomes)
        assert len(answered) == 1000
        assert all(outcome is not None and outcome.status == "completed" for outcome in answered)
    finally:
        sim.close()


def test_pages_of_large_operations_stay_under_the_message_limit() -> None:
    """A run's journal of 60 model operations with 40 KB results: one page of up to 1,000 was one 2.4 MB reply
    (past the 1 MiB message limit); now a page ends early at the read budget and the pages together hold all."""
    from protocol import MAX_MESSAGE_BYTES, FinishOperation, JsonValue, OperationsReply, ReadOperations
    from tests.unit.test_runs_core import RunSim, leased_run, model_intent, usage
    from tests.unit.test_tasks_core import expect

    sim = RunSim()
    try:
        run_id, task_id, worker = leased_run(sim)
        for _ in range(60):
            operation_id = fresh_id()
            worker.ok(task_id, model_intent(run_id, operation_id))
            result = JsonValue({"text": "o" * 40_000})
            worker.ok(
                task_id, FinishOperation(operation_id=operation_id, status="completed", result=result, usage=usage(1))
            )
        seen: list[str] = []
        cursor: int | None = 0
        pages = 0
        while cursor is not None:
            request = Received(10**7 + pages, ReadOperations(run_id=run_id, cursor=cursor, limit=1000))
            out = sim.batch((sim.client, request))
            [(reply, data)] = [
                (frame, encode_frame(frame, call_id=call_id)) for _, call_id, frame in out if call_id == request.call_id
            ]
            reply = expect(reply, OperationsReply)
            assert reply.operations and len(data) < MAX_MESSAGE_BYTES
            seen += [operation.operation_id for operation in reply.operations]
            cursor = reply.next_cursor
            pages += 1
        assert len(seen) == len(set(seen)) == 60
        assert pages > 1
    finally:
        sim.close()


def test_a_commits_records_as_the_log_stores_them_are_the_bytes_a_watch_sends() -> None:
    """A watch fed a whole commit sends the commit log's bytes as they are (``OutputLedger.change`` with
    ``packed``): they must be what encoding the ``Change`` frame's records gives, for every kind of record."""
    records = (
        test_codec.CONVERSATION_RECORD,
        test_codec.ENTRY_RECORD,
        test_codec.DOCUMENT_RECORD,
        test_codec.SUBMISSION_RECORD,
        test_codec.TASK_RECORD,
        test_codec.CHILD_TASK_RECORD,
        test_codec.RUN_RECORD,
        test_codec.OPERATION_RECORD,
        test_codec.INTERACTION_RECORD,
        *next(frame for frame in test_codec.EXAMPLES if isinstance(frame, PartialsReply)).partials,
    )
    assert {type(record) for record in records} == set(typing.get_args(Record))
    packed = MemoryStore().log_commit(LoggedCommit(seq=7, committed_at_ms=1, records=records), frozenset())
    change = Change(watch_id=3, seq=7, committed_at_ms=1, records=records)
    ledger = OutputLedger(peer_budget=1 << 30, total_budget=1 << 30)
    ledger.change(1, change, None, packed)
    assert ledger.take() == [encode_frame(change)]
