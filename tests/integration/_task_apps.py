"""Task apps for ``tests/integration/test_tasks.py``, importable as ``tests.integration._task_apps:ATTR`` (by
``tether worker --app``) or served in-process with ``actors.serve``.

Every phase and abort handler appends one JSON line to the file named by its input's ``"log"`` (when given) *before*
it commits anything: ``{"task": TASK_ID, "kind": KIND, "run": WHAT}``. A test counts how often each phase really ran,
in whatever process, even a run whose commit was refused or never sent.

Times (``until_ms``) come in the input, on the owner's clock, so that a test on a manual clock knows them exactly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

import actors

FAR_MS = 1 << 40
"""A deadline no test reaches."""


def record_run(rt: actors.Phase, what: str) -> None:
    """Append one line for this run to the input's log file (a phase may run in any worker process)."""
    log = rt.input.get("log") if isinstance(rt.input, dict) else None
    if log is None:
        return
    line = json.dumps({"task": rt.task_id, "kind": rt.kind, "run": what, "version": rt.version}, sort_keys=True)
    with open(log, "a", encoding="utf-8") as file:
        file.write(line + "\n")


def read_runs(log: str | Path) -> list[dict[str, Any]]:
    """Every line :func:`record_run` wrote to ``log``, oldest first."""
    path = Path(log)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _start(_input: Any) -> dict[str, Any]:
    return {"phase": "start"}


# ------------------------------------------------------------------------------------- sleeper: sleep, wake


async def sleeper_start(rt: actors.Phase) -> None:
    record_run(rt, "start")
    await rt.sleep_until(rt.input["until_ms"], {"phase": "wake"})


async def sleeper_wake(rt: actors.Phase) -> None:
    record_run(rt, "wake")
    await rt.complete({"woke_at_ms": rt.now_ms()})


# ------------------------------------------------------------------------ child: sleeps, then completes


async def child_start(rt: actors.Phase) -> None:
    record_run(rt, "start")
    await rt.sleep_until(rt.input.get("until_ms", FAR_MS), {"phase": "finish"})


async def child_finish(rt: actors.Phase) -> None:
    record_run(rt, "finish")
    await rt.complete({"child": "done"})


async def child_abort(rt: actors.Phase) -> None:
    record_run(rt, "abort")
    await rt.aborted({"abort": rt.abort})


# ------------------------------------------------------------- parent: creates a child, waits on it, collects


def _child_input(rt: actors.Phase) -> dict[str, Any]:
    return {"until_ms": rt.input.get("child_until_ms", FAR_MS), "log": rt.input.get("log")}


async def parent_start(rt: actors.Phase) -> None:
    record_run(rt, "start")
    async with rt.commit() as tx:
        child = tx.create_task("tt.child", _child_input(rt), background=bool(rt.input.get("background", False)))
        tx.wait(on=[child], checkpoint={"phase": "collect", "child": child})


async def parent_collect(rt: actors.Phase) -> None:
    record_run(rt, "collect")
    child = rt.checkpoint["child"]
    outcome = (await rt.outcomes([child]))[child]
    await rt.complete({"child": None if outcome is None else outcome.status})


async def parent_abort(rt: actors.Phase) -> None:
    record_run(rt, "abort")
    child = rt.checkpoint.get("child") if isinstance(rt.checkpoint, dict) else None
    outcome = (await rt.outcomes([child]))[child] if child is not None else None
    await rt.aborted({"abort": rt.abort, "child": None if outcome is None else outcome.status})


# ----------------------------------------------------------- finisher: completes while its child still runs


async def finisher_start(rt: actors.Phase) -> None:
    """Create a child (``background`` if the input says so) and end in the same commit: completed, or failed when
    the input says ``"fail": True``."""
    record_run(rt, "start")
    async with rt.commit() as tx:
        tx.create_task("tt.child", _child_input(rt), background=bool(rt.input.get("background", False)))
        if rt.input.get("fail"):
            tx.fail("the finisher failed")
        else:
            tx.complete({"finished": True})


# ------------------------------------------------------------------------- late: a kind attached later


async def late_start(rt: actors.Phase) -> None:
    record_run(rt, "start")
    await rt.complete({"late": True})


# ------------------------------------------------------------------------------------ hang: never commits


async def hang_start(rt: actors.Phase) -> None:
    record_run(rt, "start")
    await trio.sleep_forever()


# ------------------------------------------------------------------------ versioned kinds (tt.mig and co.)


async def versioned_start(rt: actors.Phase) -> None:
    record_run(rt, "start")
    await rt.sleep_until(rt.input.get("until_ms", FAR_MS), {"phase": "next", "n": 1})


async def versioned_finish(rt: actors.Phase) -> None:
    record_run(rt, rt.checkpoint["phase"])
    await rt.complete({"version": rt.version, "checkpoint": rt.checkpoint})


def migrate_to_v2(stored_version: int, checkpoint: Any) -> Any:
    return {**checkpoint, "phase": "next_v2", "migrated_from": stored_version}


def migrate_fails(stored_version: int, checkpoint: Any) -> Any:
    raise ValueError(f"cannot migrate checkpoint n={checkpoint['n']} from version {stored_version}")


VERSIONED_KINDS = ("tt.mig", "tt.nomig", "tt.badmig")

app = actors.App("tasks")
"""Everything but the versioned kinds, ``tt.hang`` and ``tt.late``."""
app.define_task("tt.sleeper", version=1, initial=_start, phases={"start": sleeper_start, "wake": sleeper_wake})
app.define_task(
    "tt.child", version=1, initial=_start, phases={"start": child_start, "finish": child_finish}, abort=child_abort
)
app.define_task(
    "tt.parent",
    version=1,
    initial=_start,
    phases={"start": parent_start, "collect": parent_collect},
    abort=parent_abort,
)
app.define_task("tt.finisher", version=1, initial=_start, phases={"start": finisher_start})

hang_app = actors.App("hang")
"""Only ``tt.hang``: a phase that runs until its worker goes."""
hang_app.define_task("tt.hang", version=1, initial=_start, phases={"start": hang_start})

late_app = actors.App("late")
"""Only ``tt.late``, the kind no worker has until this app's worker attaches."""
late_app.define_task("tt.late", version=1, initial=_start, phases={"start": late_start})

app_v1 = actors.App("versioned")
for _kind in VERSIONED_KINDS:
    app_v1.define_task(_kind, version=1, initial=_start, phases={"start": versioned_start, "next": versioned_finish})

app_v2 = actors.App("versioned")
"""Version 2 of each versioned kind: ``tt.mig`` migrates, ``tt.nomig`` cannot, ``tt.badmig``'s migrate raises."""
app_v2.define_task(
    "tt.mig",
    version=2,
    initial=_start,
    phases={"start": versioned_start, "next_v2": versioned_finish},
    migrate=migrate_to_v2,
)
app_v2.define_task("tt.nomig", version=2, initial=_start, phases={"start": versioned_start, "next": versioned_finish})
app_v2.define_task(
    "tt.badmig",
    version=2,
    initial=_start,
    phases={"start": versioned_start, "next": versioned_finish},
    migrate=migrate_fails,
)
