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


async def finish(call: actors.ToolCall, args: dict[str, Any]) -> actors.ToolResult:
    return actors.ToolResult(output=f"Refunded order {args['order_id']}.", terminate=True)


class Counting(actors.ScriptedModel):
    asked = 0

    async def stream(self, request: actors.ModelRequest) -> Any:  # type: ignore[override]
        Counting.asked += 1
        async for event in super().stream(request):
            yield event


def app() -> actors.App:
    built = actors.App("results")
    for name, handler in (("quote", quote), ("bad_quote", bad_quote)):
        built.define_tool(
            name, handler, description="Quote a refund.", parameters=ORDER, output_schema=QUOTE, recovery="safe"
        )
    built.define_tool("finish", finish, description="Refund and end.", parameters=ORDER, recovery="safe")
    turns = [
        actors.ScriptedTurn(tool_calls=[("quote", {"order_id": "A1"}), ("bad_quote", {"order_id": "A1"})]),
        actors.ScriptedTurn(tool_calls=[("finish", {"order_id": "A1"})]),
        actors.ScriptedTurn(text="never asked: the tools ended the run"),
    ]
    built.define_agent("support", version=1, model=Counting(turns), tools=["quote", "bad_quote", "finish"])
    return built


async def test_a_tool_result_carries_structured_output_details_usage_and_can_end_the_run(owner: OwnerProcess) -> None:
    Counting.asked = 0
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, app()) as client:
            conversation_id = await client.create_conversation(agent="support")
            submission = await client.submit(conversation_id, kind="input", payload="Refund A1?")
            assert submission.run_id is not None
            run = await client.wait_for_run(submission.run_id)
            entries = await client.entries(conversation_id)
            tools, _ = await client.usage_totals("tool", "quote")
    assert run.status == "completed" and run.answer is not None
    assert run.answer.text == "Refunded order A1."  # the terminating call's output
    assert Counting.asked == 2  # no request after the round that ended it
    results = {entry.data["name"]: entry.data for entry in entries if entry.kind == "tether.tool_result"}  # type: ignore[index]
    good = results["quote"]
    assert (good["content"], good["is_error"]) == ("42 EUR", False)  # the model reads the output, nothing else
    assert good["structured"] == {"amount": 42, "currency": "EUR"}
    assert good["details"] == {"source": "pricing-v2", "order": "A1"}
    bad = results["bad_quote"]
    assert bad["is_error"] and "output_schema" in bad["content"] and "$.amount" in bad["content"]
    assert results["finish"]["terminate"] is True
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
