"""Models: assembling a stream into a turn, model errors, Retry back-off, and the scripted model."""

from __future__ import annotations

import itertools
import json
import pickle
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

import actors
from actors import (
    AssistantMessage,
    Finish,
    ModelError,
    ModelRequest,
    Retry,
    ScriptedModel,
    ScriptedTurn,
    TextDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallRequest,
    ToolCallStart,
    ToolMessage,
    Usage,
    UsageReport,
    UserMessage,
    assemble,
)


def request(*messages: actors.Message, attempt: int = 1, instructions: str = "") -> ModelRequest:
    return ModelRequest(
        model="scripted", instructions=instructions, messages=messages or (UserMessage(text="hi"),), attempt=attempt
    )


async def events_of(model: actors.Model, req: ModelRequest) -> list[actors.StreamEvent]:
    return [event async for event in model.stream(req)]


# ------------------------------------------------------------------------------------------------ assemble


def test_assemble_joins_text_parses_arguments_at_the_end_and_keeps_usage_and_finish() -> None:
    turn = assemble(
        [
            TextDelta("Let me "),
            ToolCallStart("c1", "refund"),
            TextDelta("check."),
            ToolCallDelta("c1", '{"order_'),
            ToolCallStart("c2", "lookup"),
            ToolCallDelta("c2", "{}"),
            ToolCallDelta("c1", 'id": "42"}'),
            ToolCallEnd("c2"),
            ToolCallEnd("c1"),
            UsageReport(input_tokens=10, output_tokens=3),
            UsageReport(input_tokens=12, output_tokens=5, cached_tokens=4, reasoning_tokens=1),
            Finish("tool_calls"),
        ]
    )
    assert turn.message == AssistantMessage(
        text="Let me check.",
        tool_calls=(
            ToolCallRequest(call_id="c1", name="refund", arguments={"order_id": "42"}),
            ToolCallRequest(call_id="c2", name="lookup", arguments={}),
        ),
    )
    assert turn.usage == Usage(input_tokens=12, output_tokens=5, cached_tokens=4, reasoning_tokens=1)
    assert turn.finish_reason == "tool_calls"
    assert (turn.text, turn.tool_calls) == (turn.message.text, turn.message.tool_calls)


def test_usage_is_unknown_not_zero_without_a_report_and_unknown_finish_reasons_are_kept() -> None:
    turn = assemble([TextDelta("hi"), Finish("refusal")])
    assert (turn.usage, turn.finish_reason, turn.text) == (None, "refusal", "hi")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"order_id": 4', "not valid JSON"),
        ('{"n": NaN}', "not valid JSON"),
        ('{"n": 99999999999999999999999}', "not valid JSON"),
        ("[1, 2]", "must be a JSON object, not a array"),
        ('"42"', "must be a JSON object, not a string"),
        ("null", "must be a JSON object, not a null"),
    ],
)
def test_arguments_that_are_not_a_json_object_are_kept_as_an_error_on_that_call(text: str, fragment: str) -> None:
    turn = assemble(
        [
            ToolCallStart("bad", "refund"),
            ToolCallDelta("bad", text),
            ToolCallEnd("bad"),
            ToolCallStart("good", "refund"),
            ToolCallDelta("good", '{"order_id": "1"}'),
            ToolCallEnd("good"),
            Finish("tool_calls"),
        ]
    )
    bad, good = turn.tool_calls
    assert bad.arguments == text
    assert bad.invalid_arguments is not None and fragment in bad.invalid_arguments
    assert good == ToolCallRequest(call_id="good", name="refund", arguments={"order_id": "1"})


JSON_OBJECTS = st.dictionaries(
    st.text(max_size=5),
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
        max_leaves=10,
    ),
    max_size=4,
)


@given(arguments=JSON_OBJECTS, text=st.text(max_size=30), data=st.data())
def test_any_chunking_of_text_and_arguments_assembles_to_the_same_turn(
    arguments: dict[str, Any], text: str, data: st.DataObject
) -> None:
    def chunks(whole: str) -> list[str]:
        cuts = sorted(data.draw(st.lists(st.integers(0, len(whole)), max_size=5)))
        edges = [0, *cuts, len(whole)]
        return [whole[a:b] for a, b in itertools.pairwise(edges)]

    events: list[actors.StreamEvent] = [TextDelta(piece) for piece in chunks(text)]
    events.append(ToolCallStart("c", "t"))
    events += [ToolCallDelta("c", piece) for piece in chunks(json.dumps(arguments))]
    events += [ToolCallEnd("c"), Finish("tool_calls")]
    turn = assemble(events)
    assert turn.text == text
    assert turn.tool_calls == (ToolCallRequest(call_id="c", name="t", arguments=arguments),)


def test_empty_arguments_are_an_empty_object() -> None:
    turn = assemble([ToolCallStart("c", "now"), ToolCallEnd("c"), Finish("tool_calls")])
    assert turn.tool_calls == (ToolCallRequest(call_id="c", name="now", arguments={}),)


def test_a_stream_without_finish_is_a_retryable_cut() -> None:
    builder = actors.TurnBuilder()
    builder.feed(TextDelta("par"))
    builder.feed(TextDelta("tial"))
    assert builder.text == "partial"
    with pytest.raises(ModelError) as caught:
        builder.result()
    assert (caught.value.kind, caught.value.retryable) == ("cut_stream", True)


@pytest.mark.parametrize(
    "events",
    [
        [ToolCallDelta("c", "{}")],
        [ToolCallEnd("c")],
        [ToolCallStart("c", "t"), ToolCallEnd("c"), ToolCallStart("c", "t")],
        [ToolCallStart("c", "t"), Finish("tool_calls")],
        [Finish("stop"), TextDelta("late")],
        [ToolCallStart("c", "t"), ToolCallEnd("c"), ToolCallDelta("c", "{}")],
    ],
)
def test_a_malformed_stream_is_a_final_invalid_stream_error(events: list[actors.StreamEvent]) -> None:
    with pytest.raises(ModelError) as caught:
        assemble(events)
    assert (caught.value.kind, caught.value.retryable) == ("invalid_stream", False)


def test_a_tool_call_request_is_either_parsed_or_raw_with_its_error() -> None:
    with pytest.raises(actors.UsageError, match="invalid_arguments"):
        ToolCallRequest(call_id="c", name="t", arguments="{}")
    with pytest.raises(actors.UsageError, match="invalid_arguments"):
        ToolCallRequest(call_id="c", name="t", arguments={}, invalid_arguments="no")


def test_messages_carry_their_role() -> None:
    assert [m.role for m in (UserMessage(text="a"), AssistantMessage(), ToolMessage(call_id="c", content="x"))] == [
        "user",
        "assistant",
        "tool",
    ]


def test_a_request_attempt_counts_from_1() -> None:
    with pytest.raises(actors.UsageError, match="counts from 1"):
        request(attempt=0)


# ------------------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("kind", "retryable"),
    [
        ("rate_limit", True),
        ("overloaded", True),
        ("server_error", True),
        ("connection", True),
        ("timeout", True),
        ("cut_stream", True),
        ("bad_request", False),
        ("authentication", False),
        ("context_overflow", False),
        ("something_new", False),
    ],
)
def test_model_errors_are_classified_by_kind(kind: str, retryable: bool) -> None:
    error = ModelError("boom", kind=kind)
    assert isinstance(error, actors.TetherError)
    assert (error.kind, error.retryable, error.retry_after_ms) == (kind, retryable, None)


def test_a_model_error_can_override_its_classification_and_survives_pickling() -> None:
    error = ModelError("slow down", kind="bad_request", retryable=True, retry_after_ms=1500)
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.kind, copy.retryable, copy.retry_after_ms) == ("slow down", "bad_request", True, 1500)


# ------------------------------------------------------------------------------------------------ retry


def test_retry_backs_off_exponentially_then_gives_up() -> None:
    retry = Retry()
    assert [retry.delay_ms(attempt) for attempt in (1, 2, 3, 4, 5)] == [500, 1000, 2000, None, None]


def test_retry_caps_delays_and_honours_retry_after_as_a_capped_floor() -> None:
    retry = Retry(attempts=10, first_delay_ms=1000, max_delay_ms=5000, multiplier=3.0)
    assert [retry.delay_ms(attempt) for attempt in range(1, 5)] == [1000, 3000, 5000, 5000]
    assert retry.delay_ms(1, retry_after_ms=2500) == 2500
    assert retry.delay_ms(2, retry_after_ms=100) == 3000
    assert retry.delay_ms(1, retry_after_ms=60_000) == 5000
    assert Retry(attempts=2000, multiplier=10.0).delay_ms(1999) == 30_000


@given(
    attempts=st.integers(1, 50),
    first_delay_ms=st.integers(0, 10_000),
    extra_ms=st.integers(0, 100_000),
    multiplier=st.floats(1.0, 10.0),
    retry_after_ms=st.none() | st.integers(0, 200_000),
)
def test_retry_delays_never_shrink_stay_within_bounds_and_stop_at_the_last_attempt(
    attempts: int, first_delay_ms: int, extra_ms: int, multiplier: float, retry_after_ms: int | None
) -> None:
    retry = Retry(
        attempts=attempts, first_delay_ms=first_delay_ms, max_delay_ms=first_delay_ms + extra_ms, multiplier=multiplier
    )
    delays = [retry.delay_ms(attempt, retry_after_ms) for attempt in range(1, attempts + 3)]
    assert delays[attempts - 1 :] == [None, None, None]
    waits = [delay for delay in delays if delay is not None]
    assert len(waits) == attempts - 1
    assert waits == sorted(waits)
    floor = min(max(first_delay_ms, retry_after_ms or 0), retry.max_delay_ms)
    assert all(floor <= wait <= retry.max_delay_ms for wait in waits)


def test_retry_with_one_attempt_never_retries() -> None:
    assert Retry(attempts=1).delay_ms(1) is None


@pytest.mark.parametrize(
    "options",
    [
        {"attempts": 0},
        {"attempts": 2.5},
        {"first_delay_ms": -1},
        {"multiplier": 0.5},
        {"multiplier": float("inf")},
        {"first_delay_ms": 1000, "max_delay_ms": 999},
        {"attempts": True},
    ],
)
def test_retry_refuses_unusable_settings(options: dict[str, Any]) -> None:
    with pytest.raises(actors.UsageError, match="Retry"):
        Retry(**options)


def test_retry_refuses_bad_arguments() -> None:
    with pytest.raises(actors.UsageError, match="from 1"):
        Retry().delay_ms(0)
    with pytest.raises(actors.UsageError, match="negative"):
        Retry().delay_ms(1, retry_after_ms=-5)


# ------------------------------------------------------------------------------------------------ scripted model


async def test_scripted_turns_follow_the_assistant_messages_after_the_last_user_message() -> None:
    model = ScriptedModel(
        [ScriptedTurn(tool_calls=[("refund", {"order_id": "42"})]), ScriptedTurn(text="Refunded order 42.")]
    )
    assert isinstance(model, actors.Model)
    first = assemble(await events_of(model, request(UserMessage(text="refund order 42"))))
    assert first.tool_calls == (ToolCallRequest(call_id="call_1_1", name="refund", arguments={"order_id": "42"}),)
    assert first.finish_reason == "tool_calls"
    history = (
        UserMessage(text="refund order 42"),
        first.message,
        ToolMessage(call_id="call_1_1", content='{"ok": true}'),
    )
    second = assemble(await events_of(model, request(*history)))
    assert (second.text, second.tool_calls, second.finish_reason) == ("Refunded order 42.", (), "stop")
    # a new run (a new user message) starts the script again; a replay of a request answers the same
    again = assemble(await events_of(model, request(*history, second.message, UserMessage(text="again"))))
    assert again.tool_calls == first.tool_calls
    assert await events_of(model, request(*history)) == await events_of(model, request(*history))


async def test_a_steer_mid_run_does_not_start_the_script_over_the_runs_turn_picks_the_next() -> None:
    # docs/agents.md, "The scripted model": the run loop's turn, not the messages after the last user message.
    model = ScriptedModel([ScriptedTurn(tool_calls=[("lookup", {})]), ScriptedTurn(text="second turn")])
    first = assemble(await events_of(model, request(UserMessage(text="look"))))
    steered = (
        UserMessage(text="look"),
        first.message,
        ToolMessage(call_id="call_1_1", content="found"),
        UserMessage(text="check B too"),  # a steer placed at the tool boundary
    )
    in_run = ModelRequest(model="scripted", instructions="", messages=steered, turn=2)
    assert assemble(await events_of(model, in_run)).text == "second turn"


async def test_scripted_text_and_arguments_stream_in_chunks_with_counted_usage() -> None:
    model = ScriptedModel([ScriptedTurn(text="abcdefghij", tool_calls=[("t", {"k": "vvvv"})], chunk_chars=4)])
    events = await events_of(model, request(UserMessage(text="12345678"), instructions="1234"))
    assert events == [
        TextDelta("abcd"),
        TextDelta("efgh"),
        TextDelta("ij"),
        ToolCallStart("call_1_1", "t"),
        ToolCallDelta("call_1_1", '{"k"'),
        ToolCallDelta("call_1_1", ': "v'),
        ToolCallDelta("call_1_1", 'vvv"'),
        ToolCallDelta("call_1_1", "}"),
        ToolCallEnd("call_1_1"),
        UsageReport(input_tokens=3, output_tokens=6),  # 12 chars in, 10 + 13 out, 4 chars a token rounded up
        Finish("tool_calls"),
    ]


async def test_scripted_usage_and_finish_reason_can_be_given() -> None:
    usage = Usage(input_tokens=100, output_tokens=7, cached_tokens=50, reasoning_tokens=2)
    model = ScriptedModel([ScriptedTurn(text="cut", usage=usage, finish_reason="length")])
    turn = assemble(await events_of(model, request()))
    assert (turn.usage, turn.finish_reason) == (usage, "length")


async def test_scripted_raw_arguments_reach_the_turn_as_invalid() -> None:
    model = ScriptedModel([ScriptedTurn(tool_calls=[("refund", '{"order_id": 4')])])
    (call,) = assemble(await events_of(model, request())).tool_calls
    assert call.arguments == '{"order_id": 4'
    assert call.invalid_arguments is not None


async def test_scripted_errors_fail_the_first_attempts_then_the_turn_answers() -> None:
    model = ScriptedModel([ScriptedTurn(text="ok", error="rate_limit", fail_attempts=2, retry_after_ms=700)])
    for attempt in (1, 2):
        with pytest.raises(ModelError) as caught:
            await events_of(model, request(attempt=attempt))
        assert (caught.value.kind, caught.value.retryable, caught.value.retry_after_ms) == ("rate_limit", True, 700)
    assert assemble(await events_of(model, request(attempt=3))).text == "ok"


async def test_scripted_cut_streams_part_of_the_text_then_fails_retryably() -> None:
    model = ScriptedModel([ScriptedTurn(text="Hello, world", cut_after_chars=5, fail_attempts=1, chunk_chars=2)])
    seen: list[actors.StreamEvent] = []
    with pytest.raises(ModelError) as caught:
        async for event in model.stream(request()):
            seen.append(event)
    assert seen == [TextDelta("He"), TextDelta("ll"), TextDelta("o")]
    assert (caught.value.kind, caught.value.retryable) == ("cut_stream", True)
    assert assemble(await events_of(model, request(attempt=2))).text == "Hello, world"


async def test_a_request_past_the_script_is_a_final_error_saying_how_many_turns_there_are() -> None:
    model = ScriptedModel([ScriptedTurn(text="only")])
    with pytest.raises(ModelError, match="has 1 turn") as caught:
        await events_of(model, request(UserMessage(text="hi"), AssistantMessage(text="only")))
    assert (caught.value.kind, caught.value.retryable) == ("script_exhausted", False)


async def test_a_slow_scripted_stream_sleeps_between_chunks_and_can_be_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([ScriptedTurn(text="abcdef", chunk_chars=2, delay_s=10.0)])
    start = trio.current_time()
    seen: list[actors.StreamEvent] = []
    with trio.move_on_after(25):
        async for event in model.stream(request()):
            seen.append(event)
    assert seen == [TextDelta("ab"), TextDelta("cd")]
    assert trio.current_time() - start == pytest.approx(25)


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"error": "rate_limit"}, "fail_attempts=N"),
        ({"cut_after_chars": 3}, "fail_attempts=N"),
        ({"fail_attempts": 1}, "needs error=KIND"),
        ({"cut_after_chars": 3, "fail_attempts": 1, "error": "timeout"}, "always fails with cut_stream"),
        ({"chunk_chars": 0}, "chunk_chars"),
        ({"delay_s": -1.0}, "delay_s"),
        ({"tool_calls": [("", {})]}, "tool name"),
    ],
)
def test_scripted_turns_refuse_unusable_settings(options: dict[str, Any], fragment: str) -> None:
    with pytest.raises(actors.UsageError, match=fragment):
        ScriptedTurn(**options)


def test_a_scripted_model_needs_turns() -> None:
    with pytest.raises(actors.UsageError, match="at least one"):
        ScriptedModel([])
    with pytest.raises(actors.UsageError, match="ScriptedTurn records"):
        ScriptedModel(["hello"])  # type: ignore[list-item]


async def test_a_scripted_turn_reports_the_cost_it_is_given() -> None:
    usage = Usage(input_tokens=10, output_tokens=2, cost=0.125)
    turn = assemble(await events_of(ScriptedModel([ScriptedTurn(text="x", usage=usage)]), request()))
    assert turn.usage == usage
