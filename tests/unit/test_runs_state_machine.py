"""A Hypothesis state machine over the runs of agents in the owner core: random submissions (follow-up or reject),
agent and tool workers that come and go, model and tool intents and results, approvals, resolve, respond, cancel,
retry, clock moves and owner restarts, driven through OwnerCore over the memory store (the drivers of
``test_runs_core.py``), with the rules checked against the store after every step:

- a conversation never has two active runs (``pending``, ``running``, ``retry_wait``, ``waiting``,
  ``needs_attention``);
- admission never exceeds ``max_concurrent_runs``: the ``pending`` / ``running`` / ``retry_wait`` runs that never
  waited are at most that many (a ``waiting`` or ``needs_attention`` run frees capacity; once it resumes it is not
  queued again behind it, see docs/runs.md);
- an operation's committed result (``completed``, ``resolved``, a tool's ``failed``) never changes: no second result,
  and a new intent after it is refused (the machine checks every commit's answer against that rule);
- a run that ended never changes again, and its usage is the sum of its operations' usage (counted once);
- after a step the owner needs no other batch.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from protocol import (
    RUN_ACTIVE,
    RUN_TERMINAL,
    AdvanceClock,
    CancelRun,
    Committed,
    CreateInteraction,
    CreateTask,
    Error,
    FinishOperation,
    JsonValue,
    OperationRecord,
    Resolve,
    Respond,
    Retry,
    RetryRun,
    RunRecord,
    RunUsage,
    SetTaskState,
    StartOperation,
    Submitted,
    TaskOutcome,
    Withdraw,
    Withdrawn,
    approval_task_id,
)
from storage_owner.core._usage import add_usage
from tests.unit.test_inbox_state_machine import inbox_holds
from tests.unit.test_runs_core import RunSim
from tests.unit.test_tasks_core import aborted, completed, failed, fresh_id, restart_ids

MAX_RUNS = 2
CONVERSATIONS = 3
RETRY = Retry(attempts=2, first_delay_ms=100, max_delay_ms=100, multiplier=1.0)
BUSY = ("pending", "running", "retry_wait")
picks = st.integers(min_value=0, max_value=1 << 16)


def final(op: OperationRecord) -> bool:
    """Whether an operation's result is committed for good (a model's exhausted failure may be retried by
    ``retry_run``, which starts its attempts over)."""
    return op.status in ("completed", "resolved") or (op.kind == "tool" and op.status == "failed")


def tool_intent(run_id: str, op_id: str, policy: str, attempt: int, task_id: str | None = None) -> StartOperation:
    """The intent of the machine's one tool call (``task_id``: committed with its task, by the model result)."""
    return StartOperation(
        operation_id=op_id,
        run_id=run_id,
        kind="tool",
        name="lookup",
        version=1,
        turn=1,
        attempt=attempt,
        digest="args",
        tool_call_id="c",
        policy=policy,  # type: ignore[arg-type]
        task_id=task_id,
    )


def may_start(op: OperationRecord | None) -> bool:
    if op is None:
        return True
    if final(op) or op.status == "started":
        return False
    if op.kind == "model" and op.status == "failed" and op.attempt >= (op.retry or Retry()).attempts:
        return False
    return not (op.kind == "tool" and op.policy == "manual" and op.status == "interrupted")


class RunMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        restart_ids()
        self.sim = RunSim(clock="manual", max_concurrent_runs=MAX_RUNS)
        self.conversations = [self.sim.agent_conversation() for _ in range(CONVERSATIONS)]
        self.runs: list[str] = []
        self.model_ops: dict[str, str] = {}
        """The current model request of each run (a new one per turn)."""
        self.tool_ops: dict[str, tuple[str, str]] = {}
        """Each tool task's operation id and policy."""
        self.results: dict[str, OperationRecord] = {}
        """Operations whose committed result was seen: they must never change."""
        self.ended: dict[str, RunRecord] = {}
        self.submissions: list[str] = []
        """Every input and write admitted (steers and follow-ups included), in order."""
        self.waited: set[str] = set()
        """Runs seen waiting or needing attention (they may resume past the admission bound)."""
        self.sim.agent_worker()
        self.sim.worker(kinds=("tool:lookup",))

    def teardown(self) -> None:
        self.sim.close()

    # ----------------------------------------------------------------------------------------- helpers

    def leases(self, prefix: str, mode: str = "phase") -> list[tuple[Any, str]]:
        found = []
        for worker in self.sim.workers.values():
            for task_id, lease in sorted(worker.leases.items()):
                if lease.kind.startswith(prefix) and lease.mode == mode and task_id not in worker.cancelled:
                    found.append((worker, task_id))
        return found

    def run_of(self, task_id: str) -> str:
        task_input = self.sim.store.task_data(task_id)[0]
        if isinstance(task_input, dict) and "run_id" in task_input:
            return str(task_input["run_id"])
        record = self.sim.store.task(task_id)
        assert record is not None and record.owner_task_id is not None
        return self.run_of(record.owner_task_id)

    def expect_answer(self, reply: Any, allowed: bool) -> None:
        if allowed:
            assert isinstance(reply, Committed), reply
        else:
            assert isinstance(reply, Error) and reply.code == "conflict", reply

    # ------------------------------------------------------------------------------------------- rules

    @rule(
        conversation=picks,
        when_busy=st.sampled_from(["follow_up", "steer", "steer", "reject"]),
        when_idle=st.sampled_from(["start", "start", "reject"]),
    )
    def submit(self, conversation: int, when_busy: str, when_idle: str) -> None:
        conversation_id = self.conversations[conversation % CONVERSATIONS]
        busy = self.sim.core.runs.active_run(conversation_id) is not None
        reply = self.sim.submit(conversation_id, fresh_id(), when_busy=when_busy, when_idle=when_idle)
        if isinstance(reply, Error):
            assert reply.code == "conflict" and (when_busy == "reject" if busy else when_idle == "reject"), reply
            return
        record = reply.submission
        assert record.run_id is not None
        self.submissions.append(record.submission_id)
        if record.when_busy == "steer":
            assert busy and record.status == "queued"
        else:
            self.runs.append(record.run_id)

    @rule(conversation=picks)
    def write(self, conversation: int) -> None:
        conversation_id = self.conversations[conversation % CONVERSATIONS]
        reply = self.sim.submit(conversation_id, {"kind": "app.note", "data": 1}, kind="write")
        assert isinstance(reply, Submitted) and reply.submission.status == "done", reply
        self.submissions.append(reply.submission.submission_id)

    @precondition(lambda self: self.submissions)
    @rule(which=picks)
    def withdraw(self, which: int) -> None:
        submission_id = self.submissions[which % len(self.submissions)]
        before = self.sim.store.submission_by_id(submission_id)
        assert before is not None
        reply = self.sim.request(self.sim.client, Withdraw(submission_id=submission_id))
        assert isinstance(reply, Withdrawn), reply
        expected = {"queued": "withdrawn", "placed": "already_placed"}.get(before.status, "settled")
        assert reply.outcome == expected, (before, reply)

    @precondition(lambda self: self.leases("agent:"))
    @rule(
        step=st.sampled_from(
            [
                *("intent", "intent", "guess", "result", "tool", "tool", "tool", "tool_started", "tool_started"),
                *("complete", "answer", "answer", "fail"),
            ]
        ),
        which=picks,
        policy=st.sampled_from(["manual", "safe", "idempotent"]),
    )
    def run_phase(self, step: str, which: int, policy: str) -> None:
        leased = self.leases("agent:")
        if not leased:
            return
        worker, task_id = leased[which % len(leased)]
        run_id = self.run_of(task_id)
        op_id = self.model_ops.setdefault(run_id, fresh_id())
        stored = self.sim.store.operation(op_id)
        if stored is None and step == "result":
            step = "intent"
        if step in ("intent", "guess"):
            # guess: the worker's fresh phase commits attempt 1 without reading the journal; only an operation
            # with no attempt takes it, anything else is refused (conflict) and nothing changes.
            attempt = 1 if stored is None or step == "guess" else stored.attempt + 1
            intent = StartOperation(
                operation_id=op_id,
                run_id=run_id,
                kind="model",
                name="scripted",
                version=1,
                turn=0,
                attempt=attempt,
                digest="d",
                retry=RETRY,
            )
            allowed = may_start(stored) if step == "intent" else stored is None
            self.expect_answer(worker.commit(task_id, intent), allowed)
            assert allowed or self.sim.store.operation(op_id) == stored
        elif step == "result":
            assert stored is not None
            allowed = stored.status == "started" and stored.task_id == task_id
            result = FinishOperation(operation_id=op_id, status="completed", usage=RunUsage(input_tokens=1))
            reply = worker.commit(task_id, result, SetTaskState(task_id=task_id, status="running"))
            self.expect_answer(reply, allowed)
            if allowed:
                self.model_ops[run_id] = fresh_id()  # the next turn
        elif step == "tool":
            tool_id = fresh_id()
            self.tool_ops[tool_id] = (fresh_id(), policy)
            reply = worker.commit(
                task_id,
                CreateTask(task_id=tool_id, kind="tool:lookup", version=1, owner_task_id=task_id),
                SetTaskState(task_id=task_id, status="waiting", on=(tool_id,)),
            )
            assert isinstance(reply, Committed), reply
        elif step == "tool_started":
            # The model result's commit creates the tool task and commits its call's intent with it (rule 1b): only
            # a call that re-runs when cut off; the owner refuses the others, and nothing is written.
            tool_id, op_id = fresh_id(), fresh_id()
            writes = (
                CreateTask(task_id=tool_id, kind="tool:lookup", version=1, owner_task_id=task_id),
                tool_intent(run_id, op_id, policy, 1, task_id=tool_id),
                SetTaskState(task_id=task_id, status="waiting", on=(tool_id,)),
            )
            reply = worker.commit(task_id, *writes)
            if policy in ("safe", "idempotent"):
                assert isinstance(reply, Committed), reply
                self.tool_ops[tool_id] = (op_id, policy)
            else:
                assert isinstance(reply, Error) and reply.code == "invalid", reply
                assert self.sim.store.operation(op_id) is None and self.sim.store.task(tool_id) is None
        elif step in ("complete", "answer"):
            # answer: as the run loop ends a run, naming where it goes on if a steer is queued (placed after it).
            steer = JsonValue({"phase": "turn"}) if step == "answer" else JsonValue(None)
            outcome = TaskOutcome(status="completed", result=JsonValue({"text": "done"}))
            ending = SetTaskState(task_id=task_id, status="terminal", outcome=outcome, steer_checkpoint=steer)
            assert isinstance(worker.commit(task_id, ending), Committed)
        else:
            assert isinstance(worker.commit(task_id, failed(task_id)), Committed)

    @precondition(lambda self: self.leases("tool:"))
    @rule(step=st.sampled_from(["intent", "intent", "guess", "result", "ask", "complete"]), which=picks)
    def tool_phase(self, step: str, which: int) -> None:
        leased = self.leases("tool:")
        if not leased:
            return
        worker, tool_id = leased[which % len(leased)]
        op_id, policy = self.tool_ops[tool_id]
        run_id = self.run_of(tool_id)
        stored = self.sim.store.operation(op_id)
        if stored is None and step == "result":
            step = "intent"  # a result needs an intent first: spend the step on one
        if step in ("intent", "guess"):
            # guess: the worker's fresh phase commits attempt 1 without reading the journal; only an operation
            # with no attempt takes it, anything else is refused (conflict) and nothing changes.
            attempt = 1 if stored is None or step == "guess" else stored.attempt + 1
            intent = tool_intent(run_id, op_id, policy, attempt)
            allowed = may_start(stored) if step == "intent" else stored is None
            self.expect_answer(worker.commit(tool_id, intent), allowed)
            assert allowed or self.sim.store.operation(op_id) == stored
        elif step == "result":
            assert stored is not None
            allowed = stored.status == "started" and stored.task_id == tool_id
            result = FinishOperation(operation_id=op_id, status="completed", result=JsonValue(1))
            self.expect_answer(worker.commit(tool_id, result, completed(tool_id, 1)), allowed)
        elif step == "ask":
            interaction = CreateInteraction(
                interaction_id=fresh_id(), operation_id=op_id, run_id=run_id, args=JsonValue({}), digest="args"
            )
            wait = SetTaskState(task_id=tool_id, status="waiting", on=(approval_task_id(op_id),))
            assert isinstance(worker.commit(tool_id, interaction, wait), Committed)
        else:
            assert isinstance(worker.commit(tool_id, completed(tool_id, None)), Committed)

    @precondition(lambda self: self.leases("", mode="abort"))
    @rule()
    def abort_handlers_end(self) -> None:
        for worker, task_id in self.leases("", mode="abort"):
            if worker.holds(task_id):
                worker.ok(task_id, aborted(task_id))

    @precondition(lambda self: any(worker.cancelled for worker in self.sim.workers.values()))
    @rule()
    def cancelled_phases_stop(self) -> None:
        for worker in list(self.sim.workers.values()):
            for task_id in list(worker.cancelled):
                if worker.holds(task_id):
                    worker.release(task_id)

    @rule(which=picks, approve=st.booleans())
    def respond(self, which: int, approve: bool) -> None:
        found, _ = self.sim.store.interaction_page("open", None, None, 100)
        if found:
            interaction = found[which % len(found)]
            request = Respond(interaction_id=interaction.interaction_id, approve=approve)
            self.sim.request(self.sim.client, request)

    @rule(which=picks)
    def resolve(self, which: int) -> None:
        candidates = []
        for op_id, _ in self.tool_ops.values():
            stored = self.sim.store.operation(op_id)
            if stored is not None and stored.status == "interrupted":
                candidates.append(op_id)
        if candidates:
            op_id = candidates[which % len(candidates)]
            self.sim.request(self.sim.client, Resolve(operation_id=op_id, output=JsonValue("ok")))

    @rule(which=picks, retry=st.booleans())
    def cancel_or_retry(self, which: int, retry: bool) -> None:
        if not self.runs:
            return
        run_id = self.runs[which % len(self.runs)]
        request = RetryRun(run_id=run_id) if retry else CancelRun(run_id=run_id)
        reply = self.sim.request(self.sim.client, request)
        if retry and not isinstance(reply, Error):
            self.ended.pop(run_id, None)  # a failed run retried is active again

    @rule(which=picks, agent=st.booleans())
    def worker_leaves_or_joins(self, which: int, agent: bool) -> None:
        workers = list(self.sim.workers.values())
        if len(workers) > 1 and which % 2:
            workers[which % len(workers)].leave()
        elif len(workers) < 4:
            if agent:
                self.sim.agent_worker()
            else:
                self.sim.worker(kinds=("tool:lookup",))

    @rule(by_ms=st.sampled_from([0, 50, 100, 1000]))
    def clock_moves(self, by_ms: int) -> None:
        self.sim.request(self.sim.client, AdvanceClock(by_ms=by_ms))

    @rule()
    def owner_restarts(self) -> None:
        self.sim.restart()
        self.sim.agent_worker()
        self.sim.worker(kinds=("tool:lookup",))

    # ------------------------------------------------------------------------------------- invariants

    @invariant()
    def rules_hold(self) -> None:
        store = self.sim.store
        runs, _ = store.run_page(None, None, None, 1000)
        active: dict[str, str] = {}
        fresh_busy = 0
        for run in runs:
            if run.status in ("waiting", "needs_attention"):
                self.waited.add(run.run_id)
            if run.status in RUN_ACTIVE:
                assert run.conversation_id not in active, (run, active[run.conversation_id])
                active[run.conversation_id] = run.run_id
            if run.status in BUSY and run.run_id not in self.waited:
                fresh_busy += 1
            if run.run_id in self.ended:
                assert run == self.ended[run.run_id], (run, self.ended[run.run_id])
            elif run.status in ("completed", "cancelled"):
                self.ended[run.run_id] = run
            operations, _ = store.operation_page(run.run_id, 0, 1000)
            total = RunUsage()
            for op in operations:
                if op.usage is not None:
                    total = add_usage(total, op.usage)
                if op.operation_id in self.results:
                    assert op == self.results[op.operation_id], (op, self.results[op.operation_id])
                elif final(op):
                    self.results[op.operation_id] = op
            assert run.usage == total, (run.usage, total)
            for op in operations:  # an ended task's call is never in flight, unless the task said it completed
                task = store.task(op.task_id) if op.status == "started" else None
                ended = None if task is None or task.status != "terminal" else task.outcome
                assert ended is None or ended.status == "completed", (op, task)
        assert fresh_busy <= MAX_RUNS, fresh_busy
        # An interaction is open only while its run awaits it: never once the run ended or is being cancelled.
        still_open, _ = store.interaction_page("open", None, None, 1000)
        for interaction in still_open:
            run = store.run(interaction.run_id)
            assert run is not None and run.status not in RUN_TERMINAL and run.reason != "cancelling", (interaction, run)
        live = self.sim.core.runs.live
        assert self.sim.core.runs._busy == sum(1 for run in live.values() if run.status in BUSY)
        inbox_holds(self.sim, self.conversations, self.submissions, {run.run_id: run for run in runs})

    @invariant()
    def the_owner_needs_no_more_batches(self) -> None:
        assert not self.sim.core.needs_settle(self.sim.now_ms)


RunMachine.TestCase.settings = settings(
    max_examples=20,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_run_state_machine = RunMachine.TestCase
