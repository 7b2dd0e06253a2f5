"""What a tool returns besides the text the model reads (``actors.ToolResult``): structured output checked by the
tool's ``output_schema``, details for people, the call's own usage, and ending the run without another model request
(docs/agents.md, "Tool results"). The app is served in this process; the owner is a real process."""

from __future__ import annotations

from typing import Any, Final

import trio

import actors
from tests.conftest import OwnerProcess
from tests.integration._agent_helpers import serving

TIMEOUT_S: Final = 30
QUOTE: Final = {
    "type": "object",
    "properties": {"amount": {"type": "number"}, "currency": {"type": "string"}},
    "required": ["amount", "currency"],
}
ORDER: Final = {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}
SPENT: Final = actors.Usage(input_tokens=10, output_tokens=5, cost=0.25)


async def quote(call: actors.ToolCall, args: dict[str, Any]) -> actors.ToolResult:
    return actors.ToolResult(
        output="42 EUR",
        structured={"amount": 42, "currency": "EUR"},
        details={"source": "pricing-v2", "order": args["order_id"]},
        usage=SPENT,
    )


async def bad_quote(call: actors.ToolCall, args: dict[str, Any]) -> actors.ToolResult:
    return actors.ToolResult(output="many", structured={"amount": "many", "currency": "EUR"})


async def count(call: actors.ToolCall, args: dict[str, Any]) -> actors.ToolResult | None:
    for n in (1, 2, 3):
        await call.output(f"{n}\n")
    return None if args["order_id"] == "A1" else actors.ToolResult(details={"counted": 3})


async def broken(call: actors.ToolCall, args: dict[str, Any]) -> str:
    raise RuntimeError("the pricing service is down")


async def finish(call: actors.ToolCall, args: dict[str, Any]) -> actors.ToolResult:
    return actors.ToolResult(output=f"Refunded order {args['order_id']}.", terminate=True)


class Counting(actors.ScriptedModel):
    asked = 0

    async def stream(self, request: actors.ModelRequest) -> Any:  # type: ignore[override]
        Counting.asked += 1
        async for event in super().stream(request):
            yield event


def app(reports: list[actors.Report] | None = None) -> actors.App:
    def report(found: actors.Report) -> None:
        if reports is not None:
            reports.append(found)
        raise RuntimeError("a callback that raises fails nothing")

    built = actors.App("results", on_report=report)
    for name, handler in (("quote", quote), ("bad_quote", bad_quote)):
        built.define_tool(
            name, handler, description="Quote a refund.", parameters=ORDER, output_schema=QUOTE, recovery="safe"
        )
    for name, handler in (("count", count), ("broken", broken), ("finish", finish)):
        built.define_tool(name, handler, description="Refund and end.", parameters=ORDER, recovery="safe")
    first = [("quote", {"order_id": "A1"}), ("bad_quote", {"order_id": "A1"}), ("broken", {"order_id": "A1"})]
    first += [("count", {"order_id": "A1"}), ("count", {"order_id": "B2"}), ("quote", {"order_id": 7})]
    turns = [
        actors.ScriptedTurn(tool_calls=first),
        actors.ScriptedTurn(tool_calls=[("finish", {"order_id": "A1"})]),
        actors.ScriptedTurn(text="never asked: the tools ended the run"),
    ]
    tools = ["quote", "bad_quote", "count", "broken", "finish"]
    built.define_agent("support", version=1, model=Counting(turns), tools=tools)
    return built


async def test_a_tool_result_carries_structured_output_details_usage_and_can_end_the_run(owner: OwnerProcess) -> None:
    Counting.asked = 0
    reports: list[actors.Report] = []
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, app(reports)) as client:
            conversation_id = await client.create_conversation(agent="support")
            submission = await client.submit(conversation_id, kind="input", payload="Refund A1?")
            assert submission.run_id is not None
            run = await client.wait_for_run(submission.run_id)
            entries = await client.entries(conversation_id)
            tools, _ = await client.usage_totals("tool", "quote")
            journal = await client.operations(submission.run_id)
    assert run.status == "completed" and run.answer is not None
    assert run.answer.text == "Refunded order A1."  # the terminating call's output
    assert Counting.asked == 2  # no request after the round that ended it
    results: dict[str, Any] = {e.data["call_id"]: e.data for e in entries if e.kind == "tether.tool_result"}  # type: ignore[index]
    assert all("structured" not in result for result in results.values())  # for programs: in the journal
    ops = {op.tool_call_id: op for op in journal if op.kind == "tool"}
    first = next(entry.data for entry in entries if entry.kind == "tether.assistant")
    order = [call["call_id"] for call in first["tool_calls"]]  # type: ignore[index]
    calls = [(results[call_id], ops[call_id]) for call_id in order]
    (good, good_op), (bad, bad_op), (raised, _), (streamed, _), (streamed_details, _), (invalid, invalid_op) = calls
    assert (good["content"], good["is_error"]) == ("42 EUR", False)  # the model reads the output, nothing else
    assert good["details"] == {"source": "pricing-v2", "order": "A1"}
    assert good_op.structured == {"amount": 42, "currency": "EUR"} and good_op.dropped is None  # for programs
    # A structured value its schema refuses, in a call the model made: dropped and reported, the result stands.
    assert (bad["content"], bad["is_error"], bad.get("code")) == ("many", False, None)
    assert (bad_op.status, bad_op.result, bad_op.structured) == ("completed", "many", None)
    assert bad_op.dropped is not None and "output_schema" in bad_op.dropped and "$.amount" in bad_op.dropped
    [dropped] = [found for found in reports if found.kind == "dropped_output"]
    assert (dropped.operation_id, dropped.tool, dropped.run_id) == (bad_op.operation_id, "bad_quote", run.run_id)
    assert dropped.error == bad_op.dropped  # and the callback's own exception failed nothing
    # Error results carry their code, in the entry and in the journal.
    assert (raised["is_error"], raised["code"]) == (True, "tool_error") and "pricing service" in raised["content"]
    assert (invalid["is_error"], invalid["code"], invalid_op.code) == (True, "invalid_arguments", "invalid_arguments")
    # A handler that returned no output: the model reads what it streamed.
    assert (streamed["content"], streamed["is_error"]) == ("1\n2\n3\n", False)
    assert (streamed_details["content"], streamed_details["details"]) == ("1\n2\n3\n", {"counted": 3})
    [ending] = [result for call_id, result in results.items() if call_id not in order]
    assert ending["terminate"] is True
    # The call's own usage: under its tool's name, and in the run's total.
    [total] = tools
    assert (total.usage.input_tokens, total.usage.output_tokens, total.usage.cost) == (10, 5, 0.25)
    assert run.usage.input_tokens >= 10 and (run.usage.cost or 0) >= 0.25


async def test_an_agent_with_an_output_schema_answers_a_parsed_value_or_fails_invalid_output(
    owner: OwnerProcess,
) -> None:
    schema = {"type": "object", "properties": {"refund": {"type": "boolean"}}, "required": ["refund"]}
    built = actors.App("structured")
    built.define_agent(
        "judge",
        version=1,
        model=actors.ScriptedModel([actors.ScriptedTurn(text='{"refund": true}')]),
        output_schema=schema,
    )
    built.define_agent(
        "sloppy",
        version=1,
        model=actors.ScriptedModel([actors.ScriptedTurn(text="Yes, refund it.")]),
        output_schema=schema,
    )
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, built) as client:
            runs = []
            for agent in ("judge", "sloppy"):
                conversation_id = await client.create_conversation(agent=agent)
                submission = await client.submit(conversation_id, kind="input", payload="Refund A1?")
                assert submission.run_id is not None
                runs.append(await client.wait_for_run(submission.run_id))
                if agent == "sloppy":
                    settled = await client.wait_for_submission(submission.submission_id)
    judged, sloppy = runs
    assert judged.status == "completed" and judged.answer is not None
    assert (judged.answer.text, judged.answer.value) == ('{"refund": true}', {"refund": True})
    assert (sloppy.status, sloppy.reason) == ("failed", "invalid_output")
    assert sloppy.error is not None and "the answer is not JSON" in sloppy.error
    assert (settled.status, settled.reason) == ("unanswered", "invalid_output")


# ------------------------------------------------------------------------------------------------------ handoff

HANDOFF: Final = "Order A1 is refunded; the customer asks about B2 next."


class Recording(actors.ScriptedModel):
    """The script, keeping each request's messages (the app is served in the test's process)."""

    requests: list[list[actors.Message]] = []

    async def stream(self, request: actors.ModelRequest) -> Any:  # type: ignore[override]
        Recording.requests.append(list(request.messages))
        async for event in super().stream(request):
            yield event


class Gates:
    """A held call (``"hold": true``) sets ``held`` and waits for the test to set ``opened``: events of the test's
    trio run, which serves the app."""

    held = trio.Event()
    opened = trio.Event()

    @staticmethod
    def reset() -> None:
        Gates.held, Gates.opened = trio.Event(), trio.Event()


async def hand_off(call: actors.ToolCall, args: dict[str, Any]) -> actors.ToolResult:
    if args.get("hold"):
        Gates.held.set()
        await Gates.opened.wait()
    return actors.ToolResult(
        output=f"handed off at {args['order_id']}", handoff=args["handoff"], terminate=bool(args.get("terminate"))
    )


HANDING_OFF: Final = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "handoff": {"type": "string"},
        "hold": {"type": "boolean"},
        "terminate": {"type": "boolean"},
    },
    "required": ["order_id", "handoff"],
}


def handoff_app(turns: list[actors.ScriptedTurn]) -> actors.App:
    built = actors.App("handoff")
    built.define_tool("hand_off", hand_off, description="Hand off.", parameters=HANDING_OFF, recovery="safe")
    built.define_agent("support", version=1, model=Recording(turns), tools=["hand_off"])
    return built


def kinds(entries: Any) -> list[str]:
    return [entry.kind for entry in entries]


async def entries_with(client: actors.Client, conversation_id: str, kind: str) -> None:
    """Once the conversation has an entry of ``kind`` (polled: the owner is another process)."""
    while kind not in kinds(await client.entries(conversation_id)):  # noqa: ASYNC110 (another process's state)
        await trio.sleep(0.02)


async def test_a_tools_handoff_starts_the_next_context_from_its_text_and_keeps_a_steer_placed_as_the_round_ended(
    owner: OwnerProcess,
) -> None:
    Recording.requests = []
    Gates.reset()
    turns = [
        actors.ScriptedTurn(tool_calls=[("hand_off", {"order_id": "A1", "handoff": HANDOFF, "hold": True})]),
        actors.ScriptedTurn(text="B2 ships tomorrow."),
    ]
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, handoff_app(turns)) as client:
            conversation_id = await client.create_conversation(agent="support")
            own = await client.submit(conversation_id, kind="input", payload="Refund A1, then tell me about B2.")
            assert own.run_id is not None
            await Gates.held.wait()  # the call is held: a steer waits for the round's end
            steer = await client.submit(conversation_id, kind="input", payload="And quickly.", when_busy="steer")
            Gates.opened.set()
            run = await client.wait_for_run(own.run_id)
            entries = await client.entries(conversation_id)
            assert (await client.wait_for_submission(steer.submission_id)).answer == run.answer
    assert run.status == "completed" and run.answer is not None and run.answer.text == "B2 ships tomorrow."
    assert kinds(entries) == [
        "tether.user",
        "tether.assistant",
        "tether.tool_result",
        "tether.user",  # the steer, placed as the round ended
        "tether.reset",  # the handoff, placed by the run after it
        "tether.assistant",
    ]
    result, reset = entries[2].data, entries[4].data
    assert isinstance(result, dict) and isinstance(reset, dict)
    assert result["handoff"] == HANDOFF and result["content"] == "handed off at A1"
    assert reset == {
        "handoff": HANDOFF,
        "run_id": own.run_id,
        "operation_id": result["operation_id"],
        "name": "hand_off",
    }
    # The next request saw the handoff text first, then the steer; nothing of the context before.
    assert Recording.requests[1] == [actors.UserMessage(text=HANDOFF), actors.UserMessage(text="And quickly.")]
    assert len(Recording.requests) == 2


async def test_the_last_call_in_call_order_wins_the_handoff_whatever_order_the_calls_completed_in(
    owner: OwnerProcess,
) -> None:
    Recording.requests = []
    Gates.reset()
    first = {"order_id": "A1", "handoff": "From the first call.", "hold": True}
    last = {"order_id": "B2", "handoff": "From the last call."}
    turns = [
        actors.ScriptedTurn(tool_calls=[("hand_off", first), ("hand_off", last)]),
        actors.ScriptedTurn(text="Going on from the last call."),
    ]
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, handoff_app(turns)) as client:
            conversation_id = await client.create_conversation(agent="support")
            own = await client.submit(conversation_id, kind="input", payload="Both, please.")
            assert own.run_id is not None
            await entries_with(client, conversation_id, "tether.tool_result")  # the last call's; the first is held
            Gates.opened.set()
            run = await client.wait_for_run(own.run_id)
            entries = await client.entries(conversation_id)
    assert run.status == "completed"
    results = [entry.data for entry in entries if entry.kind == "tether.tool_result"]
    assert [data["handoff"] for data in results] == ["From the last call.", "From the first call."]  # type: ignore[index]
    [reset] = [entry.data for entry in entries if entry.kind == "tether.reset"]
    assert isinstance(reset, dict) and reset["handoff"] == "From the last call."
    assert reset["operation_id"] == results[0]["operation_id"]  # type: ignore[index]
    assert Recording.requests[1] == [actors.UserMessage(text="From the last call.")]


async def test_a_handoff_with_terminate_on_every_call_ends_the_run_after_the_handoff(owner: OwnerProcess) -> None:
    Recording.requests = []
    calls = [
        ("hand_off", {"order_id": "A1", "handoff": "From the first call.", "terminate": True}),
        ("hand_off", {"order_id": "B2", "handoff": "From the last call.", "terminate": True}),
    ]
    turns = [actors.ScriptedTurn(tool_calls=calls), actors.ScriptedTurn(text="never asked: the tools ended the run")]
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, handoff_app(turns)) as client:
            conversation_id = await client.create_conversation(agent="support")
            own = await client.submit(conversation_id, kind="input", payload="Both, and stop.")
            assert own.run_id is not None
            run = await client.wait_for_run(own.run_id)
            entries = await client.entries(conversation_id)
            # The next run starts from the handoff.
            later = await client.submit(conversation_id, kind="input", payload="Anything else?")
            assert later.run_id is not None
            assert (await client.wait_for_run(later.run_id)).status == "completed"  # (the script's round again)
    assert run.status == "completed" and run.answer is not None
    assert run.answer.text == "handed off at B2"  # the last call's output, in call order
    assert kinds(entries)[-1] == "tether.reset" and entries[-1].data["handoff"] == "From the last call."  # type: ignore[index]
    assert len(Recording.requests) == 2  # one for each run: none after the round that ended the first
    assert Recording.requests[1] == [
        actors.UserMessage(text="From the last call."),
        actors.UserMessage(text="Anything else?"),
    ]


async def test_a_result_too_large_to_store_faults_the_call_and_fails_its_run_naming_it(owner: OwnerProcess) -> None:
    async def huge(call: actors.ToolCall, args: dict[str, Any]) -> str:
        return "x" * (3 << 20)  # past what one commit may carry

    built = actors.App("huge")
    built.define_tool("dump", huge, description="Dump everything.", parameters=ORDER, recovery="safe")
    turns = [actors.ScriptedTurn(tool_calls=[("dump", {"order_id": "A1"})]), actors.ScriptedTurn(text="Too big.")]
    Counting.asked = 0
    built.define_agent("support", version=1, model=Counting(turns), tools=["dump"])
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, built) as client:
            conversation_id = await client.create_conversation(agent="support")
            submission = await client.submit(conversation_id, kind="input", payload="Dump A1")
            assert submission.run_id is not None
            run = await client.wait_for_run(submission.run_id)
            entries = await client.entries(conversation_id)
            operations = await client.operations(submission.run_id)
    # The commit of the call's result is a durable step under its lease: refused, the call's task faults, and the
    # run fails (``faulted``) naming the call and what went wrong, instead of the model reading an error it may ignore.
    assert (run.status, run.reason) == ("failed", "faulted") and Counting.asked == 1
    assert run.error is not None and "(tool 'dump'" in run.error and "over the limit of 1048576" in run.error
    [result] = [entry.data for entry in entries if entry.kind == "tether.tool_result"]
    assert isinstance(result, dict) and (result["is_error"], result["code"]) == (True, "faulted"), result
    assert len(str(result["content"])) < 10_000 and "x" * 100 not in str(result["content"])
    [tool] = [op for op in operations if op.kind == "tool"]
    # No output was stored; the call's journal entry is not left open: it failed with its task's error.
    assert (tool.status, tool.is_error, tool.code) == ("failed", True, "faulted") and "faulted" in str(tool.error)
