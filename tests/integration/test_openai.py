"""``actors.OpenAIChat`` against an OpenAI-compatible server on loopback (actors/testing/_openai.py) that
replays recorded streams of OpenAI, vLLM, Ollama, llama.cpp and OpenRouter with their quirks, errors, slow and cut
streams, and records the requests it got."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path
from typing import Any, Final

import pytest
import trio

import actors
from actors import AssistantTurn, ModelError, ModelRequest, OpenAIChat, ToolSpec, TurnBuilder, Usage, UserMessage
from actors._models import _openai as openai_module
from actors.testing import OpenAIServer as ReplayServer
from actors.testing import Reply, openai_server
from actors.testing import error_reply as error
from actors.testing import recorded_transcript as transcript
from actors.testing import sse_body as sse
from actors.testing import stream_reply as stream
from tests.integration._agent_apps import read_ledger
from tests.integration._up_helpers import all_up, tether_up

TIMEOUT_S: Final = 30
LOOKUP = ToolSpec(
    name="lookup",
    description="Look an order up.",
    parameters={"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
)
REQUEST = ModelRequest(
    model="gpt-4o-mini",
    instructions="You look orders up.",
    messages=(UserMessage(text="Where is A1?"),),
    tools=(LOOKUP,),
)
KEY: Final = "sk-test-0123456789abcdef"


def model_for(server: ReplayServer, **options: Any) -> OpenAIChat:
    return OpenAIChat("gpt-4o-mini", base_url=server.url, api_key=KEY, **options)


async def collect(model: OpenAIChat, request: ModelRequest = REQUEST) -> tuple[list[Any], AssistantTurn]:
    """Every event of the model's answer, and the assembled turn."""
    events: list[Any] = []
    builder = TurnBuilder()
    async with contextlib.aclosing(model.stream(request)) as stream_events:  # type: ignore[type-var]
        async for event in stream_events:
            events.append(event)
            builder.feed(event)
    return events, builder.result()


async def failure(model: OpenAIChat, request: ModelRequest = REQUEST) -> tuple[ModelError, list[Any]]:
    events: list[Any] = []
    with pytest.raises(ModelError) as caught:
        async with contextlib.aclosing(model.stream(request)) as stream_events:  # type: ignore[type-var]
            async for event in stream_events:
                events.append(event)
    return caught.value, events


def calls(turn: AssistantTurn) -> list[tuple[str, str, Any]]:
    return [(call.call_id, call.name, call.arguments) for call in turn.tool_calls]


# ------------------------------------------------------------------------------------------------ formats


async def test_openai_text_with_usage_and_the_request_it_sent() -> None:
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(stream(transcript("openai_text"))) as server:
            events, turn = await collect(model_for(server, extra_body={"temperature": 0}, headers={"x-team": "a"}))
    assert turn.text == "Your order A1 has shipped. ✓"
    assert [event.text for event in events if isinstance(event, actors.TextDelta)] == [
        "Your order",
        " A1 has",
        " shipped. ✓",
    ]
    assert turn.finish_reason == "stop"
    assert turn.usage == Usage(input_tokens=1240, output_tokens=210, cached_tokens=1024, reasoning_tokens=192)
    [request] = server.requests
    assert (request.method, request.path) == ("POST", "/v1/chat/completions")
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["accept"] == "text/event-stream"
    assert request.headers["x-team"] == "a"
    assert request.body == {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You look orders up."},
            {"role": "user", "content": "Where is A1?"},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
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


async def test_openai_parallel_tool_calls() -> None:
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(stream(transcript("openai_tool_calls"))) as server:
            events, turn = await collect(model_for(server))
    assert calls(turn) == [
        ("call_Qx1vB7", "lookup", {"order_id": "A1"}),
        ("call_Rm2wC8", "lookup", {"order_id": "B2"}),
    ]
    assert events[:2] == [actors.ToolCallStart("call_Qx1vB7", "lookup"), actors.ToolCallDelta("call_Qx1vB7", '{"or')]
    assert (turn.text, turn.finish_reason, turn.usage) == ("", "tool_calls", Usage(input_tokens=82, output_tokens=46))


async def test_vllm_tool_call_with_text_and_reasoning_left_out() -> None:
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(stream(transcript("vllm_tool_call"))) as server:
            _, turn = await collect(model_for(server))
    assert turn.text == "Let me check."
    assert calls(turn) == [("chatcmpl-tool-5e1d27c0a8f4", "lookup", {"order_id": "A1"})]
    assert turn.usage == Usage(input_tokens=310, output_tokens=25)


async def test_ollama_parallel_calls_reusing_index_0() -> None:
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(stream(transcript("ollama_parallel_calls"))) as server:
            _, turn = await collect(model_for(server))
    assert calls(turn) == [
        ("call_k2n1xq0c", "lookup", {"order_id": "A1"}),
        ("call_p9x4fz7m", "lookup", {"order_id": "B2"}),
    ]
    assert turn.usage == Usage(input_tokens=180, output_tokens=40)


async def test_older_ollama_without_index_nor_usage() -> None:
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(stream(transcript("ollama_no_index"))) as server:
            _, turn = await collect(model_for(server))
    assert calls(turn) == [("call_6mzq3l2b", "lookup", {"order_id": "A1"})]
    assert (turn.finish_reason, turn.usage) == ("stop", None)  # the reason kept as the server gave it


async def test_llamacpp_usage_on_the_finish_chunk() -> None:
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(stream(transcript("llamacpp_text"))) as server:
            _, turn = await collect(model_for(server))
    assert (turn.text, turn.usage) == ("Shipped yesterday.", Usage(input_tokens=41, output_tokens=9))


async def test_keepalive_comments_and_no_done() -> None:
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(stream(transcript("openrouter_keepalive_no_done"))) as server:
            _, turn = await collect(model_for(server))
    assert (turn.text, turn.usage) == ("On its way.", Usage(input_tokens=20, output_tokens=3))


async def test_data_lines_split_across_network_reads() -> None:
    body = transcript("openai_tool_calls")
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(stream(body), stream(body, piece_bytes=5, delay_s=0.001)) as server:
            _, whole = await collect(model_for(server))
            _, split = await collect(model_for(server))
    assert split == whole


async def test_duplicate_indexes_in_one_chunk() -> None:
    body = sse(
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "lookup", "arguments": ""},
                            },
                            {"index": 0, "function": {"arguments": '{"order_id":'}},
                            {"index": 0, "function": {"arguments": ' "A1"}'}},
                        ]
                    },
                    "finish_reason": None,
                }
            ]
        },
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    )
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(stream(body)) as server:
            _, turn = await collect(model_for(server))
    assert calls(turn) == [("c1", "lookup", {"order_id": "A1"})]


async def test_unparsable_arguments_reach_the_invalid_arguments_path() -> None:
    body = sse(
        {
            "choices": [
                {"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "lookup"}}]}}
            ]
        },
        {
            "choices": [
                {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"order_id": A1}'}}]}}
            ]
        },
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    )
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(stream(body)) as server:
            _, turn = await collect(model_for(server))
    [call] = turn.tool_calls
    assert call.arguments == '{"order_id": A1}' and call.invalid_arguments is not None


async def test_a_whole_json_answer_to_a_streamed_request() -> None:
    completion = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(error(200, completion)) as server:
            _, turn = await collect(model_for(server))
    assert (calls(turn), turn.usage) == ([("c1", "lookup", {})], Usage(input_tokens=5, output_tokens=2))


# ------------------------------------------------------------------------------------------------ cut and slow


def _before_usage_chunk(body: bytes) -> int:
    return body.rindex(b"data:", 0, body.index(b'"choices":[],'))


async def test_a_stream_cut_before_it_finished_is_retryable() -> None:
    body = transcript("openai_text")
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(stream(body, cut_after=body.index(b"shipped"))) as server:
            caught, events = await failure(model_for(server))
    assert (caught.kind, caught.retryable) == ("cut_stream", True)
    assert [event.text for event in events] == ["Your order", " A1 has"]  # shown live, then not used


async def test_a_clean_close_before_the_finish_is_a_cut_stream() -> None:
    body = transcript("openai_text")
    cut = body.index(b'"finish_reason":"stop"')
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(stream(body[: body.rindex(b"data:", 0, cut)], chunked=False)) as server:
            caught, _ = await failure(model_for(server))
    assert (caught.kind, caught.retryable) == ("cut_stream", True)


@pytest.mark.parametrize("chunked", [True, False], ids=["connection-reset", "clean-close"])
async def test_a_stream_cut_after_its_finish_keeps_the_answer_with_usage_unknown(chunked: bool) -> None:
    body = transcript("openai_text")
    cut = _before_usage_chunk(body)
    reply = stream(body, cut_after=cut) if chunked else stream(body[:cut], chunked=False)
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(reply) as server:
            _, turn = await collect(model_for(server))
    assert (turn.text, turn.finish_reason, turn.usage) == ("Your order A1 has shipped. ✓", "stop", None)


async def test_a_slow_stream_within_the_timeout() -> None:
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(stream(transcript("openai_text"), piece_bytes=300, delay_s=0.05)) as server:
            _, turn = await collect(model_for(server, timeout_s=5))
    assert turn.text == "Your order A1 has shipped. ✓"


async def test_a_server_silent_past_the_timeout() -> None:
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(stream(transcript("openai_text"), piece_bytes=300, delay_s=1.0)) as server:
            caught, _ = await failure(model_for(server, timeout_s=0.2))
    assert (caught.kind, caught.retryable) == ("timeout", True)


async def test_a_cancelled_stream_stops_at_once() -> None:
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(stream(transcript("openai_text"), piece_bytes=300, delay_s=5.0)) as server:
            events: list[Any] = []
            with trio.move_on_after(0.5) as scope:
                async with contextlib.aclosing(model_for(server).stream(REQUEST)) as stream_events:  # type: ignore[type-var]
                    async for event in stream_events:
                        events.append(event)
    assert scope.cancelled_caught and events == []


async def test_connection_refused() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with trio.fail_after(TIMEOUT_S):
        caught, _ = await failure(OpenAIChat("m", base_url=f"http://127.0.0.1:{port}/v1", api_key=""))
    assert (caught.kind, caught.retryable) == ("connection", True)
    assert f"127.0.0.1:{port}" in str(caught)


async def test_a_response_past_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openai_module, "MAX_RESPONSE_BYTES", 1000)
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(stream(transcript("openai_text"), piece_bytes=200)) as server:
            caught, _ = await failure(model_for(server))
    assert (caught.kind, caught.retryable) == ("response_too_large", False)


async def test_an_error_body_is_read_and_quoted_within_bounds() -> None:
    huge = {"error": {"message": "overloaded " + "x" * (2 * openai_module.MAX_ERROR_BODY_BYTES)}}
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(error(500, huge)) as server:
            caught, _ = await failure(model_for(server))
    assert (caught.kind, caught.retryable) == ("server_error", True)
    assert "x" * openai_module.MAX_ERROR_MESSAGE_CHARS not in str(caught)
    assert len(str(caught)) < openai_module.MAX_ERROR_MESSAGE_CHARS + len(server.url) + 100


async def test_a_page_that_is_not_an_event_stream() -> None:
    page = Reply(headers=(("content-type", "text/html; charset=utf-8"),), body=b"<html><body>Welcome</body></html>")
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(page) as server:
            caught, _ = await failure(model_for(server))
    assert (caught.kind, caught.retryable) == ("invalid_response", False)
    assert "text/html" in str(caught)


async def test_a_chunk_that_is_not_json() -> None:
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(stream(b'data: {"choices": [\n\n')) as server:
            caught, _ = await failure(model_for(server))
    assert (caught.kind, caught.retryable) == ("invalid_response", True)


# ------------------------------------------------------------------------------------------------ errors

RATE_LIMITED = {
    "error": {
        "message": "Rate limit reached for gpt-4o-mini on requests per min (RPM): Limit 3. Please try again in 20s.",
        "type": "requests",
        "param": None,
        "code": "rate_limit_exceeded",
    }
}


@pytest.mark.parametrize(
    ("reply", "kind", "retryable", "retry_after_ms", "quoted"),
    [
        (error(429, RATE_LIMITED, ("retry-after", "20")), "rate_limit", True, 20_000, "Rate limit reached"),
        (error(429, RATE_LIMITED, ("retry-after-ms", "1500")), "rate_limit", True, 1500, "HTTP 429 Too Many Requests"),
        (
            error(429, {"error": {"message": "You exceeded your current quota", "code": "insufficient_quota"}}),
            "quota_exceeded",
            False,
            None,
            "current quota",
        ),
        (
            error(500, {"error": {"message": "The server had an error", "type": "server_error"}}),
            "server_error",
            True,
            None,
            "HTTP 500",
        ),
        (error(503, {"error": "model is loading"}, ("retry-after", "5")), "overloaded", True, 5000, "model is loading"),
        (
            error(
                400,
                {
                    "error": {
                        "message": "This model's maximum context length is 128000 tokens. However, your messages "
                        "resulted in 130012 tokens. Please reduce the length of the messages.",
                        "type": "invalid_request_error",
                        "param": "messages",
                        "code": "context_length_exceeded",
                    }
                },
            ),
            "context_overflow",
            False,
            None,
            "maximum context length is 128000",
        ),
        (
            error(
                400,
                {
                    "error": {
                        "code": 400,
                        "message": "request (4476 tokens) exceeds the available context size (4096 tokens)",
                        "type": "exceed_context_size_error",
                        "n_prompt_tokens": 4476,
                        "n_ctx": 4096,
                    }
                },
            ),
            "context_overflow",
            False,
            None,
            "4476 tokens",
        ),
        (
            error(400, {"error": {"message": "Invalid 'tools[0].function.name'"}}),
            "bad_request",
            False,
            None,
            "HTTP 400",
        ),
        (error(403, {"error": {"message": "not allowed"}}), "permission_denied", False, None, "HTTP 403"),
        (error(404, {"error": {"message": "model 'gpt-9' not found"}}), "not_found", False, None, "gpt-9"),
        (
            error(422, {"detail": [{"loc": ["body", "model"], "msg": "Field required"}]}),
            "bad_request",
            False,
            None,
            "Field required",
        ),
        (stream(transcript("openai_error_mid_stream")), "server_error", True, None, "The server had an error"),
        (stream(transcript("vllm_error_mid_stream")), "context_overflow", False, None, "maximum context length"),
        (
            stream(b'event: error\ndata: {"message": "Overloaded", "code": 529}\n\n'),
            "overloaded",
            True,
            None,
            "Overloaded",
        ),
    ],
)
async def test_errors_are_classified(
    reply: Any, kind: str, retryable: bool, retry_after_ms: int | None, quoted: str
) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(reply) as server:
            caught, _ = await failure(model_for(server))
    assert (caught.kind, caught.retryable, caught.retry_after_ms) == (kind, retryable, retry_after_ms)
    assert quoted in str(caught)
    assert server.url in str(caught)


async def test_an_http_date_retry_after() -> None:
    import email.utils
    import time

    date = email.utils.formatdate(time.time() + 60, usegmt=True)
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(error(429, RATE_LIMITED, ("retry-after", date))) as server:
            caught, _ = await failure(model_for(server))
    assert caught.retry_after_ms is not None and 50_000 <= caught.retry_after_ms <= 61_000


async def test_the_api_key_is_never_in_an_error() -> None:
    echo = {
        "error": {
            "message": f"Incorrect API key provided: {KEY}.",
            "type": "invalid_request_error",
            "code": "invalid_api_key",
        }
    }
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(error(401, echo)) as server:
            caught, _ = await failure(model_for(server))
    assert (caught.kind, caught.retryable) == ("authentication", False)
    assert KEY not in str(caught) and "HTTP 401" in str(caught)


async def test_a_401_without_a_key_says_how_to_give_one() -> None:
    missing = {"error": {"message": "You didn't provide an API key.", "type": "invalid_request_error"}}
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(error(401, missing)) as server:
            caught, _ = await failure(OpenAIChat("gpt-4o-mini", base_url=server.url, api_key=""))
    assert caught.kind == "authentication" and "set OPENAI_API_KEY or pass api_key=" in str(caught)


async def test_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with openai_server(stream(transcript("llamacpp_text")), stream(transcript("llamacpp_text"))) as server:
            monkeypatch.setenv("OPENAI_BASE_URL", server.url)
            monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
            await collect(OpenAIChat("local"))
            await collect(OpenAIChat("local", api_key=""))  # a local server that wants no key
    assert server.requests[0].headers["authorization"] == "Bearer sk-env"
    assert "authorization" not in server.requests[1].headers
    assert server.requests[0].body["model"] == "local"


# ------------------------------------------------------------------------------------------------ end to end


async def run_in(client: actors.Client, run_id: str, status: str) -> None:
    while True:
        if (await client.run(run_id)).status == status:
            return
        await trio.sleep(0.05)


def _tool_call_turn() -> bytes:
    head = {"id": "chatcmpl-e2e1", "object": "chat.completion.chunk", "model": "gpt-4o-mini"}
    return sse(
        {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}]},
        {
            **head,
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_e2e1",
                                "type": "function",
                                "function": {"name": "lookup", "arguments": ""},
                            }
                        ]
                    },
                    "finish_reason": None,
                }
            ],
        },
        {
            **head,
            "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"order_'}}]}}],
        },
        {
            **head,
            "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": 'id": "A1"}'}}]}}],
        },
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {**head, "choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}},
    )


def _answer_turn() -> bytes:
    head = {"id": "chatcmpl-e2e2", "object": "chat.completion.chunk", "model": "gpt-4o-mini"}
    usage = {"prompt_tokens": 150, "completion_tokens": 8, "prompt_tokens_details": {"cached_tokens": 64}}
    return sse(
        {
            **head,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Order A1"}, "finish_reason": None}],
        },
        {**head, "choices": [{"index": 0, "delta": {"content": " has shipped."}, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {**head, "choices": [], "usage": usage},
    )


async def test_an_agent_on_openai_chat_under_tether_up(db_path: str, tmp_path: Path) -> None:
    """A run of an agent whose model is OpenAIChat (found from OPENAI_BASE_URL), under ``tether up`` with a manual
    clock: the first request is rate limited (429, Retry-After 2 s): the run waits durably in ``retry_wait`` until
    the owner's clock passes the delay, then the model calls the tool, the tool runs once, the model answers."""
    ledger = tmp_path / "ledger.jsonl"
    replies = (
        error(429, RATE_LIMITED, ("retry-after", "2")),
        stream(_tool_call_turn(), piece_bytes=40),
        stream(_answer_turn()),
    )
    with trio.fail_after(120):
        async with openai_server(*replies) as server:
            env = {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": KEY, "TETHER_TEST_LEDGER": str(ledger)}
            args = ("--workers", "1", "--clock", "manual", "--app", "tests.integration._openai_apps:app")
            async with tether_up(db_path, tmp_path, *args, env=env) as up:
                await up.wait_status(all_up(1), "the worker attached", timeout_s=60)
                async with actors.connect(db_path) as client:
                    conversation_id = await client.create_conversation(agent="support")
                    submission = await client.submit(
                        conversation_id, kind="input", payload="Where is A1?", request_id="r-1"
                    )
                    run_id = submission.run_id
                    assert run_id is not None
                    await run_in(client, run_id, "retry_wait")
                    [op] = await client.operations(run_id)
                    assert (op.kind, op.status, op.attempt) == ("model", "failed", 1)
                    assert op.error is not None and op.error.startswith("rate_limit: ") and "HTTP 429" in op.error
                    assert len(server.requests) == 1
                    # the delay is the server's 2 s (above the policy's 1 s); the advance's batch commits what fell due
                    await client.advance_clock(1999)
                    assert (await client.run(run_id)).status == "retry_wait" and len(server.requests) == 1
                    await client.advance_clock(1)
                    run = await client.wait_for_run(run_id)
                    entries = await client.entries(conversation_id)
                    operations = await client.operations(run_id)
                    by_model = await client.usage()
            await up.assert_everything_gone()
    assert run.status == "completed"
    assert run.answer is not None and run.answer.text == "Order A1 has shipped."
    assert run.usage == actors.RunUsage(input_tokens=250, output_tokens=18, cached_tokens=64, unpriced_tokens=268)
    assert by_model["gpt-4o-mini"] == run.usage
    assert [(op.kind, op.status, op.attempt) for op in operations] == [
        ("model", "completed", 2),
        ("tool", "completed", 1),
        ("model", "completed", 1),
    ]
    assert [(line["tool"], line["args"]) for line in read_ledger(ledger)] == [("lookup", {"order_id": "A1"})]
    kinds = [(entry.kind, entry.data) for entry in entries]
    assert [kind for kind, _ in kinds] == ["tether.user", "tether.assistant", "tether.tool_result", "tether.assistant"]
    assert kinds[1][1]["tool_calls"] == [{"call_id": "call_e2e1", "name": "lookup", "arguments": {"order_id": "A1"}}]
    assert kinds[2][1]["call_id"] == "call_e2e1" and kinds[2][1]["is_error"] is False
    assert "shipped" in kinds[2][1]["content"]
    # The last request carried the call and its result back to the model, with the key from the environment.
    last = server.requests[-1]
    assert last.headers["authorization"] == f"Bearer {KEY}"
    assert last.body["messages"][2:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_e2e1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"order_id": "A1"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_e2e1", "content": kinds[2][1]["content"]},
    ]
    assert len(server.requests) == 3
