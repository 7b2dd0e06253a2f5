"""How long ``tether stop`` takes, idle and with a tool call in flight (issue 16: a stop drains).

Each round starts ``tether up --workers 1`` on a fresh database serving ``_stop_app:app``, whose ``manual`` tool
sleeps ``--tool-s`` seconds, and times ``tether stop`` from its launch to its exit: (a) idle, the baseline measured in
the same run; (b) with the tool in flight, stopped ``--stop-after-s`` into the call. Drained, (b) takes the tool's
remaining time plus about what (a) takes; the run must then be intact: its tool call ``completed`` once, never
``interrupted``. Prints the medians and the overhead of (b) beyond the tool's remaining time, as a ratio of (a).

    python bench/stop.py [--json] [--rounds 3] [--tool-s 2] [--stop-after-s 0.5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import trio
from _common import bench_env

import actors
from runtime import stop_gracefully, tether_command


async def _attached(db: str) -> None:
    while True:
        try:
            with trio.fail_after(2):
                async with actors.connect(db=db, role="reader", reconnect=False) as client:
                    if any(peer.role == "worker" and peer.announced for peer in await client.peers()):
                        return
        except (actors.TetherError, trio.TooSlowError, OSError):
            pass
        await trio.sleep(0.02)


async def measure_round(directory: str, tool_s: float, stop_after_s: float, busy: bool) -> tuple[float, float]:
    """(seconds from ``tether stop`` to its exit, the tool's remaining seconds at the stop: 0 when idle)."""
    db = os.path.join(directory, f"stop-{time.monotonic_ns()}.db")
    started_file = db + ".started"
    env = bench_env(TETHER_BENCH_STARTED=started_file, TETHER_BENCH_TOOL_S=str(tool_s))
    command = tether_command("up", "--db", db, "--app", "_stop_app:app", "--workers", "1")
    up = await trio.lowlevel.open_process(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        with trio.fail_after(60):
            await _attached(db)
            remaining_s = 0.0
            if busy:
                async with actors.connect(db=db) as client:
                    conversation_id = await client.create_conversation(agent="banker")
                    submission = await client.submit(
                        conversation_id, kind="input", payload="move 5", request_id=actors.new_id()
                    )
                while not os.path.exists(started_file):
                    await trio.sleep(0.005)
                tool_started = float(Path(started_file).read_text().split()[0])
                await trio.sleep(stop_after_s)
            began = time.perf_counter()
            if busy:
                remaining_s = max(0.0, tool_started + tool_s - time.time())
            await trio.run_process(tether_command("stop", "--db", db), stdout=subprocess.DEVNULL, env=env)
            took_s = time.perf_counter() - began
            await up.wait()
    finally:
        await stop_gracefully(up)
    if busy:  # the run must be intact: its tool completed once, never interrupted
        check = await trio.lowlevel.open_process(
            tether_command("up", "--db", db, "--app", "_stop_app:app", "--workers", "1"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        try:
            with trio.fail_after(60):
                async with actors.connect(db=db, wait_for_owner_s=30) as client:
                    assert submission.run_id is not None
                    run = await client.wait_for_run(submission.run_id)
                    ops = await client.operations(submission.run_id)
            assert run.status == "completed", run
            assert [(op.kind, op.status, op.attempt) for op in ops if op.kind == "tool"] == [("tool", "completed", 1)]
            assert len(Path(started_file).read_text().split()) == 1, "the tool ran more than once"
        finally:
            await stop_gracefully(check)
    return took_s, remaining_s


async def main(rounds: int, tool_s: float, stop_after_s: float) -> dict[str, float]:
    idle: list[float] = []
    busy: list[float] = []
    overhead: list[float] = []
    with tempfile.TemporaryDirectory() as directory:
        for _ in range(rounds):  # alternating, so the machine's load falls on both alike
            took_s, _ = await measure_round(directory, tool_s, stop_after_s, busy=False)
            idle.append(took_s)
            took_s, remaining_s = await measure_round(directory, tool_s, stop_after_s, busy=True)
            busy.append(took_s)
            overhead.append(took_s - remaining_s)
    idle_s = statistics.median(idle)
    return {
        "rounds": rounds,
        "tool_s": tool_s,
        "stop_after_s": stop_after_s,
        "stop_idle_s": round(idle_s, 3),
        "stop_tool_in_flight_s": round(statistics.median(busy), 3),
        "beyond_the_tool_s": round(statistics.median(overhead), 3),
        "beyond_the_tool_vs_idle": round(statistics.median(overhead) / idle_s, 2),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tool-s", type=float, default=2.0)
    parser.add_argument("--stop-after-s", type=float, default=0.5)
    args = parser.parse_args()
    result = trio.run(main, args.rounds, args.tool_s, args.stop_after_s)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:24} {value}")
