"""Agents: definition checks against the app's tools, and the model requests an agent builds."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest

import actors
from actors import ModelRequest, Retry, ScriptedModel, ScriptedTurn, ToolMessage, UserMessage
from actors._worker._agent_run import AgentRun, Configuration, ModelUnavailable
from protocol import JsonValue, OperationRecord

SCHEMA: dict[str, Any] = {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}


async def refund(call: actors.ToolCall, args: dict[str, Any]) -> str:
    return "ok"


def support_app() -> actors.App:
    app = actors.App("support")
    app.define_tool("refund", refund, description="Refund an order", parameters=SCHEMA)
    app.define_tool("lookup", refund, description="Look an order up", parameters=SCHEMA, recovery="safe")
    return app


SCRIPT = ScriptedModel([ScriptedTurn(text="hello")], name="scripted-support")


def test_a_defined_agent_is_registered_with_its_tools_resolved_in_order() -> None:
    app = support_app()
    retry = Retry(attempts=2)
    agent = app.define_agent(
        "support",
        version=2,
        model=SCRIPT,
        instructions="Be brief.",
        tools=["lookup", "refund"],
        max_turns=8,
        model_retry=retry,
    )
    assert app.agents == {"support": agent}
    assert [tool.name for tool in agent.tools] == ["lookup", "refund"]
    assert agent.tools[0] is app.tools["lookup"]
    assert (agent.version, agent.instructions, agent.max_turns, agent.model_retry) == (2, "Be brief.", 8, retry)
    assert agent.tool("refund") is app.tools["refund"]
    assert agent.tool("delete") is None


def test_defaults_are_no_instructions_no_tools_no_turn_limit_and_the_default_retry() -> None:
    agent = support_app().define_agent("plain", version=1, model=SCRIPT)
    assert (agent.instructions, agent.tools, agent.max_turns, agent.model_retry) == ("", (), None, Retry())


def test_request_carries_the_model_name_instructions_messages_tool_specs_and_attempt() -> None:
    app = support_app()
    agent = app.define_agent("support", version=1, model=SCRIPT, instructions="Be brief.", tools=["refund"])
    messages: list[actors.Message] = [UserMessage(text="refund 42"), ToolMessage(call_id="c", content="done")]
    assert agent.request(messages, attempt=3) == ModelRequest(
        model="scripted-support",
        instructions="Be brief.",
        messages=tuple(messages),
        tools=(app.tools["refund"].spec(),),
        attempt=3,
    )


async def test_an_agents_request_drives_its_model() -> None:
    agent = support_app().define_agent("support", version=1, model=SCRIPT)
    events = [event async for event in agent.model.stream(agent.request([UserMessage(text="hi")], 1))]
    assert actors.assemble(events).text == "hello"


def test_a_tool_must_be_defined_before_the_agent_that_uses_it() -> None:
    app = support_app()
    with pytest.raises(actors.UsageError, match=r"tool 'delete' is not defined in this app.*\['lookup', 'refund'\]"):
        app.define_agent("support", version=1, model=SCRIPT, tools=["refund", "delete"])
    assert app.agents == {}


def test_a_tool_definition_from_another_app_is_refused() -> None:
    other = support_app().tools["refund"]
    app = support_app()
    with pytest.raises(actors.UsageError, match="tool 'refund' is not defined in this app"):
        app.define_agent("support", version=1, model=SCRIPT, tools=[other])
    assert app.define_agent("support", version=1, model=SCRIPT, tools=[app.tools["refund"]]).tools == (
        app.tools["refund"],
    )


class NoName:
    name = ""

    async def stream(self, request: ModelRequest) -> AsyncIterator[actors.StreamEvent]:
        yield actors.Finish("stop")


@pytest.mark.parametrize(
    ("name", "options", "fragment"),
    [
        ("support bot", {}, "must start with a letter"),
        ("support", {"version": 0}, "version must be a whole number of 1 or more"),
        ("support", {"model": object()}, "model must have a non-empty name and a stream"),
        ("support", {"model": NoName()}, "model must have a non-empty name"),
        ("support", {"tools": "refund"}, r"tools is a list of tool names, such as \['refund'\]"),
        ("support", {"tools": ["refund", "refund"]}, "listed twice"),
        ("support", {"max_turns": 0}, "max_turns must be None"),
        ("support", {"instructions": None}, "instructions must be a string"),
        ("support", {"model_retry": 3}, "model_retry must be an actors.Retry"),
    ],
)
def test_unusable_agents_are_refused(name: str, options: dict[str, Any], fragment: str) -> None:
    app = support_app()
    with pytest.raises(actors.UsageError, match=fragment):
        settings: dict[str, Any] = {"version": 1, "model": SCRIPT} | options
        app.define_agent(name, **settings)
    assert app.agents == {}


def test_an_agent_name_is_defined_once_per_app() -> None:
    app = support_app()
    first = app.define_agent("support", version=1, model=SCRIPT)
    with pytest.raises(actors.UsageError, match="already defined in app 'support'"):
        app.define_agent("support", version=2, model=SCRIPT)
    assert app.agents == {"support": first}


def test_the_apps_registries_are_read_only_views() -> None:
    app = support_app()
    app.tools.pop("refund")  # type: ignore[attr-defined]
    assert "refund" in app.tools
    assert app.tasks == {}


def test_define_model_names_a_model_once_and_workers_announce_it() -> None:
    app = support_app()
    fast = ScriptedModel([ScriptedTurn(text="fast")], name="fast-model")
    assert app.define_model("fast", fast) is fast
    for name, model, fragment in (
        ("fast", fast, "already defined in app 'support'"),
        ("", fast, "1 to 128 printable characters"),
        ("x" * 129, fast, "1 to 128 printable characters"),
        ("slow", object(), "is not a model"),
    ):
        with pytest.raises(actors.UsageError, match=fragment):
            app.define_model(name, model)  # type: ignore[arg-type]
    assert app.models == {"fast": fast}
    assert [(one.kind, one.name) for one in app.capabilities() if one.kind == "model"] == [("model", "fast")]


def test_a_configuration_picks_the_apps_model_and_a_replay_the_one_its_first_attempt_recorded() -> None:
    app = support_app()
    fast = app.define_model("fast", ScriptedModel([ScriptedTurn(text="fast")], name="fast-model"))
    agent = app.define_agent("support", version=1, model=SCRIPT, tools=["lookup"])
    run = AgentRun(agent, app_tools=app.tools, app_models=app.models)
    assert run.configured(None) is agent
    configured = run.configured(Configuration(3, {"model": "fast", "tools": ["refund", "gone"], "max_turns": 2}))
    assert configured.model is fast and [tool.name for tool in configured.tools] == ["refund"]
    assert configured.max_turns == 2
    with pytest.raises(ModelUnavailable, match="'slow', which this app does not define"):
        run.configured(Configuration(4, {"model": "slow"}))
    # A later attempt of a turn runs with what its first attempt recorded, none included...
    current = Configuration(5, {"instructions": "now"})
    recorded = Configuration(3, {"model": "fast"})
    op = OperationRecord(
        operation_id="op",
        run_id="run",
        conversation_id="c",
        task_id="t",
        kind="model",
        name="fast-model",
        version=1,
        turn=1,
        attempt=1,
        arguments=recorded.to_arguments(),
        digest="d",
        status="started",
        seq=1,
        created_at_ms=0,
        updated_at_ms=0,
    )
    assert run._replayed(None, current) == current
    assert run._replayed(op, current) == recorded
    assert run._replayed(attrs.evolve(op, arguments=JsonValue(None)), current) is None
    # ... unless its model is not named here any more: then the current one, as a new turn would.
    gone = attrs.evolve(op, arguments=Configuration(3, {"model": "retired"}).to_arguments())
    assert run._replayed(gone, current) == current


def test_an_agent_output_schema_parses_and_checks_the_final_answer() -> None:
    app = support_app()
    schema = {"type": "object", "properties": {"refund": {"type": "boolean"}}, "required": ["refund"]}
    agent = app.define_agent("support", version=1, model=SCRIPT, output_schema=schema)
    assert agent.request([UserMessage(text="hi")]).output_schema == schema
    assert agent.parse_answer('{"refund": true}') == ({"refund": True}, None)
    assert agent.parse_answer('{"refund": "yes"}') == (
        None,
        "the answer does not match the agent's output_schema: $.refund: 'yes' is not of type 'boolean'",
    )
    value, problem = agent.parse_answer("Sure, refunded.")
    assert value is None and problem is not None and problem.startswith("the answer is not JSON")
    plain = app.define_agent("plain", version=1, model=SCRIPT)
    assert plain.parse_answer("anything") == (None, None) and plain.request([]).output_schema is None
    with pytest.raises(actors.UsageError, match="agent 'bad': output_schema is not a valid JSON Schema"):
        app.define_agent("bad", version=1, model=SCRIPT, output_schema={"type": "nonsense"})
