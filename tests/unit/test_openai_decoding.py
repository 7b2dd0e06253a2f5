"""The sans-IO parts of ``actors.OpenAIChat`` (actors/_models/_openai_wire.py): the event-stream parser over any split
of the bytes, the chunk decoder's tolerance of real servers' tool-call deltas, error classification, Retry-After, the
request body, and the checks of its arguments."""

from __future__ import annotations

import email.utils
import json
from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import pytest

import actors
from actors import (
    AssistantMessage,
    Finish,
    ModelError,
    ModelRequest,
    ToolCallRequest,
    ToolMessage,
    ToolSpec,
    Usage,
    UsageReport,
    UserMessage,
    assemble,
    testing,
)
from actors._models._openai import OpenAIChat
from actors._models._openai_wire import (
    MAX_TOOL_CALLS,
    ChatStreamDecoder,
    ServerError,
    SSEParser,
    classify_error,
    parse_retry_after,
)
from actors._worker._journal import run_usage
from protocol import UsageError

LOOKUP = ToolSpec(
    name="lookup",
    description="Look an order up.",
    parameters={"type": "object", "properties": {"order_id": {"type": "string"}}},
)


def decode(body: bytes, pieces: list[bytes] | None = None) -> list[Any]:
    """The neutral events of a whole recorded body fed to the parser in ``pieces`` (default: one piece)."""
    parser = SSEParser()
    decoder = ChatStreamDecoder()
    events: list[Any] = []
    pairs = []
    for piece in pieces if pieces is not None else [body]:
        pairs += parser.feed(piece)
    pairs += parser.close()
    for _, data in pairs:
        if data == "[DONE]":
            break
        events += decoder.feed(json.loads(data))
    return events + decoder.end()


def delta_chunk(*calls: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"tool_calls": list(calls)}, "finish_reason": finish}]}


def calls_of(*chunks: dict[str, Any]) -> tuple[ToolCallRequest, ...]:
    decoder = ChatStreamDecoder()
    events: list[Any] = []
    for chunk in chunks:
        events += decoder.feed(chunk)
    events += decoder.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    return assemble(events + decoder.end()).tool_calls


# ------------------------------------------------------------------------------------------------ the parser


@pytest.mark.parametrize("name", [name for name in testing.TRANSCRIPTS if "error" not in name])
def test_every_split_of_a_transcript_decodes_the_same(name: str) -> None:
    body = testing.recorded_transcript(name)
    whole = decode(body)
    for cut in range(1, len(body)):
        assert decode(body, [body[:cut], body[cut:]]) == whole, f"split at byte {cut}"
    assert decode(body, [bytes([b]) for b in body]) == whole  # one byte per read: a multi-byte character too


def test_parser_reads_crlf_comments_fields_and_a_last_event_without_its_blank_line() -> None:
    parser = SSEParser()
    assert parser.feed(b': ping\r\n\r\nevent: error\r\ndata: {"a":\r\ndata: 1}\r\nid: 7\r\nretry: 10\r\n\r\n') == [
        ("error", '{"a":\n1}')
    ]
    assert parser.feed(b"data:{}") == []
    assert parser.close() == [("", "{}")]


def test_parser_bounds_a_line() -> None:
    parser = SSEParser(max_line_bytes=16)
    assert parser.feed(b"data: 0123456789") == []
    with pytest.raises(ValueError, match="longer than 16 bytes"):
        parser.feed(b"abcdef")


# ------------------------------------------------------------------------------------------------ tool calls


def test_a_new_id_at_an_index_in_use_opens_a_new_call() -> None:
    calls = calls_of(
        delta_chunk({"index": 0, "id": "a", "function": {"name": "lookup", "arguments": '{"order_id":"A1"}'}}),
        delta_chunk({"index": 0, "id": "b", "function": {"name": "lookup", "arguments": '{"order_id":"B2"}'}}),
    )
    assert [(c.call_id, c.arguments) for c in calls] == [("a", {"order_id": "A1"}), ("b", {"order_id": "B2"})]


def test_duplicate_indexes_in_one_chunk_continue_their_call() -> None:
    calls = calls_of(
        delta_chunk(
            {"index": 0, "id": "a", "type": "function", "function": {"name": "lookup", "arguments": ""}},
            {"index": 0, "function": {"arguments": '{"order_id":'}},
            {"index": 0, "function": {"arguments": '"A1"}'}},
            {"index": 1, "id": "b", "function": {"name": "lookup", "arguments": "{}"}},
            {"index": 0, "function": {"arguments": ""}},
        )
    )
    assert [(c.call_id, c.arguments) for c in calls] == [("a", {"order_id": "A1"}), ("b", {})]


def test_deltas_without_index_or_id() -> None:
    calls = calls_of(
        delta_chunk({"function": {"name": "lookup", "arguments": '{"order_id"'}}),
        delta_chunk({"function": {"arguments": ': "A1"}'}}),
        delta_chunk({"function": {"name": "lookup", "arguments": '{"order_id": "B2"}'}}),
    )
    assert [(c.call_id, c.arguments) for c in calls] == [("call_1", {"order_id": "A1"}), ("call_2", {"order_id": "B2"})]


def test_an_id_after_the_first_delta_keeps_the_call() -> None:
    calls = calls_of(
        delta_chunk({"index": 0, "function": {"name": "lookup", "arguments": '{"order_id"'}}),
        delta_chunk({"index": 0, "id": "late", "function": {"arguments": ': "A1"}'}}),
    )
    assert [(c.call_id, c.arguments) for c in calls] == [("call_1", {"order_id": "A1"})]


def test_a_name_after_the_arguments_starts_the_call_with_them() -> None:
    decoder = ChatStreamDecoder()
    assert decoder.feed(delta_chunk({"index": 0, "id": "a", "function": {"arguments": "{}"}})) == []
    assert decoder.feed(delta_chunk({"index": 0, "function": {"name": "lookup"}})) == [
        actors.ToolCallStart("a", "lookup"),
        actors.ToolCallDelta("a", "{}"),
    ]


def test_arguments_sent_as_an_object_are_taken_as_their_json() -> None:
    [call] = calls_of(delta_chunk({"id": "a", "function": {"name": "lookup", "arguments": {"order_id": "A1"}}}))
    assert call.arguments == {"order_id": "A1"}


def test_unparsable_arguments_become_invalid_arguments() -> None:
    [call] = calls_of(delta_chunk({"index": 0, "id": "a", "function": {"name": "lookup", "arguments": '{"order'}}))
    assert call.arguments == '{"order'
    assert call.invalid_arguments is not None and "not valid JSON" in call.invalid_arguments


def test_an_answer_cut_off_mid_call_closes_its_call_and_finishes_with_length() -> None:
    # What the run loop gets from a server that stopped at max_tokens inside a call's arguments: the call closed, its
    # arguments invalid, and finish reason "length" (whose calls never run: docs/agents.md).
    decoder = ChatStreamDecoder()
    events = decoder.feed(delta_chunk({"index": 0, "id": "a", "function": {"name": "lookup", "arguments": '{"ord'}}))
    events += decoder.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    turn = assemble(events + decoder.end())
    [call] = turn.tool_calls
    assert turn.finish_reason == "length" and call.invalid_arguments is not None


def test_a_call_that_never_gets_a_name_is_an_invalid_response() -> None:
    decoder = ChatStreamDecoder()
    decoder.feed(delta_chunk({"index": 0, "id": "a", "function": {"arguments": "{}"}}, finish="tool_calls"))
    with pytest.raises(ModelError) as caught:
        decoder.end()
    assert (caught.value.kind, caught.value.retryable) == ("invalid_response", True)


def test_tool_calls_per_response_are_bounded() -> None:
    decoder = ChatStreamDecoder()
    for n in range(MAX_TOOL_CALLS):
        decoder.feed(delta_chunk({"index": n, "id": f"c{n}", "function": {"name": "lookup"}}))
    with pytest.raises(ModelError) as caught:
        decoder.feed(delta_chunk({"index": MAX_TOOL_CALLS, "id": "one-more", "function": {"name": "lookup"}}))
    assert (caught.value.kind, caught.value.retryable) == ("response_too_large", False)


# ------------------------------------------------------------------------------------------------ usage, finish


def test_usage_fields_and_the_last_report_wins() -> None:
    decoder = ChatStreamDecoder()
    decoder.feed(
        {"choices": [{"index": 0, "delta": {"content": "x"}}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
    )
    decoder.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    decoder.feed(
        {
            "choices": [],
            "usage": {
                "prompt_tokens": 100,
                "completion_tokens": 20,
                "prompt_tokens_details": {"cached_tokens": 64},
                "completion_tokens_details": {"reasoning_tokens": 12},
            },
        }
    )
    assert decoder.end()[-2:] == [
        UsageReport(input_tokens=100, output_tokens=20, cached_tokens=64, reasoning_tokens=12),
        Finish("length"),
    ]


@pytest.mark.parametrize(
    ("reported", "cost"),
    [(0.00042, 0.00042), (0, 0.0), (None, None), ("0.1", None), (True, None), (-1.0, None), (float("nan"), None)],
)
def test_a_cost_the_server_reports_is_carried_to_the_turn(reported: object, cost: float | None) -> None:
    # OpenRouter adds usage.cost (its credits); anything but a finite number of 0 or more is no cost at all.
    decoder = ChatStreamDecoder()
    usage = {"prompt_tokens": 10, "completion_tokens": 2, **({} if reported is None else {"cost": reported})}
    events = decoder.feed({"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]})
    events += decoder.feed({"choices": [], "usage": usage})
    turn = assemble(events + decoder.end())
    assert turn.usage == Usage(input_tokens=10, output_tokens=2, cost=cost)
    # and on to the result the worker commits (the owner keeps it when its price table does not price the model).
    reported_usage = run_usage(turn.usage)
    assert reported_usage is not None and reported_usage.cost == cost


def test_a_stream_without_usage_has_unknown_usage() -> None:
    decoder = ChatStreamDecoder()
    events = decoder.feed({"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]})
    turn = assemble(events + decoder.end())
    assert (turn.text, turn.usage, turn.finish_reason) == ("hi", None, "stop")


def test_a_stream_without_finish_is_cut() -> None:
    decoder = ChatStreamDecoder()
    decoder.feed({"choices": [{"index": 0, "delta": {"content": "hi"}}]})
    with pytest.raises(ModelError) as caught:
        decoder.end()
    assert (caught.value.kind, caught.value.retryable) == ("cut_stream", True)


# ------------------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("status", "payload", "kind", "retryable"),
    [
        (429, {"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}}, "rate_limit", True),
        (
            429,
            {"error": {"message": "You exceeded your current quota", "code": "insufficient_quota"}},
            "quota_exceeded",
            False,
        ),
        (500, {"error": {"message": "The server had an error"}}, "server_error", True),
        (502, "<html>Bad Gateway</html>", "server_error", True),
        (503, {"error": "model is loading"}, "overloaded", True),
        (408, {}, "timeout", True),
        (409, {}, "conflict", True),
        (
            400,
            {"error": {"message": "maximum context length is 8192 tokens", "code": "context_length_exceeded"}},
            "context_overflow",
            False,
        ),
        (
            400,
            {
                "error": {
                    "code": 400,
                    "message": "request exceeds the available context size",
                    "type": "exceed_context_size_error",
                }
            },
            "context_overflow",
            False,
        ),
        (
            400,
            {"object": "error", "message": "This model's maximum context length is 4096 tokens.", "code": 400},
            "context_overflow",
            False,
        ),
        (
            400,
            {"error": {"message": "Invalid value for 'tools'", "type": "invalid_request_error"}},
            "bad_request",
            False,
        ),
        (401, {"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}}, "authentication", False),
        (403, {"error": {"message": "Project does not have access"}}, "permission_denied", False),
        (
            404,
            {"error": {"message": "The model `gpt-9` does not exist", "code": "model_not_found"}},
            "not_found",
            False,
        ),
        (422, {"detail": [{"loc": ["body", "messages"], "msg": "field required"}]}, "bad_request", False),
        (
            None,
            {"error": {"message": "The server had an error", "type": "server_error", "code": None}},
            "server_error",
            True,
        ),
        (None, {"error": {"message": "Rate limit", "code": "rate_limit_exceeded"}}, "rate_limit", True),
        (
            None,
            {"error": {"message": "maximum context length", "type": "BadRequestError", "code": 400}},
            "context_overflow",
            False,
        ),
        (None, {"error": {"message": "bad tool", "type": "BadRequestError", "code": 400}}, "bad_request", False),
        (None, {"error": {"message": "something odd"}}, "server_error", True),
    ],
)
def test_classification(status: int | None, payload: object, kind: str, retryable: bool) -> None:
    body = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
    found, override = classify_error(status, ServerError.from_body(body))
    error = ModelError("x", kind=found, retryable=override)
    assert (error.kind, error.retryable) == (kind, retryable)


def test_server_error_fields() -> None:
    assert ServerError.from_body(b'{"error": {"message": "m", "code": "c", "type": "t"}}') == ServerError(
        message="m", code="c", type="t"
    )
    assert ServerError.from_body(b'{"error": "model not found"}') == ServerError(message="model not found")
    assert ServerError.from_body(b"plain text") == ServerError(message="plain text")


def test_retry_after() -> None:
    now = 1_764_540_000.0
    assert parse_retry_after({"retry-after": "2"}, now) == 2000
    assert parse_retry_after({"retry-after": "0.25"}, now) == 250
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}, now) == 1500
    assert parse_retry_after({"retry-after": email.utils.formatdate(now + 30, usegmt=True)}, now) == 30_000
    assert parse_retry_after({"retry-after": email.utils.formatdate(now - 30, usegmt=True)}, now) == 0
    assert parse_retry_after({"retry-after": "10000000"}, now) == 24 * 60 * 60 * 1000
    assert parse_retry_after({"retry-after": "soon"}, now) is None
    assert parse_retry_after({}, now) is None


# ------------------------------------------------------------------------------------------------ the request


def test_request_body_maps_the_transcript() -> None:
    request = ModelRequest(
        model="gpt-4o-mini",
        instructions="You look orders up.",
        messages=(
            UserMessage(text="Where are A1 and B2?"),
            AssistantMessage(
                text="",
                tool_calls=(
                    ToolCallRequest(call_id="a", name="lookup", arguments={"order_id": "A1"}),
                    ToolCallRequest(call_id="b", name="lookup", arguments='{"order', invalid_arguments="not JSON"),
                ),
            ),
            ToolMessage(call_id="a", content='{"status": "shipped"}'),
            ToolMessage(call_id="b", content="error: the arguments are not a JSON object", is_error=True),
            AssistantMessage(text="A1 shipped."),
        ),
        tools=(LOOKUP,),
    )
    model = OpenAIChat("gpt-4o-mini", base_url="http://x/v1", api_key="", extra_body={"temperature": 0})
    assert model.request_body(request) == {
        "model": "gpt-4o-mini",
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
        "messages": [
            {"role": "system", "content": "You look orders up."},
            {"role": "user", "content": "Where are A1 and B2?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "lookup", "arguments": '{"order_id": "A1"}'}},
                    {"id": "b", "type": "function", "function": {"name": "lookup", "arguments": '{"order'}},
                ],
            },
            {"role": "tool", "tool_call_id": "a", "content": '{"status": "shipped"}'},
            {"role": "tool", "tool_call_id": "b", "content": "error: the arguments are not a JSON object"},
            {"role": "assistant", "content": "A1 shipped."},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "description": "Look an order up.",
                    "parameters": dict(LOOKUP.parameters),
                },
            }
        ],
    }


def test_no_instructions_no_tools_and_stream_options_merged() -> None:
    model = OpenAIChat("m", base_url="http://x/v1", extra_body={"stream_options": {"continuous_usage_stats": True}})
    body = model.request_body(ModelRequest(model="m", instructions="", messages=(UserMessage(text="hi"),)))
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert "tools" not in body
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


def test_an_output_schema_asks_for_a_json_schema_response_format() -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    request = ModelRequest(model="m", instructions="", messages=(UserMessage(text="hi"),), output_schema=schema)
    body = OpenAIChat("m", base_url="http://x/v1").request_body(request)
    assert body["response_format"] == {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    plain = OpenAIChat("m", base_url="http://x/v1").request_body(attrs.evolve(request, output_schema=None))
    assert "response_format" not in plain


@pytest.mark.parametrize(
    ("kwargs", "complaint"),
    [
        ({"model": ""}, "model must be a model name"),
        ({"base_url": "ftp://example.com/v1"}, "base_url must be an http"),
        ({"base_url": "localhost:8000"}, "base_url must be an http"),
        ({"timeout_s": 0}, "timeout_s must be a positive"),
        ({"timeout_s": float("inf")}, "timeout_s must be a positive"),
        ({"extra_body": {"stream": False}}, "extra_body may not set stream"),
        ({"extra_body": {"model": "x", "messages": []}}, "extra_body may not set messages, model"),
        ({"extra_body": {"temperature": float("nan")}}, "extra_body is not JSON-like"),
        ({"extra_body": {"stream_options": True}}, "stream_options must be an object"),
        ({"headers": {"x-a": 1}}, "headers must map"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], complaint: str) -> None:
    arguments = {"model": "gpt-4o-mini", "base_url": "http://127.0.0.1:1/v1", **kwargs}
    with pytest.raises(UsageError, match=complaint):
        OpenAIChat(arguments.pop("model"), **arguments)


def test_environment_and_repr_without_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1/")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env-1234")
    model = OpenAIChat("gpt-4o-mini")
    assert (model.name, model.url) == ("gpt-4o-mini", "http://127.0.0.1:8000/v1/chat/completions")
    assert model._request_headers()["Authorization"] == "Bearer sk-from-env-1234"
    assert "sk-from" not in repr(model)
    assert "Authorization" not in OpenAIChat("m", api_key="")._request_headers()
    monkeypatch.delenv("OPENAI_BASE_URL")
    assert OpenAIChat("m").url == "https://api.openai.com/v1/chat/completions"
    monkeypatch.setenv("OPENAI_BASE_URL", "not a url")
    with pytest.raises(UsageError, match="OPENAI_BASE_URL must be"):
        OpenAIChat("m")


def test_it_is_a_model_an_agent_accepts() -> None:
    app = actors.App("openai")
    agent = app.define_agent("support", version=1, model=OpenAIChat("gpt-4o-mini", base_url="http://x/v1"))
    assert isinstance(agent.model, actors.Model) and agent.request(()).model == "gpt-4o-mini"


@pytest.mark.parametrize(
    ("base_url", "complaint"),
    [
        ("http://[::1/v1", "base_url is not a URL"),  # urlsplit's ValueError: now a UsageError naming base_url
        ("http://a\x00b/v1", "base_url is not a URL"),  # httpx.InvalidURL, which used to escape at the first request
        ("http://" + "a" * 64 + ".example/v1", "base_url's host"),  # a label past 63: a UnicodeError, at the first call
    ],
)
def test_a_base_url_httpx_cannot_use_is_refused_when_the_model_is_built(base_url: str, complaint: str) -> None:
    with pytest.raises(UsageError, match=complaint):
        OpenAIChat("m", base_url=base_url)


def request() -> ModelRequest:
    return ModelRequest(model="m", instructions="", messages=(UserMessage(text="hi"),))


async def test_an_invalid_url_at_request_time_is_a_final_model_error() -> None:
    # httpx.InvalidURL is not an httpx.HTTPError: it escaped stream() unmapped, and the run faulted (phase_error).
    model = OpenAIChat("m", base_url="http://127.0.0.1:1/v1", api_key="")
    model.url = "http://127.0.0.1:1/v1/chat\x00completions"  # what httpx refuses while it builds the request
    with pytest.raises(ModelError) as caught:
        async for _ in model.stream(request()):
            pass
    assert (caught.value.kind, caught.value.retryable) == ("bad_request", False)
    assert "InvalidURL" in str(caught.value) and "model 'm'" in str(caught.value)


class _ClosedStream(httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        raise httpx.StreamClosed()
        yield b""  # pragma: no cover


async def test_a_stream_error_is_a_final_model_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # httpx.StreamError (a RuntimeError, not an httpx.HTTPError) is the adapter misreading a response: final, since
    # sending the request again would meet the same bug.
    def answer(_request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=_ClosedStream())

    model = OpenAIChat("m", base_url="http://127.0.0.1:1/v1", api_key="")
    monkeypatch.setattr(model, "_client", lambda: httpx.AsyncClient(transport=httpx.MockTransport(answer)))
    with pytest.raises(ModelError) as caught:
        async for _ in model.stream(request()):
            pass
    assert (caught.value.kind, caught.value.retryable) == ("invalid_stream", False)
    assert "StreamClosed" in str(caught.value)
