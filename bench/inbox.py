"""What the inbox costs (issue 18): the owner's CPU per submission of each kind, and how soon a steer is placed once
a tool round ends, each against a plain commit measured in the same run.

One ``tether owner`` on a fresh database; the clients and a worker serving ``_inbox_app:app`` run in this process.

- **Owner CPU per request** (``/proc/PID/task/*/schedstat``, every thread of the owner), ``--count`` requests one
  after the other: the baseline is ``append`` (one entry); then a ``write`` submission (an entry and its record), an
  ``input`` that starts a run (a submission, a run, its task and its user entry; its agent has no worker, so nothing
  runs it), and a ``steer`` to a conversation whose run waits on a tool call (a submission queued in the inbox).
- **Steer latency**, ``--rounds`` times: a run's tool call waits; a steer is submitted; the tool call is let go, and
  the time is taken from then until a watch of the conversation sees the steer ``placed`` (the tool's result commit,
  the boundary's placement in the same commit, the fan-out). The baseline: from an ``append`` sent until the same
  watch sees the entry.

    python bench/inbox.py [--json] [--count 2000] [--rounds 50]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import trio
from _common import bench_env
from _inbox_app import HELD, app

import actors
from protocol import EntryRecord, SubmissionRecord
from runtime import stop_gracefully, tether_command, wait_for_owner

STEERS_PER_CONVERSATION: Final = 500
"""Steers measured per held conversation: under the inbox's bound of 1000 waiting."""


def cpu_ns(pid: int) -> int:
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as file:
                total += int(file.read().split()[0])
        except OSError:
            pass
    return total


async def owner_us_per(pid: int, count: int, one: Callable[[int], Awaitable[Any]]) -> float:
    """The owner's CPU per call of ``one`` (microseconds), over ``count`` calls one after the other."""
    before = cpu_ns(pid)
    for n in range(count):
        await one(n)
    return (cpu_ns(pid) - before) / count / 1000


async def request_costs(client: actors.Client, pid: int, count: int) -> dict[str, float]:
    plain = await client.create_conversation()
    busy: list[str] = []  # a conversation whose run holds, for every STEERS_PER_CONVERSATION steers (its inbox bound)
    for _ in range(-(-count // STEERS_PER_CONVERSATION)):
        conversation_id = await client.create_conversation(agent="steerable")
        await client.submit(conversation_id, kind="input", payload="hold on")
        await HELD.started(conversation_id)
        busy.append(conversation_id)

    async def append(n: int) -> Any:
        return await client.append(plain, kind="app.note", data={"n": n})

    async def write(n: int) -> Any:
        return await client.submit(plain, kind="write", payload={"kind": "app.note", "data": {"n": n}})

    async def start(n: int) -> Any:
        conversation_id = await client.create_conversation(agent="nobody")  # a commit of its own, measured apart
        return conversation_id

    async def steer(n: int) -> Any:
        conversation_id = busy[n // STEERS_PER_CONVERSATION]
        return await client.submit(conversation_id, kind="input", payload=f"steer {n}", when_busy="steer")

    costs = {"append_us": await owner_us_per(pid, count, append)}
    costs["write_us"] = await owner_us_per(pid, count, write)
    conversations = []
    created_us = await owner_us_per(pid, count, lambda n: _keep(conversations, start(n)))
    inputs = iter(conversations)
    runs: list[str] = []
    costs["input_us"] = await owner_us_per(
        pid, count, lambda n: _keep_run(runs, client.submit(next(inputs), kind="input", payload="hello"))
    )
    for run_id in runs:  # their agent has no worker: pending, they would hold the owner's run capacity
        await client.cancel_run(run_id)
    costs["create_conversation_us"] = created_us
    costs["steer_us"] = await owner_us_per(pid, count, steer)
    for conversation_id in busy:
        HELD.release(conversation_id)
    return costs


async def _keep_run(into: list[str], made: Awaitable[SubmissionRecord]) -> None:
    submission = await made
    assert submission.run_id is not None
    into.append(submission.run_id)


async def _keep(into: list[str], made: Awaitable[str]) -> str:
    value = await made
    into.append(value)
    return value


async def steer_latency(client: actors.Client, rounds: int) -> tuple[list[float], list[float]]:
    """(seconds from a tool call let go until its steer is seen placed, seconds from an append until it is seen),
    one of each per round."""
    steered: list[float] = []
    appended: list[float] = []
    for _ in range(rounds):
        conversation_id = await client.create_conversation(agent="steerable")
        async with client.watch(conversation_id=conversation_id) as changes:
            await client.submit(conversation_id, kind="input", payload="hold on")
            await HELD.started(conversation_id)
            steer = await client.submit(conversation_id, kind="input", payload="and this", when_busy="steer")
            let_go = time.perf_counter()
            HELD.release(conversation_id)
            async for change in changes:
                if any(
                    isinstance(r, SubmissionRecord) and r.submission_id == steer.submission_id and r.status == "placed"
                    for r in change.records
                ):
                    steered.append(time.perf_counter() - let_go)
                    break
            sent = time.perf_counter()
            seq = await client.append(conversation_id, kind="app.note", data={})
            async for change in changes:
                if change.seq == seq and any(isinstance(r, EntryRecord) for r in change.records):
                    appended.append(time.perf_counter() - sent)
                    break
        await client.wait_for_submission(steer.submission_id)
    return steered, appended


def quantiles_ms(values: list[float]) -> dict[str, float]:
    cuts = statistics.quantiles(values, n=10)
    return {"p50_ms": statistics.median(values) * 1000, "p90_ms": cuts[8] * 1000}


async def main(count: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as directory:
        db = os.path.join(directory, "inbox.db")
        owner = await trio.lowlevel.open_process(
            tether_command("owner", "--db", db), stdout=subprocess.DEVNULL, env=bench_env()
        )
        try:
            await wait_for_owner(db, owner)
            async with trio.open_nursery() as nursery:
                await nursery.start(_serve, db)
                async with actors.connect(db=db) as client:
                    costs = await request_costs(client, owner.pid, count)
                    steered, appended = await steer_latency(client, rounds)
                nursery.cancel_scope.cancel()
        finally:
            await stop_gracefully(owner)
    steer_ms, append_ms = quantiles_ms(steered), quantiles_ms(appended)
    return {
        "count": count,
        "rounds": rounds,
        "owner_cpu_us": {key: round(value, 1) for key, value in costs.items()},
        "owner_cpu_vs_append": {
            key.removesuffix("_us"): round(value / costs["append_us"], 2)
            for key, value in costs.items()
            if key != "append_us"
        },
        "steer_placed_after_round_ms": {key: round(value, 2) for key, value in steer_ms.items()},
        "append_seen_ms": {key: round(value, 2) for key, value in append_ms.items()},
        "steer_vs_append_p50": round(steer_ms["p50_ms"] / append_ms["p50_ms"], 2),
    }


async def _serve(db: str, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    await actors.serve(app, db=db, name="bench-inbox", log=lambda line: None, task_status=task_status)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000, help="requests of each kind (default 2000)")
    parser.add_argument("--rounds", type=int, default=50, help="steers timed (default 50)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    result = trio.run(main, args.count, args.rounds)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:30} {value}")
