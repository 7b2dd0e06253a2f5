"""What the agent tests against real processes share (tests/integration/test_agents.py, test_partials.py,
tests/faults/test_run_owner_kills.py, test_run_worker_kills.py, test_partials_faults.py): the tools' ledger and gate,
an app served in this process or by a ``tether worker`` process (reaped), a run started, a run's status awaited.

The waits poll another process's state: bound each test with ``trio.fail_after``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Final

import pytest
import trio

import actors
from actors import testing
from protocol import new_id
from runtime import stop_gracefully, tether_command
from tests.integration._up_helpers import CHILD_ENV, ROOT

POLL_S: Final = 0.02
AGENT_APPS: Final = "tests.integration._agent_apps"

served = testing.served
"""The kit's :func:`actors.testing.served`: ``app`` served in this process for the duration of a block."""


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tools' execution ledger (``TETHER_TEST_LEDGER``) and their gate file (``TETHER_TEST_GATE``, absent:
    a gated handler blocks until the test creates it), both in the test's temporary folder."""
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("TETHER_TEST_LEDGER", str(path))
    monkeypatch.setenv("TETHER_TEST_GATE", str(tmp_path / "gate"))
    return path


@contextlib.asynccontextmanager
async def serving(
    db: str, app: actors.App, *, name: str = "agents", log: Callable[[str], None] | None = None
) -> AsyncIterator[actors.Client]:
    """A client, and ``app`` served in this process by worker ``name`` for the duration of the block (the kit's
    :func:`actors.testing.serving`, under the name these tests' workers have)."""
    async with testing.serving(db, app, name=name, log=log) as client:
        yield client


@contextlib.asynccontextmanager
async def worker_process(
    db: str, attribute: str, ledger: Path, *, module: str = AGENT_APPS, stderr: Path | None = None
) -> AsyncIterator[trio.Process]:
    """``tether worker --app MODULE:ATTRIBUTE``, with the test's ledger and gate (its log in ``stderr`` if given, else
    the test's); reaped."""
    command = tether_command("worker", "--db", db, "--app", f"{module}:{attribute}")
    env = {**CHILD_ENV, "TETHER_TEST_LEDGER": str(ledger), "TETHER_TEST_GATE": os.environ["TETHER_TEST_GATE"]}
    with contextlib.ExitStack() as files:
        log = None if stderr is None else files.enter_context(stderr.open("wb"))
        process = await trio.lowlevel.open_process(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log)
        try:
            yield process
        finally:
            await stop_gracefully(process)


async def kill_mid_stream(
    client: actors.Client, db: str, run_id: str, attribute: str, ledger: Path, *, chars: int = 8
) -> None:
    """Serve ``attribute`` in a ``tether worker`` (:func:`worker_process`) and SIGKILL it once the run's model request
    has stored ``chars`` characters of its answer (the model mid-stream); reaped."""
    async with worker_process(db, attribute, ledger) as process:
        while True:
            read = await client.partials(run_id=run_id)
            if read.partials and len(read.partials[0].text) >= chars:
                break
            await trio.sleep(0.02)
        process.kill()
        await process.wait()


async def start_run(client: actors.Client, text: str = "Where is my order?") -> tuple[str, str]:
    """A new conversation bound to agent ``support`` and an input submitted to it: (conversation id, run id)."""
    conversation_id = await client.create_conversation(agent="support")
    submission = await client.submit(conversation_id, kind="input", payload=text, request_id=new_id())
    assert submission.run_id is not None
    return conversation_id, submission.run_id


async def run_in(client: actors.Client, run_id: str, *statuses: str) -> actors.RunRecord:
    """The run's record once its status is one of ``statuses`` (polled)."""
    while True:
        run = await client.run(run_id)
        if run.status in statuses:
            return run
        await trio.sleep(POLL_S)


async def lease_holder(client: actors.Client, task_id: str) -> str | None:
    """The name of the worker holding the lease of the live task ``task_id``, or None (a task no longer live fails
    the test: it could not be handed to anyone, so a check on it would prove nothing).

    Read right after a worker attached (``served``/``serving`` return once its announcement is committed), it shows
    what that arrival did: the owner grants the leases an announcement allows in the batch that commits it, so a test
    proves that a task was not handed to the new worker without sleeping in real time."""
    node = (await client.task_graph()).nodes.get(task_id)
    assert node is not None, f"task {task_id} is not live"
    return node.leased_to
