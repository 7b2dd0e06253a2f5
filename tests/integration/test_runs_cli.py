"""``tether submit / runs / cancel / retry / resolve / respond / interactions`` as processes against a real owner
(``--clock manual``) with no worker: runs stay ``pending`` or ``queued``; refusals exit 1 with one line and change
nothing; bad usage exits 2."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

import actors
from runtime._cli_owner_options import DEFAULT_MAX_CONCURRENT_RUNS
from storage_owner.core import DEFAULT_MAX_CONCURRENT_RUNS as CORE_DEFAULT
from storage_owner.core import ORPHAN_GRACE_MS
from tests.conftest import OwnerProcess
from tests.integration._up_helpers import nonblank_lines, run_tether


async def tether_json(*args: str) -> Any:
    done = await run_tether(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_cli_default_is_the_owners() -> None:
    assert DEFAULT_MAX_CONCURRENT_RUNS == CORE_DEFAULT


async def test_submit_with_agent_then_follow_up_runs_and_reject(manual_owner: OwnerProcess) -> None:
    db = manual_owner.db
    with trio.fail_after(60):
        submitted = await run_tether(
            "submit", "--db", db, "--agent", "support", "--request-id", "r-1", "hello", "--json"
        )
        assert submitted.returncode == 0, submitted.stderr
        # No worker: the run waits for one, and the submit says so on stderr (its stdout is the JSON alone).
        assert nonblank_lines(submitted.stderr) == [
            "tether submit: no worker is attached, so none announces agent 'support'; the run waits until one that "
            f"does attaches (tether up --db {db} --app MODULE:ATTR, or tether worker --db {db} --app MODULE:ATTR)"
        ]
        first = json.loads(submitted.stdout)
        conversation_id = first["conversation_id"]
        assert first["run"]["status"] == "pending" and first["run"]["agent"] == "support"
        assert first["run"]["reason"] == "agent_missing"
        assert first["submission"]["request_id"] == "r-1"
        again = await tether_json(
            "submit", "--db", db, "--conversation", conversation_id, "--request-id", "r-1", "hello"
        )
        assert again["run"]["run_id"] == first["run"]["run_id"]  # the same request: the same run

        done = await run_tether("submit", "--db", db, "--conversation", conversation_id, "--request-id", "r-2", "more")
        assert done.returncode == 0, done.stderr
        [line] = nonblank_lines(done.stdout)
        assert line.startswith("run ") and ": queued; request r-2" in line

        refused = await run_tether(
            "submit", "--db", db, "--conversation", conversation_id, "--when-busy", "reject", "--request-id", "r-3", "x"
        )
        assert refused.returncode == 1
        assert len(nonblank_lines(refused.stderr)) == 1 and refused.stdout == b""

        listed = await tether_json("runs", "--db", db)
        assert [run["status"] for run in listed["runs"]] == ["pending", "queued"]
        assert {run["conversation_id"] for run in listed["runs"]} == {conversation_id}
        queued = await tether_json("runs", "--db", db, "--status", "queued")
        assert [run["run_id"] for run in queued["runs"]] == [listed["runs"][1]["run_id"]]

        table = await run_tether("runs", "--db", db)
        assert table.returncode == 0
        lines = nonblank_lines(table.stdout)
        assert lines[0].split()[:4] == ["RUN", "CONVERSATION", "AGENT", "STATUS"]
        assert [line.split()[3] for line in lines[1:]] == ["pending", "queued"]


async def test_cancel_then_retry_is_refused_and_the_run_stays_cancelled(manual_owner: OwnerProcess) -> None:
    db = manual_owner.db
    with trio.fail_after(60):
        async with actors.connect(db=db) as client:
            conversation_id = await client.create_conversation(agent="support")
            await client.submit(conversation_id, kind="input", payload="1", request_id="r-1")
            queued = await client.submit(conversation_id, kind="input", payload="2", request_id="r-2")
            assert queued.run_id is not None
            cancelled = await tether_json("cancel", "--db", db, queued.run_id)
            assert cancelled["status"] == "cancelled"
            refused = await run_tether("retry", "--db", db, queued.run_id)
            assert refused.returncode == 1 and len(nonblank_lines(refused.stderr)) == 1
            assert (await client.run(queued.run_id)).status == "cancelled"
            missing = await run_tether("cancel", "--db", db, actors.new_id())
            assert missing.returncode == 1 and "does not exist" in refused.stderr.decode() + missing.stderr.decode()


async def test_bad_usage_exits_2_and_changes_nothing(manual_owner: OwnerProcess) -> None:
    db = manual_owner.db
    with trio.fail_after(60):
        async with actors.connect(db=db) as client:
            head = (await client.ping()).head_seq
            for args in (
                ("resolve", "--db", db, actors.new_id(), "--output", "{not json"),
                ("respond", "--db", db, actors.new_id()),  # neither --approve nor --deny
                ("respond", "--db", db, actors.new_id(), "--approve", "--deny"),
                ("submit", "--db", db, "hello"),  # neither --conversation nor --agent
                ("submit", "--db", db, "--when-busy", "later", "--agent", "a", "hello"),
                ("runs", "--db", db, "--status", "sleeping"),
            ):
                done = await run_tether(*args)
                assert done.returncode == 2, args
                assert done.stdout == b""
            assert (await client.ping()).head_seq == head
            assert await client.runs() == []


@pytest.mark.parametrize(
    "args",
    [
        ("resolve", "OP", "--output", '{"ok": true}'),
        ("respond", "INTERACTION", "--deny", "--note", "no"),
    ],
)
async def test_resolve_and_respond_of_unknown_ids_fail_with_one_line(
    manual_owner: OwnerProcess, args: tuple[str, ...]
) -> None:
    with trio.fail_after(60):
        command, _, *rest = args
        done = await run_tether(command, "--db", manual_owner.db, actors.new_id(), *rest)
        assert done.returncode == 1
        [line] = nonblank_lines(done.stderr)
        assert "does not exist" in line


async def test_interactions_lists_none_open(manual_owner: OwnerProcess) -> None:
    with trio.fail_after(60):
        assert (await tether_json("interactions", "--db", manual_owner.db))["interactions"] == []
        done = await run_tether("interactions", "--db", manual_owner.db)
        assert done.returncode == 0 and nonblank_lines(done.stdout) == ["no open interactions"]


async def test_the_commands_need_a_database(tmp_path: Any) -> None:
    with trio.fail_after(60):
        done = await run_tether("runs", "--db", str(tmp_path / "absent.db"))
        assert done.returncode == 1
        [line] = nonblank_lines(done.stderr)
        assert "there is no database" in line


async def test_owner_max_concurrent_runs_admits_that_many(db_path: str) -> None:
    owner = OwnerProcess(db_path, "--clock", "manual", "--max-concurrent-runs", "1")
    await owner.start()
    try:
        with trio.fail_after(30):
            async with actors.connect(db=db_path) as client:
                a = await client.create_conversation(agent="support")
                b = await client.create_conversation(agent="support")
                first = await client.submit(a, kind="input", payload="1", request_id="r-1")
                second = await client.submit(b, kind="input", payload="1", request_id="r-1")
                assert first.run_id is not None and second.run_id is not None
                assert (await client.run(first.run_id)).status == "pending"
                assert (await client.run(second.run_id)).status == "queued"  # another conversation, no capacity
    finally:
        await owner.close()


async def test_help_for_each_command() -> None:
    with trio.fail_after(60):
        for command in ("submit", "runs", "resolve", "retry", "cancel", "respond", "interactions"):
            done = await run_tether(command, "--help")
            assert done.returncode == 0 and b"--db" in done.stdout, command


async def test_submit_wait_shows_the_run_before_waiting_and_ends_when_it_is_cancelled(
    manual_owner: OwnerProcess,
) -> None:
    db = manual_owner.db
    with trio.fail_after(60):
        async with actors.connect(db=db) as client:
            done: list[Any] = []

            async def submit_and_wait() -> None:
                done.append(await run_tether("submit", "--db", db, "--agent", "support", "--wait", "hello"))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(submit_and_wait)
                while True:  # poll until the submit process has written its run
                    runs = await client.runs()
                    if runs:
                        break
                    await trio.sleep(0.05)
                await client.cancel_run(runs[0].run_id)
                await client.advance_clock(ORPHAN_GRACE_MS + 1)  # no worker: the marked task ends after the grace
            [completed] = done
            # Nobody could run its abort handler: its task was orphaned, so the run failed (orphaned), exit 1.
            failure = (
                "failed (orphaned): the run's task was orphaned (missing_task): no attached worker has task kind "
                "agent:support"
            )
            orphaned = f"run {runs[0].run_id} {failure}"
            assert completed.returncode == 1, completed.stderr
            # No worker: unless the cancel came first, the submit said the run waits for one, and that it waits too.
            warning = (
                "tether submit: no worker is attached, so none announces agent 'support'; the run waits until one "
                f"that does attaches (tether up --db {db} --app MODULE:ATTR, or tether worker --db {db} --app "
                "MODULE:ATTR); waiting for it (Ctrl-C ends the wait, not the run)"
            )
            assert nonblank_lines(completed.stderr) in ([f"tether: {orphaned}"], [warning, f"tether: {orphaned}"])
            lines = nonblank_lines(completed.stdout)
            assert lines[0] == f"conversation {runs[0].conversation_id} (agent support)"
            # The run as the submit read it back (with its request id), then each new status while it waits: the
            # states the run went through, in order, each shown once, ending failed (orphaned). Which one the read
            # saw depends on whether the test's cancel (and the grace's end) came first.
            assert "; request " in lines[1]
            run_lines = [line.partition("; request ")[0] for line in lines[1:] if line.startswith("run ")]
            statuses = ("pending (agent_missing)", "pending (cancelling)", failure)
            states = [f"run {runs[0].run_id}: {status}" for status in statuses]
            assert set(run_lines) <= set(states) and run_lines == sorted(set(run_lines), key=states.index)
            assert run_lines[-1] == states[-1]


async def _open_interaction(client: actors.Client, run_id: str) -> actors.InteractionRecord:
    while True:
        found = await client.interactions(status="open", run_id=run_id)
        if found:
            return found[0]
        await trio.sleep(0.02)


async def test_respond_with_the_wrong_flag_names_the_flag_that_answers_and_changes_nothing(
    owner: OwnerProcess,
) -> None:
    from tests.integration._agent_apps import approving
    from tests.integration._agent_helpers import serving
    from tests.integration._ui_apps import asking

    db = owner.db
    with trio.fail_after(60):
        async with serving(db, asking, name="asking") as client:
            conversation_id = await client.create_conversation(agent="support")
            submission = await client.submit(conversation_id, kind="input", payload="ask about A1")
            assert submission.run_id is not None
            question = await _open_interaction(client, submission.run_id)
            assert question.kind == "question"
            for flag in ("--approve", "--deny"):
                done = await run_tether("respond", "--db", db, question.interaction_id, flag)
                assert done.returncode == 1
                [line] = nonblank_lines(done.stderr)
                assert f"interaction {question.interaction_id} is a question, not an approval" in line
                assert '--answer JSON (a JSON value of the schema {"type":"boolean"}' in line
                assert "answer=" not in line
            assert await _open_interaction(client, submission.run_id) == question  # nothing was written
            done = await run_tether("respond", "--db", db, question.interaction_id, "--answer", "true")
            assert done.returncode == 0, done.stderr
            assert nonblank_lines(done.stdout) == [
                f"interaction {question.interaction_id}: answered true (run {submission.run_id})"
            ]
            assert (await client.wait_for_run(submission.run_id)).status == "completed"
        async with serving(db, approving, name="approving") as client:
            conversation_id = await client.create_conversation(agent="support")
            submission = await client.submit(conversation_id, kind="input", payload="where?")
            assert submission.run_id is not None
            approval = await _open_interaction(client, submission.run_id)
            assert approval.kind == "approval"
            done = await run_tether("respond", "--db", db, approval.interaction_id, "--answer", "true")
            assert done.returncode == 1
            [line] = nonblank_lines(done.stderr)
            assert f"interaction {approval.interaction_id} is an approval, not a question" in line
            assert "answer it with --approve or --deny" in line
            assert await _open_interaction(client, submission.run_id) == approval
            await client.cancel_run(submission.run_id)
