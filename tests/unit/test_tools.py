"""Tools: definition checks, argument validation against the JSON Schema, specs, the decorator form."""

from __future__ import annotations

from typing import Any

import pytest

import actors
from actors._app._tools import MAX_HANDOFF_BYTES
from storage_owner.core._conversations import MAX_HANDOFF_BYTES as OWNER_MAX_HANDOFF_BYTES

ORDER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "amount": {"type": "integer", "minimum": 1}},
    "required": ["order_id"],
    "additionalProperties": False,
}


async def refund(call: actors.ToolCall, args: dict[str, Any]) -> dict[str, Any]:
    return {"refunded": args["order_id"], "key": call.operation_id}


def define(app: actors.App, name: str = "refund", **overrides: Any) -> actors.ToolDefinition:
    options: dict[str, Any] = {"description": "Refund an order", "parameters": ORDER_SCHEMA} | overrides
    handler = options.pop("handler", refund)
    return app.define_tool(name, handler, **options)


def test_a_defined_tool_is_registered_with_its_settings() -> None:
    app = actors.App("support")
    definition = define(app, recovery="idempotent", version=3, needs_approval=lambda args: True)
    assert app.tools == {"refund": definition}
    assert (definition.name, definition.recovery, definition.version) == ("refund", "idempotent", 3)
    assert definition.handler is refund
    assert definition.approval_required({"order_id": "1"}) is True


def test_defaults_are_manual_recovery_version_1_and_no_approval() -> None:
    definition = define(actors.App("support"))
    assert (definition.recovery, definition.version, definition.needs_approval) == ("manual", 1, None)
    assert definition.approval_required({"order_id": "1"}) is False


def test_validate_names_the_json_path_of_each_error() -> None:
    definition = define(actors.App("support"))
    assert definition.validate({"order_id": "42", "amount": 5}) == ()
    assert definition.validate({"order_id": 42}) == ("$.order_id: 42 is not of type 'string'",)
    assert definition.validate({"amount": 0, "extra": True}) == (
        "$: 'order_id' is a required property",
        "$: Additional properties are not allowed ('extra' was unexpected)",
        "$.amount: 0 is less than the minimum of 1",
    )
    assert definition.validate([1]) == ("$: [1] is not of type 'object'",)


def test_validate_reaches_nested_paths() -> None:
    schema = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"}}}}
    definition = define(actors.App("support"), parameters=schema)
    assert definition.validate({"items": ["a", 2]}) == ("$.items[1]: 2 is not of type 'string'",)


def test_spec_is_what_a_model_receives() -> None:
    spec = define(actors.App("support")).spec()
    assert spec == actors.ToolSpec(name="refund", description="Refund an order", parameters=ORDER_SCHEMA)


def test_the_schema_is_copied_so_later_edits_do_not_change_the_tool() -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {"n": {"type": "integer"}}}
    definition = define(actors.App("support"), parameters=schema)
    schema["properties"]["n"]["type"] = "string"
    assert definition.validate({"n": 1}) == ()
    assert definition.spec().parameters["properties"]["n"]["type"] == "integer"


def test_an_invalid_schema_is_refused_naming_its_path_and_nothing_is_registered() -> None:
    app = actors.App("support")
    bad = {"type": "object", "properties": {"order_id": {"type": "strin"}}}
    with pytest.raises(
        actors.UsageError, match=r"not a valid JSON Schema \(draft 2020-12\) at \$\.properties\.order_id"
    ):
        define(app, parameters=bad)
    assert app.tools == {}


@pytest.mark.parametrize(
    ("parameters", "fragment"),
    [
        ({"type": "string"}, '"type": "object"'),
        ({"properties": {}}, '"type": "object"'),
        ([{"type": "object"}], "must be a JSON Schema object"),
        ({"type": "object", "default": {1: 2}}, "not JSON-like"),
    ],
)
def test_parameters_must_describe_a_json_object(parameters: Any, fragment: str) -> None:
    with pytest.raises(actors.UsageError, match=fragment):
        define(actors.App("support"), parameters=parameters)


@pytest.mark.parametrize(
    ("name", "overrides", "fragment"),
    [
        ("1refund", {}, "must start with a letter"),
        ("refund.order", {}, "must start with a letter"),
        ("r" * 65, {}, "at most 64"),
        ("refund", {"recovery": "sometimes"}, "recovery must be one of manual, safe, idempotent"),
        ("refund", {"version": 0}, "version must be a whole number of 1 or more"),
        ("refund", {"version": True}, "version must be a whole number"),
        ("refund", {"description": "  "}, "give a description"),
        ("refund", {"needs_approval": True}, "needs_approval must be None or a function"),
        ("refund", {"handler": lambda call, args: None}, "must be an async function"),
    ],
)
def test_unusable_definitions_are_refused(name: str, overrides: dict[str, Any], fragment: str) -> None:
    app = actors.App("support")
    with pytest.raises(actors.UsageError, match=fragment):
        define(app, name, **overrides)
    assert app.tools == {}


def test_a_name_of_64_characters_with_dash_and_underscore_is_accepted() -> None:
    name = "a-b_" + "c" * 60
    assert define(actors.App("support"), name).name == name


def test_a_tool_name_is_defined_once_per_app() -> None:
    app = actors.App("support")
    first = define(app)
    with pytest.raises(actors.UsageError, match="already defined in app 'support'"):
        define(app)
    assert app.tools == {"refund": first}


def test_an_object_with_an_async_call_method_is_a_handler() -> None:
    class Handler:
        async def __call__(self, call: actors.ToolCall, args: dict[str, Any]) -> None:
            return None

    handler = Handler()
    assert define(actors.App("support"), handler=handler).handler is handler


def test_approval_predicate_must_answer_a_bool() -> None:
    definition = define(actors.App("support"), needs_approval=lambda args: "yes")
    with pytest.raises(TypeError, match="must return True or False"):
        definition.approval_required({"order_id": "1"})


async def test_decorator_form_uses_the_function_name_and_docstring_and_returns_the_function() -> None:
    app = actors.App("support")

    @app.tool(parameters=ORDER_SCHEMA, recovery="safe")
    async def lookup(call: actors.ToolCall, args: dict[str, Any]) -> str:
        """Look an order up."""
        return f"{args['order_id']}@{call.attempt}"

    definition = app.tools["lookup"]
    assert (definition.description, definition.recovery, definition.handler) == ("Look an order up.", "safe", lookup)
    call = actors.ToolCall(
        operation_id="op-1", run_id="run-1", conversation_id="c-1", attempt=2, tool="lookup", version=1
    )
    assert await lookup(call, {"order_id": "7"}) == "7@2"


def test_decorator_form_with_an_explicit_name_and_description() -> None:
    app = actors.App("support")

    @app.tool("find-order", description="Find an order", parameters=ORDER_SCHEMA)
    async def whatever(call: actors.ToolCall, args: dict[str, Any]) -> None:
        return None

    assert list(app.tools) == ["find-order"]
    assert app.tools["find-order"].description == "Find an order"


def test_decorator_without_description_or_docstring_is_refused() -> None:
    app = actors.App("support")

    async def bare(call: actors.ToolCall, args: dict[str, Any]) -> None:
        return None

    with pytest.raises(actors.UsageError, match="give a description"):
        app.tool(parameters=ORDER_SCHEMA)(bare)
    assert app.tools == {}


def test_a_tool_without_parameters_or_description_is_a_usage_error_not_a_type_error() -> None:
    # docs/agents.md promises a ValueError saying what is wrong; a missing keyword used to be Python's TypeError.
    app = actors.App("support")
    with pytest.raises(ValueError, match=r'give parameters.*"properties": \{\}'):
        app.define_tool("refund", refund, description="Refund an order")
    with pytest.raises(actors.UsageError, match="give a description"):
        app.define_tool("refund", refund, parameters=ORDER_SCHEMA)

    async def lookup(call: actors.ToolCall, args: dict[str, Any]) -> None:
        """Look an order up."""

    with pytest.raises(actors.UsageError, match="give parameters"):
        app.tool()(lookup)
    assert app.tools == {}


def test_an_output_schema_checks_structured_output_naming_its_path() -> None:
    app = actors.App("support")
    schema = {"type": "object", "properties": {"refund_id": {"type": "string"}}, "required": ["refund_id"]}
    tool = define(app, output_schema=schema)
    assert tool.validate_output({"refund_id": "r1"}) == ()
    assert tool.validate_output({"refund_id": 1}) == ("$.refund_id: 1 is not of type 'string'",)
    assert tool.validate_output(None) == ("$: None is not of type 'object'",)  # a tool that declares one owes it
    assert define(app, "plain").validate_output({"anything": 1}) == ()  # none declared: nothing checked
    schema["required"] = []  # the tool keeps its own copy
    assert tool.validate_output({}) == ("$: 'refund_id' is a required property",)


@pytest.mark.parametrize(
    ("output_schema", "fragment"),
    [
        ({"type": "nonsense"}, "output_schema is not a valid JSON Schema"),
        ("string", "output_schema must be a JSON Schema object"),
        ({"type": "object", "default": float("nan")}, "output_schema is not JSON-like"),
    ],
)
def test_an_unusable_output_schema_is_refused(output_schema: Any, fragment: str) -> None:
    app = actors.App("support")
    with pytest.raises(actors.UsageError, match=fragment):
        define(app, output_schema=output_schema)
    assert app.tools == {}


def test_a_tool_result_refuses_what_it_cannot_carry() -> None:
    assert actors.ToolResult(output="ok").terminate is False
    assert actors.ToolResult(output="ok").handoff is None
    assert actors.ToolResult(output="ok", handoff="From here.").handoff == "From here."
    assert len(actors.ToolResult(handoff="é" * (MAX_HANDOFF_BYTES // 2)).handoff or "") == MAX_HANDOFF_BYTES // 2
    # The owner's limit for a reset's handoff: a tool's handoff is placed as a reset.
    assert MAX_HANDOFF_BYTES == OWNER_MAX_HANDOFF_BYTES
    for bad, given in (("", "a str of 0 bytes"), ("é" * MAX_HANDOFF_BYTES, f"a str of {2 * MAX_HANDOFF_BYTES} bytes")):
        with pytest.raises(actors.UsageError, match=rf"ToolResult\(handoff=\.\.\.\) is the text .* not {given}$"):
            actors.ToolResult(output="ok", handoff=bad)
    with pytest.raises(actors.UsageError, match=r"or None for no handoff; not dict$"):
        actors.ToolResult(handoff={"text": "From here."})  # type: ignore[arg-type]
    with pytest.raises(actors.UsageError, match=r"ToolResult\(terminate=\.\.\.\) is True or False"):
        actors.ToolResult(terminate="yes")  # type: ignore[arg-type]
    with pytest.raises(actors.UsageError, match=r"is an actors\.Usage"):
        actors.ToolResult(usage={"input_tokens": 1})  # type: ignore[arg-type]


def test_callers_say_who_may_call_a_tool_and_a_tool_only_tools_call_is_not_offered_to_the_model() -> None:
    app = actors.App("support")
    assert define(app).callers == ("agent",)
    inner = define(app, "look_up_order", callers=["refund"])
    both = define(app, "audit", callers=["agent", "refund", "agent"])
    assert (inner.callers, inner.agent_callable) == (("refund",), False)
    assert (both.callers, both.agent_callable) == (("agent", "refund"), True)  # each once, in order
    agent = app.define_agent(
        "support",
        version=1,
        model=actors.ScriptedModel([actors.ScriptedTurn(text="hi")]),
        tools=["refund", "look_up_order", "audit"],
    )
    assert [spec.name for spec in agent.request([]).tools] == ["refund", "audit"]
    for callers, fragment in (("agent", "callers is a list"), (["agent", "no spaces"], "is 'agent' or a tool's name")):
        with pytest.raises(actors.UsageError, match=fragment):
            define(actors.App("other"), callers=callers)


def test_a_structured_value_does_for_a_tool_with_an_output_schema_only_when_it_matches_it() -> None:
    schema = {"type": "object", "properties": {"lines": {"type": "integer"}}, "required": ["lines"]}
    tool = define(actors.App("a"), "count", output_schema=schema)
    assert tool.structured_problem({"lines": 3}) is None
    assert tool.structured_problem(None) == "the tool declares an output_schema and returned no structured value"
    problem = tool.structured_problem({"lines": "3"})
    assert problem is not None and problem.startswith("the tool's structured output does not match its output_schema")
    assert "$.lines: '3' is not of type 'integer'" in problem
    free = define(actors.App("b"), "free")
    assert free.structured_problem(None) is None and free.structured_problem({"any": "thing"}) is None


def test_what_a_call_streamed_is_kept_up_to_its_bound_its_tail_after_a_line_saying_what_was_cut() -> None:
    from actors._worker._tool_run import StreamedOutput

    assert StreamedOutput().text() is None
    small = StreamedOutput()
    for piece in ("1\n", "", "2\n"):
        small.add(piece)
    assert small.text() == "1\n2\n"
    bounded = StreamedOutput(max_bytes=10)
    for piece in ("abcdef", "ghij", "é" * 4):  # 6 + 4 + 8 bytes: the first 8 bytes go
        bounded.add(piece)
    text = bounded.text()
    assert text is not None
    header, tail = text.split("\n")
    assert tail == "ij" + "é" * 4 and len(tail.encode()) == 10
    assert header == "[the first 8 characters of the output were cut; its last 10 bytes follow]"
    split = StreamedOutput(max_bytes=3)
    split.add("éé")  # 4 bytes: the cut falls inside the first character, which is dropped whole
    assert split.text() == "[the first 1 characters of the output were cut; its last 2 bytes follow]\né"
