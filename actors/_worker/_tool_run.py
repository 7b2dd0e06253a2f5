"""A tool call's task (``tool:<name>``), which a run's turn creates for each call of its model's answer (or a tool's
handler for a nested call): validates the arguments, asks for an approval if the tool wants one (and waits), then
commits the call's intent, runs the handler (whose questions, nested calls and subagents ``_call_host`` serves), and
commits its result, the ``tether.tool_result`` entry (none for a nested call) and its completion in ONE commit.

A result has three channels (docs/agents.md, "Tool results"): the output, for the model (what the handler returned,
else what it streamed with ``call.output``, its tail bounded by :data:`MAX_STREAMED_RESULT_BYTES`); the ``structured``
value, for programs, kept in the journal only and checked by the tool's ``output_schema`` (a value that does not do
is dropped and reported for a call the model made, and an ``invalid_structured_output`` error result for a nested
call); and ``details``, in the result entry. An error result carries its code (:data:`~protocol.ToolErrorCode`). A
durable step of the handler that failed (``_call_host``) faults the task instead of giving any result. A
``safe`` or ``idempotent`` call the model made with valid arguments and no approval to ask has its intent committed
with its task, in the model result's commit (input ``started``): its first lease runs the handler at once. An
interrupted call is the owner's to decide (docs/runs.md); the worker follows the journal. The same task kind also
runs a background subagent (``subagent_tool(background=True)``), its input naming it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, Final

from protocol import (
    CreateInteraction,
    FinishOperation,
    JsonValue,
    OperationRecord,
    ToolErrorCode,
    Write,
    approval_task_id,
    has_result,
    json_value,
)

from .._app._app import TaskDefinition
from .._app._tools import ToolCall, ToolDefinition, ToolResult
from .._models._model import Usage
from ._call_host import CallHost, SubagentUnanswered, _nested, _parent, _run_subagent
from ._journal import (
    CONFIRMED_POLICIES,
    TOOL_PREFIX,
    _derived,
    _fresh,
    _refused_call,
    _result_entry,
    _start,
    content_text,
    digest,
    journaled,
    run_usage,
    tool_intent,
)
from ._partials import partial_output
from ._phase import GiveBack, Phase
from ._reports import phase_report

REPORTED: Final = (
    "error: the tool call was interrupted and may have partially run; it was not run again (its recovery is 'report')"
)
PROGRESS_INTERVAL_MS: Final = 100
"""How often, at most, a tool call's progress (``call.output``) goes to the owner while it runs."""
MAX_STREAMED_RESULT_BYTES: Final = 128 << 10
"""The most of what a call streamed (``call.output``) that becomes its output when its handler returns none: the
tail, after a line saying how much was cut before it. The result's commit carries the output twice (the journal and
the entry), well inside a message (``protocol.MAX_MESSAGE_BYTES``)."""


class StreamedOutput:
    """What a call streamed with ``call.output``, its last :data:`MAX_STREAMED_RESULT_BYTES` (UTF-8) kept: the output
    of a handler that returns none."""

    def __init__(self, max_bytes: int = MAX_STREAMED_RESULT_BYTES) -> None:
        self._max_bytes = max_bytes
        self._pieces: deque[tuple[str, int]] = deque()
        self._bytes = 0
        self._cut_chars = 0

    def add(self, text: str) -> None:
        if not text:
            return
        size = len(text.encode())
        self._pieces.append((text, size))
        self._bytes += size
        while self._bytes > self._max_bytes:
            first, first_size = self._pieces.popleft()
            excess = self._bytes - self._max_bytes
            self._bytes -= first_size
            if first_size > excess:  # keep its end (a character cut in half is dropped)
                kept = first.encode()[excess:].decode(errors="ignore")
                kept_size = len(kept.encode())
                self._pieces.appendleft((kept, kept_size))
                self._bytes += kept_size
                self._cut_chars += len(first) - len(kept)
            else:
                self._cut_chars += len(first)

    def text(self) -> str | None:
        """What was streamed (its tail), or ``None`` if nothing was."""
        if not self._pieces and not self._cut_chars:
            return None
        tail = "".join(text for text, _ in self._pieces)
        if not self._cut_chars:
            return tail
        cut = f"[the first {self._cut_chars} characters of the output were cut; its last {self._bytes} bytes follow]"
        return f"{cut}\n{tail}"


async def _progress_of(rt: Phase, operation_id: str) -> str:
    """What an interrupted call had stored of its progress, as a line for its error result (nothing: empty)."""
    reply = await rt.client.partials(operation_id=operation_id)
    text = "".join(record.text for record in reply.partials if record.status == "aborted")
    return f"; its progress so far: {text}" if text else ""


class ToolRun:
    """The phases of a tool call's task (``tool:<name>``) for one :class:`ToolDefinition`."""

    def __init__(self, tool: ToolDefinition) -> None:
        self.tool = tool

    def definition(self) -> TaskDefinition:
        return TaskDefinition(
            kind=TOOL_PREFIX + self.tool.name,
            version=self.tool.version,
            initial=lambda _input: {"phase": "call"},
            phases={"call": self.call, "approved": self.approved},
            restart_limit=self.tool.restart_limit,
        )

    async def call(self, rt: Phase) -> None:
        tool = self.tool
        spec = rt.input.get("subagent")
        if isinstance(spec, dict):  # the background task of a subagent call (``subagent_tool(background=True)``)
            try:
                found = await _run_subagent(
                    rt, spec["agent"], spec["text"], spec["conversation_id"], spec["submission_id"]
                )
            except SubagentUnanswered as exc:
                await rt.fail(str(exc))
                return
            await rt.complete(found)
            return
        run_id = str(rt.input["run_id"])
        operation_id = str(rt.input["operation_id"])
        guessed = _fresh(rt)
        started = rt.input.get("started") is True
        # Attempt 1's intent was committed with this task (the model's result): its first lease runs the call, no
        # commit first. A later lease (given back by a closing worker, no restart counted) reads the journal first.
        op = None if guessed and rt.lease.epoch == 1 else await journaled(rt, operation_id)
        if started and (op is None or (op.status == "started" and op.attempt == 1 and op.task_id == rt.task_id)):
            if rt._kill_switch is not None:
                rt._kill_switch.call_started(tool.name)  # fault injection's after_intent point for this call
            await rt.ensure_lease()  # a lease read after a pause or a silence is confirmed before the call starts
            await self._execute(rt, None, started=True)
            return
        if op is not None and has_result(op):
            await self._replay(rt, op)  # its result entry (a call the model made) was committed with it
            return
        caller = rt.input.get("caller")
        if isinstance(caller, str) and caller not in tool.callers:
            allowed = ", ".join(repr(one) for one in tool.callers)
            error = f"error: tool {tool.name!r} may not be called by tool {caller!r} (its callers: {allowed})"
            await self._finish(rt, None, error, is_error=True, code="not_allowed")
            return
        args = rt.input["arguments"]
        errors = tool.validate(args)
        if errors:
            error = "error: invalid arguments: " + "; ".join(errors)
            await self._finish(rt, None, error, is_error=True, code="invalid_arguments")
            return
        if tool.approval_required(args):
            async with rt.commit() as tx:
                tx.create_interaction(
                    CreateInteraction(
                        interaction_id=_derived(operation_id, "interaction"),
                        operation_id=operation_id,
                        run_id=run_id,
                        args=json_value(args),
                        digest=digest(args),
                    )
                )
                tx.wait(on=[approval_task_id(operation_id)], checkpoint={"phase": "approved"})
            return
        await self._execute(rt, op, guessed=guessed)

    async def approved(self, rt: Phase) -> None:
        """Resumed once the approval was answered: a denial is an error result; an approval runs exactly the
        approved arguments (the interaction's digest is of the same arguments the task holds)."""
        operation_id = str(rt.input["operation_id"])
        op = await journaled(rt, operation_id)
        if op is not None and has_result(op):
            await self._replay(rt, op)
            return
        approval = approval_task_id(operation_id)
        outcome = (await rt.outcomes([approval]))[approval]
        answer: Any = outcome.result if outcome is not None and outcome.status == "completed" else None
        if not isinstance(answer, dict) or answer.get("approve") is not True:
            note = answer.get("note") if isinstance(answer, dict) else None
            content = "error: the call was denied by a person" + (f": {note}" if note else "")
            await self._finish(rt, None, content, is_error=True, code="denied")
            return
        await self._execute(rt, op)

    async def _execute(
        self, rt: Phase, op: OperationRecord | None, *, guessed: bool = False, started: bool = False
    ) -> None:
        """Commit the call's next intent (``started``: attempt 1's is committed already), run the handler, commit its
        result."""
        tool = self.tool
        inp = rt.input
        if op is not None and op.status == "interrupted" and op.policy == "report":
            # Not run again: the model reads that it was cut off (it may have partially run), with the progress it
            # had stored, and decides.
            error = REPORTED + await _progress_of(rt, op.operation_id)
            await self._finish(rt, op.operation_id, error, is_error=True, code="interrupted")
            return
        run_id = str(inp["run_id"])
        operation_id = str(inp["operation_id"])
        args = inp["arguments"]
        attempt = 1 if op is None else op.attempt + 1
        policy = tool.recovery if op is None or op.policy is None else op.policy
        if not started and policy in CONFIRMED_POLICIES:
            if rt.stopping:  # its worker stops: the call is the next worker's, rather than a person's if cut off
                raise GiveBack(f"its worker stops, so the {policy} call of {tool.name} is left to the next worker")
            rt._manual_call = True  # from its intent on, the worker's stop waits for it past the drain deadline
        intent = tool_intent(
            tool,
            run_id=run_id,
            operation_id=operation_id,
            turn=int(inp["turn"]),
            call_id=str(inp["call_id"]),
            arguments=args,
            attempt=attempt,
            policy=policy,
            parent_operation_id=_parent(inp),
        )
        if not started and not await _start(rt, intent, guessed):
            op = await journaled(rt, operation_id)  # the journal has an attempt: decide from it
            if op is not None and has_result(op):
                await self._replay(rt, op)
                return
            await self._execute(rt, op)
            return
        failure: str | None = None
        raised: Exception | None = None
        telemetry = rt._telemetry
        span = None
        if telemetry is not None:
            span = telemetry.start_tool_call(tool, str(inp["call_id"]), operation_id, attempt, policy)
        host = CallHost(rt, tool, operation_id)
        streamed = StreamedOutput()
        try:
            async with partial_output(rt, operation_id, attempt, PROGRESS_INTERVAL_MS) as progress:

                def feed(text: str) -> None:
                    streamed.add(text)
                    progress.feed(text)

                call = ToolCall(
                    operation_id=operation_id,
                    run_id=run_id,
                    conversation_id=rt.conversation_id,
                    attempt=attempt,
                    tool=tool.name,
                    version=tool.version,
                    progress=feed,
                    host=host,
                )
                try:
                    returned = await tool.handler(call, dict(args))
                    result = returned if isinstance(returned, ToolResult) else ToolResult(output=returned)
                    given = result.output if result.output is not None else streamed.text()
                    output = json_value(given, "output")
                    structured = None if result.structured is None else json_value(result.structured, "structured")
                    extra = {} if result.details is None else {"details": json_value(result.details, "details")}
                except Exception as exc:  # the handler's failure is the model's to read
                    if host.failed is not None:
                        raise host.failed from exc  # a durable step failed: the task faults, whatever it raised
                    failure = f"error: {type(exc).__name__}: {exc}"
                    raised = exc
                if host.failed is not None:  # caught and swallowed by the handler: the task faults all the same
                    raise host.failed
        except BaseException as exc:  # cut off while the handler ran (cancelled, the connection lost), or faulted
            if span is not None:
                span.cut_off(exc)
            raise
        pieces = progress.final_writes()  # the progress not stored yet, in the result's commit
        if failure is not None:
            if span is not None:
                span.end("error", raised)
            await self._finish(rt, operation_id, failure, is_error=True, code="tool_error", pieces=pieces)
            return
        problem = tool.structured_problem(structured)
        nested = _nested(inp)
        if span is not None:
            span.end("invalid_output" if problem is not None else "completed")
        if problem is not None and nested:
            # The caller, a program, reads the structured value: an error result for it.
            await self._finish(
                rt,
                operation_id,
                f"error: {problem}",
                is_error=True,
                code="invalid_structured_output",
                usage=result.usage,
                pieces=pieces,
            )
            return
        if result.terminate:
            extra["terminate"] = JsonValue(True)
        if result.handoff is not None:
            extra["handoff"] = JsonValue(result.handoff)  # placed as a reset by the run, once its round ends
        await self._finish(
            rt,
            operation_id,
            output,
            is_error=False,
            extra=extra,
            usage=result.usage,
            pieces=pieces,
            structured=None if problem is not None else structured,
            dropped=problem,
        )
        if problem is not None:  # the model never reads it: dropped, the call's result stands, and reported
            await rt.report(phase_report(rt, "dropped_output", problem))

    async def _replay(self, rt: Phase, op: OperationRecord) -> None:
        """End the task from the call's committed result: what a caller of a nested call reads of it (its result
        entry, for a call the model made, was committed with it)."""
        if not _nested(rt.input):
            await rt.complete(op.result)
        elif op.status in ("completed", "resolved"):
            await rt.complete(op.structured if op.structured is not None else op.result)
        else:
            await rt.fail(str(op.error or op.result))

    async def _finish(
        self,
        rt: Phase,
        operation_id: str | None,
        result: Any,
        *,
        is_error: bool,
        code: ToolErrorCode | None = None,
        extra: dict[str, JsonValue] | None = None,
        usage: Usage | None = None,
        pieces: Sequence[Write] = (),
        structured: JsonValue | None = None,
        dropped: str | None = None,
    ) -> None:
        """ONE commit: the operation's result (its output, or its error and ``code``; its ``structured`` value or why
        it was ``dropped``; what the call reported it cost), the result entry and the task's completion (with no
        result: the journal and the transcript hold it). A call that ran nothing (``operation_id`` ``None``: invalid
        arguments, a denial) is journaled by :func:`_refused_call`. A nested call (``call.execute_tool``) has no result
        entry (the model did not make it): its task completes with what its caller reads (its ``structured`` value,
        else its output), or fails with the error."""
        inp = rt.input
        nested = _nested(inp)
        async with rt.commit() as tx:
            tx.writes.extend(pieces)  # the progress streamed before the result: stored, then ended by it
            if operation_id is None:
                assert code is not None
                _refused_call(
                    tx,
                    self.tool,
                    run_id=str(inp["run_id"]),
                    operation_id=str(inp["operation_id"]),
                    turn=int(inp["turn"]),
                    call_id=str(inp["call_id"]),
                    arguments=inp["arguments"],
                    error=str(result),
                    code=code,
                    parent_operation_id=_parent(inp),
                )
            else:
                tx.finish_operation(
                    FinishOperation(
                        operation_id=operation_id,
                        status="failed" if is_error else "completed",
                        result=JsonValue(result),
                        is_error=is_error,
                        error=result if is_error else None,
                        usage=run_usage(usage),
                        code=code,
                        structured=JsonValue(structured),
                        dropped=dropped,
                    )
                )
            if nested:
                if is_error:
                    tx.fail(str(result))
                else:
                    tx.complete(result if structured is None else structured)
                return
            _result_entry(
                tx,
                rt.conversation_id,
                run_id=str(inp["run_id"]),
                operation_id=str(inp["operation_id"]),
                call_id=str(inp["call_id"]),
                name=str(inp["name"]),
                content=content_text(result),
                is_error=is_error,
                code=code,
                extra=extra,
            )
            tx.complete(None)  # the result is the journal's and the entry's: not a third copy in the commit
