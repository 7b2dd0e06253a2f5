"""What a running tool call's handler does durably beside its own effect, under its task's lease: ask a person
(``call.ask``), call another tool (``call.execute_tool``) and run a subagent (``actors.subagent_tool``). Each is found
again by a re-run of the call (after a crash, under a ``safe`` or ``idempotent`` policy) from ids derived from the
call's operation: a question by its place among the call's questions, a nested call by its key, a subagent's
conversation and input by the call itself. A ``manual`` or ``report`` call is never re-run: the owner abandons what it
made (its nested calls, questions, subagent) when it is cut off; and whatever its policy, a call that commits its
result aborts the nested calls and questions it left running, in that commit (docs/tasks.md, rules 11 and 12).

Each of these steps is durable: a commit under the call's lease, or a wait for what it committed. One the owner
refuses (``conflict``, ``invalid``, any refusal but a stale lease; a storage error), or a nested call whose task
faulted, is not the handler's error: it raises :class:`~actors.DurableStepFailed` in the handler and is kept here
(:attr:`CallHost.failed`), so the call's task faults whatever the handler does with it (the first reference
document: checkpoint errors propagate out of the agent loop, never an error result the model may ignore). A stale
lease or a lost connection ends the phase as anywhere else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Final

from protocol import (
    ConnectionLost,
    CreateInteraction,
    Duplicate,
    StaleLease,
    TetherError,
    UsageError,
    ended_code,
    json_value,
    question_task_id,
)

from .._app._tools import DurableStepFailed, QuestionUnanswered, ToolCallFailed, ToolDefinition
from ._journal import TOOL_PREFIX, _derived, digest, journaled
from ._phase import Phase

MAX_QUESTIONS_PER_CALL: Final = 1000
"""The most questions one tool call asks (``call.ask``); one more raises :class:`~protocol.UsageError`."""
MAX_NESTED_CALLS_PER_CALL: Final = 10_000
"""The most nested calls one tool call makes (``call.execute_tool``); one more raises :class:`~protocol.UsageError`."""


def _nested(inp: Any) -> bool:
    """Whether a tool task's input is a nested call's (``call.execute_tool``), not a call the model made."""
    return isinstance(inp, dict) and isinstance(inp.get("parent_operation_id"), str)


def _parent(inp: Any) -> str | None:
    return str(inp["parent_operation_id"]) if _nested(inp) else None


class CallHost:
    """The durable side of a running call's :meth:`~actors.ToolCall.ask`, :meth:`~actors.ToolCall.execute_tool` and
    subagent (:class:`~actors.SubagentTool`), under its tool task's lease; one per run of the handler, which counts
    its questions and keeps its keys."""

    def __init__(self, rt: Phase, tool: ToolDefinition, operation_id: str) -> None:
        self._rt = rt
        self._tool = tool
        self._operation_id = operation_id
        self._asked = 0
        self._keys: set[str] = set()
        self.failed: DurableStepFailed | None = None
        """The first durable step of this run of the handler that failed: the call's task faults with it."""

    def _fail(self, step: str, why: str) -> DurableStepFailed:
        failed = DurableStepFailed(f"{step} in tool {self._tool.name!r} failed: {why}; the call's task faults")
        if self.failed is None:
            self.failed = failed
        return failed

    @contextlib.contextmanager
    def _durable(self, step: str) -> Iterator[None]:
        """A durable step: the owner's refusal of it (anything but a stale lease, a lost connection or a usage error of
        the handler's) becomes :class:`DurableStepFailed`, kept."""
        try:
            yield
        except (StaleLease, ConnectionLost, UsageError):
            raise
        except TetherError as exc:
            raise self._fail(step, f"the owner refused it: {type(exc).__name__}: {exc}") from exc

    async def ask(self, text: str, schema: dict[str, Any] | None) -> Any:
        """One commit asks (none if a run before asked it: the owner keeps the first), then the wait for the
        answer, holding the lease."""
        if self._asked >= MAX_QUESTIONS_PER_CALL:
            raise UsageError(f"call.ask: a tool call asks at most {MAX_QUESTIONS_PER_CALL} questions")
        rt = self._rt
        interaction_id = _derived(self._operation_id, "question", self._asked)
        self._asked += 1
        args = {"text": text, "schema": schema}
        with self._durable(f"call.ask (question {self._asked})"):
            async with rt.commit() as tx:
                tx.create_interaction(
                    CreateInteraction(
                        interaction_id=interaction_id,
                        operation_id=self._operation_id,
                        run_id=str(rt.input["run_id"]),
                        args=json_value(args),
                        digest=digest(args),
                        kind="question",
                    )
                )
            task = await rt.client.wait_for_task(question_task_id(interaction_id))
        outcome = task.outcome
        if outcome is None or outcome.status != "completed" or not isinstance(outcome.result, dict):
            raise QuestionUnanswered(f"the question {text!r} will not be answered: its run is being cancelled")
        return outcome.result.get("answer")

    async def execute_tool(self, name: str, args: dict[str, Any], key: str) -> Any:
        """One commit creates the nested call's task, owned by this call's (none if a run before created it), then
        the wait for its end, holding the lease."""
        if key in self._keys:
            raise UsageError(f"call.execute_tool({name!r}, ..., key={key!r}): this call used that key already")
        if len(self._keys) >= MAX_NESTED_CALLS_PER_CALL:
            raise UsageError(f"call.execute_tool: a tool call makes at most {MAX_NESTED_CALLS_PER_CALL} nested calls")
        self._keys.add(key)
        rt = self._rt
        inp = rt.input
        task_id = _derived(rt.task_id, "call", key)
        child = {
            "run_id": inp["run_id"],
            "operation_id": _derived(self._operation_id, "call", key),
            "turn": inp["turn"],
            "call_id": key,
            "name": name,
            "arguments": args,
            "caller": self._tool.name,
            "parent_operation_id": self._operation_id,
            **({"run_attempt": inp["run_attempt"]} if "run_attempt" in inp else {}),
        }
        step = f"call.execute_tool({name!r}, ..., key={key!r})"
        with self._durable(step):
            try:
                async with rt.commit() as tx:
                    tx.create_task(TOOL_PREFIX + name, child, task_id=task_id, owner_task_id=rt.task_id)
            except Duplicate:
                pass  # a re-run of this call: the nested call exists (its task id is this call's task's and the key)
            record = await rt.client.wait_for_task(task_id)
        outcome = record.outcome
        assert outcome is not None
        if outcome.status == "completed":
            return outcome.result
        why = ": ".join(part for part in (outcome.reason, outcome.error) if part)
        if outcome.status == "faulted" and outcome.reason != "restart_limit":
            raise self._fail(step, f"the nested call's task faulted ({why})")
        with self._durable(step):
            op = await journaled(rt, str(child["operation_id"]))
        code = op.code if op is not None and op.code is not None else ended_code(outcome)
        raise ToolCallFailed(name, key, outcome.error or why or f"its task ended {outcome.status}", code=code)

    async def subagent(self, agent: str, text: str, background: bool) -> dict[str, Any]:
        """Foreground: :func:`_run_subagent` under this call's lease. Background: one commit creates the background
        task (a ``tool:<name>`` task of this tool, its input naming the subagent) that runs it; none if a run before
        did. Every id derives from the operation."""
        rt = self._rt
        conversation_id = _derived(self._operation_id, "subagent")
        submission_id = _derived(self._operation_id, "subagent", "input")
        if not background:
            with self._durable(f"the subagent {agent!r}"):
                return await _run_subagent(rt, agent, text, conversation_id, submission_id)
        task_id = _derived(self._operation_id, "subagent", "task")
        spec = {"agent": agent, "text": text, "conversation_id": conversation_id, "submission_id": submission_id}
        with self._durable(f"the background subagent {agent!r}"):
            try:
                async with rt.commit() as tx:
                    tx.create_task(
                        TOOL_PREFIX + self._tool.name,
                        {"run_id": rt.input["run_id"], "subagent": spec},
                        task_id=task_id,
                        owner_task_id=rt.task_id,
                        background=True,
                    )
            except Duplicate:
                pass  # a re-run of this call: its background task exists
        return {"conversation_id": conversation_id, "submission_id": submission_id, "task_id": task_id}


class SubagentUnanswered(Exception):
    """A subagent's input settled without an answer."""


async def _run_subagent(rt: Phase, agent: str, text: str, conversation_id: str, submission_id: str) -> dict[str, Any]:
    """One commit creates the subagent's conversation, owned by ``rt``'s task and bound to ``agent``, and submits
    ``text`` to it (none if a run before did), then the wait for the answer, holding the lease."""
    try:
        async with rt.commit() as tx:
            tx.create_conversation(conversation_id, owner_task_id=rt.task_id, agent=agent)
            tx.submit(
                conversation_id, kind="input", payload=text, request_id=submission_id, submission_id=submission_id
            )
    except Duplicate:
        pass  # a re-run: the subagent's conversation and its input exist
    record = await rt.client.wait_for_submission(submission_id)
    if record.status != "done" or record.answer is None or record.run_id is None:
        raise SubagentUnanswered(f"the subagent {agent!r} did not answer ({record.status}: {record.reason})")
    return {"conversation_id": conversation_id, "run_id": record.run_id, "answer": record.answer.text}
