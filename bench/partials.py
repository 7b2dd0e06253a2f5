"""The cost of partial output: appends per second of an unrelated client while 16 runs stream, against its rate
alone, in the same run; with pieces every 100 ms (the default) and with none before the result (interval 0).

    python bench/partials.py [--json] [--seconds 3] [--runs 16]

Each variant starts an owner and one worker on ``_steps_app:app`` (agent ``bench-stream``: a scripted model that
streams 2,000 characters, 16 to a delta every 10 ms, then calls a tool, for 10 turns), then measures the appends
per second of 8 concurrent appenders on one client: first alone, then while ``--runs`` runs stream. ``pieces`` is
how many partial records the owner committed during the loaded window (read from a watch of everything).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from _common import bench_env, owner_and_worker

import actors
from protocol import PartialRecord

HERE = Path(__file__).parent
APPENDERS = 8
STREAM_AGENT = "bench-stream"


async def _appends_per_s(client: actors.Client, conversation_id: str, seconds: float) -> float:
    count = 0
    deadline = time.perf_counter() + seconds

    async def appender() -> None:
        nonlocal count
        while time.perf_counter() < deadline:
            await client.append(conversation_id, kind="bench.note", data={"n": count})
            count += 1

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(APPENDERS):
            nursery.start_soon(appender)
    return count / (time.perf_counter() - started)


async def variant(directory: str, name: str, interval_ms: int, runs: int, seconds: float) -> dict[str, Any]:
    db = os.path.join(directory, f"{name}.db")
    env = bench_env(BENCH_PARTIAL_INTERVAL_MS=str(interval_ms))
    async with owner_and_worker(db, env):
        with trio.fail_after(300):
            async with actors.connect(db=db, wait_for_owner_s=30) as client:
                notes = await client.create_conversation()
                await _appends_per_s(client, notes, 0.5)  # warm
                alone = await _appends_per_s(client, notes, seconds)
                conversations = [await client.create_conversation(agent=STREAM_AGENT) for _ in range(runs)]
                run_ids = [
                    str((await client.submit(c, kind="input", payload="go", request_id="bench")).run_id)
                    for c in conversations
                ]
                while not (read := await client.partials(run_id=run_ids[-1])).partials:
                    await trio.sleep(0.05)  # the streams have begun
                pieces = 0

                async def count_pieces() -> None:
                    nonlocal pieces
                    async with client.watch(from_seq=read.seq) as changes:
                        async for change in changes:
                            pieces += sum(isinstance(r, PartialRecord) for r in change.records)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(count_pieces)
                    loaded = await _appends_per_s(client, notes, seconds)
                    nursery.cancel_scope.cancel(reason="measured")
                busy = [run_id for run_id in run_ids if (await client.run(run_id)).status != "completed"]
    return {
        "partial_interval_ms": interval_ms,
        "appends_per_s_alone": round(alone, 1),
        "appends_per_s_while_streaming": round(loaded, 1),
        "ratio": round(loaded / alone, 3),
        "pieces_committed_per_s": round(pieces / seconds, 1),
        "runs_still_streaming_at_end": len(busy),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each measurement window (3)")
    parser.add_argument("--runs", type=int, default=16, help="runs streaming at once (16)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        result = {
            "pieces_every_100_ms": await variant(directory, "pieces", 100, args.runs, args.seconds),
            "no_pieces": await variant(directory, "none", 0, args.runs, args.seconds),
        }
    if args.json:
        print(json.dumps(result))
    else:
        for name, figures in result.items():
            print(name, figures)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    trio.run(main)
