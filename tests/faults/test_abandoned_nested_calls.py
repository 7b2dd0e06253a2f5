"""SIGKILL of a worker while a tool call that is not replay-safe (``manual``, ``report``) waits for its nested call
(docs/agents.md, "Tools calling tools", "Recovery"): the ``settle`` tool of ``tests/faults/_acting_apps.py`` makes a
nested ``look_up_order`` call that blocks (the gate is never opened). The caller never runs its handler again, so
its nested call is abandoned: its task ends ``aborted`` (reason ``restart``) and never runs its handler again on any
worker, whether it ran in the killed worker too or in another one (which the owner cancels). A ``manual`` caller then
waits for a person, whose ``resolve`` lets the run go on; a ``report`` caller settles with an ``interrupted`` error
result the model reads.
"""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path
from typing import Final

import pytest
import trio

import actors
from tests.conftest import OwnerProcess
from tests.faults import _acting_apps
from tests.integration._agent_apps import read_ledger
from tests.integration._agent_helpers import lease_holder, ledger, run_in, served, start_run, worker_process

__all__ = ["ledger"]  # the fixture

TIMEOUT_S: Final = 60
POLL_S: Final = 0.02
APPS: Final = "tests.faults._acting_apps"


async def handler_started(path: Path, tool: str) -> None:
    while not any(line["tool"] == tool for line in read_ledger(path)):  # noqa: ASYNC110 (another process writes it)
        await trio.sleep(POLL_S)


def executions(path: Path) -> list[tuple[str, int]]:
    return sorted((line["tool"], line["attempt"]) for line in read_ledger(path))


async def operations(client: actors.Client, run_id: str) -> dict[str, actors.OperationRecord]:
    return {op.name: op for op in await client.operations(run_id)}


@pytest.mark.parametrize("recovery", ["manual", "report"])
@pytest.mark.parametrize("nested_in", ["the_killed_worker", "another_worker"])
async def test_a_caller_that_is_not_replay_safe_killed_abandons_its_nested_call_which_never_runs_again(
    owner: OwnerProcess, ledger: Path, recovery: str, nested_in: str
) -> None:
    same = nested_in == "the_killed_worker"
    killed = f"{recovery}_settling_app" if same else f"{recovery}_caller_app"
    next_app = getattr(_acting_apps, f"{recovery}_settling_app")
    with trio.fail_after(TIMEOUT_S):
        async with actors.connect(owner.db) as client:
            async with contextlib.AsyncExitStack() as lookups:
                if not same:  # the nested call runs in a worker of its own, which lives on
                    await lookups.enter_async_context(served(owner.db, _acting_apps.lookups_app, name="lookups"))
                async with worker_process(owner.db, killed, ledger, module=APPS) as process:
                    conversation_id, run_id = await start_run(client, "Settle A1")
                    await handler_started(ledger, "look_up_order")  # the nested call runs, blocked at the gate
                    nested_id = (await operations(client, run_id))["look_up_order"].task_id
                    holder = await lease_holder(client, nested_id)
                    assert (holder == "lookups") is not same, holder
                    process.kill()
                    assert await process.wait() == -signal.SIGKILL
                if not same:  # cancelled in the worker that ran it, and ended by its (empty) abort there
                    nested = await client.wait_for_task(nested_id)
            async with served(owner.db, next_app, name="next"):
                if same:  # cut off with its caller: the next worker runs only its abort
                    nested = await client.wait_for_task(nested_id)
                assert nested.outcome is not None
                assert (nested.outcome.status, nested.outcome.reason) == ("aborted", "restart")
                ops = await operations(client, run_id)
                assert (ops["look_up_order"].status, ops["look_up_order"].code) == ("failed", "aborted")
                if recovery == "manual":
                    blocked = await run_in(client, run_id, "needs_attention")
                    assert (blocked.reason, blocked.operation_id) == ("tool_interrupted", ops["settle"].operation_id)
                    resolved = await client.resolve(ops["settle"].operation_id, "settled A1 by hand")
                    assert resolved.status == "resolved"
                run = await client.wait_for_run(run_id)
            entries = await client.entries(conversation_id)
            ops = await operations(client, run_id)
    assert (run.status, run.answer is not None and run.answer.text) == ("completed", "Settled.")
    [result] = [entry.data for entry in entries if entry.kind == "tether.tool_result"]
    assert isinstance(result, dict)
    if recovery == "manual":
        assert (result["content"], result["is_error"]) == ("settled A1 by hand", False)
        assert ops["settle"].status == "resolved"
    else:
        assert (result["is_error"], result["code"]) == (True, "interrupted")
        assert ops["settle"].status == "failed"
    # Each handler ran once: the caller's never again, the abandoned nested call's never again on any worker.
    assert executions(ledger) == [("look_up_order", 1), ("settle", 1)]
