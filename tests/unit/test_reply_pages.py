"""Replies that grew with what peers sent, paged at the read budget (issue 11): ``read_peers`` (workers announcing
many capabilities) and ``read_partials`` (a run's streamed output, up to 1 MiB per model request)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing

from actors._client._client import Client
from actors._client._runs import _join_partials
from protocol import (
    MAX_ANNOUNCE_BYTES,
    MAX_MESSAGE_BYTES,
    MAX_PARTIAL_BYTES,
    Announce,
    AppendPartial,
    Capability,
    ErrorCode,
    FinishOperation,
    Frame,
    JsonValue,
    LeaseRef,
    Ok,
    PartialRecord,
    PartialsReply,
    PeersReply,
    ProtocolError,
    ReadPartials,
    ReadPeers,
    ReadUsageTotals,
    Received,
    RunUsage,
    UsageError,
    UsageTotal,
    UsageTotalsReply,
    encode_frame,
)
from tests.unit.test_runs_core import RunSim, leased_run, model_intent
from tests.unit.test_tasks_core import OwnerSim, error_code, expect, fresh_id

_calls = itertools.count(10**8)


def capabilities(count: int, tag: str, name_chars: int = 150) -> tuple[Capability, ...]:
    return tuple(
        Capability(kind="task", name=f"{tag}.{index:05d}.".ljust(name_chars, "c"), version=1) for index in range(count)
    )


def call(sim: OwnerSim, peer: int, request: Frame) -> tuple[Frame, int]:
    """One request in its own batch: its reply and the reply's size on the wire."""
    received = Received(next(_calls), request)
    out = sim.batch((peer, received))
    [(reply, size)] = [
        (frame, len(encode_frame(frame, call_id=call_id))) for _, call_id, frame in out if call_id == received.call_id
    ]
    return reply, size


def test_an_announce_past_its_byte_bound_is_refused_and_the_previous_one_stands() -> None:
    sim = OwnerSim()
    try:
        worker = sim.attach_worker("big")
        small = Announce(pid=1, host="h", app="a", capabilities=capabilities(3, "small"))
        expect(sim.request(worker.peer, small), Ok)
        big = Announce(pid=2, host="h", app="a", capabilities=capabilities(2000, "big"))
        assert len(encode_frame(big, call_id=1)) > MAX_ANNOUNCE_BYTES
        refused, _ = call(sim, worker.peer, big)
        assert error_code(refused) == ErrorCode.INVALID
        assert str(MAX_ANNOUNCE_BYTES) in refused.message  # type: ignore[attr-defined]
        reply, _ = call(sim, sim.client, ReadPeers())
        [info] = [peer for peer in expect(reply, PeersReply).peers if peer.peer_name == "big"]
        assert info.pid == 1 and info.capabilities == small.capabilities
    finally:
        sim.close()


def test_read_peers_pages_many_large_announcements_under_the_message_limit() -> None:
    """Eight workers announcing about 200 KB each made one 1.6 MB ``peers`` reply (past the 1 MiB message limit);
    now a page ends at the read budget and the pages together list every peer once."""
    sim = OwnerSim()
    try:
        names = []
        for index in range(8):
            worker = sim.attach_worker(f"w{index}")
            announce = Announce(pid=100 + index, host="h", app="a", capabilities=capabilities(1000, f"w{index}"))
            assert len(encode_frame(announce, call_id=1)) <= MAX_ANNOUNCE_BYTES
            expect(sim.request(worker.peer, announce), Ok)
            names.append(worker.name)
        seen: list[int] = []
        after: int | None = None
        pages = 0
        while True:
            reply, size = call(sim, sim.client, ReadPeers(after_peer_id=after))
            page = expect(reply, PeersReply)
            assert page.peers and size < MAX_MESSAGE_BYTES
            seen += [peer.peer_id for peer in page.peers]
            assert all(len(peer.capabilities) == 1000 for peer in page.peers if peer.role == "worker")
            pages += 1
            if page.next_after_peer_id is None:
                break
            assert page.next_after_peer_id == page.peers[-1].peer_id
            after = page.next_after_peer_id
        assert pages > 1
        assert seen == sorted(set(seen)) and len(seen) == 9  # the client and the eight workers
        # A page after the last peer is empty, and a default read starts at the first.
        last, _ = call(sim, sim.client, ReadPeers(after_peer_id=seen[-1]))
        assert expect(last, PeersReply) == PeersReply(peers=())
        first, _ = call(sim, sim.client, ReadPeers())
        assert expect(first, PeersReply).peers[0].peer_id == seen[0]
    finally:
        sim.close()


# ------------------------------------------------------------------------------------------------ read_partials

BIG_PIECE = "aé€😀" * 26_000
"""260,000 bytes of UTF-8 (characters of 1 to 4 bytes, so a cut must fall between characters); four of them are
just under ``MAX_PARTIAL_BYTES``."""


def streamed_run(done_operations: int) -> tuple[RunSim, str, list[str], str]:
    """A run with ``done_operations`` finished model requests (each a ``done`` record) and one streaming about
    1 MB: (sim, run id, the finished ids, the streaming id)."""
    sim = RunSim()
    run_id, task_id, worker = leased_run(sim)
    finished = []
    for _ in range(done_operations):
        op = fresh_id()
        worker.ok(task_id, model_intent(run_id, op))
        worker.ok(task_id, AppendPartial(operation_id=op, attempt=1, offset=0, text="short"))
        worker.ok(task_id, FinishOperation(operation_id=op, status="completed", result=JsonValue({"text": "short"})))
        finished.append(op)
    big = fresh_id()
    worker.ok(task_id, model_intent(run_id, big))
    for index in range(4):
        offset = index * len(BIG_PIECE)
        worker.ok(task_id, AppendPartial(operation_id=big, attempt=1, offset=offset, text=BIG_PIECE))
    assert MAX_PARTIAL_BYTES - 4 * len(BIG_PIECE.encode()) < 10_000
    return sim, run_id, finished, big


def read_pages(sim: OwnerSim, **key: str) -> tuple[list[PartialsReply], list[PartialRecord]]:
    """Every page of ``read_partials`` (each checked under the message limit) and their records joined by the
    client's rules."""
    pages: list[PartialsReply] = []
    cursor: str | None = None
    offset = 0
    held: dict[str, PartialRecord] = {}
    while True:
        reply, size = call(sim, sim.client, ReadPartials(**key, from_operation_id=cursor, from_offset=offset))
        page = expect(reply, PartialsReply)
        assert page.partials and size < MAX_MESSAGE_BYTES
        assert _join_partials(held, page.partials) is None
        pages.append(page)
        if page.next_operation_id is None:
            return pages, list(held.values())
        cursor, offset = page.next_operation_id, page.next_offset
        assert len(pages) < 100


def test_a_run_s_partials_come_in_pages_under_the_message_limit_and_join_whole() -> None:
    """1,050 finished model requests and one streaming 1 MB made one ``partials`` reply of about 1.2 MB (past the
    1 MiB message limit); now pages end at the read budget (a long text cut between characters and continued)
    and together hold every operation once, with the text exact."""
    sim, run_id, finished, big = streamed_run(1050)
    try:
        pages, joined = read_pages(sim, run_id=run_id)
        assert len(pages) >= 3
        assert [record.operation_id for record in joined] == [*finished, big]
        assert all(record.status == "done" and not record.text for record in joined[:-1])
        assert joined[-1].offset == 0 and joined[-1].text == BIG_PIECE * 4 and joined[-1].status == "streaming"
        assert any(page.next_offset > 0 for page in pages)  # the big text was cut
        # One operation alone pages the same way.
        op_pages, [alone] = read_pages(sim, operation_id=big)
        assert len(op_pages) >= 2 and alone.text == BIG_PIECE * 4
    finally:
        sim.close()


def test_read_partials_cursors_are_checked() -> None:
    sim, run_id, finished, big = streamed_run(1)
    try:
        other_run = sim.start_run(sim.agent_conversation())
        bad = [
            ReadPartials(run_id=run_id, from_offset=3),  # an offset without an operation
            ReadPartials(run_id=run_id, from_operation_id=big, from_offset=-1),
            ReadPartials(run_id=other_run, from_operation_id=big),  # not that run's
            ReadPartials(operation_id=big, from_operation_id=finished[0]),
        ]
        for request in bad:
            reply, _ = call(sim, sim.client, request)
            assert error_code(reply) == ErrorCode.INVALID, request
        # An offset past the text (another attempt replaced the one read) answers the text from its start.
        reply, _ = call(sim, sim.client, ReadPartials(operation_id=big, from_operation_id=big, from_offset=10**7))
        assert expect(reply, PartialsReply).partials[0].offset == 0
    finally:
        sim.close()


def test_the_client_reads_again_a_text_whose_attempt_changed_between_pages() -> None:
    def record(attempt: int, offset: int, text: str, created_at_ms: int = 1) -> PartialRecord:
        return PartialRecord(
            operation_id="op",
            run_id="run",
            conversation_id="c",
            attempt=attempt,
            offset=offset,
            text=text,
            status="streaming",
            seq=attempt,
            created_at_ms=created_at_ms,
        )

    held: dict[str, PartialRecord] = {}
    assert _join_partials(held, [record(1, 0, "Hello, ")]) is None
    assert _join_partials(held, [record(1, 7, "world")]) is None
    assert held["op"].text == "Hello, world" and held["op"].offset == 0
    assert _join_partials(held, [record(2, 12, "!")]) == "op" and "op" not in held  # another attempt's
    assert _join_partials(held, [record(2, 0, "Hi")]) is None and held["op"].text == "Hi"
    assert _join_partials(held, [record(2, 2, "!", created_at_ms=5)]) == "op"  # a retried run's attempt 2


def test_an_announce_naming_many_leases_is_not_held_to_the_byte_bound() -> None:
    """The byte bound is on what ``read_peers`` shows: a worker reattaching with thousands of running phases
    (its ``leases``, answered with ``cancel_lease`` where no longer valid, never kept) still announces."""
    sim = OwnerSim()
    try:
        worker = sim.attach_worker("busy")
        leases = tuple(LeaseRef(task_id=fresh_id(), epoch=1) for _ in range(6000))
        announce = Announce(
            pid=1, host="h", app="a", capabilities=capabilities(3, "t"), max_leases=10_000, leases=leases
        )
        assert len(encode_frame(announce, call_id=1)) > MAX_ANNOUNCE_BYTES
        expect(sim.request(worker.peer, announce), Ok)
    finally:
        sim.close()


async def test_usage_totals_stop_at_an_owner_that_answers_the_same_page_again() -> None:
    """Paging ends: an owner that names the key it was asked to read after as the next one (or sends an empty page
    with a next key) is a ``ProtocolError``, not a loop gathering the same totals without end."""

    class SamePage:
        def __init__(self) -> None:
            self.calls = 0

        async def call(self, request: ReadUsageTotals, expected: type[Any]) -> UsageTotalsReply:
            await trio.lowlevel.checkpoint()
            self.calls += 1
            total = UsageTotal(scope="model", key="m", usage=RunUsage(input_tokens=1))
            return UsageTotalsReply(totals=(total,), budgets=(), next_after_key="m")

    connection = SamePage()
    with trio.fail_after(5), pytest.raises(ProtocolError, match="no progress"):
        await Client(connection).usage_totals("model")  # type: ignore[arg-type]
    assert connection.calls == 2


async def test_a_bad_set_budget_call_is_refused_at_a_checkpoint() -> None:
    """Every client method is a checkpoint, even one refused before anything is sent."""
    client = Client(object())  # type: ignore[arg-type]
    with trio.testing.assert_checkpoints(), pytest.raises(UsageError, match="exactly one"):
        await client.set_budget(max_tokens=10)
