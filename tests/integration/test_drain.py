"""A worker that stops drains (issue 16): it takes no new lease, lets what it runs finish and commit for at most its
drain timeout, then stops; only what still runs at that deadline is cut off and follows its recovery policy. A
second signal stops at once. In this process (``actors.serve``), under ``tether worker``, and under ``tether up`` /
``tether stop``; the tools count their executions in a ledger file (tests/integration/_agent_apps.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Final

import trio

import actors
from actors import testing
from runtime import stop_gracefully, tether_command
from tests.conftest import OwnerProcess
from tests.integration import _agent_apps
from tests.integration._agent_apps import read_ledger
from tests.integration._agent_helpers import AGENT_APPS, POLL_S, ledger, run_in, served, start_run, worker_process
from tests.integration._up_helpers import CHILD_ENV, ROOT, all_up, nonblank_lines, tether_up, wait_for

__all__ = ["ledger"]  # the fixture

TIMEOUT_S: Final = 40


async def tool_started(ledger: Path) -> None:
    """Return once the tool's handler has started (it records itself first, then waits for the gate)."""
    await wait_for(lambda: bool(read_ledger(ledger)), "the tool started")


def open_gate() -> None:
    Path(os.environ["TETHER_TEST_GATE"]).touch()


async def test_a_stopped_worker_lets_its_manual_tool_finish_and_takes_nothing_new(
    owner: OwnerProcess, ledger: Path
) -> None:
    """``serve(stop=...)``: the manual tool in flight ends with its result, not as an interrupted call; the run's
    next model turn is not taken by the draining worker but by the next one, and the run completes: no resolve."""
    with trio.fail_after(TIMEOUT_S):
        async with actors.connect(owner.db) as client, trio.open_nursery() as nursery:
            stop = trio.Event()
            logged: list[str] = []
            stopped = trio.Event()

            async def first_worker(*, task_status: trio.TaskStatus[None]) -> None:
                await actors.serve(
                    _agent_apps.manual, db=owner.db, name="first", stop=stop.wait, log=logged.append,
                    task_status=task_status,
                )  # fmt: skip
                stopped.set()

            await nursery.start(first_worker)
            conversation_id, run_id = await start_run(client)
            await tool_started(ledger)
            stop.set()
            await wait_for(lambda: any("waiting up to 30 s for what runs" in line for line in logged), "the drain")
            assert "tool:lookup (task " in logged[-1]
            assert not stopped.is_set()  # it waits for the tool
            open_gate()
            await stopped.wait()
            assert any("everything it ran finished and committed" in line for line in logged), logged
            run = await client.run(run_id)
            assert run.status == "pending", run  # its next turn waits for a worker: nothing needs a person
            ops = await client.operations(run_id)
            assert [(op.kind, op.status, op.attempt) for op in ops] == [
                ("model", "completed", 1),
                ("tool", "completed", 1),
            ]
            second = trio.CancelScope()

            async def second_worker(*, task_status: trio.TaskStatus[None]) -> None:
                with second:
                    await actors.serve(_agent_apps.manual, db=owner.db, name="second", task_status=task_status)

            await nursery.start(second_worker)
            run = await client.wait_for_run(run_id)
            second.cancel()
            assert run.status == "completed" and run.answer is not None
            assert run.answer.text == "Your order shipped."
            assert len(read_ledger(ledger)) == 1  # the tool ran once
            assert [op.status for op in await client.operations(run_id)] == ["completed"] * 3
            assert conversation_id == run.conversation_id


async def _stop_during_the_tool(
    db: str, client: actors.Client, ledger: Path, logged: list[str], *, manual_grace_s: float, open_when: str | None
) -> str:
    """Serve ``manual`` with a drain timeout of 0.1 s and ``manual_grace_s``, start a run, stop the worker while
    its tool runs (opening the gate once the log says ``open_when``, if given): the run's id once it stopped."""
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: actors.serve(
                _agent_apps.manual, db=db, name="first", stop=stop.wait, log=logged.append, drain_timeout_s=0.1,
                manual_grace_s=manual_grace_s, task_status=task_status,
            )
        )  # fmt: skip
        _, run_id = await start_run(client)
        await tool_started(ledger)
        stop.set()  # the gate stays shut: the tool is still running at the drain's deadline
        if open_when is not None:
            await wait_for(lambda: any(open_when in line for line in logged), open_when)
            open_gate()
    return run_id


async def test_a_manual_tool_running_past_the_drain_deadline_finishes_and_commits_its_result(
    owner: OwnerProcess, ledger: Path
) -> None:
    """A close is not a crash (issue 28): at the drain's deadline the manual call, whose cut-off would need a person,
    is waited for first; it finishes and commits, and the run waits for the next worker, needing nobody."""
    with trio.fail_after(TIMEOUT_S):
        async with actors.connect(owner.db) as client:
            logged: list[str] = []
            waits = "waiting up to 30 s more for 1 manual or report tool call(s)"
            run_id = await _stop_during_the_tool(owner.db, client, ledger, logged, manual_grace_s=30, open_when=waits)
            assert any("the manual and report tool calls finished and committed" in line for line in logged), logged
            run = await client.run(run_id)
            assert run.status == "pending", run  # its next turn waits for a worker: nothing needs a person
            ops = await client.operations(run_id)
            assert [(op.kind, op.status, op.attempt) for op in ops] == [
                ("model", "completed", 1),
                ("tool", "completed", 1),
            ]


async def test_a_manual_tool_still_running_at_the_stops_outer_bound_needs_a_person(
    owner: OwnerProcess, ledger: Path
) -> None:
    """Past the drain's deadline and the manual grace, the manual call is cut off: the only work a close leaves in a
    person's hands. Given back as a close, it counts no restart."""
    with trio.fail_after(TIMEOUT_S):
        async with actors.connect(owner.db) as client:
            logged: list[str] = []
            run_id = await _stop_during_the_tool(owner.db, client, ledger, logged, manual_grace_s=0.2, open_when=None)
            assert any("0.2 s more passed; cutting off 1" in line for line in logged), logged
            run = await run_in(client, run_id, "needs_attention")
            assert run.reason == "tool_interrupted"  # the manual policy: a person decides
            [_, tool] = await client.operations(run_id)
            task = await client.task(tool.task_id)
            assert task.restarts == 0


async def test_a_safe_call_running_at_the_drain_deadline_runs_again_under_the_next_worker_no_restart_counted(
    owner: OwnerProcess, ledger: Path
) -> None:
    """The call's intent went with its task (a safe call): given back as a close, it is interrupted (it may have
    partly run), and the next worker, seeing a lease that is not the task's first, reads the journal and runs attempt
    2, instead of taking attempt 1 for still open."""
    with trio.fail_after(TIMEOUT_S):
        async with actors.connect(owner.db) as client:
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                await nursery.start(
                    lambda task_status: actors.serve(
                        _agent_apps.safe, db=owner.db, name="first", stop=stop.wait, log=lambda line: None,
                        drain_timeout_s=0.1, task_status=task_status,
                    )
                )  # fmt: skip
                _, run_id = await start_run(client)
                await tool_started(ledger)
                stop.set()
            [_, tool] = await client.operations(run_id)
            assert (tool.status, tool.attempt) == ("interrupted", 1)
            open_gate()
            async with served(owner.db, _agent_apps.safe, name="second"):
                run = await client.wait_for_run(run_id)
            assert run.status == "completed", run
            [_, tool, _] = await client.operations(run_id)
            assert (tool.status, tool.attempt) == ("completed", 2)
            assert (await client.task(tool.task_id)).restarts == 0
    assert [line["attempt"] for line in read_ledger(ledger)] == [1, 2]


async def test_a_model_stream_at_the_drain_deadline_is_sent_again_by_the_next_worker_uncharged(
    owner: OwnerProcess, ledger: Path, tmp_path: Path
) -> None:
    """``tether worker --drain-timeout 0.3`` stopped mid-stream (a 6 s answer): at the deadline it gives the run's
    task back as a close. The request is not a failed attempt (no retry_wait, no back-off, no attempt consumed) and
    no restart is counted: the next worker sends it again, as attempt 1, and the run completes."""
    with trio.fail_after(TIMEOUT_S):
        async with actors.connect(owner.db) as client:
            conversation_id = await client.create_conversation(agent="support")
            worker = testing.WorkerProcess(
                owner.db, f"{AGENT_APPS}:streaming_slow", name="first", args=("--drain-timeout", "0.3")
            )
            async with worker:
                submission = await client.submit(conversation_id, kind="input", payload="Where?")
                assert submission.run_id is not None
                run_id = submission.run_id
                await run_in(client, run_id, "running")
                while not any(record.text for record in (await client.partials(run_id=run_id)).partials):  # noqa: ASYNC110
                    await trio.sleep(POLL_S)  # (another process streams)
                assert await worker.stop() == 0
            assert "giving back 1 still running" in worker.log_text()
            [op] = await client.operations(run_id)
            assert (op.kind, op.status, op.attempt) == ("model", "interrupted", 0)  # withdrawn: nothing charged
            assert op.error is not None and op.error.startswith("withdrawn: attempt 1")
            run = await client.run(run_id)
            assert run.status == "pending", run  # not retry_wait: no back-off for a close
            async with served(owner.db, _agent_apps.streaming, name="second"):  # the same agent, streaming faster
                run = await client.wait_for_run(run_id)
            assert run.status == "completed" and run.answer is not None
            assert run.answer.text == _agent_apps.STREAMED_ANSWER
            [op] = await client.operations(run_id)
            assert (op.kind, op.status, op.attempt) == ("model", "completed", 1)
            assert run.task_id is not None
            assert (await client.task(run.task_id)).restarts == 0


async def test_tether_worker_drains_on_sigterm_and_stops_at_once_on_a_second(
    owner: OwnerProcess, ledger: Path, tmp_path: Path
) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with actors.connect(owner.db) as client:
            log = tmp_path / "worker.log"
            async with worker_process(owner.db, "manual", ledger, stderr=log) as process:
                _, run_id = await start_run(client)
                await tool_started(ledger)
                process.send_signal(signal.SIGTERM)
                await wait_for(lambda: "waiting up to 30 s for what runs to finish" in log.read_text(), "the drain")
                assert process.returncode is None  # draining: the tool still runs
                process.send_signal(signal.SIGTERM)  # a second one: at once
                assert await process.wait() == 0
            run = await run_in(client, run_id, "needs_attention")
            assert run.reason == "tool_interrupted"


async def test_ctrl_c_of_a_script_serving_stops_it_cleanly(owner: OwnerProcess, tmp_path: Path) -> None:
    """``trio.run(actors.serve...)`` in a script: SIGINT drains and returns, exit 0, no KeyboardInterrupt."""
    script = tmp_path / "serve_script.py"
    script.write_text(
        "import functools, sys, trio, actors\n"
        "from tests.integration import _agent_apps\n"
        "trio.run(functools.partial(actors.serve, _agent_apps.manual, db=sys.argv[1], name='script'))\n"
        "print('the script ends', flush=True)\n",
        encoding="utf-8",
    )
    with trio.fail_after(TIMEOUT_S):
        process = await trio.lowlevel.open_process(
            [sys.executable, str(script), owner.db],
            cwd=ROOT,
            env=CHILD_ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            async with actors.connect(owner.db) as client:
                while True:
                    if any(peer.peer_name == "script" and peer.announced for peer in await client.peers()):
                        break
                    await trio.sleep(POLL_S)
            process.send_signal(signal.SIGINT)
            assert await process.wait() == 0
            assert process.stdout is not None and process.stderr is not None
            out = await process.stdout.receive_some(65536)
            err = await process.stderr.receive_some(65536)
        finally:
            await stop_gracefully(process)
    assert b"the script ends" in out
    assert b"Traceback" not in err and b"KeyboardInterrupt" not in err, err.decode(errors="replace")


async def test_tether_stop_lets_a_manual_tool_finish_and_tether_up_completes_the_run(
    db_path: str, tmp_path: Path, ledger: Path
) -> None:
    """Issue 16's case: a manual tool running, ``tether stop`` says what it waits for, the tool finishes and
    commits, everything stops; ``tether up`` again completes the run without ``resolve``, the tool having run once."""
    app = "tests.integration._agent_apps:manual"
    env = {"TETHER_TEST_LEDGER": str(ledger), "TETHER_TEST_GATE": os.environ["TETHER_TEST_GATE"]}
    with trio.fail_after(TIMEOUT_S * 2):
        async with tether_up(db_path, tmp_path, "--app", app, "--workers", "1", env=env) as up:
            await up.wait_status(all_up(1), "the owner and a worker attached")
            async with actors.connect(db_path) as client:
                _, run_id = await start_run(client)
                await tool_started(ledger)
            stop = await trio.lowlevel.open_process(
                tether_command("stop", "--db", db_path), cwd=ROOT, env=CHILD_ENV, stdout=subprocess.PIPE
            )
            try:
                assert stop.stdout is not None
                said = b""
                while b"tool:lookup" not in said:
                    chunk = await stop.stdout.receive_some(65536)
                    assert chunk, f"tether stop ended without saying what it waits for: {said!r}"
                    said += chunk
                assert up.process.poll() is None  # still draining: the tool has not returned
                open_gate()
                assert await stop.wait() == 0
                said += await stop.stdout.receive_some(65536)
            finally:
                await stop_gracefully(stop)
            assert await up.wait_exit() == 0
            lines = nonblank_lines(said)
            assert lines[0].startswith("tether stop: sent SIGTERM to the supervisor"), lines
            assert any(
                "waiting for 1 running on the workers to finish and commit: tool:lookup" in line for line in lines
            )
            assert lines[-1].startswith("stopped the supervisor"), lines
            await up.assert_everything_gone()
        async with tether_up(db_path, tmp_path, "--app", app, "--workers", "1", label="again", env=env) as up:
            async with actors.connect(db_path, wait_for_owner_s=20) as client:
                run = await client.wait_for_run(run_id)
                assert run.status == "completed", run
                ops = await client.operations(run_id)
            assert [(op.kind, op.status, op.attempt) for op in ops] == [
                ("model", "completed", 1),
                ("tool", "completed", 1),
                ("model", "completed", 1),
            ]
            assert len(read_ledger(ledger)) == 1  # the tool ran once, and nobody resolved anything


async def test_ctrl_c_of_tether_up_drains_its_workers(db_path: str, tmp_path: Path, ledger: Path) -> None:
    """A terminal's Ctrl-C sends SIGINT to the whole foreground process group: the supervisor alone must get it (its
    children run in sessions of their own), or each worker, signalled by the terminal and then by the supervisor,
    would stop at once instead of draining."""
    app = "tests.integration._agent_apps:manual"
    env = {"TETHER_TEST_LEDGER": str(ledger), "TETHER_TEST_GATE": os.environ["TETHER_TEST_GATE"]}
    with trio.fail_after(TIMEOUT_S):
        async with tether_up(db_path, tmp_path, "--app", app, "--workers", "1", env=env, own_process_group=True) as up:
            await up.wait_status(all_up(1), "the owner and a worker attached")
            async with actors.connect(db_path) as client:
                _, run_id = await start_run(client)
                await tool_started(ledger)
            os.killpg(up.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
            while True:
                if "waiting up to 30 s for what runs to finish" in up.stderr_text():
                    break
                assert up.process.poll() is None, up.stderr_text()
                await trio.sleep(POLL_S)
            open_gate()
            assert await up.wait_exit() == 0, up.stderr_text()
            await up.assert_everything_gone()
        assert "cutting off" not in up.stderr_text()
        async with (
            tether_up(db_path, tmp_path, "--app", app, "--workers", "1", label="again", env=env),
            actors.connect(db_path, wait_for_owner_s=20) as client,
        ):
            run = await client.wait_for_run(run_id)
        assert run.status == "completed" and len(read_ledger(ledger)) == 1


async def test_a_second_signal_stops_tether_up_at_once(db_path: str, tmp_path: Path, ledger: Path) -> None:
    """The first SIGTERM drains (the tool keeps running); a second passes on to the workers, which cut it off: the
    manual tool call is interrupted and its run needs a person, as after a crash."""
    app = "tests.integration._agent_apps:manual"
    env = {"TETHER_TEST_LEDGER": str(ledger), "TETHER_TEST_GATE": os.environ["TETHER_TEST_GATE"]}
    with trio.fail_after(TIMEOUT_S):
        async with tether_up(db_path, tmp_path, "--app", app, "--workers", "1", env=env) as up:
            await up.wait_status(all_up(1), "the owner and a worker attached")
            async with actors.connect(db_path) as client:
                _, run_id = await start_run(client)
                await tool_started(ledger)
            up.process.send_signal(signal.SIGTERM)
            await wait_for(lambda: "waiting up to 30 s for what runs to finish" in up.stderr_text(), "the drain")
            up.process.send_signal(signal.SIGTERM)  # the gate stays shut: only the second signal ends the tool
            assert await up.wait_exit(timeout_s=10) == 0, up.stderr_text()
            await up.assert_everything_gone()
        assert "stopping at once" in up.stdout_text() + up.stderr_text()
        async with (
            tether_up(db_path, tmp_path, "--app", app, "--workers", "1", label="again", env=env),
            actors.connect(db_path, wait_for_owner_s=20) as client,
        ):
            run = await run_in(client, run_id, "needs_attention")
        assert run.reason == "tool_interrupted"
