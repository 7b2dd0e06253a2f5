"""The command line's newer commands and flags as processes against a real owner: ``tether configure --tools``
(names stripped, checked against what the workers announce, ``--force``), ``tether owner --model-grace``, ``tether
worker --manual-grace``, ``tether journal``, ``tether resolve --by``, ``tether runs --conversation`` of none, a steer
to an idle conversation, a reader that closed the output pipe, and ``tether submit --wait`` through an owner's
SIGKILL and restart."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import trio

import actors
from runtime import stop_gracefully, tether_command
from tests.conftest import OwnerProcess
from tests.integration._agent_apps import ONE_CALL
from tests.integration._agent_apps import build as build_agents
from tests.integration._agent_helpers import AGENT_APPS, ledger, run_in, serving
from tests.integration._inbox_apps import build
from tests.integration._up_helpers import CHILD_ENV, ROOT, nonblank_lines, run_tether
from tests.integration.test_agents import ledger_lines

__all__ = ["ledger"]  # the fixture
TIMEOUT_S = 60


async def _json(*args: str) -> Any:
    done = await run_tether(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def test_configure_strips_tool_names_refuses_empty_and_unknown_ones_unless_forced(
    manual_owner: OwnerProcess, ledger: Path
) -> None:
    app, _ = build([actors.ScriptedTurn(text="never asked")])  # tools lookup and track, no other model
    db = manual_owner.db
    with trio.fail_after(TIMEOUT_S):
        async with serving(db, app) as client:
            conversation_id = await client.create_conversation(agent="support")
            done = await run_tether("configure", "--db", db, conversation_id, "--tools", " lookup, track ")
            assert done.returncode == 0, done.stderr
            assert await client.configuration(conversation_id) == {"tools": ["lookup", "track"]}
            refused = await run_tether("configure", "--db", db, conversation_id, "--tools", "lookup,,track")
            assert refused.returncode == 2 and b"a tool's name is empty" in refused.stderr  # tests/unit: the rest
            refused = await run_tether("configure", "--db", db, conversation_id, "--tools", "lookup, nope")
            assert refused.returncode == 1 and refused.stdout == b""
            [line] = nonblank_lines(refused.stderr)
            assert "tools 'nope'" in line and "they name 'lookup', 'track'" in line and "--force" in line, line
            assert await client.configuration(conversation_id) == {"tools": ["lookup", "track"]}  # nothing changed
            forced = await run_tether(
                "configure", "--db", db, conversation_id, "--tools", "nope", "--model", "ghost", "--force"
            )
            assert forced.returncode == 0, forced.stderr
            assert await client.configuration(conversation_id) == {"tools": ["nope"], "model": "ghost"}
            none = await run_tether("configure", "--db", db, conversation_id, "--tools", "")
            assert none.returncode == 0, none.stderr
            assert (await client.configuration(conversation_id))["tools"] == []


async def test_owner_model_grace_is_how_long_a_run_waits_for_its_model(db_path: str, ledger: Path) -> None:
    owner = OwnerProcess(db_path, "--clock", "manual", "--model-grace", "0.5")
    await owner.start()
    app, _ = build([actors.ScriptedTurn(text="never asked")])
    try:
        with trio.fail_after(TIMEOUT_S):
            async with serving(db_path, app) as client:
                conversation_id = await client.create_conversation(agent="support")
                await client.configure(conversation_id, model="ghost", force=True)
                submitted = await client.submit(conversation_id, kind="input", payload="Hi?")
                assert submitted.run_id is not None
                stuck = await run_in(client, submitted.run_id, "needs_attention")
                assert stuck.reason == "no_model"
                await client.advance_clock(501)  # past 0.5 s (the default grace is 10 s)
                failed = await client.wait_for_run(submitted.run_id)
                assert (failed.status, failed.reason) == ("failed", "no_model")
    finally:
        await owner.close()


async def test_manual_grace_then_resolve_by_a_person_shown_in_the_journal(
    manual_owner: OwnerProcess, ledger: Path, tmp_path: Path
) -> None:
    """A worker stopped with a manual call running: its drain (0 s) and manual grace (0.2 s) pass, the call is cut
    off and its run needs a person, who resolves it with --by; tether journal shows who."""
    db = manual_owner.db
    log = tmp_path / "worker.log"
    command = tether_command(
        "worker", "--db", db, "--app", f"{AGENT_APPS}:manual", "--drain-timeout", "0", "--manual-grace", "0.2"
    )
    env = {**CHILD_ENV, "TETHER_TEST_LEDGER": str(ledger), "TETHER_TEST_GATE": os.environ["TETHER_TEST_GATE"]}
    with trio.fail_after(TIMEOUT_S):
        async with actors.connect(db=db) as client:
            with log.open("wb") as stderr:
                worker = await trio.lowlevel.open_process(
                    command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr
                )
                try:
                    conversation_id = await client.create_conversation(agent="support")
                    submitted = await client.submit(conversation_id, kind="input", payload="Where is A1?")
                    assert submitted.run_id is not None
                    run_id = submitted.run_id
                    [call] = await ledger_lines(ledger, 1)  # the manual tool runs, blocked on the gate
                    worker.terminate()
                    assert await worker.wait() == 0
                finally:
                    await stop_gracefully(worker)
            said = log.read_text()
            assert "waiting up to 0.2 s more for 1 manual or report tool call(s)" in said, said
            run = await run_in(client, run_id, "needs_attention")
            assert (run.reason, run.operation_id) == ("tool_interrupted", call["operation_id"])

            empty = await run_tether("resolve", "--db", db, call["operation_id"], "--output", "1", "--by", " ")
            assert empty.returncode == 2 and b"--by names who resolved" in empty.stderr
            done = await run_tether(
                "resolve", "--db", db, call["operation_id"], "--output", '{"status": "checked"}', "--by", "alice"
            )
            assert done.returncode == 0, done.stderr
            assert nonblank_lines(done.stdout) == [f"operation {call['operation_id']}: resolved (resolved by alice)"]
            assert (await client.operation(call["operation_id"])).resolved_by == "alice"

            journal = await _json("journal", "--db", db, run_id)
            assert journal["run_id"] == run_id
            ops = journal["operations"]
            assert [(op["kind"], op["status"], op["resolved_by"]) for op in ops] == [
                ("model", "completed", None),
                ("tool", "resolved", "alice"),
            ]
            table = await run_tether("journal", "--db", db, run_id)
            assert table.returncode == 0, table.stderr
            header, model, tool = nonblank_lines(table.stdout)
            assert header.split() == [
                "OPERATION", "TURN", "KIND", "NAME", "ATTEMPT", "STATUS", "POLICY", "STARTED", "ENDED", "BY", "ERROR"
            ]  # fmt: skip
            assert model.split()[:7] == [ops[0]["operation_id"], "1", "model", model.split()[3], "1", "completed", "-"]
            cells = tool.split()
            assert cells[:7] == [call["operation_id"], "1", "tool", "lookup@1", "1", "resolved", "manual"]
            assert cells[7].endswith("Z") and cells[8].endswith("Z") and cells[9] == "alice"


async def test_journal_shows_errors_and_refuses_a_run_that_does_not_exist(
    manual_owner: OwnerProcess, ledger: Path
) -> None:
    app = build_agents([actors.ScriptedTurn(tool_calls=[("boom", {})]), *ONE_CALL[1:]], recovery="safe")
    db = manual_owner.db
    with trio.fail_after(TIMEOUT_S):
        async with serving(db, app) as client:
            conversation_id = await client.create_conversation(agent="support")
            submitted = await client.submit(conversation_id, kind="input", payload="Hi?")
            assert submitted.run_id is not None
            assert (await client.wait_for_run(submitted.run_id)).status == "completed"
            table = await run_tether("journal", "--db", db, submitted.run_id)
            assert table.returncode == 0, table.stderr
            _, _, boom, _ = nonblank_lines(table.stdout)
            assert " boom@1 " in boom and " failed " in boom and "tool_error: " in boom, boom
            [op] = [op for op in (await _json("journal", "--db", db, submitted.run_id))["operations"] if op["is_error"]]
            assert op["code"] == "tool_error"
        missing = actors.new_id()
        for command in ("journal", "runs --conversation"):
            done = await run_tether(*command.split(), missing, "--db", db)
            assert done.returncode == 1 and done.stdout == b"", command
            what = "run" if command == "journal" else "conversation"
            assert nonblank_lines(done.stderr) == [f"tether: {what} {missing} does not exist"], command


async def test_a_steer_to_an_idle_conversation_says_it_started_a_run(manual_owner: OwnerProcess) -> None:
    db = manual_owner.db
    with trio.fail_after(TIMEOUT_S):
        async with actors.connect(db=db) as client:
            conversation_id = await client.create_conversation(agent="support")
            done = await run_tether(
                "submit", "--db", db, "--conversation", conversation_id, "--when-busy", "steer", "hi"
            )
            assert done.returncode == 0, done.stderr
            said, run_line = nonblank_lines(done.stdout)
            [run] = await client.runs(conversation_id=conversation_id)
            assert said.startswith("submission ")
            assert said.endswith(": nothing was running to join, so the steer started a run"), said
            assert run_line.startswith(f"run {run.run_id}: pending")
            # While that run is going, a steer joins it, and says so.
            joined = await run_tether(
                "submit", "--db", db, "--conversation", conversation_id, "--when-busy", "steer", "x"
            )
            assert joined.returncode == 0, joined.stderr
            [line] = nonblank_lines(joined.stdout)
            assert line.endswith(f", run {run.run_id}") and ": steer, queued (joins the run" in line, line


async def test_a_reader_that_went_away_ends_a_command_quietly(manual_owner: OwnerProcess) -> None:
    # As `tether status | head -1` when head exits first: the output pipe has no reader left.
    for args in (("status",), ("runs",)):
        read, write = os.pipe()
        os.close(read)
        try:
            done = await trio.run_process(
                tether_command(*args, "--db", manual_owner.db),
                stdout=write,
                capture_stderr=True,
                check=False,
                cwd=ROOT,
                env=CHILD_ENV,
            )
        finally:
            os.close(write)
        assert done.stderr == b"", (args, done.stderr)
        assert done.returncode == 128 + 13, args  # as a writer SIGPIPE ended: what a shell's pipefail expects


async def test_submit_wait_says_when_the_owner_stops_answering_and_when_it_answers_again(owner: OwnerProcess) -> None:
    # No worker serves agent support: the run waits (pending) and so does the command, through an owner SIGKILL.
    command = tether_command("submit", "--db", owner.db, "--agent", "support", "--wait", "hi")
    with trio.fail_after(TIMEOUT_S):
        process = await trio.lowlevel.open_process(
            command, cwd=ROOT, env=CHILD_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            assert process.stdout is not None and process.stderr is not None
            out, err = bytearray(), bytearray()

            async def read_until(stream: Any, into: bytearray, text: bytes) -> None:
                while text not in into:
                    chunk = await stream.receive_some(4096)
                    assert chunk, f"the output ended without {text!r}: {bytes(into)!r}"
                    into += chunk

            await read_until(process.stdout, out, b": pending")  # the run is shown before the wait starts
            await read_until(process.stderr, err, b"waiting for it")  # no worker announces the agent: it waits
            await owner.kill()
            await read_until(process.stderr, err, b"does not answer")
            assert err.count(b"does not answer") == 1  # one line for the silence, not one per attempt
            await owner.start()
            await read_until(process.stderr, err, b"answers again")
            lines = [line for line in err.decode().splitlines() if "owner" in line]
            assert lines[-2:] == [
                f"tether-submit: the owner of {owner.db} does not answer ({lines[-2].split('(', 1)[1]}",
                f"tether-submit: the owner of {owner.db} answers again",
            ], err.decode()
            assert process.poll() is None  # the wait goes on
        finally:
            await stop_gracefully(process)
