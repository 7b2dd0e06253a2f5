"""A paused worker never acts on a lease it lost (issue 28, point 12). A worker SIGSTOPped right after it sent a
manual tool call's intent (``WorkerKill("intent_sent", signal="SIGSTOP")``) holds, once continued, the dead owner's
acknowledgement in its socket: it must not start the handler under that lease, which the next owner (the standby)
cut off and a person resolved meanwhile. Every tool writes a ledger line as its handler starts
(tests/integration/_agent_apps.py): the ledger is the marker."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Final

import trio

import actors
from actors import testing
from protocol import read_runtime
from runtime import open_tether_process, stop_gracefully, tether_command
from tests.conftest import OwnerProcess
from tests.integration._agent_apps import read_ledger
from tests.integration._agent_helpers import AGENT_APPS, ledger, run_in, start_run
from tests.integration._up_helpers import ROOT, wait_for

__all__ = ["ledger"]  # the fixture

TIMEOUT_S: Final = 60


def stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (``T`` in ``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
        return stat.read().rpartition(")")[2].split()[0] in ("T", "t")


async def test_a_worker_paused_after_a_manual_intent_never_starts_the_call_a_person_resolved_meanwhile(
    owner: OwnerProcess, ledger: Path
) -> None:
    with trio.fail_after(TIMEOUT_S):
        standby = await open_tether_process(
            tether_command("owner", "--db", owner.db, "--clock", "wall", "--standby"),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        pause = actors.WorkerKill("intent_sent", kind="tool", name="lookup", signal="SIGSTOP")
        worker = testing.WorkerProcess(
            owner.db,
            f"{AGENT_APPS}:manual",
            kill=pause,
            env={"TETHER_TEST_LEDGER": str(ledger), "TETHER_TEST_GATE": os.environ["TETHER_TEST_GATE"]},
        )
        try:
            async with actors.connect(owner.db) as client:
                await worker.start()
                process = worker.process
                assert process is not None
                _, run_id = await start_run(client)
                await wait_for(lambda: stopped(process.pid), "the worker stopped with its intent sent")
                [_, tool] = await client.operations(run_id)
                assert (tool.kind, tool.status, tool.policy) == ("tool", "started", "manual")  # the intent landed
                await owner.kill()
                await wait_for(lambda: read_runtime(owner.db).pid == standby.pid, "the standby serving")
                run = await run_in(client, run_id, "needs_attention")  # the standby cut the call off: a person's
                assert (run.reason, run.operation_id) == ("tool_interrupted", tool.operation_id)
                await client.resolve(tool.operation_id, {"order": "A1", "status": "shipped"}, resolved_by="test")
                os.kill(process.pid, signal.SIGCONT)
                run = await client.wait_for_run(run_id)  # the continued worker reattaches and answers
                assert run.status == "completed", run
                assert await worker.stop() == 0  # whatever it was going to do, it has done
                ops = await client.operations(run_id)
        finally:
            if worker.process is not None and worker.process.returncode is None:
                os.kill(worker.process.pid, signal.SIGCONT)
            await worker.aclose()
            await stop_gracefully(standby)
    assert read_ledger(ledger) == [], "the handler started under a lease the worker had lost"
    assert [(op.kind, op.status, op.attempt) for op in ops] == [
        ("model", "completed", 1),
        ("tool", "resolved", 1),
        ("model", "completed", 1),
    ]
