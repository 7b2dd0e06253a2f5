"""Start-up and recovery times of ``tether up``, against the cost of starting one Python process.

Measures (a) from launching ``tether up --workers N`` to every worker attached to the owner, and (b) from a SIGKILL
of the owner under ``tether up`` to every worker attached to the restarted owner. The baseline, measured in the same
run, is the time to start one interpreter that imports the project (``python -c "import actors, storage_owner.io"``):
``tether up`` starts N + 1 such processes, so the ratio says how much the runtime adds on top.

    python bench/startup.py [--json] [--workers 2] [--rounds 5]
"""

from __future__ import annotations

import argparse
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
from protocol import OwnerUnavailable, TetherError, read_runtime
from runtime import stop_gracefully, tether_command


async def _attached_workers(db: str) -> tuple[int, int | None]:
    """(workers attached, owner pid), or (0, None) while no owner answers."""
    try:
        info = read_runtime(db)
        with trio.fail_after(2):
            async with actors.connect(db=db, role="reader", reconnect=False) as client:
                peers = await client.peers()
    except (TetherError, trio.TooSlowError, OSError):
        return 0, None
    return sum(1 for peer in peers if peer.role == "worker" and peer.announced), info.pid


async def _wait_attached(db: str, workers: int, *, not_owner: int | None = None) -> int:
    # Probe only once the runtime file names another owner: a connection attempted while the killed owner is
    # still being torn down can be accepted by the kernel and then hang until the handshake times out.
    while True:
        try:
            if read_runtime(db).pid != not_owner:
                break
        except OwnerUnavailable:
            pass
        await trio.sleep(0.005)
    while True:
        attached, owner_pid = await _attached_workers(db)
        if attached >= workers and owner_pid is not None and owner_pid != not_owner:
            return owner_pid
        await trio.sleep(0.005)


async def measure_round(directory: str, workers: int) -> tuple[float, float]:
    db = os.path.join(directory, f"startup-{time.monotonic_ns()}.db")
    started = time.perf_counter()
    process = await trio.lowlevel.open_process(
        tether_command("up", "--db", db, "--workers", str(workers)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with trio.fail_after(60):
            owner_pid = await _wait_attached(db, workers)
            up_s = time.perf_counter() - started
            killed = time.perf_counter()
            os.kill(owner_pid, signal.SIGKILL)
            await _wait_attached(db, workers, not_owner=owner_pid)
            recovery_s = time.perf_counter() - killed
    finally:
        await stop_gracefully(process)
    return up_s, recovery_s


async def run(workers: int, rounds: int) -> dict[str, object]:
    baseline = import_baseline_s(rounds)
    ups, recoveries = [], []
    with tempfile.TemporaryDirectory(prefix="tether-bench-") as directory:
        for _ in range(rounds):
            up_s, recovery_s = await measure_round(directory, workers)
            ups.append(up_s)
            recoveries.append(recovery_s)
    up, recovery = statistics.median(ups), statistics.median(recoveries)
    return {
        "benchmark": "startup",
        "workers": workers,
        "rounds": rounds,
        "baseline_python_import_s": round(baseline, 3),
        "up_to_workers_attached_s": round(up, 3),
        "up_ratio_to_baseline": round(up / baseline, 2),
        "owner_sigkill_to_workers_attached_s": round(recovery, 3),
        "recovery_ratio_to_baseline": round(recovery / baseline, 2),
        "up_s_all": [round(value, 3) for value in ups],
        "recovery_s_all": [round(value, 3) for value in recoveries],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    result = trio.run(run, args.workers, args.rounds)
    if args.json:
        print(json.dumps(result))
        return
    print(f"startup, {args.workers} workers, median of {args.rounds} rounds, {os.cpu_count()} cores")
    print(f"baseline: one python process importing the project   {result['baseline_python_import_s']:.3f} s")
    print(
        f"tether up -> all workers attached                     {result['up_to_workers_attached_s']:.3f} s "
        f"({result['up_ratio_to_baseline']} x baseline)"
    )
    print(
        f"owner SIGKILL -> all workers attached again           {result['owner_sigkill_to_workers_attached_s']:.3f} s "
        f"({result['recovery_ratio_to_baseline']} x baseline)"
    )


if __name__ == "__main__":
    try:
        main()
    except OwnerUnavailable as exc:
        raise SystemExit(f"startup: {exc}") from None
