"""``bench/steps.py --variant stream``: the owner's overhead per step while 16 runs stream, and what that load costs
an unrelated client.

An owner and one worker on ``_steps_app:app`` (agent ``bench-stream-steps``: each turn streams text, a delta every
20 ms and a partial piece committed every 100 ms, then calls the tool ``stamp``). In one run:

- alone, before: an unrelated client (the writer process of ``bench/commit_throughput.py``: its own connection and
  conversations, ``WRITER_ACTORS`` actors appending) for ``seconds``; nothing else runs.
- loaded: ``runs`` runs submitted at once (one conversation each); once every one has begun to stream, the same
  writer again for ``seconds``, while they stream and step. Then every run is waited for.
- alone, after: the writer once more. The ratio is the loaded rate over the mean of the two alone, so a drift of
  the machine's load over the run shows as a gap between them rather than passing for a cost.

The owner's and the worker's CPU (``/proc``, seconds per second of the window) say how much of the machine the
streams took.

The overhead per step is, for every tool call of every run, the gap between the end of the model stream that asked
for it and the start of its handler, both read in the worker process (``time.monotonic()``): the model result's
commit, the owner's tool task and its lease, the handler's start. ``steps_in_window`` counts those whose stream
ended while the writer ran; the warm-up run (one run alone, before anything else) gives the same gap without the
load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

import trio
from _common import bench_env, cpu_s, owner_and_worker

import actors

HERE: Final = Path(__file__).parent
WRITER: Final = str(HERE / "_writer.py")
WRITER_ACTORS: Final = 16
WRITER_START_S: Final = 1.5
"""Time for the writer process to start, connect and create its conversations before its window opens."""
AGENT: Final = "bench-stream-steps"


def percentile_ms(sorted_s: list[float], fraction: float) -> float:
    index = min(len(sorted_s) - 1, round(fraction * (len(sorted_s) - 1)))
    return round(sorted_s[index] * 1000, 2)


async def _writer(url: str, token: str, seconds: float) -> tuple[float, float, float]:
    """Run the writer process; return its appends per second and its window (start, end) on this machine's
    ``time.time()``."""
    start_at = time.time() + WRITER_START_S
    process = await trio.lowlevel.open_process(
        [sys.executable, WRITER, url, token, str(WRITER_ACTORS), str(start_at), str(seconds)], stdout=subprocess.PIPE
    )
    assert process.stdout is not None
    chunks = []
    while chunk := await process.stdout.receive_some(1 << 20):
        chunks.append(chunk)
    if await process.wait() != 0:
        raise RuntimeError(f"the writer process failed with status {process.returncode}")
    output = json.loads(b"".join(chunks))
    return output["commits"] / seconds, start_at, start_at + seconds


async def _submit(client: actors.Client, runs: int) -> list[str]:
    conversations = [await client.create_conversation(agent=AGENT) for _ in range(runs)]
    run_ids = []
    for index, conversation in enumerate(conversations):
        submitted = await client.submit(conversation, kind="input", payload=f"run-{index}", request_id="bench")
        assert submitted.run_id is not None
        run_ids.append(submitted.run_id)
    for run_id in run_ids:  # every run streams before the window opens
        while not (await client.partials(run_id=run_id)).partials:
            await trio.sleep(0.05)
    return run_ids


async def _gaps(client: actors.Client, run_ids: list[str], turns: int) -> list[tuple[float, float]]:
    """Every step's (stream end, tool start), worker-monotonic seconds, after every run completed."""
    stamps = []
    for run_id in run_ids:
        record = await client.wait_for_run(run_id)
        assert record.status == "completed", record
        for operation in await client.operations(run_id):
            if operation.kind == "tool" and operation.status == "completed":
                result: Any = operation.result
                assert result["stream_ended_s"] is not None, operation
                stamps.append((float(result["stream_ended_s"]), float(result["started_s"])))
    assert len(stamps) == len(run_ids) * turns, (len(stamps), len(run_ids), turns)
    return stamps


class _Window:
    """The writer's appends/s in one window, and the owner's and the worker's CPU share (of one core) meanwhile."""

    def __init__(self, owner: int, worker: int) -> None:
        self.pids = (owner, worker)
        self.appends_per_s = 0.0
        self.cpu_share = (0.0, 0.0)

    async def measure(self, url: str, token: str, seconds: float) -> tuple[float, float]:
        """Run the writer; return its window (start, end) on ``time.time()``."""
        before = [cpu_s(pid) for pid in self.pids]
        started = time.perf_counter()
        self.appends_per_s, window_start, window_end = await _writer(url, token, seconds)
        elapsed = time.perf_counter() - started  # the writer's start-up included, for both windows alike
        after = [cpu_s(pid) for pid in self.pids]
        self.cpu_share = (round((after[0] - before[0]) / elapsed, 2), round((after[1] - before[1]) / elapsed, 2))
        return window_start, window_end


async def measure(directory: str, runs: int, seconds: float, turns: int) -> dict[str, Any]:
    db = os.path.join(directory, "stream.db")
    async with owner_and_worker(db, bench_env(BENCH_STEP_STREAM_TURNS=str(turns))) as (owner, worker, info):
        with trio.fail_after(600):
            before, loaded, after = (_Window(owner.pid, worker.pid) for _ in range(3))
            async with actors.connect(db=db, wait_for_owner_s=30) as client:
                # The worker is attached and warm; one run alone gives the overhead per step without the load.
                single = sorted(start - end for end, start in await _gaps(client, await _submit(client, 1), turns))
                await before.measure(info.url, info.token, seconds)
                started = time.perf_counter()
                run_ids = await _submit(client, runs)
                window_start, window_end = await loaded.measure(info.url, info.token, seconds)
                mono_offset = time.time() - time.monotonic()  # CLOCK_MONOTONIC is the machine's: the worker's too
                stamps = await _gaps(client, run_ids, turns)
                elapsed = time.perf_counter() - started
                await after.measure(info.url, info.token, seconds)
    gaps = sorted(start - end for end, start in stamps)
    in_window = sorted(start - end for end, start in stamps if window_start <= end + mono_offset <= window_end)
    alone = (before.appends_per_s + after.appends_per_s) / 2
    result: dict[str, Any] = {
        "runs": runs,
        "turns_per_run": turns,
        "steps": len(gaps),
        "step_overhead_p50_ms": percentile_ms(gaps, 0.50),
        "step_overhead_p99_ms": percentile_ms(gaps, 0.99),
        "step_overhead_max_ms": round(gaps[-1] * 1000, 2),
        "steps_in_window": len(in_window),
        "step_overhead_p50_ms_one_run_alone": percentile_ms(single, 0.50),
        "writer_actors": WRITER_ACTORS,
        "appends_per_s_alone_before": round(before.appends_per_s, 1),
        "appends_per_s_while_streaming": round(loaded.appends_per_s, 1),
        "appends_per_s_alone_after": round(after.appends_per_s, 1),
        "ratio": round(loaded.appends_per_s / alone, 3),
        "owner_worker_cpu_alone_before": before.cpu_share,
        "owner_worker_cpu_while_streaming": loaded.cpu_share,
        "runs_wall_s": round(elapsed, 2),
    }
    if in_window:
        result["step_overhead_p50_ms_in_window"] = percentile_ms(in_window, 0.50)
        result["step_overhead_p99_ms_in_window"] = percentile_ms(in_window, 0.99)
    return result
