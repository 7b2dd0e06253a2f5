"""The test app of ``tests/faults/test_task_faults.py``, importable as ``tests.faults._task_apps:app``.

Every task takes ``{"dir": DIRECTORY, ...}`` as input and leaves files named after its task id in that directory,
so that a test can see from outside what ran where (worker processes share nothing else with the test):

- ``faults.crash`` SIGKILLs its own worker on every run (after ``delay_s``, so that tasks next to it can commit).
  ``TASK.runs`` gets one JSON line per run: the worker's pid, ``restarts`` and the lease epoch.
- ``faults.progress`` crashes its worker once on each of ``checkpoints`` checkpoints (a marker file per checkpoint),
  then advances; it completes after the last. ``TASK.runs`` as above, plus the checkpoint ``n``.
- ``faults.steady`` advances through ``steps`` checkpoints of ``step_s`` each and completes.
- ``faults.stall`` on its first run writes ``TASK.started`` (the worker's pid), then, shielded from cancellation
  (a lost lease cannot stop it), waits for ``TASK.go`` and commits its completion with an entry in its
  conversation: under a lease that was given to another worker meanwhile, that commit must be refused whole;
  ``TASK.stale`` records the refusal, ``TASK.landed`` a commit that was accepted. Any later run commits the same
  at once, with its own pid.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any, Final

import trio

import actors

CRASH: Final = "faults.crash"
PROGRESS: Final = "faults.progress"
STEADY: Final = "faults.steady"
STALL: Final = "faults.stall"
STALL_ENTRY: Final = "faults.stall.done"
"""The entry a ``faults.stall`` run appends to its conversation in the commit that completes it."""
POLL_S: Final = 0.02
STALL_LIMIT_S: Final = 60.0
"""A stalled first run gives up waiting for its go file after this long (a bound on its shield)."""


def task_file(directory: str | os.PathLike[str], task_id: str, suffix: str) -> Path:
    return Path(directory) / f"{task_id}.{suffix}"


def read_runs(directory: str | os.PathLike[str], task_id: str) -> list[dict[str, Any]]:
    """The runs a task recorded in ``TASK.runs``, oldest first."""
    path = task_file(directory, task_id, "runs")
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _record_run(rt: actors.Phase, **extra: Any) -> None:
    line = {"pid": os.getpid(), "restarts": rt.restarts, "epoch": rt.lease.epoch, **extra}
    with open(task_file(rt.input["dir"], rt.task_id, "runs"), "a", encoding="utf-8") as file:
        file.write(json.dumps(line, sort_keys=True) + "\n")


async def _die(delay_s: float) -> None:
    await trio.sleep(delay_s)
    os.kill(os.getpid(), signal.SIGKILL)
    await trio.sleep_forever()  # not reached


async def _crash(rt: actors.Phase) -> None:
    _record_run(rt)
    await _die(float(rt.input.get("delay_s", 0)))


async def _progress_step(rt: actors.Phase) -> None:
    step = int(rt.checkpoint["n"])
    _record_run(rt, n=step)
    marker = task_file(rt.input["dir"], rt.task_id, f"crashed-{step}")
    if not marker.exists():
        marker.touch()
        await _die(float(rt.input.get("delay_s", 0)))
    if step + 1 < int(rt.input["checkpoints"]):
        await rt.advance({"phase": "step", "n": step + 1})
    else:
        await rt.complete({"checkpoints": step + 1})


async def _steady_step(rt: actors.Phase) -> None:
    step = int(rt.checkpoint["n"])
    await trio.sleep(float(rt.input.get("step_s", 0)))
    if step + 1 < int(rt.input["steps"]):
        await rt.advance({"phase": "step", "n": step + 1})
    else:
        await rt.complete({"steps": step + 1})


async def _stall(rt: actors.Phase) -> None:
    directory = rt.input["dir"]
    started = task_file(directory, rt.task_id, "started")
    if started.exists():
        async with rt.commit() as tx:
            tx.append(rt.conversation_id, kind=STALL_ENTRY, data={"pid": os.getpid(), "late": False})
            tx.complete({"pid": os.getpid(), "restarts": rt.restarts, "epoch": rt.lease.epoch, "late": False})
        return
    started.write_text(str(os.getpid()), encoding="utf-8")
    go = task_file(directory, rt.task_id, "go")
    # Shielded: the CancelLease this worker gets once it is back must not stop the late commit from being tried.
    with trio.CancelScope(shield=True, deadline=trio.current_time() + STALL_LIMIT_S):
        while not go.exists():  # noqa: ASYNC110 - the test writes the file
            await trio.sleep(POLL_S)
        try:
            async with rt.commit() as tx:
                tx.append(rt.conversation_id, kind=STALL_ENTRY, data={"pid": os.getpid(), "late": True})
                tx.complete({"pid": os.getpid(), "restarts": rt.restarts, "epoch": rt.lease.epoch, "late": True})
        except actors.StaleLease as exc:
            refusal = {"code": exc.code, "message": str(exc)}
            task_file(directory, rt.task_id, "stale").write_text(json.dumps(refusal), encoding="utf-8")
            raise
        task_file(directory, rt.task_id, "landed").write_text("the late commit was accepted", encoding="utf-8")


def _first_step(_input: Any) -> dict[str, Any]:
    return {"phase": "step", "n": 0}


app = actors.App("task-faults")
app.define_task(CRASH, version=1, initial=lambda _input: {"phase": "run"}, phases={"run": _crash})
app.define_task(PROGRESS, version=1, initial=_first_step, phases={"step": _progress_step})
app.define_task(STEADY, version=1, initial=_first_step, phases={"step": _steady_step})
app.define_task(STALL, version=1, initial=lambda _input: {"phase": "run"}, phases={"run": _stall})
