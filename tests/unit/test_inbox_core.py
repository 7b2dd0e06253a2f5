"""The inbox in the owner core, sans-IO (docs/runs.md, "The inbox"): steers placed at a run's boundaries, inputs that
may only join a run, writes appended at once, submissions that settle with their run, withdrawal, waits, and what an
owner restart keeps. Driven batch by batch, on the SQLite store, as test_runs_core."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import attrs
import pytest

from protocol import (
    ASSISTANT_ENTRY,
    CONFIG_DOCUMENT,
    RESET_ENTRY,
    USER_ENTRY,
    AbortConversation,
    AdvanceClock,
    AppendEntry,
    CancelRun,
    Committed,
    Configure,
    ConversationAborted,
    CreateConversation,
    CreateTask,
    DocumentReply,
    Error,
    ErrorCode,
    JsonValue,
    Ok,
    PutDocument,
    RetryRun,
    RunAnswer,
    RunReply,
    SetTaskState,
    SubmissionRecord,
    SubmissionReply,
    Submitted,
    SubmitWrite,
    TaskOutcome,
    WaitSubmission,
    Withdraw,
    Withdrawn,
)
from storage_owner.core import MODEL_GRACE_MS, Output, _config
from storage_owner.core._inbox import MAX_QUEUED_PER_CONVERSATION
from storage_owner.core._run_rules import run_task_id
from tests.unit._stores import open_store
from tests.unit.test_runs_core import AGENT, RunSim
from tests.unit.test_tasks_core import Worker, aborted, completed, ended, error_code, expect, fresh_id, sent

NEXT_TURN = {"phase": "turn", "turn": 2}


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[RunSim]:
    opened = RunSim(open_store("sqlite", tmp_path))
    yield opened
    opened.close()


def submitted(sim: RunSim, conversation_id: str, text: str = "hello", **fields: Any) -> SubmissionRecord:
    reply = expect(sim.submit(conversation_id, text, **fields), Submitted)
    assert reply.created
    return reply.submission


def submission(sim: RunSim, record: SubmissionRecord) -> SubmissionRecord:
    stored = sim.store.submission_by_id(record.submission_id)
    assert stored is not None
    return stored


def answer(worker: Worker, task_id: str, conversation_id: str, text: str, *, steer: bool = True) -> Committed:
    """The run task's answer as the run loop commits it: the assistant entry, then the task's completion naming the
    checkpoint that goes on if a steer is queued (``steer=False``: a completion that names none)."""
    outcome = TaskOutcome(status="completed", result=JsonValue({"text": text}))
    ending = SetTaskState(
        task_id=task_id,
        status="terminal",
        outcome=outcome,
        steer_checkpoint=JsonValue(NEXT_TURN if steer else None),
    )
    entry = AppendEntry(
        conversation_id=conversation_id,
        entry_id=fresh_id(),
        kind=ASSISTANT_ENTRY,
        data=JsonValue({"text": text, "tool_calls": []}),
    )
    return worker.ok(task_id, entry, ending)


class Busy:
    """A conversation whose run is leased to an agent worker: its task, and a tool round to start."""

    def __init__(self, sim: RunSim, text: str = "first", *, workers: Busy | None = None) -> None:
        """``workers``: another conversation's, to run this one's too (a sim's first workers take every lease)."""
        self.sim = sim
        self.conversation_id = sim.agent_conversation()
        self.own = submitted(sim, self.conversation_id, text)
        assert self.own.run_id is not None
        self.run_id = self.own.run_id
        self.task_id = run_task_id(self.run_id, 1)
        self.worker = sim.agent_worker() if workers is None else workers.worker
        self.tools = sim.worker(kinds=("tool:lookup",)) if workers is None else workers.tools
        assert self.worker.holds(self.task_id)

    def call_tool(self) -> str:
        """The run task waits on one tool call (its assistant entry first, as the run loop writes it)."""
        tool_id = fresh_id()
        call = {"call_id": "c1", "name": "lookup", "arguments": {}}
        self.worker.ok(
            self.task_id,
            AppendEntry(
                conversation_id=self.conversation_id,
                entry_id=fresh_id(),
                kind=ASSISTANT_ENTRY,
                data=JsonValue({"text": "", "tool_calls": [call]}),
            ),
            CreateTask(task_id=tool_id, kind="tool:lookup", version=1, owner_task_id=self.task_id),
            SetTaskState(
                task_id=self.task_id, status="waiting", on=(tool_id,), checkpoint=JsonValue({"phase": "tools"})
            ),
        )
        assert self.tools.holds(tool_id)
        return tool_id

    def finish_tool(self, tool_id: str) -> None:
        """The tool call's result entry and its task's completion, in one commit (which ends the tool round)."""
        result = {"call_id": "c1", "name": "lookup", "content": "42", "is_error": False}
        self.tools.ok(
            tool_id,
            AppendEntry(
                conversation_id=self.conversation_id,
                entry_id=fresh_id(),
                kind="tether.tool_result",
                data=JsonValue(result),
            ),
            completed(tool_id, {"ok": True}),
        )

    def kinds(self) -> list[tuple[str, Any]]:
        return [
            (kind, data.get("text") if isinstance(data, dict) else data)
            for kind, data in self.sim.entries(self.conversation_id)
        ]


# -------------------------------------------------------------------------------------------- admission


def test_a_steer_to_an_idle_conversation_starts_a_run_and_when_idle_reject_refuses_writing_nothing(sim: RunSim) -> None:
    conversation_id = sim.agent_conversation()
    head = sim.core.head_seq
    refused = sim.submit(conversation_id, "only if busy", when_busy="steer", when_idle="reject")
    assert error_code(refused) == ErrorCode.CONFLICT
    assert sim.core.head_seq == head and sim.entries(conversation_id) == []
    record = submitted(sim, conversation_id, "steer while idle", when_busy="steer")
    assert record.run_id == record.submission_id and record.when_busy == "follow_up"
    assert sim.run(record.submission_id).status == "pending"
    assert submission(sim, record).status == "placed"


def test_when_idle_reject_is_admitted_while_a_run_is_live(sim: RunSim) -> None:
    busy = Busy(sim)
    follow = submitted(sim, busy.conversation_id, "next", when_idle="reject")
    assert follow.status == "queued" and sim.run(follow.submission_id).status == "queued"


def test_the_request_id_is_looked_up_before_the_busy_check(sim: RunSim) -> None:
    conversation_id = sim.agent_conversation()
    first = submitted(sim, conversation_id, "hi", request_id="r1")
    again = expect(sim.submit(conversation_id, "hi", request_id="r1", when_busy="reject"), Submitted)
    assert not again.created and again.submission.submission_id == first.submission_id
    steer_again = expect(sim.submit(conversation_id, "hi", request_id="r1", when_busy="steer"), Submitted)
    assert not steer_again.created
    assert (
        error_code(sim.submit(conversation_id, {"kind": "app.x"}, request_id="r1", kind="write")) == ErrorCode.CONFLICT
    )


# ------------------------------------------------------------------------------------------------ steers


def test_a_steer_is_placed_when_the_tool_round_ends_after_its_results_and_settles_with_the_same_answer(
    sim: RunSim,
) -> None:
    busy = Busy(sim)
    tool_id = busy.call_tool()
    steer = submitted(sim, busy.conversation_id, "use pnpm", when_busy="steer")
    assert (steer.status, steer.run_id, steer.when_busy) == ("queued", busy.run_id, "steer")
    assert busy.kinds()[-1][0] == ASSISTANT_ENTRY  # not placed while the round goes on
    busy.finish_tool(tool_id)
    assert busy.kinds()[-2:] == [("tether.tool_result", None), (USER_ENTRY, "use pnpm")]
    placed = submission(sim, steer)
    assert (placed.status, placed.run_id) == ("placed", busy.run_id)
    assert busy.worker.holds(busy.task_id)  # the run goes on: its next request sees the steer
    answer(busy.worker, busy.task_id, busy.conversation_id, "done with pnpm")
    run = sim.run(busy.run_id)
    assert run.status == "completed"
    for record in (busy.own, steer):
        settled = submission(sim, record)
        assert (settled.status, settled.answer) == ("done", run.answer)
        assert settled.answer == RunAnswer(seq=run.answer.seq, text="done with pnpm") if run.answer else False


def test_a_steer_after_the_last_tool_round_is_placed_after_the_answer_and_the_run_answers_it_once_more(
    sim: RunSim,
) -> None:
    busy = Busy(sim)
    steer = submitted(sim, busy.conversation_id, "and B too", when_busy="steer")
    reply = answer(busy.worker, busy.task_id, busy.conversation_id, "A is fine")
    assert isinstance(reply, Committed)
    assert busy.kinds()[-2:] == [(ASSISTANT_ENTRY, "A is fine"), (USER_ENTRY, "and B too")]
    task = sim.task(busy.task_id)
    assert (task.status, sim.store.task_data(busy.task_id)[1]) == ("running", NEXT_TURN)  # went on, not completed
    assert sim.run(busy.run_id).status != "completed"
    assert submission(sim, steer).status == "placed"
    assert busy.worker.holds(busy.task_id)
    answer(busy.worker, busy.task_id, busy.conversation_id, "A and B are fine")
    run = sim.run(busy.run_id)
    assert run.status == "completed" and run.answer is not None and run.answer.text == "A and B are fine"
    assert {submission(sim, record).status for record in (busy.own, steer)} == {"done"}


def test_steers_are_placed_one_per_boundary_in_admission_order(sim: RunSim) -> None:
    busy = Busy(sim)
    tool_id = busy.call_tool()
    first = submitted(sim, busy.conversation_id, "one", when_busy="steer")
    second = submitted(sim, busy.conversation_id, "two", when_busy="steer")
    busy.finish_tool(tool_id)
    assert (submission(sim, first).status, submission(sim, second).status) == ("placed", "queued")
    answer(busy.worker, busy.task_id, busy.conversation_id, "did one")
    assert submission(sim, second).status == "placed"
    assert [text for kind, text in busy.kinds() if kind == USER_ENTRY] == ["first", "one", "two"]
    answer(busy.worker, busy.task_id, busy.conversation_id, "did two")
    assert sim.run(busy.run_id).status == "completed"


def test_a_completion_naming_no_steer_checkpoint_completes_and_the_steer_gets_a_run_of_its_own(sim: RunSim) -> None:
    """A run answering at its last allowed turn names no ``steer_checkpoint``: an answer always ends the run."""
    busy = Busy(sim)
    steer = submitted(sim, busy.conversation_id, "late", when_busy="steer")
    answer(busy.worker, busy.task_id, busy.conversation_id, "answered", steer=False)
    run = sim.run(busy.run_id)
    assert (run.status, run.answer is not None and run.answer.text) == ("completed", "answered")
    assert submission(sim, busy.own).status == "done"
    # The run ended without reaching it, and nothing is queued behind it: a run of its own, at once.
    placed = submission(sim, steer)
    assert (placed.status, placed.run_id) == ("placed", steer.submission_id)
    assert sim.run(steer.submission_id).status == "running"
    assert [text for kind, text in busy.kinds() if kind == USER_ENTRY] == ["first", "late"]
    # With a follow-up queued behind the run, that run places it first instead.
    other = Busy(sim, workers=busy)
    late = submitted(sim, other.conversation_id, "late", when_busy="steer")
    follow = submitted(sim, other.conversation_id, "next question")
    answer(other.worker, other.task_id, other.conversation_id, "answered", steer=False)
    assert [text for kind, text in other.kinds() if kind == USER_ENTRY] == ["first", "late", "next question"]
    assert submission(sim, late).run_id == follow.submission_id


def test_a_failed_run_settles_its_inputs_unanswered_and_leaves_its_queued_steers(sim: RunSim) -> None:
    busy = Busy(sim)
    tool_id = busy.call_tool()
    placed = submitted(sim, busy.conversation_id, "placed one", when_busy="steer")
    busy.finish_tool(tool_id)
    left = submitted(sim, busy.conversation_id, "left one", when_busy="steer")
    busy.worker.ok(busy.task_id, ended(busy.task_id, "failed", error="the model failed", reason="model_error"))
    assert sim.run(busy.run_id).status == "failed"
    for record in (busy.own, placed):
        settled = submission(sim, record)
        assert (settled.status, settled.reason) == ("unanswered", "model_error")
    assert submission(sim, left).status == "queued"


@pytest.mark.parametrize(
    ("status", "reason", "settled"),
    [
        ("failed", "model_retries_exhausted", "interrupted"),
        ("faulted", "phase_error", "faulted"),
        ("faulted", "no_progress", "faulted"),
        ("failed", "max_turns", "turn_limit"),
        ("failed", "budget_exceeded", "budget_exceeded"),
    ],
)
def test_an_inputs_reason_is_the_references_name_for_its_runs(
    sim: RunSim, status: str, reason: str, settled: str
) -> None:
    busy = Busy(sim)
    busy.worker.ok(busy.task_id, ended(busy.task_id, status, error="ended", reason=reason))
    assert sim_status(sim, busy.run_id) == ("failed", reason)  # the run keeps the precise one
    record = submission(sim, busy.own)
    assert (record.status, record.reason) == ("unanswered", settled)


def test_a_retried_run_answers_the_steers_placed_in_it_again(sim: RunSim) -> None:
    busy = Busy(sim)
    tool_id = busy.call_tool()
    steer = submitted(sim, busy.conversation_id, "and B", when_busy="steer")
    withdrawn = submitted(sim, busy.conversation_id, "never mind", when_busy="steer")
    expect(sim.request(sim.client, Withdraw(submission_id=withdrawn.submission_id)), Withdrawn)
    busy.finish_tool(tool_id)
    fail(busy)
    assert [submission(sim, one).status for one in (busy.own, steer)] == ["unanswered", "unanswered"]
    expect(sim.request(sim.client, RetryRun(run_id=busy.run_id)), RunReply)
    assert [submission(sim, one).status for one in (busy.own, steer)] == ["placed", "placed"]
    task_id = run_task_id(busy.run_id, 2)
    answer(busy.worker, task_id, busy.conversation_id, "both answered", steer=False)
    for record in (busy.own, steer):
        assert submission(sim, record).status == "done"
    assert (submission(sim, withdrawn).status, submission(sim, withdrawn).reason) == ("unanswered", "withdrawn")


def test_a_cancelled_run_settles_its_inputs_aborted(sim: RunSim) -> None:
    busy = Busy(sim)
    expect(sim.request(sim.client, CancelRun(run_id=busy.run_id)), RunReply)
    expect(busy.worker.release(busy.task_id), Ok)
    assert busy.worker.lease(busy.task_id).mode == "abort"
    busy.worker.ok(busy.task_id, aborted(busy.task_id))
    assert sim.run(busy.run_id).status == "cancelled"
    settled = submission(sim, busy.own)
    assert (settled.status, settled.reason) == ("unanswered", "aborted")


# ------------------------------------------------------------------------------------- after a failed run


def fail(busy: Busy) -> None:
    busy.worker.ok(busy.task_id, ended(busy.task_id, "failed", error="the model failed", reason="model_error"))
    assert sim_status(busy.sim, busy.run_id) == ("failed", "model_error")


def sim_status(sim: RunSim, run_id: str) -> tuple[str, str | None]:
    run = sim.run(run_id)
    return run.status, run.reason


def test_by_default_a_failed_run_holds_the_runs_queued_behind_it_until_the_next_input(sim: RunSim) -> None:
    busy = Busy(sim)
    first = submitted(sim, busy.conversation_id, "follow one")
    second = submitted(sim, busy.conversation_id, "follow two")
    left = submitted(sim, busy.conversation_id, "a steer it never reached", when_busy="steer")
    fail(busy)
    assert [sim_status(sim, one.submission_id) for one in (first, second)] == [("queued", "held")] * 2
    assert not busy.worker.leases or list(busy.worker.leases) == [busy.task_id]
    # Held across a restart too: nothing runs on a context nobody looked at.
    sim.restart()
    worker = sim.agent_worker()
    assert not worker.leases and sim_status(sim, first.submission_id) == ("queued", "held")
    # A plain write does not release them; the next input does, and queues behind them (even one asking reject).
    submitted(sim, busy.conversation_id, {"kind": "app.note"}, kind="write")
    assert sim_status(sim, first.submission_id) == ("queued", "held")
    head = sim.core.head_seq
    later = submitted(sim, busy.conversation_id, "and now?", when_busy="reject", when_idle="reject")
    assert later.run_id == later.submission_id and later.status == "queued"
    assert sim.core.head_seq == head + 2  # the submission (with the release), then the settle that admitted the first
    assert sim.statuses(first.submission_id, second.submission_id, later.submission_id) == [
        "running",
        "queued",
        "queued",
    ]
    assert sim.run(second.submission_id).reason is None
    # The first run places what the failed run left (the steer), then its own input.
    texts = [text for kind, text in busy.kinds() if kind == USER_ENTRY]
    assert texts[-2:] == ["a steer it never reached", "follow one"]
    assert submission(sim, left).status == "placed" and submission(sim, left).run_id == first.submission_id


@pytest.mark.parametrize(
    ("status", "reason", "holds"),
    [
        ("failed", "model_error", True),
        ("failed", "no_model", True),
        ("failed", "nothing_to_answer", True),
        ("failed", "max_turns", True),
        ("failed", "model_retries_exhausted", True),
        ("faulted", "restart_limit", True),
        ("faulted", "phase_error", True),
        ("failed", "budget_exceeded", True),
        ("failed", "invalid_output", True),
        ("failed", "reset", False),  # what follows a reset runs in the new context
        ("cancelled", None, False),  # someone stopped it: the next run starts at once
    ],
)
def test_only_a_failure_holds_the_runs_and_steers_queued_behind_it(
    sim: RunSim, status: str, reason: str | None, holds: bool
) -> None:
    busy = Busy(sim)
    follow = submitted(sim, busy.conversation_id, "follow")
    lone = Busy(sim, workers=busy)
    steer = submitted(sim, lone.conversation_id, "steer it", when_busy="steer")
    for one in (busy, lone):
        if status == "cancelled":
            expect(sim.request(sim.client, CancelRun(run_id=one.run_id)), RunReply)
            expect(one.worker.release(one.task_id), Ok)
            one.worker.ok(one.task_id, aborted(one.task_id))
        else:
            one.worker.ok(one.task_id, ended(one.task_id, status, error="it ended", reason=reason))  # type: ignore[arg-type]
        assert sim.run(one.run_id).status == ("cancelled" if status == "cancelled" else "failed")
    if holds:
        assert sim_status(sim, follow.submission_id) == ("queued", "held")
        assert submission(sim, steer).status == "queued"
        assert sim.store.run(steer.submission_id) is None
    else:
        assert sim_status(sim, follow.submission_id) == ("running", None)
        # A steer the run never reached, nothing queued behind it: a run of its own at once.
        assert sim.run(steer.submission_id).status == "running"
        assert (submission(sim, steer).status, submission(sim, steer).run_id) == ("placed", steer.submission_id)


def test_a_continue_joins_the_oldest_held_run_and_a_retry_releases_them(sim: RunSim) -> None:
    busy = Busy(sim)
    follow = submitted(sim, busy.conversation_id, "follow")
    fail(busy)
    assert sim_status(sim, follow.submission_id) == ("queued", "held")
    resumed = submitted(sim, busy.conversation_id, None, kind="continue")
    assert (resumed.status, resumed.run_id) == ("queued", follow.submission_id)
    assert sim.run(follow.submission_id).status == "running"
    assert submission(sim, resumed).status == "placed"
    task_id = run_task_id(follow.submission_id, 1)
    answer(busy.worker, task_id, busy.conversation_id, "done")
    for record in (follow, resumed):
        assert submission(sim, record).status == "done"
    # A retry of a failed run releases the runs held behind it: they follow it again.
    other = Busy(sim, workers=busy)
    behind = submitted(sim, other.conversation_id, "behind")
    fail(other)
    assert sim_status(sim, behind.submission_id) == ("queued", "held")
    sim.request(sim.client, RetryRun(run_id=other.run_id))
    assert sim.statuses(other.run_id, behind.submission_id) == ["running", "queued"]
    assert sim.run(behind.submission_id).reason is None


def test_after_failed_run_continue_admits_the_next_and_gives_lone_steers_a_run(sim: RunSim) -> None:
    busy = Busy(sim)
    sim.configure(busy.conversation_id, after_failed_run="continue")
    follow = submitted(sim, busy.conversation_id, "follow")
    fail(busy)
    assert sim.statuses(follow.submission_id) == ["running"]
    lone = Busy(sim, workers=busy)
    sim.configure(lone.conversation_id, after_failed_run="continue")
    steer = submitted(sim, lone.conversation_id, "steer it", when_busy="steer")
    fail(lone)
    # The steer the failed run never reached gets a run of its own, named after it, and is placed once in it.
    assert sim.run(steer.submission_id).status == "running"
    placed = submission(sim, steer)
    assert (placed.status, placed.run_id) == ("placed", steer.submission_id)
    assert [text for kind, text in lone.kinds() if kind == USER_ENTRY].count("steer it") == 1


def test_after_failed_run_withdraw_settles_what_waited_run_failed_and_keeps_resets_and_writes(sim: RunSim) -> None:
    busy = Busy(sim)
    sim.configure(busy.conversation_id, after_failed_run="withdraw")
    follow = submitted(sim, busy.conversation_id, "follow")
    steer = submitted(sim, busy.conversation_id, "steer", when_busy="steer")
    reset = submitted(sim, busy.conversation_id, None, kind="reset")
    write = submitted(sim, busy.conversation_id, {"kind": "app.note"}, kind="write")
    assert write.status == "queued"
    fail(busy)
    for record in (follow, steer):
        settled = submission(sim, record)
        assert (settled.status, settled.reason) == ("unanswered", "run_failed")
    assert sim_status(sim, follow.submission_id) == ("cancelled", "run_failed")
    assert [submission(sim, one).status for one in (reset, write)] == ["queued", "queued"]
    # The next run places them first.
    after = submitted(sim, busy.conversation_id, "again")
    assert [submission(sim, one).status for one in (reset, write, after)] == ["done", "done", "placed"]
    assert [kind for kind, _ in busy.kinds()][-3:] == [RESET_ENTRY, "app.note", USER_ENTRY]


def test_a_run_ended_by_a_reset_holds_nothing(sim: RunSim) -> None:
    busy = Busy(sim)
    tool_id = busy.call_tool()
    follow = submitted(sim, busy.conversation_id, "follow")
    submitted(sim, busy.conversation_id, None, kind="reset")
    busy.finish_tool(tool_id)
    busy.worker.ok(busy.task_id, ended(busy.task_id, "failed", error="reset", reason="reset"))
    assert sim.statuses(follow.submission_id) == ["running"]


# ------------------------------------------------------------------------------------------------ writes


def test_a_write_is_appended_at_once_mid_run_and_done(sim: RunSim) -> None:
    busy = Busy(sim)
    busy.call_tool()
    record = submitted(sim, busy.conversation_id, {"kind": "app.note", "data": {"n": 1}}, kind="write")  # type: ignore[arg-type]
    assert (record.status, record.run_id) == ("done", None)
    assert sim.entries(busy.conversation_id)[-1] == ("app.note", {"n": 1})


def entry_rows(sim: RunSim, conversation_id: str) -> list[tuple[str, Any, Any]]:
    """Each entry's kind, data and what the model sees of it."""
    return [(one.kind, one.data, one.model) for one in sim.store.entry_page(conversation_id, "asc", None, 100)[0]]


SEEN: Final = [{"role": "user", "text": "the build is red"}]


def test_a_write_the_model_sees_waits_for_the_working_runs_boundary_and_goes_before_the_steers(sim: RunSim) -> None:
    busy = Busy(sim)
    tool_id = busy.call_tool()
    steer = submitted(sim, busy.conversation_id, "and check B", when_busy="steer")
    seen = submitted(
        sim, busy.conversation_id, {"kind": "ci.status", "data": {"red": True}, "model": SEEN}, kind="write"
    )  # type: ignore[arg-type]
    assert (seen.status, seen.run_id) == ("queued", busy.run_id)
    plain = submitted(sim, busy.conversation_id, {"kind": "app.note"}, kind="write")  # type: ignore[arg-type]
    assert plain.status == "done"  # the model does not see it: at once
    busy.finish_tool(tool_id)
    rows = entry_rows(sim, busy.conversation_id)
    assert [kind for kind, _, _ in rows][-4:] == ["app.note", "tether.tool_result", "ci.status", USER_ENTRY]
    assert rows[-2][1:] == ({"red": True}, SEEN)
    assert [submission(sim, one).status for one in (seen, steer)] == ["done", "placed"]


def test_a_write_the_model_sees_to_an_idle_conversation_is_appended_at_once(sim: RunSim) -> None:
    conversation_id = sim.agent_conversation()
    record = submitted(sim, conversation_id, {"kind": "ci.status", "model": SEEN}, kind="write")  # type: ignore[arg-type]
    assert record.status == "done"
    assert entry_rows(sim, conversation_id) == [("ci.status", None, SEEN)]


@pytest.mark.parametrize(
    "payload",
    [
        {"kind": "app.s", "model": []},
        {"kind": "app.s", "model": [{"role": "system", "text": "x"}]},
        {"kind": "app.s", "model": [{"role": "user", "text": ""}]},
        {"kind": "app.s", "model": [{"role": "user", "text": "x", "extra": 1}]},
        {"kind": "app.s", "model": "text"},
        {"kind": "app.s", "head": "no-such-entry"},
        {"kind": "app.s", "head": 3},
    ],
)
def test_a_write_with_a_bad_model_or_head_is_refused_writing_nothing(sim: RunSim, payload: Any) -> None:
    conversation_id = sim.agent_conversation()
    head = sim.core.head_seq
    assert error_code(sim.submit(conversation_id, payload, kind="write")) == ErrorCode.INVALID
    assert sim.core.head_seq == head


def test_a_write_whose_head_left_the_context_is_stale_and_places_nothing(sim: RunSim) -> None:
    busy = Busy(sim)
    first = sim.store.entry_page(busy.conversation_id, "asc", None, 1)[0][0]  # the run's user entry
    summary = {"kind": "app.summary", "model": [{"role": "user", "text": "so far"}], "head": first.entry_id}
    # Idle conversation, head in the context: placed at once, naming its head.
    answer(busy.worker, busy.task_id, busy.conversation_id, "done", steer=False)
    placed = submitted(sim, busy.conversation_id, summary, kind="write")  # type: ignore[arg-type]
    assert placed.status == "done"
    assert sim.store.entry_page(busy.conversation_id, "desc", None, 1)[0][0].head == first.entry_id
    # After a reset, the same head is before the context: stale at once, nothing placed.
    reset(sim, busy.conversation_id)
    count = len(entry_rows(sim, busy.conversation_id))
    stale = submitted(sim, busy.conversation_id, summary, kind="write")  # type: ignore[arg-type]
    assert (stale.status, stale.reason) == ("unanswered", "stale")
    assert len(entry_rows(sim, busy.conversation_id)) == count
    # Queued behind a reset while a run works: the reset is placed first, so the write is stale when its turn comes.
    other = Busy(sim, workers=busy)
    own = sim.store.entry_page(other.conversation_id, "asc", None, 1)[0][0]
    reset(sim, other.conversation_id)
    waiting = submitted(sim, other.conversation_id, {**summary, "head": own.entry_id}, kind="write")  # type: ignore[arg-type]
    assert waiting.status == "queued"
    answer(other.worker, other.task_id, other.conversation_id, "done")
    settled = submission(sim, waiting)
    assert (settled.status, settled.reason) == ("unanswered", "stale")
    assert [kind for kind, _, _ in entry_rows(sim, other.conversation_id)][-1] == RESET_ENTRY


def test_an_input_with_its_own_entry_is_placed_as_it_and_the_model_sees_its_text(sim: RunSim) -> None:
    busy = Busy(sim)
    mention = {"kind": "chat.mention", "data": {"author": "ann"}}
    steer = submitted(sim, busy.conversation_id, "ann: and B?", when_busy="steer", entry=mention, request_id="m1")
    assert steer.entry == mention
    again = expect(
        sim.submit(busy.conversation_id, "ann: and B?", when_busy="steer", entry=mention, request_id="m1"), Submitted
    )
    assert not again.created and again.submission == steer
    other = {"kind": "chat.mention", "data": {"author": "bob"}}
    conflict = sim.submit(busy.conversation_id, "ann: and B?", when_busy="steer", entry=other, request_id="m1")
    assert error_code(conflict) == ErrorCode.CONFLICT  # the same request id for other content
    answer(busy.worker, busy.task_id, busy.conversation_id, "first answer")
    kind, data, model = entry_rows(sim, busy.conversation_id)[-1]
    assert (kind, data, model) == ("chat.mention", {"author": "ann"}, [{"role": "user", "text": "ann: and B?"}])
    # A run's own input too.
    conversation_id = sim.agent_conversation()
    submitted(sim, conversation_id, "bob: hi", entry={"kind": "chat.mention", "data": {"author": "bob"}})
    assert entry_rows(sim, conversation_id) == [
        ("chat.mention", {"author": "bob"}, [{"role": "user", "text": "bob: hi"}])
    ]


@pytest.mark.parametrize(
    ("kind", "entry"),
    [
        ("input", {"kind": "tether.user", "data": 1}),
        ("input", {"kind": "chat.x", "model": []}),
        ("input", "text"),
        ("write", {"kind": "chat.x"}),
    ],
)
def test_an_entry_that_is_not_an_inputs_of_the_applications_kind_is_refused(sim: RunSim, kind: str, entry: Any) -> None:
    conversation_id = sim.agent_conversation()
    head = sim.core.head_seq
    payload = "hi" if kind == "input" else {"kind": "app.note"}
    assert error_code(sim.submit(conversation_id, payload, kind=kind, entry=entry)) == ErrorCode.INVALID
    assert sim.core.head_seq == head


@pytest.mark.parametrize(
    "payload",
    [{"kind": "tether.user", "data": 1}, {"kind": "app.note", "extra": 1}, "text", {"data": 1}, {"kind": ""}],
)
def test_a_write_that_is_not_a_kind_of_the_applications_and_data_is_refused_writing_nothing(
    sim: RunSim, payload: Any
) -> None:
    conversation_id = sim.agent_conversation()
    head = sim.core.head_seq
    assert error_code(sim.submit(conversation_id, payload, kind="write")) == ErrorCode.INVALID
    assert sim.core.head_seq == head and sim.entries(conversation_id) == []


# ------------------------------------------------------------------------------------------ withdrawal


def withdraw(sim: RunSim, submission_id: str) -> Withdrawn:
    return expect(sim.request(sim.client, Withdraw(submission_id=submission_id)), Withdrawn)


def test_withdraw_takes_a_queued_steer_out_of_the_inbox_once(sim: RunSim) -> None:
    busy = Busy(sim)
    tool_id = busy.call_tool()
    steer = submitted(sim, busy.conversation_id, "never mind", when_busy="steer")
    first = withdraw(sim, steer.submission_id)
    assert first.outcome == "withdrawn" and first.submission is not None
    assert (first.submission.status, first.submission.reason) == ("unanswered", "withdrawn")
    head = sim.core.head_seq
    assert withdraw(sim, steer.submission_id).outcome == "settled"
    assert sim.core.head_seq == head
    busy.finish_tool(tool_id)
    assert [text for kind, text in busy.kinds() if kind == USER_ENTRY] == ["first"]


def test_withdrawing_a_queued_follow_up_cancels_its_run_and_a_placed_one_is_already_placed(sim: RunSim) -> None:
    busy = Busy(sim)
    follow = submitted(sim, busy.conversation_id, "next")
    assert withdraw(sim, follow.submission_id).outcome == "withdrawn"
    assert sim.run(follow.submission_id).status == "cancelled"
    assert (submission(sim, follow).status, submission(sim, follow).reason) == ("unanswered", "withdrawn")
    assert withdraw(sim, busy.own.submission_id).outcome == "already_placed"
    assert withdraw(sim, fresh_id()).outcome == "not_found"


# ------------------------------------------------------------------------------------------------- waits


def test_wait_submission_is_answered_when_the_submission_settles(sim: RunSim) -> None:
    busy = Busy(sim)
    steer = submitted(sim, busy.conversation_id, "more", when_busy="steer")
    request = sent(WaitSubmission(submission_id=steer.submission_id))
    seen: list[Output] = []
    sim.after_batch = seen.extend
    sim.batch((sim.client, request))
    answer(busy.worker, busy.task_id, busy.conversation_id, "first answer")  # places the steer: not settled yet
    assert not [frame for _, call_id, frame in seen if call_id == request.call_id]
    answer(busy.worker, busy.task_id, busy.conversation_id, "second answer")
    replies = [frame for peer, call_id, frame in seen if peer == sim.client and call_id == request.call_id]
    assert len(replies) == 1 and isinstance(replies[0], SubmissionReply)
    assert replies[0].submission == submission(sim, steer) and replies[0].submission.status == "done"
    done = expect(sim.request(sim.client, WaitSubmission(submission_id=steer.submission_id)), SubmissionReply)
    assert done.submission == submission(sim, steer)
    assert error_code(sim.request(sim.client, WaitSubmission(submission_id=fresh_id()))) == ErrorCode.NOT_FOUND


# ----------------------------------------------------------------------------------------------- restarts


def test_queued_and_placed_inputs_survive_an_owner_restart(sim: RunSim) -> None:
    busy = Busy(sim)
    tool_id = busy.call_tool()
    placed = submitted(sim, busy.conversation_id, "placed", when_busy="steer")
    busy.finish_tool(tool_id)
    queued = submitted(sim, busy.conversation_id, "queued", when_busy="steer")
    sim.restart()
    worker = sim.agent_worker()
    assert worker.holds(busy.task_id)
    answer(worker, busy.task_id, busy.conversation_id, "after the restart")
    assert submission(sim, queued).status == "placed"
    answer(worker, busy.task_id, busy.conversation_id, "and the queued one")
    assert {submission(sim, record).status for record in (busy.own, placed, queued)} == {"done"}


def test_a_refused_commit_leaves_the_steer_queued(sim: RunSim) -> None:
    """The steer is placed inside the answer's commit; a write after it refuses the commit whole: the entry, the
    placement and the inbox's memory are all put back, and the next answer places it."""
    busy = Busy(sim)
    steer = submitted(sim, busy.conversation_id, "wait", when_busy="steer")
    outcome = TaskOutcome(status="completed", result=JsonValue({"text": "x"}))
    ending = SetTaskState(
        task_id=busy.task_id, status="terminal", outcome=outcome, steer_checkpoint=JsonValue(NEXT_TURN)
    )
    bad = AppendEntry(conversation_id=fresh_id(), entry_id=fresh_id(), kind="app.note", data=JsonValue(1))
    assert error_code(busy.worker.commit(busy.task_id, ending, bad)) == ErrorCode.NOT_FOUND
    assert submission(sim, steer).status == "queued" and sim.core.inbox.queued[busy.conversation_id] == [steer]
    answer(busy.worker, busy.task_id, busy.conversation_id, "now")
    assert submission(sim, steer).status == "placed"


def test_a_steer_to_a_run_queued_for_capacity_is_placed_after_its_input_when_it_is_admitted(tmp_path: Path) -> None:
    sim = RunSim(open_store("sqlite", tmp_path), max_concurrent_runs=1)
    try:
        busy = Busy(sim)  # takes the only place
        waiting = sim.agent_conversation()
        own = submitted(sim, waiting, "second conversation")
        assert own.run_id is not None and sim.run(own.run_id).status == "queued"
        steer = submitted(sim, waiting, "and this too", when_busy="steer")
        assert (steer.status, steer.run_id) == ("queued", own.run_id)
        answer(busy.worker, busy.task_id, busy.conversation_id, "first done")  # frees the place
        assert sim.run(own.run_id).status in ("pending", "running")  # admitted (the free worker may take it)
        assert [data["text"] for kind, data in sim.entries(waiting) if kind == USER_ENTRY] == [
            "second conversation",
            "and this too",
        ]
        assert {submission(sim, record).status for record in (own, steer)} == {"placed"}
    finally:
        sim.close()


# --------------------------------------------------------------------------------------------- configuration


def configure(
    sim: RunSim, conversation_id: str, clear: tuple[str, ...] = (), *, force: bool = False, **changes: Any
) -> Any:
    request = Configure(conversation_id=conversation_id, changes=JsonValue(changes), clear=clear, force=force)
    return sim.request(sim.client, request)


def test_configure_checks_every_field_before_it_writes_and_versions_each_change(sim: RunSim) -> None:
    conversation_id = sim.agent_conversation()
    head = sim.core.head_seq
    for bad in ({"steering": "some"}, {"max_turns": 0}, {"tools": ["a", "a"]}, {"colour": "red"}, {"model": ""}):
        assert error_code(configure(sim, conversation_id, **bad)) == ErrorCode.INVALID, bad
    assert error_code(configure(sim, conversation_id, clear=("colour",))) == ErrorCode.INVALID
    assert error_code(configure(sim, fresh_id(), steering="all")) == ErrorCode.NOT_FOUND
    assert sim.core.head_seq == head
    first = expect(configure(sim, conversation_id, steering="all", max_turns=3), DocumentReply).document
    assert first is not None and (first.version, first.value) == (1, {"steering": "all", "max_turns": 3})
    same = expect(configure(sim, conversation_id, steering="all"), DocumentReply).document
    assert same == first and sim.core.head_seq == head + 1  # nothing changed: nothing written
    second = expect(configure(sim, conversation_id, clear=("max_turns",), instructions="Be brief."), DocumentReply)
    assert second.document is not None and second.document.version == 2
    assert second.document.value == {"steering": "all", "instructions": "Be brief."}
    forged = PutDocument(conversation_id=conversation_id, name=CONFIG_DOCUMENT, value=JsonValue({}))
    assert error_code(sim.commit(forged)) == ErrorCode.INVALID  # the owner's document


def test_a_conversation_a_task_owns_starts_with_the_configuration_of_the_tasks_conversation(sim: RunSim) -> None:
    busy = Busy(sim)
    expect(configure(sim, busy.conversation_id, instructions="Be brief.", max_turns=4), DocumentReply)
    expect(configure(sim, busy.conversation_id, model="fast", steering="all", force=True), DocumentReply)
    child, helper = fresh_id(), fresh_id()
    busy.worker.ok(
        busy.task_id,
        CreateConversation(conversation_id=child, agent=AGENT, owner_task_id=busy.task_id),
        CreateConversation(conversation_id=helper, agent="helper", owner_task_id=busy.task_id),
    )
    inherited = sim.store.document(child, CONFIG_DOCUMENT)
    assert inherited is not None and (inherited.version, inherited.value) == (
        1,
        {"instructions": "Be brief.", "max_turns": 4, "model": "fast", "steering": "all"},
    )
    # Bound to another agent (a subagent of another kind): only what applies to any agent.
    shared = sim.store.document(helper, CONFIG_DOCUMENT)
    assert shared is not None and shared.value == {"model": "fast", "steering": "all"}
    # The task graph shows a task of the owned conversation under the task owning it (a subagent's run).
    in_child = fresh_id()
    expect(sim.commit(CreateTask(task_id=in_child, kind="app.step", conversation_id=helper)), Committed)
    assert sim.graph()[in_child].conversation_owner_task_id == busy.task_id
    # From then on each is its own.
    expect(configure(sim, busy.conversation_id, max_turns=9), DocumentReply)
    stored = sim.store.document(child, CONFIG_DOCUMENT)
    assert stored is not None and stored.value == {
        "instructions": "Be brief.",
        "max_turns": 4,
        "model": "fast",
        "steering": "all",
    }
    # A conversation owned by a task of an unconfigured conversation has no document.
    other = Busy(sim, workers=busy)
    unowned = fresh_id()
    other.worker.ok(other.task_id, CreateConversation(conversation_id=unowned, owner_task_id=other.task_id))
    assert sim.store.document(unowned, CONFIG_DOCUMENT) is None


def test_a_run_configured_to_use_a_model_is_leased_only_to_a_worker_naming_it(sim: RunSim) -> None:
    conversation_id = sim.agent_conversation()
    expect(configure(sim, conversation_id, model="fast", force=True), DocumentReply)  # a deploy that brings it
    plain = sim.agent_worker()
    run_id = submitted(sim, conversation_id, "hi").submission_id
    task_id = run_task_id(run_id, 1)
    assert not plain.holds(task_id)
    # Workers run the agent, none names the model: the run needs attention, and says which model.
    assert sim_status(sim, run_id) == ("needs_attention", "no_model")
    graph = sim.core.tasks.blocked_reason_of(sim.core.tasks.record(task_id))  # type: ignore[arg-type]
    assert graph == "missing_model"
    named = sim.agent_worker(models=("fast",))
    assert named.holds(task_id) and not plain.holds(task_id)
    assert sim_status(sim, run_id) == ("running", None)


def test_a_model_configured_away_mid_run_is_placed_again_when_the_worker_gives_the_lease_back(sim: RunSim) -> None:
    conversation_id = sim.agent_conversation()
    fast = sim.agent_worker(models=("fast",))
    run_id = submitted(sim, conversation_id, "hi").submission_id
    task_id = run_task_id(run_id, 1)
    assert fast.holds(task_id)
    expect(configure(sim, conversation_id, model="slow", force=True), DocumentReply)
    # The worker finds, at its next model request, a model its app does not name: it gives the lease back unrun.
    expect(fast.release(task_id), Ok)
    assert not fast.holds(task_id)
    assert sim_status(sim, run_id) == ("needs_attention", "no_model")
    assert sim.core.tasks.record(task_id).restarts == 0  # type: ignore[union-attr]  # not a cut-off
    # Configured back to a model a worker names: placed again at once, no worker attaching needed.
    expect(configure(sim, conversation_id, model="fast"), DocumentReply)
    assert fast.holds(task_id) and sim_status(sim, run_id) == ("running", None)
    # Clearing the model: any worker running the agent will do.
    expect(configure(sim, conversation_id, clear=("model",)), DocumentReply)
    # A run being cancelled needs no model: its abort handler runs on any worker of the agent.
    expect(configure(sim, conversation_id, model="slow", force=True), DocumentReply)
    expect(fast.release(task_id), Ok)
    assert sim_status(sim, run_id) == ("needs_attention", "no_model")
    expect(sim.request(sim.client, CancelRun(run_id=run_id)), RunReply)
    assert fast.lease(task_id).mode == "abort"


def test_configure_refuses_a_model_or_tool_no_attached_worker_announces_naming_the_known_ones(sim: RunSim) -> None:
    conversation_id = sim.agent_conversation()
    head = sim.core.head_seq

    def refusal(**changes: Any) -> str:
        return expect(configure(sim, conversation_id, **changes), Error).message

    assert "model 'fast': no worker is attached to check it against; nothing was changed" in refusal(model="fast")
    assert "pass force=True" in refusal(tools=["lookup"])
    # Only workers of another agent: checked against every attached worker.
    sim.agent_worker("helper", models=("remote",), tools=("far",))
    expect(configure(sim, conversation_id, tools=["far"]), DocumentReply)
    # Workers of the conversation's agent attached: they prepare its requests, so their names count.
    sim.agent_worker(models=("fast", "slow"), tools=("lookup", "track"))
    message = refusal(model="remote")
    assert message.startswith(
        "configure: model 'remote': named by none of the attached workers that run agent 'support' (they name "
        "'fast', 'slow'); nothing was changed"
    ), message
    assert "then fails no_model" in message
    message = refusal(tools=["lookup", "nope", "gone"])
    assert "tools 'nope', 'gone': named by none of" in message and "(they name 'lookup', 'track')" in message
    # A stray space is not a name (``tether configure --tools 'lookup, track'`` stored ' track').
    assert "without spaces at its ends, not ' track'" in refusal(tools=["lookup", " track"])
    assert sim.core.head_seq == head + 1  # the tools=["far"] change only
    changed = expect(configure(sim, conversation_id, model="fast", tools=["lookup", "track"]), DocumentReply)
    assert changed.document is not None and changed.document.value == {"model": "fast", "tools": ["lookup", "track"]}
    # ``force``: a deploy that brings it later.
    forced = expect(configure(sim, conversation_id, model="next-week", force=True), DocumentReply).document
    assert forced is not None and forced.value["model"] == "next-week"


def test_a_refusal_of_configure_lists_a_bounded_number_of_names(sim: RunSim) -> None:
    conversation_id = sim.agent_conversation()
    sim.agent_worker(tools=tuple(f"known{index:03}" for index in range(200)))
    message = expect(configure(sim, conversation_id, tools=[f"new{index}" for index in range(256)]), Error).message
    assert (
        f"and {256 - _config.MAX_NAMES_SHOWN} more" in message
        and f"and {200 - _config.MAX_NAMES_SHOWN} more" in message
    )
    assert len(message) < 2_000


@pytest.fixture
def manual_sim(tmp_path: Path) -> Iterator[RunSim]:
    opened = RunSim(open_store("sqlite", tmp_path), clock="manual")
    yield opened
    opened.close()


def test_a_run_whose_model_no_worker_names_fails_no_model_past_the_grace_and_holds_what_follows(
    manual_sim: RunSim,
) -> None:
    sim = manual_sim
    conversation_id = sim.agent_conversation()
    expect(configure(sim, conversation_id, model="fast", force=True), DocumentReply)
    # No worker of the agent at all: workers are coming back (agent_missing), no grace runs.
    own = submitted(sim, conversation_id, "hi")
    follow = submitted(sim, conversation_id, "and then?")
    assert own.run_id is not None and follow.run_id is not None
    sim.request(sim.client, AdvanceClock(by_ms=MODEL_GRACE_MS))
    assert sim_status(sim, own.run_id) == ("pending", "agent_missing") and sim.core.next_deadline_ms() is None
    # Workers of the agent attach, none names the model: it waits, within the grace, as before.
    plain = sim.agent_worker()
    start_ms = sim.now_ms
    assert sim_status(sim, own.run_id) == ("needs_attention", "no_model")
    assert sim.core.next_deadline_ms() == start_ms + MODEL_GRACE_MS
    sim.request(sim.client, AdvanceClock(by_ms=MODEL_GRACE_MS - 1))
    assert sim_status(sim, own.run_id) == ("needs_attention", "no_model")
    sim.request(sim.client, AdvanceClock(by_ms=1))
    run = sim.run(own.run_id)
    assert (run.status, run.reason) == ("failed", "no_model")
    assert run.error is not None and "names the model 'fast'" in run.error and "10 s (the model grace)" in run.error
    settled = submission(sim, own)
    assert (settled.status, settled.reason) == ("unanswered", "no_model")
    # A failure: what is queued behind it is held (after_failed_run="wait"), nothing was leased.
    assert sim_status(sim, follow.run_id) == ("queued", "held")
    assert not plain.leases and sim.core.next_deadline_ms() is None


def test_a_model_that_comes_back_within_the_grace_lets_the_run_go_on_and_a_new_gap_starts_a_new_grace(
    manual_sim: RunSim,
) -> None:
    sim = manual_sim
    conversation_id = sim.agent_conversation()
    sim.agent_worker()
    expect(configure(sim, conversation_id, model="fast", force=True), DocumentReply)
    run_id = submitted(sim, conversation_id, "hi").submission_id
    task_id = run_task_id(run_id, 1)
    sim.request(sim.client, AdvanceClock(by_ms=MODEL_GRACE_MS - 1))
    fast = sim.agent_worker(models=("fast",))  # a deploy, in time
    assert fast.holds(task_id) and sim_status(sim, run_id) == ("running", None)
    assert sim.core.next_deadline_ms() is None
    # Moved to a model nobody names mid-run: the worker gives the lease back; a grace of its own starts now.
    expect(configure(sim, conversation_id, model="slow", force=True), DocumentReply)
    expect(fast.release(task_id), Ok)
    assert sim_status(sim, run_id) == ("needs_attention", "no_model")
    assert sim.core.next_deadline_ms() == sim.now_ms + MODEL_GRACE_MS
    sim.request(sim.client, AdvanceClock(by_ms=MODEL_GRACE_MS - 1))
    expect(configure(sim, conversation_id, model="fast"), DocumentReply)  # configured back: it runs again
    assert fast.holds(task_id) and sim_status(sim, run_id) == ("running", None)
    sim.request(sim.client, AdvanceClock(by_ms=MODEL_GRACE_MS))
    assert sim_status(sim, run_id) == ("running", None)


def test_the_owner_keeps_at_most_its_bound_of_configured_models_in_memory(
    sim: RunSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_config, "MAX_CACHED_MODELS", 3)
    conversations = [sim.agent_conversation() for _ in range(7)]
    for index, conversation_id in enumerate(conversations):
        expect(configure(sim, conversation_id, model=f"m{index}", force=True), DocumentReply)
    for index, conversation_id in enumerate(conversations * 2):
        assert sim.core.config.model_of(conversation_id) == f"m{index % 7}"  # right, whatever was dropped
        assert len(sim.core.config._models) <= 3


def test_steering_all_places_every_queued_steer_at_one_boundary(sim: RunSim) -> None:
    busy = Busy(sim)
    expect(configure(sim, busy.conversation_id, steering="all"), DocumentReply)
    tool_id = busy.call_tool()
    steers = [submitted(sim, busy.conversation_id, text, when_busy="steer") for text in ("one", "two")]
    busy.finish_tool(tool_id)
    assert [submission(sim, record).status for record in steers] == ["placed", "placed"]
    assert busy.kinds()[-2:] == [(USER_ENTRY, "one"), (USER_ENTRY, "two")]


def test_follow_ups_all_queue_together_in_one_run_and_settle_with_its_answer(sim: RunSim) -> None:
    busy = Busy(sim)
    expect(configure(sim, busy.conversation_id, follow_ups="all"), DocumentReply)
    first = submitted(sim, busy.conversation_id, "next one")
    second = submitted(sim, busy.conversation_id, "and another")
    assert first.run_id == first.submission_id and second.run_id == first.run_id  # it joined the queued run
    assert [run.run_id for run in sim.core.runs.live.values() if run.conversation_id == busy.conversation_id] == [
        busy.run_id,
        first.run_id,
    ]
    answer(busy.worker, busy.task_id, busy.conversation_id, "first done")
    assert first.run_id is not None
    follow_task = run_task_id(first.run_id, 1)
    assert busy.worker.holds(follow_task)
    assert [text for kind, text in busy.kinds() if kind == USER_ENTRY][-2:] == ["next one", "and another"]
    answer(busy.worker, follow_task, busy.conversation_id, "both done")
    run = sim.run(first.run_id)
    assert {submission(sim, record).answer for record in (first, second)} == {run.answer}


# ------------------------------------------------------------------------------------------------- abort


def test_abort_conversation_withdraws_what_is_queued_keeps_writes_and_aborts_the_run(sim: RunSim) -> None:
    busy = Busy(sim)
    tool_id = busy.call_tool()
    steer = submitted(sim, busy.conversation_id, "steer", when_busy="steer")
    follow = submitted(sim, busy.conversation_id, "follow")
    note = submitted(sim, busy.conversation_id, {"kind": "app.note", "data": 1}, kind="write")  # type: ignore[arg-type]
    background = fresh_id()
    expect(
        sim.commit(CreateTask(task_id=background, kind="tool:lookup", conversation_id=busy.conversation_id)), Committed
    )
    reply = expect(
        sim.request(sim.client, AbortConversation(conversation_id=busy.conversation_id, background=True)),
        ConversationAborted,
    )
    assert set(reply.withdrawn) == {steer.submission_id, follow.submission_id}
    assert reply.run is not None and reply.run.run_id == busy.run_id and reply.tasks == (background,)
    assert (submission(sim, steer).reason, submission(sim, follow).reason) == ("withdrawn", "withdrawn")
    assert sim.run(follow.submission_id).status == "cancelled"
    assert submission(sim, note).status == "done"
    assert sim.task(background).abort is not None and sim.task(tool_id).abort is not None
    again = expect(
        sim.request(sim.client, AbortConversation(conversation_id=busy.conversation_id)), ConversationAborted
    )
    assert again.withdrawn == () and again.tasks == ()
    assert error_code(sim.request(sim.client, AbortConversation(conversation_id=fresh_id()))) == ErrorCode.NOT_FOUND


# ------------------------------------------------------------------------------------------------- reset


def reset(sim: RunSim, conversation_id: str, handoff: str | None = None) -> SubmissionRecord:
    payload = None if handoff is None else {"handoff": handoff}
    return submitted(sim, conversation_id, payload, kind="reset")  # type: ignore[arg-type]


def test_a_reset_while_idle_is_placed_at_once_and_a_bad_one_writes_nothing(sim: RunSim) -> None:
    conversation_id = sim.agent_conversation()
    head = sim.core.head_seq
    for bad in ({"handoff": ""}, {"handoff": 1}, {"other": "x"}, "text"):
        assert error_code(sim.submit(conversation_id, bad, kind="reset")) == ErrorCode.INVALID, bad
    assert sim.core.head_seq == head
    record = reset(sim, conversation_id, "We were fixing the login test.")
    assert record.status == "done"
    assert sim.entries(conversation_id) == [
        (RESET_ENTRY, {"handoff": "We were fixing the login test.", "submission_id": record.submission_id})
    ]


def test_a_reset_queued_during_a_tool_round_is_placed_when_it_ends_and_writes_wait_behind_it(sim: RunSim) -> None:
    busy = Busy(sim)
    tool_id = busy.call_tool()
    record = reset(sim, busy.conversation_id, "start over")
    assert (record.status, record.run_id) == ("queued", busy.run_id)
    note = submitted(sim, busy.conversation_id, {"kind": "app.note", "data": 1}, kind="write")  # type: ignore[arg-type]
    assert note.status == "queued"  # behind the reset, so that the reset does not hide it
    follow = submitted(sim, busy.conversation_id, "then this")
    busy.finish_tool(tool_id)
    assert [kind for kind, _ in sim.entries(busy.conversation_id)][-3:] == [
        "tether.tool_result",
        RESET_ENTRY,
        "app.note",
    ]
    assert (submission(sim, record).status, submission(sim, note).status) == ("done", "done")
    # The worker sees the reset after its round and ends the run there (the run loop's reason).
    outcome = TaskOutcome(status="failed", error="a reset was placed", reason="reset")
    busy.worker.ok(busy.task_id, SetTaskState(task_id=busy.task_id, status="terminal", outcome=outcome))
    run = sim.run(busy.run_id)
    assert (run.status, run.reason) == ("failed", "reset")
    assert (submission(sim, busy.own).status, submission(sim, busy.own).reason) == ("unanswered", "reset")
    assert sim.run(follow.submission_id).status in ("pending", "running")  # the follow-up, in the new context


def test_a_reset_behind_a_steer_waits_for_the_next_boundary(sim: RunSim) -> None:
    busy = Busy(sim)
    steer = submitted(sim, busy.conversation_id, "one more thing", when_busy="steer")
    record = reset(sim, busy.conversation_id)
    answer(busy.worker, busy.task_id, busy.conversation_id, "first")  # places the steer; the reset waits
    assert (submission(sim, steer).status, submission(sim, record).status) == ("placed", "queued")
    answer(busy.worker, busy.task_id, busy.conversation_id, "second")  # places the reset; the run completes
    assert submission(sim, record).status == "done" and sim.run(busy.run_id).status == "completed"
    assert [kind for kind, _ in sim.entries(busy.conversation_id)][-1] == RESET_ENTRY


def test_an_inbox_holds_at_most_its_bound_waiting(sim: RunSim) -> None:
    busy = Busy(sim)
    for n in range(MAX_QUEUED_PER_CONVERSATION):
        submitted(sim, busy.conversation_id, f"steer {n}", when_busy="steer")
    head = sim.core.head_seq
    assert error_code(sim.submit(busy.conversation_id, "one more", when_busy="steer")) == ErrorCode.CONFLICT
    assert sim.core.head_seq == head and len(sim.core.inbox.queued[busy.conversation_id]) == MAX_QUEUED_PER_CONVERSATION
    assert submitted(sim, busy.conversation_id, "a follow-up still queues its own run").status == "queued"


# ------------------------------------------------------------------------------------------------ tx.submit


def test_a_submit_inside_a_commit_is_admitted_with_its_writes_or_not_at_all(sim: RunSim) -> None:
    busy = Busy(sim)
    note = AppendEntry(conversation_id=busy.conversation_id, entry_id=fresh_id(), kind="app.sent", data=JsonValue(1))
    steer = SubmitWrite(
        conversation_id=busy.conversation_id,
        submission_id=fresh_id(),
        request_id="tx-1",
        kind="input",
        payload=JsonValue("from a commit"),
        when_busy="steer",
    )
    committed = expect(sim.commit(steer, note), Committed)
    assert committed.results[0] == 1  # admitted now (the entry's result is its position)
    record = sim.store.submission_by_id(steer.submission_id)
    assert record is not None and (record.status, record.when_busy, record.run_id) == ("queued", "steer", busy.run_id)
    again = expect(sim.commit(attrs.evolve(steer, submission_id=fresh_id())), Committed)
    assert again.results == (0,)  # the request id was used: the original stands
    head = sim.core.head_seq
    refused = attrs.evolve(steer, submission_id=fresh_id(), request_id="tx-2", when_busy="reject")
    other = AppendEntry(conversation_id=busy.conversation_id, entry_id=fresh_id(), kind="app.sent", data=JsonValue(2))
    assert error_code(sim.commit(other, refused)) == ErrorCode.CONFLICT  # busy: the whole commit is refused
    assert sim.core.head_seq == head and sim.store.submission_by_id(refused.submission_id) is None
    assert [kind for kind, _ in sim.entries(busy.conversation_id)].count("app.sent") == 1


def test_a_reset_left_waiting_by_a_cancelled_run_is_placed_once_with_its_writes_by_the_next_run(sim: RunSim) -> None:
    """Found by the inbox's state machine: the next run's admission placed the reset with the writes behind it,
    then placed those writes again (an entry id conflict that broke the owner's batch)."""
    busy = Busy(sim)
    first_reset = reset(sim, busy.conversation_id)
    note = submitted(sim, busy.conversation_id, {"kind": "app.note", "data": 1}, kind="write")  # type: ignore[arg-type]
    second_reset = reset(sim, busy.conversation_id, "again")
    late = submitted(sim, busy.conversation_id, {"kind": "app.late", "data": 2}, kind="write")  # type: ignore[arg-type]
    expect(sim.request(sim.client, CancelRun(run_id=busy.run_id)), RunReply)
    expect(busy.worker.release(busy.task_id), Ok)
    busy.worker.ok(busy.task_id, aborted(busy.task_id))
    assert sim.run(busy.run_id).status == "cancelled"
    assert all(submission(sim, one).status == "queued" for one in (first_reset, note, second_reset, late))
    submitted(sim, busy.conversation_id, "a new question")
    kinds = [kind for kind, _ in sim.entries(busy.conversation_id)]
    assert kinds[-5:] == [RESET_ENTRY, "app.note", RESET_ENTRY, "app.late", USER_ENTRY]
    assert all(submission(sim, one).status == "done" for one in (first_reset, note, second_reset, late))
