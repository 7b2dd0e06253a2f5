"""The inbox as a state machine (Hypothesis): inputs submitted every way (follow-up, steer, reject, only while busy),
writes, withdrawals, tool rounds that end, answers that may place a steer, failures, cancels and owner restarts, in
any order. After every step: each input is placed at most once and as its status says, it settles as its run ended,
and the owner's memory of the queued steers is the store's (docs/runs.md, "The inbox"). The wider machine of runs
(test_runs_state_machine) submits and withdraws too, among its other rules; this one keeps to the inbox, so that
its boundaries are reached often."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from protocol import (
    RUN_ACTIVE,
    RUN_TERMINAL,
    AbortConversation,
    CancelRun,
    Committed,
    Configure,
    ConversationAborted,
    CreateTask,
    DocumentReply,
    Error,
    JsonValue,
    Ok,
    RetryRun,
    RunRecord,
    RunReply,
    SetTaskState,
    Submitted,
    TaskOutcome,
    Withdraw,
    Withdrawn,
)
from tests.unit.test_runs_core import RunSim
from tests.unit.test_tasks_core import aborted, completed, fresh_id, restart_ids

CONVERSATIONS = 2
picks = st.integers(min_value=0, max_value=1 << 16)


def inbox_holds(sim: RunSim, conversations: list[str], submissions: list[str], runs: dict[str, RunRecord]) -> None:
    """Each input is placed at most once, and as its status says; it settles as its run ended; the owner's
    memory of the queued steers is the store's."""
    store = sim.store
    placed: dict[str, int] = {}
    for conversation_id in conversations:
        for entry in store.entry_page(conversation_id, "asc", None, 10_000, max_data_bytes=1 << 30)[0]:
            if entry.kind == "tether.user":
                key = str(entry.data["submission_id"])  # type: ignore[index]
                placed[key] = placed.get(key, 0) + 1
    queued: dict[str, list[str]] = {}
    for submission_id in submissions:
        record = store.submission_by_id(submission_id)
        assert record is not None
        if record.kind in ("write", "reset"):
            assert record.status in ("queued", "done") or record.reason in ("withdrawn", "stale"), record
            if record.status == "queued":
                queued.setdefault(record.conversation_id, []).append(submission_id)
            continue
        run = runs.get(record.run_id or "")
        assert run is not None and run.conversation_id == record.conversation_id, (record, run)
        count = placed.get(submission_id, 0)
        if record.kind == "continue":
            assert count == 0, record  # a continue places nothing of its own
        elif record.status == "queued" or record.reason in ("withdrawn", "run_failed"):
            assert count == 0, record
        elif record.status == "unanswered":
            assert count <= 1, (record, count)  # a queued run cancelled settles its input unplaced
        else:
            assert count == 1, (record, count)
        if record.status == "queued" and record.run_id != submission_id:  # a steer, or a follow-up joining a run
            queued.setdefault(record.conversation_id, []).append(submission_id)
        if record.status == "done":
            assert run.status == "completed" and record.answer == run.answer, (record, run)
        elif record.status == "placed":
            assert run.status not in RUN_TERMINAL, (record, run)  # a run settles its inputs as it ends
        elif record.status == "unanswered" and record.reason not in ("withdrawn", "run_failed"):
            # (Settled without being placed, withdrawn by a person or by after_failed_run="withdraw": final, even
            # once a retry of its run goes on and answers the run's own input.)
            assert run.status in ("failed", "cancelled"), (record, run)
    for conversation_id in conversations:
        # Runs held after a failed run are the whole of their conversation's queue, admitted by nothing but a release.
        live = [run for run in runs.values() if run.conversation_id == conversation_id and run.status in RUN_ACTIVE]
        if any(run.reason == "held" for run in live):
            assert all(run.status == "queued" and run.reason == "held" for run in live), live
    memory = {
        conversation_id: [record.submission_id for record in records]
        for conversation_id, records in sim.core.inbox.queued.items()
    }
    assert memory == queued, (memory, queued)


class InboxMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        restart_ids()
        self.sim = RunSim(clock="manual")
        self.conversations = [self.sim.agent_conversation() for _ in range(CONVERSATIONS)]
        self.submissions: list[str] = []
        self.runs: list[str] = []
        self.sim.agent_worker()
        self.sim.worker(kinds=("tool:lookup",))

    def teardown(self) -> None:
        self.sim.close()

    def leased(self, prefix: str, mode: str = "phase") -> list[tuple[Any, str]]:
        return [
            (worker, task_id)
            for worker in self.sim.workers.values()
            for task_id, lease in sorted(worker.leases.items())
            if lease.kind.startswith(prefix) and lease.mode == mode and task_id not in worker.cancelled
        ]

    @rule(
        conversation=picks,
        when_busy=st.sampled_from(["follow_up", "steer", "steer", "steer", "reject"]),
        when_idle=st.sampled_from(["start", "start", "reject"]),
    )
    def submit(self, conversation: int, when_busy: str, when_idle: str) -> None:
        conversation_id = self.conversations[conversation % CONVERSATIONS]
        busy = self.sim.core.runs.active_run(conversation_id) is not None
        held = self.sim.core.runs.held(conversation_id) is not None
        reply = self.sim.submit(conversation_id, fresh_id(), when_busy=when_busy, when_idle=when_idle)
        if isinstance(reply, Error):
            assert not held, reply  # an input to a held conversation queues behind, whatever it asked
            assert reply.code == "conflict" and (when_busy == "reject" if busy else when_idle == "reject"), reply
            return
        if held:
            assert self.sim.core.runs.held(conversation_id) is None  # released
        record = reply.submission
        self.submissions.append(record.submission_id)
        assert record.run_id is not None
        if record.run_id == record.submission_id and record.run_id not in self.runs:  # a run of its own
            self.runs.append(record.run_id)

    @rule(conversation=picks)
    def continue_(self, conversation: int) -> None:
        conversation_id = self.conversations[conversation % CONVERSATIONS]
        active = self.sim.core.runs.active_run(conversation_id)
        held = self.sim.core.runs.held(conversation_id)
        reply = self.sim.submit(conversation_id, None, kind="continue")
        if isinstance(reply, Error):
            assert reply.code == "conflict" and active is not None and held is None, reply
            return
        record = reply.submission
        self.submissions.append(record.submission_id)
        if held is not None:
            assert record.run_id == held.run_id, (record, held)
        else:
            assert active is None and record.run_id == record.submission_id, record
            self.runs.append(record.submission_id)

    @rule(
        conversation=picks,
        setting=st.sampled_from(
            [
                ("steering", "first"),
                ("steering", "all"),
                ("follow_ups", "first"),
                ("follow_ups", "all"),
                ("after_failed_run", "wait"),
                ("after_failed_run", "continue"),
                ("after_failed_run", "withdraw"),
            ]
        ),
    )
    def configure(self, conversation: int, setting: tuple[str, str]) -> None:
        field, value = setting
        conversation_id = self.conversations[conversation % CONVERSATIONS]
        reply = self.sim.request(
            self.sim.client, Configure(conversation_id=conversation_id, changes=JsonValue({field: value}))
        )
        assert isinstance(reply, DocumentReply) and reply.document is not None, reply
        assert reply.document.value[field] == value  # type: ignore[index]

    @rule(conversation=picks)
    def write(self, conversation: int) -> None:
        conversation_id = self.conversations[conversation % CONVERSATIONS]
        waits = self.sim.core.inbox.reset_queued(conversation_id)
        reply = self.sim.submit(conversation_id, {"kind": "app.note", "data": 1}, kind="write")
        assert isinstance(reply, Submitted) and reply.submission.status == ("queued" if waits else "done"), reply
        self.submissions.append(reply.submission.submission_id)

    @rule(conversation=picks, head=st.sampled_from(["none", "first", "last"]))
    def visible_write(self, conversation: int, head: str) -> None:
        """A write the model sees (it waits for the working run's boundary), naming a head or not (then, placed
        after a reset that cut it off, stale)."""
        conversation_id = self.conversations[conversation % CONVERSATIONS]
        payload: dict[str, Any] = {"kind": "app.seen", "model": [{"role": "user", "text": "seen"}]}
        if head != "none":
            order = "asc" if head == "first" else "desc"
            entries = self.sim.store.entry_page(conversation_id, order, None, 1)[0]
            if not entries:
                return
            payload["head"] = entries[0].entry_id
        reply = self.sim.submit(conversation_id, payload, kind="write")
        assert isinstance(reply, Submitted), reply
        record = reply.submission
        assert record.status in ("queued", "done") or record.reason == "stale", record
        self.submissions.append(record.submission_id)

    @rule(conversation=picks, handoff=st.sampled_from([None, "from here"]))
    def reset(self, conversation: int, handoff: str | None) -> None:
        conversation_id = self.conversations[conversation % CONVERSATIONS]
        payload = None if handoff is None else {"handoff": handoff}
        reply = self.sim.submit(conversation_id, payload, kind="reset")
        assert isinstance(reply, Submitted), reply
        self.submissions.append(reply.submission.submission_id)

    @precondition(lambda self: self.submissions)
    @rule(which=picks)
    def withdraw(self, which: int) -> None:
        submission_id = self.submissions[which % len(self.submissions)]
        before = self.sim.store.submission_by_id(submission_id)
        assert before is not None
        reply = self.sim.request(self.sim.client, Withdraw(submission_id=submission_id))
        assert isinstance(reply, Withdrawn), reply
        assert reply.outcome == {"queued": "withdrawn", "placed": "already_placed"}.get(before.status, "settled")

    @precondition(lambda self: self.leased("agent:"))
    @rule(which=picks, step=st.sampled_from(["tools", "answer", "answer", "complete", "fail", "fail"]))
    def run_phase(self, which: int, step: str) -> None:
        leased = self.leased("agent:")
        worker, task_id = leased[which % len(leased)]
        if step == "tools":
            tool_id = fresh_id()
            reply = worker.commit(
                task_id,
                CreateTask(task_id=tool_id, kind="tool:lookup", version=1, owner_task_id=task_id),
                SetTaskState(task_id=task_id, status="waiting", on=(tool_id,), checkpoint=JsonValue({"phase": "t"})),
            )
        elif step == "fail":
            outcome = TaskOutcome(status="failed", error="boom", reason="model_error")
            reply = worker.commit(task_id, SetTaskState(task_id=task_id, status="terminal", outcome=outcome))
        else:
            steer = JsonValue({"phase": "turn"}) if step == "answer" else JsonValue(None)
            outcome = TaskOutcome(status="completed", result=JsonValue({"text": "done"}))
            ending = SetTaskState(task_id=task_id, status="terminal", outcome=outcome, steer_checkpoint=steer)
            reply = worker.commit(task_id, ending)
        assert isinstance(reply, Committed), reply

    @precondition(lambda self: self.leased("tool:"))
    @rule(which=picks)
    def tool_ends(self, which: int) -> None:
        leased = self.leased("tool:")
        worker, task_id = leased[which % len(leased)]
        assert isinstance(worker.commit(task_id, completed(task_id, {"ok": True})), Committed)

    @precondition(lambda self: self.leased("", mode="abort"))
    @rule()
    def abort_handlers_end(self) -> None:
        for worker, task_id in self.leased("", mode="abort"):
            assert isinstance(worker.commit(task_id, aborted(task_id)), Committed)

    @precondition(lambda self: any(worker.cancelled for worker in self.sim.workers.values()))
    @rule()
    def cancelled_phases_stop(self) -> None:
        for worker in list(self.sim.workers.values()):
            for task_id in list(worker.cancelled):
                assert isinstance(worker.release(task_id), Ok)

    @precondition(lambda self: self.runs)
    @rule(which=picks)
    def cancel(self, which: int) -> None:
        reply = self.sim.request(self.sim.client, CancelRun(run_id=self.runs[which % len(self.runs)]))
        assert isinstance(reply, RunReply) or (isinstance(reply, Error) and reply.code == "conflict"), reply

    @precondition(lambda self: self.runs)
    @rule(which=picks)
    def retry(self, which: int) -> None:
        reply = self.sim.request(self.sim.client, RetryRun(run_id=self.runs[which % len(self.runs)]))
        assert isinstance(reply, RunReply) or (isinstance(reply, Error) and reply.code == "conflict"), reply

    @rule(conversation=picks, background=st.booleans())
    def abort_conversation(self, conversation: int, background: bool) -> None:
        conversation_id = self.conversations[conversation % CONVERSATIONS]
        request = AbortConversation(conversation_id=conversation_id, background=background)
        reply = self.sim.request(self.sim.client, request)
        assert isinstance(reply, ConversationAborted), reply
        assert not self.sim.core.inbox.queued.get(conversation_id)
        assert not self.sim.core.runs.queued_run_ids(conversation_id)

    @rule()
    def owner_restarts(self) -> None:
        self.sim.restart()
        self.sim.agent_worker()
        self.sim.worker(kinds=("tool:lookup",))

    @invariant()
    def the_inbox_holds(self) -> None:
        runs, _ = self.sim.store.run_page(None, None, None, 1000)
        active = [run.conversation_id for run in runs if run.status in RUN_ACTIVE]
        assert len(active) == len(set(active)), runs
        inbox_holds(self.sim, self.conversations, self.submissions, {run.run_id: run for run in runs})
        assert not self.sim.core.needs_settle(self.sim.now_ms)


InboxMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_inbox_state_machine = InboxMachine.TestCase
