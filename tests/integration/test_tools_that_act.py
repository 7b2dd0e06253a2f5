"""Tools that act (docs/agents.md, "Questions" and "Tools calling tools"): a tool call asks a person a question and
goes on with the answer; a tool calls other tools, each a journaled call of its own, found again by its key. The
app is served in this process; the owner is a real process."""

from __future__ import annotations

import functools
from typing import Any, Final

import pytest
import trio

import actors
from tests.conftest import OwnerProcess
from tests.integration._agent_helpers import serving

TIMEOUT_S: Final = 30
POLL_S: Final = 0.02
ORDER: Final = {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}
NOTHING: Final = {"type": "object", "properties": {}}
LOOKUP_COST: Final = actors.Usage(input_tokens=0, output_tokens=0, cost=0.01)


async def refund(call: actors.ToolCall, args: dict[str, Any]) -> actors.ToolResult:
    await call.output("looking the order up...\n")
    order = await call.execute_tool("look_up_order", {"order_id": args["order_id"]}, key="lookup")
    full = await call.ask(f"Refund {order['total']} EUR in full?", schema={"type": "boolean"})
    amount = order["total"] if full else order["total"] / 2
    receipt = await call.execute_tool("pay_out", {"amount": amount}, key="pay")
    return actors.ToolResult(output=f"refunded {amount} EUR", structured={"receipt": receipt}, details={"order": order})


async def look_up_order(call: actors.ToolCall, args: dict[str, Any]) -> actors.ToolResult:
    return actors.ToolResult(output="found", structured={"order_id": args["order_id"], "total": 40}, usage=LOOKUP_COST)


async def pay_out(call: actors.ToolCall, args: dict[str, Any]) -> str:
    return f"r-{args['amount']}"


async def sneaky(call: actors.ToolCall, args: dict[str, Any]) -> str:
    try:
        await call.execute_tool("pay_out", {"amount": 1000}, key="pay")  # pay_out does not list sneaky
    except actors.ToolCallFailed as exc:
        first = f"{exc.code}: {exc.error}"
    else:
        raise AssertionError("pay_out ran for a caller it does not list")
    await call.execute_tool("look_up_order", {"order_id": "A1"}, key="again")
    try:
        await call.execute_tool("look_up_order", {"order_id": "A2"}, key="again")  # a key is used once
    except actors.UsageError as exc:
        second = str(exc)
    else:
        raise AssertionError("a key was used twice")
    try:
        await call.execute_tool("count_lines", {"bad": True}, key="bad")  # a structured value its schema refuses
    except actors.ToolCallFailed as exc:
        third = exc.code
    else:
        raise AssertionError("a nested call's invalid structured output was read")
    streamed = await call.execute_tool("stream_lines", {"bad": False}, key="streamed")  # none: what it streamed
    return f"{first} | {second} | {third} | {streamed}"


async def count_lines(call: actors.ToolCall, args: dict[str, Any]) -> actors.ToolResult | None:
    await call.output("1\n")
    await call.output("2\n")
    return actors.ToolResult(output="two", structured={"lines": "two"}) if args["bad"] else None


def app() -> actors.App:
    built = actors.App("acting")
    built.define_tool("refund", refund, description="Refund an order.", parameters=ORDER, recovery="safe")
    built.define_tool(
        "look_up_order",
        look_up_order,
        description="Read an order.",
        parameters=ORDER,
        recovery="safe",
        callers=["agent", "refund", "sneaky", "greedy"],
    )
    built.define_tool(
        "pay_out",
        pay_out,
        description="Pay money out.",
        parameters={"type": "object", "properties": {"amount": {"type": "number"}}, "required": ["amount"]},
        recovery="idempotent",
        callers=["refund"],
    )
    built.define_tool("sneaky", sneaky, description="Misbehave.", parameters=NOTHING, recovery="safe")
    built.define_tool(
        "count_lines",
        count_lines,
        description="Count lines.",
        parameters={"type": "object", "properties": {"bad": {"type": "boolean"}}, "required": ["bad"]},
        output_schema={"type": "object", "properties": {"lines": {"type": "integer"}}},
        recovery="safe",
        callers=["sneaky"],
    )
    built.define_tool(
        "stream_lines",
        count_lines,
        description="Stream lines.",
        parameters={"type": "object", "properties": {"bad": {"type": "boolean"}}, "required": ["bad"]},
        recovery="safe",
        callers=["sneaky"],
    )
    built.define_agent(
        "support",
        version=1,
        model=actors.ScriptedModel(
            [actors.ScriptedTurn(tool_calls=[("refund", {"order_id": "A1"})]), actors.ScriptedTurn(text="Done.")]
        ),
        tools=["refund", "look_up_order", "pay_out"],
    )
    built.define_agent(
        "mischief",
        version=1,
        model=actors.ScriptedModel([actors.ScriptedTurn(tool_calls=[("sneaky", {})]), actors.ScriptedTurn(text="Ok.")]),
        tools=["sneaky"],
    )
    return built


async def _open_question(client: actors.Client, run_id: str) -> actors.InteractionRecord:
    while True:
        found = await client.interactions(status="open", run_id=run_id)
        if found:
            return found[0]
        await trio.sleep(POLL_S)


async def test_a_tool_asks_a_question_calls_tools_and_goes_on_with_the_answer(owner: OwnerProcess) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, app()) as client:
            conversation_id = await client.create_conversation(agent="support")
            submission = await client.submit(conversation_id, kind="input", payload="Refund A1")
            assert submission.run_id is not None
            question = await _open_question(client, submission.run_id)
            assert (question.kind, question.tool) == ("question", "refund")
            assert question.args == {"text": "Refund 40 EUR in full?", "schema": {"type": "boolean"}}
            waiting = await client.run(submission.run_id)
            assert waiting.status == "waiting"
            # Answers of the wrong shape are refused and change nothing.
            with pytest.raises(actors.InvalidRequest, match=r"does not match the question's schema: \$: 'yes'"):
                await client.respond(question.interaction_id, answer="yes")
            with pytest.raises(actors.InvalidRequest, match="is a question: answer it with a JSON value"):
                await client.respond(question.interaction_id, approve=True)
            answered = await client.respond(question.interaction_id, answer=False, responded_by="ops")
            assert answered.status == "answered" and answered.answer is not None
            assert (answered.answer.value, answered.answer.approve, answered.answer.responded_by) == (
                False,
                None,
                "ops",
            )
            assert await client.respond(question.interaction_id, answer=False) == answered  # the same: a no-op
            with pytest.raises(actors.Conflict, match="already answered"):
                await client.respond(question.interaction_id, answer=True)
            run = await client.wait_for_run(submission.run_id)
            operations = await client.operations(submission.run_id)
            entries = await client.entries(conversation_id)
            totals, _ = await client.usage_totals("tool", "look_up_order")
    assert run.status == "completed" and run.answer is not None and run.answer.text == "Done."
    [result] = [entry.data for entry in entries if entry.kind == "tether.tool_result"]
    assert isinstance(result, dict)
    assert (result["content"], "structured" in result) == ("refunded 20.0 EUR", False)  # the journal has it
    assert result["details"] == {"order": {"order_id": "A1", "total": 40}}
    tools = {op.name: op for op in operations if op.kind == "tool"}
    parent = tools["refund"]
    assert parent.parent_operation_id is None and parent.status == "completed"
    assert parent.structured == {"receipt": "r-20.0"}
    for name, key in (("look_up_order", "lookup"), ("pay_out", "pay")):
        child = tools[name]
        assert (child.parent_operation_id, child.tool_call_id, child.status) == (parent.operation_id, key, "completed")
    # Its structured value, what refund read; its output beside it.
    assert (tools["look_up_order"].structured, tools["look_up_order"].result) == (
        {"order_id": "A1", "total": 40},
        "found",
    )
    [total] = totals  # a nested call's usage counts under its own tool
    assert total.usage.cost == pytest.approx(0.01)


async def test_a_nested_call_is_refused_to_a_caller_the_tool_does_not_list_and_a_key_is_used_once(
    owner: OwnerProcess,
) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, app()) as client:
            conversation_id = await client.create_conversation(agent="mischief")
            submission = await client.submit(conversation_id, kind="input", payload="Go")
            assert submission.run_id is not None
            run = await client.wait_for_run(submission.run_id)
            operations = await client.operations(submission.run_id)
            entries = await client.entries(conversation_id)
    assert run.status == "completed"
    [result] = [entry.data for entry in entries if entry.kind == "tether.tool_result"]
    assert isinstance(result, dict) and not result["is_error"], result
    first, second, third, streamed = str(result["content"]).split(" | ")
    assert "tool 'pay_out' may not be called by tool 'sneaky' (its callers: 'refund')" in first
    assert "used that key already" in second
    assert third == "invalid_structured_output"  # a nested call's caller is a program: an error result for it
    assert streamed == "1\n2\n"  # a nested call that returned nothing gives its caller what it streamed
    counted = {op.tool_call_id: op for op in operations if op.name == "count_lines"}
    assert (counted["bad"].status, counted["bad"].code) == ("failed", "invalid_structured_output")
    assert counted["bad"].structured is None and "$.lines" in str(counted["bad"].error)
    refused = [op for op in operations if op.name == "pay_out"]
    assert [(op.status, op.is_error, op.code) for op in refused] == [("failed", True, "not_allowed")]  # never run
    assert first.startswith("not_allowed: ")  # ToolCallFailed's code


def research_app() -> actors.App:
    built = actors.App("research")
    built.define_tool(
        "research", actors.subagent_tool(agent="researcher"), description="Ask a researcher.", recovery="safe"
    )
    built.define_agent(
        "support",
        version=1,
        model=actors.ScriptedModel(
            [
                actors.ScriptedTurn(tool_calls=[("research", {"task": "Find papers on durable agents."})]),
                actors.ScriptedTurn(text="The researcher found 3 papers."),
            ]
        ),
        tools=["research"],
    )
    built.define_agent(
        "researcher",
        version=1,
        model=actors.ScriptedModel([actors.ScriptedTurn(text="Found 3 papers.")]),
        instructions="You research.",
    )
    return built


async def test_a_subagent_tool_runs_another_agent_in_a_conversation_its_call_owns(owner: OwnerProcess) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, research_app()) as client:
            conversation_id = await client.create_conversation(agent="support")
            await client.configure(conversation_id, instructions="Be brief.", steering="all")
            submission = await client.submit(conversation_id, kind="input", payload="What is known?")
            assert submission.run_id is not None
            run = await client.wait_for_run(submission.run_id)
            entries = await client.entries(conversation_id)
            [result] = [entry.data for entry in entries if entry.kind == "tether.tool_result"]
            [call] = [op for op in await client.operations(submission.run_id) if op.kind == "tool"]
            assert isinstance(result, dict) and isinstance(call.structured, dict)
            child_id = str(call.structured["conversation_id"])
            child = await client.conversation(child_id)
            [child_run] = await client.runs(conversation_id=child_id)
            child_config = await client.document("tether.config", conversation_id=child_id)
            assert run.task_id is not None
            [tree], _ = await client.usage_totals("tree", run.task_id)
    assert run.status == "completed" and run.answer is not None
    assert (result["content"], result["is_error"]) == ("Found 3 papers.", False)
    answer = {"conversation_id": child_id, "run_id": child_run.run_id, "answer": "Found 3 papers."}
    assert call.structured == answer
    assert child.agent == "researcher" and child.owner_task_id is not None  # owned by the research call's task
    assert child_run.status == "completed" and child_run.agent == "researcher"
    # The caller's configuration where it applies to another agent: its inbox modes, not its instructions.
    assert child_config is not None and child_config.value == {"steering": "all"}
    # The subagent's tokens count in the caller's task tree.
    spent = run.usage.input_tokens + child_run.usage.input_tokens
    assert tree.usage.input_tokens == spent and child_run.usage.input_tokens > 0


async def test_a_call_makes_at_most_its_bound_of_nested_calls(
    owner: OwnerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    from actors._worker import _call_host

    monkeypatch.setattr(_call_host, "MAX_NESTED_CALLS_PER_CALL", 2)

    async def greedy(call: actors.ToolCall, args: dict[str, Any]) -> str:
        for n in range(3):
            try:
                await call.execute_tool("look_up_order", {"order_id": f"A{n}"}, key=f"k{n}")
            except actors.UsageError as exc:
                return f"{n} calls made; then: {exc}"
        raise AssertionError("a third nested call was made")

    built = app()
    built.define_tool("greedy", greedy, description="Call too much.", parameters=NOTHING, recovery="safe")
    built.define_agent(
        "glutton",
        version=1,
        model=actors.ScriptedModel([actors.ScriptedTurn(tool_calls=[("greedy", {})]), actors.ScriptedTurn(text="Ok")]),
        tools=["greedy"],
    )
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, built) as client:
            conversation_id = await client.create_conversation(agent="glutton")
            submission = await client.submit(conversation_id, kind="input", payload="Go")
            assert submission.run_id is not None
            await client.wait_for_run(submission.run_id)
            entries = await client.entries(conversation_id)
            lookups = [op for op in await client.operations(submission.run_id) if op.name == "look_up_order"]
    [result] = [entry.data for entry in entries if entry.kind == "tether.tool_result"]
    assert isinstance(result, dict)
    assert result["content"] == "2 calls made; then: call.execute_tool: a tool call makes at most 2 nested calls"
    assert len(lookups) == 2


async def test_a_background_subagent_goes_on_past_its_callers_end_and_its_cancellation(owner: OwnerProcess) -> None:
    built = actors.App("background")
    built.define_tool(
        "delegate",
        actors.subagent_tool(agent="researcher", background=True),
        description="Start a researcher.",
        recovery="safe",
    )
    parent = [actors.ScriptedTurn(tool_calls=[("delegate", {"task": "Dig."})])]
    parent.append(actors.ScriptedTurn(text="Started it.", delay_s=0.5))
    built.define_agent("support", version=1, model=actors.ScriptedModel(parent), tools=["delegate"])
    slow = actors.ScriptedModel([actors.ScriptedTurn(text="Dug deep.", delay_s=0.3, chunk_chars=2)])
    built.define_agent("researcher", version=1, model=slow)
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, built) as client:
            conversation_id = await client.create_conversation(agent="support")
            submission = await client.submit(conversation_id, kind="input", payload="Research it.")
            assert submission.run_id is not None
            while not [e for e in await client.entries(conversation_id) if e.kind == "tether.tool_result"]:  # noqa: ASYNC110
                await trio.sleep(POLL_S)
            [result] = [e.data for e in await client.entries(conversation_id) if e.kind == "tether.tool_result"]
            [call] = [op for op in await client.operations(submission.run_id) if op.kind == "tool"]
            assert isinstance(result, dict) and isinstance(call.structured, dict)
            child_id = str(call.structured["conversation_id"])
            anchor_id = str(call.structured["task_id"])
            cancelled = await client.cancel_run(submission.run_id)  # mid-way through its second (slow) turn
            parent_run = await client.wait_for_run(submission.run_id)
            child_running = await client.runs(conversation_id=child_id)
            anchor = await client.wait_for_task(anchor_id)
            [child_run] = await client.runs(conversation_id=child_id)
            child = await client.conversation(child_id)
    assert cancelled.run_id == submission.run_id and parent_run.status == "cancelled"
    assert result["content"].startswith("started the researcher subagent in the background")
    assert [run.status for run in child_running] != ["cancelled"]  # the caller's cancellation did not cross
    assert child.owner_task_id == anchor_id and child.agent == "researcher"
    assert child_run.status == "completed" and child_run.answer is not None and child_run.answer.text == "Dug deep."
    assert anchor.outcome is not None and anchor.outcome.status == "completed"
    assert anchor.outcome.result == {"conversation_id": child_id, "run_id": child_run.run_id, "answer": "Dug deep."}


# ------------------------------------------------------------------------------- a durable step refused

TOO_LONG: Final = "?" * 10_001  # past the owner's limit on a question's text: it refuses the commit (invalid)


async def asks_too_much(call: actors.ToolCall, args: dict[str, Any]) -> str:
    try:
        await call.ask(TOO_LONG)
    except Exception:
        return "ignored the refusal"
    raise AssertionError("the owner took a question past its limit")


async def nests_it(call: actors.ToolCall, args: dict[str, Any]) -> str:
    await call.execute_tool("asks_too_much", {}, key="ask")
    raise AssertionError("a nested call whose task faulted returned")


def refusing_app(reports: list[actors.Report]) -> actors.App:
    built = actors.App("refusing", on_report=reports.append)
    built.define_tool(
        "asks_too_much",
        asks_too_much,
        description="Ask.",
        parameters=NOTHING,
        recovery="safe",
        callers=["agent", "nests_it"],
    )
    built.define_tool("nests_it", nests_it, description="Nest.", parameters=NOTHING, recovery="safe")
    for agent, tool in (("asker", "asks_too_much"), ("nester", "nests_it")):
        turns = [actors.ScriptedTurn(tool_calls=[(tool, {})]), actors.ScriptedTurn(text="never asked")]
        built.define_agent(agent, version=1, model=actors.ScriptedModel(turns), tools=[tool])
    return built


async def test_a_refused_durable_step_faults_the_call_and_fails_its_run_whatever_the_handler_does(
    owner: OwnerProcess,
) -> None:
    reports: list[actors.Report] = []
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, refusing_app(reports)) as client:
            found = []
            for agent in ("asker", "nester"):
                conversation_id = await client.create_conversation(agent=agent)
                submission = await client.submit(conversation_id, kind="input", payload="Go")
                assert submission.run_id is not None
                run = await client.wait_for_run(submission.run_id)
                settled = await client.wait_for_submission(submission.submission_id)
                entries = await client.entries(conversation_id)
                found.append((run, settled, entries, await client.operations(submission.run_id)))
    for (run, settled, entries, operations), tool in zip(found, ("asks_too_much", "nests_it"), strict=True):
        # Not an error result the model may ignore: the run fails, naming the call; the model is not asked again.
        assert (run.status, run.reason) == ("failed", "faulted"), run
        assert run.error is not None and f"(tool {tool!r}" in run.error and "DurableStepFailed" in run.error
        assert (settled.status, settled.reason) == ("unanswered", "faulted")
        assert [entry.kind for entry in entries] == ["tether.user", "tether.assistant", "tether.tool_result"]
        result = entries[-1].data
        assert isinstance(result, dict) and (result["is_error"], result["code"]) == (True, "faulted")
        ops = {op.name: op for op in operations if op.kind == "tool"}
        assert (ops[tool].status, ops[tool].code) == ("failed", "faulted")
    nested = found[1][3]
    [inner] = [op for op in nested if op.name == "asks_too_much"]
    assert inner.parent_operation_id is not None and inner.code == "faulted"  # the nested call faulted first
    faults = [(found.task_kind, found.reason) for found in reports if found.kind == "task_faulted"]
    # Each tool task that faulted (the nested one and its caller too), and each run, reported by its worker.
    assert sorted(faults, key=str) == sorted(
        [
            ("tool:asks_too_much", "phase_error"),
            ("agent:asker", None),
            ("tool:asks_too_much", "phase_error"),
            ("tool:nests_it", "phase_error"),
            ("agent:nester", None),
        ],
        key=str,
    )


def impatient_app(dawdling: trio.Event, stopped: trio.Event) -> actors.App:
    """``impatient`` (``safe``) starts a nested ``dawdle`` call and a question, and returns as soon as ``dawdle``'s
    handler runs, leaving both open; ``dawdle`` runs until it is cancelled."""

    async def impatient(call: actors.ToolCall, args: dict[str, Any]) -> str:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(call.execute_tool, "dawdle", {}, key="slow"))
            nursery.start_soon(call.ask, "Go on?", None)
            await dawdling.wait()
            nursery.cancel_scope.cancel()  # stops only this handler's waits: the nested call and question live on
        return "left them running"

    async def dawdle(call: actors.ToolCall, args: dict[str, Any]) -> str:
        dawdling.set()
        try:
            await trio.sleep_forever()
        finally:
            stopped.set()

    built = actors.App("impatient")
    built.define_tool("impatient", impatient, description="Give up.", parameters=NOTHING, recovery="safe")
    built.define_tool(
        "dawdle", dawdle, description="Take forever.", parameters=NOTHING, recovery="safe", callers=["impatient"]
    )
    turns = [actors.ScriptedTurn(tool_calls=[("impatient", {})]), actors.ScriptedTurn(text="Gave up.")]
    built.define_agent("support", version=1, model=actors.ScriptedModel(turns), tools=["impatient"])
    return built


async def test_a_caller_that_returns_aborts_the_nested_calls_and_questions_it_left_running(owner: OwnerProcess) -> None:
    dawdling, stopped = trio.Event(), trio.Event()
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, impatient_app(dawdling, stopped)) as client:
            conversation_id = await client.create_conversation(agent="support")
            submission = await client.submit(conversation_id, kind="input", payload="Go")
            assert submission.run_id is not None
            run = await client.wait_for_run(submission.run_id)
            operations = {op.name: op for op in await client.operations(submission.run_id)}
            nested = await client.task(operations["dawdle"].task_id)
            caller = await client.task(operations["impatient"].task_id)
            questions = await client.interactions(status=None, run_id=submission.run_id)
            entries = await client.entries(conversation_id)
    assert run.status == "completed" and stopped.is_set()  # the nested call's handler was cancelled
    [result] = [entry.data for entry in entries if entry.kind == "tether.tool_result"]
    assert isinstance(result, dict) and (result["content"], result["is_error"]) == ("left them running", False)
    assert caller.outcome is not None and caller.outcome.status == "completed"
    assert nested.outcome is not None and (nested.outcome.status, nested.outcome.reason) == ("aborted", None)
    assert (operations["dawdle"].status, operations["dawdle"].code) == ("failed", "aborted")
    assert [(question.kind, question.status) for question in questions] == [("question", "cancelled")]
