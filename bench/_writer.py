"""A benchmark writer process: ``ACTORS`` trio tasks appending through one ``actors.connect`` client.

Usage: python bench/_writer.py URL TOKEN ACTORS START_AT_UNIX_S DURATION_S
Prints one JSON object: acknowledged commits and every latency in microseconds.
"""

from __future__ import annotations

import json
import sys
import time

import trio

import actors


async def main(url: str, token: str, actor_count: int, start_at: float, duration_s: float) -> None:
    latencies_us: list[int] = []
    async with actors.connect(url=url, token=token, name="bench-writer") as client:
        conversations = [await client.create_conversation() for _ in range(actor_count)]
        await trio.sleep(max(0.0, start_at - time.time()))
        deadline = time.perf_counter() + duration_s

        async def actor(conversation_id: str) -> None:
            data = {"text": "x" * 64}
            while (started := time.perf_counter()) < deadline:
                await client.append(conversation_id, kind="bench.note", data=data)
                latencies_us.append(int((time.perf_counter() - started) * 1e6))

        async with trio.open_nursery() as nursery:
            for conversation_id in conversations:
                nursery.start_soon(actor, conversation_id)
    print(json.dumps({"commits": len(latencies_us), "latencies_us": latencies_us}))


if __name__ == "__main__":
    url, token, actor_count, start_at, duration_s = sys.argv[1:6]
    trio.run(main, url, token, int(actor_count), float(start_at), float(duration_s))
