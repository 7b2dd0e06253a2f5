"""Recovery under ``tether up``: SIGKILL the owner N times while a client keeps appending, and measure from each
kill to the first append acknowledged by the restarted owner.

The client appends one entry at a time, retrying an entry under the same id after a lost connection until it is
known to have landed (acknowledged, or ``Duplicate`` on a retry). Each owner runs ``--hold`` seconds (longer than
the supervisor's ``STABLE_AFTER_S``, as in the issue's soak where each owner ran for several seconds) before it is
killed. At the end every acknowledged entry is checked to be stored exactly once. The baseline, measured in the same
run, is the time to start one interpreter that imports the project: a restart cannot be faster than that.

    python bench/recovery.py [--json] [--kills 20] [--hold 3] [--workers 0]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time

import trio
from _common import import_baseline_s

import actors
from protocol import OwnerUnavailable, read_runtime
from runtime import stop_gracefully, tether_command


class Appender:
    """Appends one entry at a time through one reconnecting client; records when each was acknowledged."""

    def __init__(self, db: str, conversation_id: str) -> None:
        self.db = db
        self.conversation_id = conversation_id
        self.acked: dict[str, int] = {}
        self.acks: list[tuple[float, int]] = []
        """(perf_counter when acknowledged, the client's reconnect count then), in order."""
        self.client: actors.Client | None = None

    async def run(self, stop: trio.Event) -> None:
        async with actors.connect(db=self.db) as client:
            self.client = client
            while not stop.is_set():
                entry_id = actors.new_id()
                retried = False
                while True:
                    try:
                        seq = await client.append(self.conversation_id, kind="bench.n", data=1, entry_id=entry_id)
                    except (actors.ConnectionLost, actors.OwnerUnavailable):
                        retried = True
                        continue
                    except actors.Duplicate:
                        assert retried, f"Duplicate for {entry_id} on its first attempt"
                        seq = 0
                    break
                self.acked[entry_id] = seq
                self.acks.append((time.perf_counter(), client.reconnects))


def _owner_pid(db: str) -> int | None:
    try:
        return read_runtime(db).pid
    except OwnerUnavailable:
        return None


async def _first_answer_after(appender: Appender, killed_at: float, reconnects_before: int) -> float:
    """Seconds from the kill to the first acknowledgement over a new connection (to the restarted owner)."""
    while True:
        for acked_at, reconnects in reversed(appender.acks):
            if acked_at < killed_at:
                break
            if reconnects > reconnects_before:
                earliest = min(at for at, count in appender.acks if at >= killed_at and count > reconnects_before)
                return earliest - killed_at
        await trio.sleep(0.002)


async def _listening_after(db: str, killed_pid: int, killed_at: float) -> float:
    """Seconds from the kill until the runtime file names a new owner (it listens)."""
    while True:
        pid = _owner_pid(db)
        if pid is not None and pid != killed_pid:
            return time.perf_counter() - killed_at
        await trio.sleep(0.002)


async def run(kills: int, hold_s: float, workers: int) -> dict[str, object]:
    baseline = import_baseline_s()
    recoveries: list[float] = []
    listening: list[float] = []
    with tempfile.TemporaryDirectory(prefix="tether-bench-recovery-") as directory:
        db = os.path.join(directory, "recovery.db")
        process = await trio.lowlevel.open_process(
            tether_command("up", "--db", db, "--workers", str(workers), "--max-restarts", str(kills * 2 + 10)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            with trio.fail_after(60 + kills * (hold_s + 15)):
                while _owner_pid(db) is None:
                    await trio.sleep(0.01)
                async with actors.connect(db=db) as client:
                    conversation_id = await client.create_conversation()
                appender = Appender(db, conversation_id)
                stop = trio.Event()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(appender.run, stop)
                    while appender.client is None or not appender.acks:
                        await trio.sleep(0.01)
                    for _ in range(kills):
                        await trio.sleep(hold_s)
                        pid = _owner_pid(db)
                        assert pid is not None
                        reconnects_before = appender.client.reconnects
                        killed_at = time.perf_counter()
                        os.kill(pid, signal.SIGKILL)
                        listening.append(await _listening_after(db, pid, killed_at))
                        recoveries.append(await _first_answer_after(appender, killed_at, reconnects_before))
                    stop.set()
                async with actors.connect(db=db, role="reader") as reader:
                    stored = await reader.entries(conversation_id)
        finally:
            await stop_gracefully(process)
    counts = collections.Counter(entry.entry_id for entry in stored)
    missing = set(appender.acked) - set(counts)
    doubled = [entry_id for entry_id, count in counts.items() if count > 1]
    ordered = sorted(recoveries)
    p50 = statistics.median(ordered)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return {
        "benchmark": "recovery",
        "kills": kills,
        "hold_s": hold_s,
        "workers": workers,
        "baseline_python_import_s": round(baseline, 3),
        "kill_to_first_answer_p50_s": round(p50, 3),
        "kill_to_first_answer_p90_s": round(p90, 3),
        "kill_to_first_answer_max_s": round(ordered[-1], 3),
        "p50_ratio_to_baseline": round(p50 / baseline, 2),
        "kill_to_owner_listening_p50_s": round(statistics.median(listening), 3),
        "acknowledged": len(appender.acked),
        "missing": len(missing),
        "doubled": len(doubled),
        "all_s": [round(value, 3) for value in recoveries],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--kills", type=int, default=20, help="owner SIGKILLs (default 20)")
    parser.add_argument("--hold", type=float, default=3.0, help="seconds each owner runs before its kill (default 3)")
    parser.add_argument("--workers", type=int, default=0, help="workers under tether up (default 0)")
    args = parser.parse_args()
    result = trio.run(run, args.kills, args.hold, args.workers)
    if args.json:
        print(json.dumps(result))
        return
    print(f"recovery: {args.kills} owner SIGKILLs under tether up, each after {args.hold:g} s, {os.cpu_count()} cores")
    print(f"baseline: one python process importing the project   {result['baseline_python_import_s']:.3f} s")
    print(
        f"kill -> first answer: p50 {result['kill_to_first_answer_p50_s']:.3f} s "
        f"({result['p50_ratio_to_baseline']} x baseline), p90 {result['kill_to_first_answer_p90_s']:.3f} s, "
        f"max {result['kill_to_first_answer_max_s']:.3f} s"
    )
    print(f"kill -> restarted owner listening: p50 {result['kill_to_owner_listening_p50_s']:.3f} s")
    print(f"appends acknowledged {result['acknowledged']}, missing {result['missing']}, doubled {result['doubled']}")


if __name__ == "__main__":
    main()
