"""Partial output of model requests (and a tool call's progress) in the owner core, sans-IO
(storage_owner/core/_partials.py): pieces stored and logged with their commit, a new attempt replaces the earlier
one's, ``done`` on the result, ``aborted`` when an attempt fails or is cut off, stale leases and the bounds refused
whole. Driven through ``OwnerCore.run_batch``, over the memory store."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs
import pytest

from actors._client._runs import _join_partials
from protocol import (
    MAX_PARTIAL_BYTES,
    MAX_PARTIAL_PIECE_BYTES,
    AdvanceClock,
    AppendEntry,
    AppendPartial,
    CancelRun,
    Change,
    EntryRecord,
    ErrorCode,
    FinishOperation,
    JsonValue,
    OperationRecord,
    PartialRecord,
    PartialsReply,
    ReadPartials,
    Retry,
    SetTaskState,
    TaskOutcome,
    Watch,
    Watching,
    aborted_answer_entry_id,
)
from storage_owner.core._checks import IllegalTransition
from storage_owner.core._partials import PARTIAL_TRANSITIONS
from storage_owner.core._run_rules import TERMINAL
from tests.unit.test_runs_core import (
    RunSim,
    doc_table,
    leased_run,
    model_intent,
    model_requested,
    tool_intent,
    with_tool,
)
from tests.unit.test_tasks_core import aborted, completed, error_code, expect, fresh_id, sent


@pytest.fixture
def sim() -> Iterator[RunSim]:
    opened = RunSim()
    yield opened
    opened.close()


@pytest.fixture
def manual_sim() -> Iterator[RunSim]:
    """A sim whose owner runs on the manual clock (time moves by ``AdvanceClock`` only)."""
    opened = RunSim(clock="manual")
    yield opened
    opened.close()


def piece(op: str, offset: int, text: str, attempt: int = 1) -> AppendPartial:
    return AppendPartial(operation_id=op, attempt=attempt, offset=offset, text=text)


def logged_partials(sim: RunSim, after_seq: int = 0) -> list[tuple[int, int, int, str, str]]:
    """Every partial record of the commit log after ``after_seq``: (seq, attempt, offset, text, status)."""
    return [
        (commit.seq, record.attempt, record.offset, record.text, record.status)
        for commit in sim.store.read_log(after_seq, None, 10_000)
        for record in commit.records
        if isinstance(record, PartialRecord)
    ]


def stored(sim: RunSim, **key: str) -> list[tuple[int, int, str, str]]:
    """What ``read_partials`` answers, its pages (a text past the read budget is cut) joined as the client does."""
    held: dict[str, PartialRecord] = {}
    cursor: str | None = None
    offset = 0
    while True:
        request = ReadPartials(**key, from_operation_id=cursor, from_offset=offset)
        reply = expect(sim.request(sim.client, request), PartialsReply)
        assert _join_partials(held, reply.partials) is None
        if reply.next_operation_id is None:
            return [(record.attempt, record.offset, record.text, record.status) for record in held.values()]
        cursor, offset = reply.next_operation_id, reply.next_offset


def test_pieces_are_stored_logged_in_order_and_done_with_the_result(sim: RunSim) -> None:
    run_id, task_id, worker = leased_run(sim)
    conversation_id = sim.run(run_id).conversation_id
    op = fresh_id()
    worker.ok(task_id, model_intent(run_id, op))
    head = sim.core.head_seq
    first = worker.ok(task_id, piece(op, 0, "Hel"))
    second = worker.ok(task_id, piece(op, 0, "Hello, wo"))  # resent with an overlap: only "lo, wo" is new
    assert error_code(worker.commit(task_id, piece(op, 12, "gap"))) == ErrorCode.CONFLICT  # the text ends at 9
    assert stored(sim, run_id=run_id) == [(1, 0, "Hello, wo", "streaming")]
    assert stored(sim, operation_id=op) == [(1, 0, "Hello, wo", "streaming")]
    done = worker.ok(
        task_id,
        piece(op, 9, "rld"),
        FinishOperation(operation_id=op, status="completed", result=JsonValue({"text": "Hello, world"})),
        AppendEntry(conversation_id=conversation_id, entry_id=fresh_id(), kind="tether.assistant", data=JsonValue({})),
        next_turn(task_id),
    )
    assert logged_partials(sim, head) == [
        (first.seq, 1, 0, "Hel", "streaming"),
        (second.seq, 1, 3, "lo, wo", "streaming"),
        (done.seq, 1, 9, "rld", "streaming"),
        (done.seq, 1, 12, "", "done"),
    ]
    # The final text is kept once, in the result: the pieces are gone, the head says how far it streamed.
    assert sim.store.partial_piece_count() == 0
    assert stored(sim, run_id=run_id) == [(1, 12, "", "done")]
    assert sim.core.partials.held_count == 0
    # A watch of the conversation replays them from the log, in the same commits.
    watch = sent(Watch(watch_id=7, conversation_id=conversation_id, from_seq=head))
    out = sim.batch((sim.client, watch))
    assert any(isinstance(frame, Watching) for _, _, frame in out)
    changes = [frame for _, _, frame in sim.core.catch_up() if isinstance(frame, Change)]
    replayed = [(c.seq, r.offset, r.text, r.status) for c in changes for r in c.records if isinstance(r, PartialRecord)]
    assert replayed == [(seq, offset, text, status) for seq, _, offset, text, status in logged_partials(sim, head)]


def test_a_tool_calls_progress_is_stored_under_its_tool_tasks_lease_and_kept_when_it_is_cut_off(sim: RunSim) -> None:
    run_id, task_id, worker = leased_run(sim)
    tool_id, tools = with_tool(sim, worker, task_id)
    op = fresh_id()
    tools.ok(tool_id, tool_intent(run_id, op, "report"))
    tools.ok(tool_id, piece(op, 0, "checking the order... "))
    assert stored(sim, operation_id=op) == [(1, 0, "checking the order... ", "streaming")]
    tools.leave()  # cut off: the progress is aborted and kept for whoever settles the call
    assert stored(sim, operation_id=op) == [(1, 0, "checking the order... ", "aborted")]
    again = sim.worker(kinds=("tool:lookup",))
    error = (
        "error: the tool call was interrupted and may have partially run; its progress so far: checking the order..."
    )
    settled = FinishOperation(operation_id=op, status="failed", result=JsonValue(error), is_error=True, error=error)
    again.ok(tool_id, settled, completed(tool_id, error))
    assert sim.store.partial_piece_count() == 0  # its result holds what the model reads now


def next_turn(task_id: str) -> SetTaskState:
    return SetTaskState(task_id=task_id, status="running", checkpoint=JsonValue({"phase": "turn", "turn": 2}))


def test_a_failed_attempt_is_aborted_and_the_next_attempt_replaces_its_text(manual_sim: RunSim) -> None:
    sim = manual_sim
    run_id, task_id, worker, op = model_requested(sim)
    worker.ok(task_id, piece(op, 0, "first try"))
    lease = worker.lease(task_id).lease
    until_ms = sim.now_ms + 1_000
    failed = worker.ok(
        task_id,
        FinishOperation(operation_id=op, status="failed", error="server_error: 502"),
        SetTaskState(task_id=task_id, status="sleeping", until_ms=until_ms, checkpoint=JsonValue({"turn": 0})),
    )
    assert logged_partials(sim)[-1] == (failed.seq, 1, 9, "", "aborted")
    assert stored(sim, operation_id=op) == [(1, 0, "first try", "aborted")]  # kept until the next attempt
    # The aborted attempt takes no more pieces: its phase ended with the failure.
    assert error_code(worker.commit(task_id, piece(op, 9, "more"), lease=lease)) == ErrorCode.STALE_LEASE
    sim.request(sim.client, AdvanceClock(by_ms=1_000))
    assert worker.holds(task_id)
    worker.ok(task_id, model_intent(run_id, op, attempt=2))
    # A piece of attempt 1 is refused now: only the open attempt streams.
    assert error_code(worker.commit(task_id, piece(op, 0, "x", attempt=1))) == ErrorCode.CONFLICT
    second = worker.ok(task_id, piece(op, 0, "second", attempt=2))
    assert logged_partials(sim)[-1] == (second.seq, 2, 0, "second", "streaming")
    assert stored(sim, operation_id=op) == [(2, 0, "second", "streaming")]
    assert sim.store.partial_text(op) == "second"


def test_an_interrupted_stream_is_aborted_by_the_owner_and_deleted_past_the_last_attempt(manual_sim: RunSim) -> None:
    sim = manual_sim
    run_id, task_id, worker, op = model_requested(sim)
    worker.ok(task_id, piece(op, 0, "cut me"))
    head = sim.core.head_seq
    worker.leave()  # the settling commit interrupts the operation: its stream is aborted there
    assert sim.run(run_id).status == "retry_wait"
    [(seq, attempt, offset, text, status)] = logged_partials(sim, head)
    assert (attempt, offset, text, status) == (1, 6, "", "aborted") and seq > head
    assert stored(sim, operation_id=op) == [(1, 0, "cut me", "aborted")]
    # An owner restart meanwhile keeps it aborted (never streaming again, never an answer).
    sim.restart()
    assert stored(sim, operation_id=op) == [(1, 0, "cut me", "aborted")]
    for attempt_number in (2, 3):
        sim.request(sim.client, AdvanceClock(by_ms=2_000))
        worker = sim.agent_worker()
        assert worker.holds(task_id)
        worker.ok(task_id, model_intent(run_id, op, attempt=attempt_number))
        worker.ok(task_id, piece(op, 0, f"try {attempt_number}", attempt=attempt_number))
        assert stored(sim, operation_id=op) == [(attempt_number, 0, f"try {attempt_number}", "streaming")]
        worker.leave()
    # Cut off at its last attempt: the run fails, the partial is aborted and its pieces deleted.
    assert sim.run(run_id).status == "failed"
    assert logged_partials(sim)[-1][1:] == (3, 5, "", "aborted")
    assert stored(sim, operation_id=op) == [(3, 5, "", "aborted")]
    assert sim.store.partial_piece_count() == 0 and sim.core.partials.held_count == 0


def test_a_stream_its_workers_close_withdrew_is_aborted_and_its_attempt_streams_again(sim: RunSim) -> None:
    """Withdrawn (its worker closed: ``release`` with ``closing``), the attempt's text is aborted in the settling
    commit; the same attempt, sent again, replaces it."""
    run_id, task_id, worker, op = model_requested(sim)
    worker.ok(task_id, piece(op, 0, "half an ans"))
    head = sim.core.head_seq
    worker.release(task_id, closing=True)
    [(_, attempt, offset, text, status)] = logged_partials(sim, head)
    assert (attempt, offset, text, status) == (1, 11, "", "aborted")
    assert worker.holds(task_id)
    worker.ok(task_id, model_intent(run_id, op, attempt=1))
    worker.ok(task_id, piece(op, 0, "a whole answer"))
    assert stored(sim, operation_id=op) == [(1, 0, "a whole answer", "streaming")]


def test_an_owner_restart_mid_stream_aborts_it_in_the_recovery_commit(sim: RunSim) -> None:
    _run_id, task_id, worker, op = model_requested(sim)
    worker.ok(task_id, piece(op, 0, "half"))
    head = sim.core.head_seq
    sim.restart()
    assert [entry[1:] for entry in logged_partials(sim, head)] == [(1, 4, "", "aborted")]
    assert stored(sim, operation_id=op) == [(1, 0, "half", "aborted")]


def test_a_cancelled_run_aborts_its_stream_and_deletes_the_pieces(sim: RunSim) -> None:
    run_id, task_id, worker, op = model_requested(sim)
    worker.ok(task_id, piece(op, 0, "never mind"))
    sim.request(sim.client, CancelRun(run_id=run_id))
    assert task_id in worker.cancelled
    # The cancelled phase is gone: its lease takes no more pieces.
    assert error_code(worker.commit(task_id, piece(op, 10, "!"))) == ErrorCode.STALE_LEASE
    worker.release(task_id)
    worker.ok(task_id, aborted(task_id))
    assert sim.run(run_id).status == "cancelled"
    assert logged_partials(sim)[-1][1:] == (1, 10, "", "aborted")
    assert stored(sim, run_id=run_id) == [(1, 10, "", "aborted")]
    assert sim.store.partial_piece_count() == 0 and sim.core.partials.held_count == 0


def test_a_stale_lease_is_refused_whole_and_stores_nothing(sim: RunSim) -> None:
    _run_id, task_id, worker, op = model_requested(sim)
    old = worker.lease(task_id).lease
    worker.leave()
    head = sim.core.head_seq
    other = sim.agent_worker()
    reply = other.commit(task_id, piece(op, 0, "late"), lease=old)
    assert error_code(reply) == ErrorCode.STALE_LEASE
    assert logged_partials(sim, head) == [] and sim.store.partial_piece_count() == 0
    # Nor from a client without a lease, nor for another task's lease.
    assert error_code(sim.commit(piece(op, 0, "x"))) == ErrorCode.NOT_ALLOWED


def test_bounds_refuse_the_piece_whole_and_keep_what_was_stored(sim: RunSim) -> None:
    _run_id, task_id, worker, op = model_requested(sim)
    big = "x" * MAX_PARTIAL_PIECE_BYTES
    offset = 0
    while offset + len(big) <= MAX_PARTIAL_BYTES:
        worker.ok(task_id, piece(op, offset, big))
        offset += len(big)
    assert offset == MAX_PARTIAL_BYTES
    head = sim.core.head_seq
    assert error_code(worker.commit(task_id, piece(op, offset, "y"))) == ErrorCode.INVALID  # past 1 MiB
    assert error_code(worker.commit(task_id, piece(op, offset, "é" * (MAX_PARTIAL_PIECE_BYTES // 2 + 1)))) == (
        ErrorCode.INVALID  # a piece past 256 KiB (bytes, not characters)
    )
    assert error_code(worker.commit(task_id, piece(op, offset, ""))) == ErrorCode.INVALID
    assert sim.core.head_seq == head
    [(attempt, start, text, status)] = stored(sim, operation_id=op)
    assert (attempt, start, len(text), status) == (1, 0, MAX_PARTIAL_BYTES, "streaming")


def test_a_refused_commit_with_a_piece_changes_nothing_in_store_or_memory(sim: RunSim) -> None:
    run_id, task_id, worker, op = model_requested(sim)
    bad = FinishOperation(operation_id=fresh_id(), status="completed")  # no such operation: the commit is refused
    assert error_code(worker.commit(task_id, piece(op, 0, "lost"), bad)) == ErrorCode.NOT_FOUND
    assert stored(sim, operation_id=op) == [] and sim.core.partials.held_count == 0
    worker.ok(task_id, piece(op, 0, "kept"))
    assert stored(sim, operation_id=op) == [(1, 0, "kept", "streaming")]
    # Reads: nothing streamed yet is an empty list; an unknown run or operation is not found; one of the two ids.
    assert stored(sim, run_id=sim.start_run(sim.agent_conversation())) == []
    for key in ({"run_id": fresh_id()}, {"operation_id": fresh_id()}):
        assert error_code(sim.request(sim.client, ReadPartials(**key))) == ErrorCode.NOT_FOUND
    assert error_code(sim.request(sim.client, ReadPartials())) == ErrorCode.INVALID
    assert error_code(sim.request(sim.client, ReadPartials(run_id=run_id, operation_id=op))) == ErrorCode.INVALID
    # An unknown operation takes no piece.
    assert error_code(worker.commit(task_id, piece(fresh_id(), 0, "x"))) == ErrorCode.NOT_FOUND


def test_an_interruption_settled_with_an_admission_logs_the_operation_and_its_aborted_output(sim: RunSim) -> None:
    """Fix: a settling commit that also admitted a run dropped the records of the operations it interrupted from
    the log (they were stored, but no watch saw them, nor the partial output's abort)."""
    _run_id, task_id, worker, op = model_requested(sim)
    worker.ok(task_id, piece(op, 0, "cut"))
    other = sim.agent_conversation()
    head = sim.core.head_seq
    worker.leave(settle=False)
    second = sim.start_run(other)  # its batch settles the cut-off and admits this run
    assert sim.run(second).status == "pending"
    logged = [record for commit in sim.store.read_log(head, None, 100) for record in commit.records]
    assert any(isinstance(r, OperationRecord) and r.operation_id == op and r.status == "interrupted" for r in logged)
    assert any(isinstance(r, PartialRecord) and r.operation_id == op and r.status == "aborted" for r in logged)


def test_a_retry_that_streams_no_text_still_ends_the_aborted_output_as_done(manual_sim: RunSim) -> None:
    sim = manual_sim
    run_id, task_id, worker, op = model_requested(sim)
    worker.ok(task_id, piece(op, 0, "half an answ"))
    worker.leave()
    sim.request(sim.client, AdvanceClock(by_ms=1_000))
    worker = sim.agent_worker()
    worker.ok(task_id, model_intent(run_id, op, attempt=2))
    done = worker.ok(task_id, FinishOperation(operation_id=op, status="completed"), next_turn(task_id))
    # Tool calls only this time: a done record of attempt 2 replaces attempt 1's aborted text for readers.
    assert logged_partials(sim)[-1] == (done.seq, 2, 0, "", "done")
    assert stored(sim, operation_id=op) == [(2, 0, "", "done")]
    assert sim.store.partial_piece_count() == 0 and sim.core.partials.held_count == 0


def test_the_partial_output_transition_table_in_docs_runs_md_is_the_owners() -> None:
    assert doc_table("(`PARTIAL_TRANSITIONS` in `_partials.py`)") == PARTIAL_TRANSITIONS


def test_a_partial_output_put_outside_its_table_raises_and_stores_nothing(sim: RunSim) -> None:
    run_id, task_id, worker = leased_run(sim)
    op = fresh_id()
    worker.ok(task_id, model_intent(run_id, op), piece(op, 0, "Hi"))
    done = FinishOperation(operation_id=op, status="completed", result=JsonValue({"text": "Hi"}))
    worker.ok(task_id, done, next_turn(task_id))
    head = sim.store.partial(op)
    assert head is not None and head.status == "done"
    with pytest.raises(IllegalTransition):  # nothing leaves done: no attempt follows a committed result
        sim.core.partials._put("done", attrs.evolve(head, status="streaming", attempt=2), "replace")
    assert sim.store.partial(op) == head


def aborted_answers(sim: RunSim, run_id: str) -> list[Any]:
    """The data of the run's conversation's ``tether.aborted_answer`` entries, oldest first."""
    entries = sim.entries(sim.run(run_id).conversation_id)
    return [data for kind, data in entries if kind == "tether.aborted_answer"]


def test_an_interrupted_last_attempt_keeps_its_text_as_an_aborted_entry_as_the_run_ends(manual_sim: RunSim) -> None:
    sim = manual_sim
    run_id, task_id, worker, op = model_requested(sim)
    worker.ok(task_id, piece(op, 0, "first"))
    worker.leave()  # interrupted with attempts left: the owner keeps nothing (the next attempt's worker will)
    assert sim.run(run_id).status == "retry_wait" and aborted_answers(sim, run_id) == []
    for attempt_number in (2, 3):
        sim.request(sim.client, AdvanceClock(by_ms=2_000))
        worker = sim.agent_worker()
        worker.ok(task_id, model_intent(run_id, op, attempt=attempt_number))
        worker.ok(task_id, piece(op, 0, f"try {attempt_number}", attempt=attempt_number))
        worker.leave()
    # Cut off at its last attempt: the commit that fails the run keeps what it had said, before dropping the pieces.
    assert sim.run(run_id).status == "failed"
    [kept] = aborted_answers(sim, run_id)
    assert kept == {
        "run_id": run_id,
        "turn": 0,
        "operation_id": op,
        "attempt": 3,
        "ended": "interrupted",
        "text": "try 3",
    }
    [entry] = [
        record
        for commit in sim.store.read_log(0, None, 10_000)
        for record in commit.records
        if isinstance(record, EntryRecord) and record.kind == "tether.aborted_answer"
    ]
    assert entry.entry_id == aborted_answer_entry_id(op, 3)
    assert sim.store.partial_piece_count() == 0 and sim.core.partials.held_count == 0


def test_a_run_cancelled_while_it_waits_to_retry_keeps_the_interrupted_attempts_text(manual_sim: RunSim) -> None:
    sim = manual_sim
    run_id, task_id, worker, op = model_requested(sim)
    worker.ok(task_id, piece(op, 0, "half an answer"))
    worker.leave()
    assert sim.run(run_id).status == "retry_wait"
    sim.request(sim.client, CancelRun(run_id=run_id))  # its task sleeps: no phase to cut off, the run ends at once
    assert sim.run(run_id).status in TERMINAL
    assert [data["text"] for data in aborted_answers(sim, run_id)] == ["half an answer"]


def test_the_owner_keeps_nothing_for_a_failed_last_attempt(manual_sim: RunSim) -> None:
    """The worker keeps a failed attempt's text in the commit of its failure: the owner adds nothing as the run ends."""
    sim = manual_sim
    run_id, task_id, worker = leased_run(sim)
    op = fresh_id()
    worker.ok(task_id, model_intent(run_id, op, retry=Retry(attempts=1)))
    worker.ok(task_id, piece(op, 0, "cut"))
    worker.ok(
        task_id,
        FinishOperation(operation_id=op, status="failed", error="server_error: 502"),
        SetTaskState(
            task_id=task_id, status="terminal", outcome=TaskOutcome(status="failed", reason="model_error", error="x")
        ),
    )
    assert sim.run(run_id).status == "failed" and aborted_answers(sim, run_id) == []


def test_the_owner_keeps_nothing_for_a_stream_cancelled_with_its_run(sim: RunSim) -> None:
    """Cancelled while it streams, the request ends failed with its run, not interrupted: not kept (docs/agents.md)."""
    run_id, task_id, worker, op = model_requested(sim)
    worker.ok(task_id, piece(op, 0, "never mind"))
    sim.request(sim.client, CancelRun(run_id=run_id))
    worker.release(task_id)
    worker.ok(task_id, aborted(task_id))
    assert sim.run(run_id).status == "cancelled" and aborted_answers(sim, run_id) == []


def test_the_owner_keeps_nothing_for_a_last_attempt_interrupted_before_any_text(manual_sim: RunSim) -> None:
    sim = manual_sim
    run_id, task_id, worker = leased_run(sim)
    worker.ok(task_id, model_intent(run_id, fresh_id(), retry=Retry(attempts=1)))
    worker.leave()
    assert sim.run(run_id).status == "failed" and aborted_answers(sim, run_id) == []
