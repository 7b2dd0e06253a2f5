"""What ``actors.OpenAIChat`` costs per streamed chunk, against what any client must spend anyway.

- ``decode``: a recorded-format stream of ``--chunks`` chunks (text deltas, then a tool call's argument fragments,
  the finish and the usage chunk) through :class:`SSEParser` and :class:`ChatStreamDecoder` (sans-IO, the adapter's
  whole parsing), against the baseline of ``json.loads`` of each chunk alone. The ratio is the adapter's overhead.
- ``http``: the same stream served by the tests' replay server on loopback (``actors/testing/_openai.py``,
  in this process) and read by ``OpenAIChat.stream`` into a :class:`TurnBuilder`, against the baseline of httpx
  reading the same body's bytes from the same server.

Chunks per second (best of ``--rounds``); a model streams tens to a few hundred chunks per second, so the figure to
read is how far above that the adapter stays. ``python bench/openai_stream.py [--json] [--chunks 20000]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from actors import ModelRequest, OpenAIChat, TurnBuilder, UserMessage  # noqa: E402
from actors._models._openai_wire import ChatStreamDecoder, SSEParser  # noqa: E402
from actors.testing import openai_server  # noqa: E402
from actors.testing import sse_body as sse  # noqa: E402
from actors.testing import stream_reply as stream  # noqa: E402

HEAD = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1764540000, "model": "gpt-4o-mini"}


def body(chunks: int) -> bytes:
    """``chunks`` chunks: three quarters text deltas, then one tool call's argument fragments, finish, usage."""
    text = chunks * 3 // 4
    parts: list[dict[str, Any]] = [
        {**HEAD, "choices": [{"index": 0, "delta": {"content": f" word{n}"}, "finish_reason": None}], "usage": None}
        for n in range(text)
    ]
    start = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"n": "'}}
    parts.append({**HEAD, "choices": [{"index": 0, "delta": {"tool_calls": [start]}, "finish_reason": None}]})
    for _ in range(chunks - text - 3):
        fragment = {"index": 0, "function": {"arguments": "x"}}
        parts.append({**HEAD, "choices": [{"index": 0, "delta": {"tool_calls": [fragment]}, "finish_reason": None}]})
    fragment = {"index": 0, "function": {"arguments": '"}'}}
    parts.append(
        {**HEAD, "choices": [{"index": 0, "delta": {"tool_calls": [fragment]}, "finish_reason": "tool_calls"}]}
    )
    parts.append({**HEAD, "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": chunks}})
    return sse(*parts)


def decode_rate(data: bytes, chunks: int, rounds: int) -> tuple[float, float]:
    """(adapter chunks/s, json.loads-only chunks/s), best of ``rounds``."""
    lines = [line[6:] for line in data.split(b"\n") if line.startswith(b"data: {")]
    adapter = baseline = 0.0
    for _ in range(rounds):
        started = time.perf_counter()
        for line in lines:
            json.loads(line)
        baseline = max(baseline, chunks / (time.perf_counter() - started))
        started = time.perf_counter()
        parser, decoder = SSEParser(), ChatStreamDecoder()
        builder = TurnBuilder()
        for piece in range(0, len(data), 16384):  # as the network delivers it
            for _, text in parser.feed(data[piece : piece + 16384]):
                if text != "[DONE]":
                    for event in decoder.feed(json.loads(text)):
                        builder.feed(event)
        for event in decoder.end():
            builder.feed(event)
        builder.result()
        adapter = max(adapter, chunks / (time.perf_counter() - started))
    return adapter, baseline


async def http_rate(data: bytes, chunks: int, rounds: int) -> tuple[float, float]:
    """(OpenAIChat chunks/s, httpx raw-bytes chunks/s) over loopback, best of ``rounds``."""
    request = ModelRequest(model="gpt-4o-mini", instructions="", messages=(UserMessage(text="go"),))
    adapter = baseline = 0.0
    replies = [stream(data) for _ in range(2 * rounds)]
    async with openai_server(*replies) as server:
        model = OpenAIChat("gpt-4o-mini", base_url=server.url, api_key="")
        for _ in range(rounds):
            started = time.perf_counter()
            async with httpx.AsyncClient() as client, client.stream("POST", model.url, json={}) as response:
                received = 0
                async for piece in response.aiter_bytes():
                    received += len(piece)
            assert received == len(data)
            baseline = max(baseline, chunks / (time.perf_counter() - started))
            started = time.perf_counter()
            builder = TurnBuilder()
            async with contextlib.aclosing(model.stream(request)) as events:  # type: ignore[type-var]
                async for event in events:
                    builder.feed(event)
            assert len(builder.result().tool_calls) == 1
            adapter = max(adapter, chunks / (time.perf_counter() - started))
    return adapter, baseline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    data = body(args.chunks)
    decode, loads = decode_rate(data, args.chunks, args.rounds)
    http, raw = trio.run(http_rate, data, args.chunks, args.rounds)
    result = {
        "chunks": args.chunks,
        "body_bytes": len(data),
        "decode_chunks_per_s": round(decode),
        "json_loads_chunks_per_s": round(loads),
        "decode_vs_json_loads": round(decode / loads, 3),
        "http_chunks_per_s": round(http),
        "httpx_raw_chunks_per_s": round(raw),
        "http_vs_httpx_raw": round(http / raw, 3),
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"{args.chunks} chunks, {len(data):,} bytes")
    print(f"decode:  {decode:12,.0f} chunks/s   json.loads alone {loads:12,.0f} /s   ratio {decode / loads:.2f}")
    print(f"http:    {http:12,.0f} chunks/s   httpx raw bytes  {raw:12,.0f} /s   ratio {http / raw:.2f}")


if __name__ == "__main__":
    main()
