"""The inbox end to end (docs/runs.md, "The inbox"): an owner process, the app served in this process, a client
that steers a running agent, writes beside it, takes an input back, and waits for what it submitted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final

import pytest
import trio

import actors
from storage_owner.core import MODEL_GRACE_MS
from tests.conftest import OwnerProcess
from tests.integration._agent_helpers import ledger, run_in, served, serving
from tests.integration._inbox_apps import build, build_gated, build_with_models
from tests.integration._up_helpers import nonblank_lines, run_tether
from tests.integration.test_agents import ledger_lines, transcript

__all__ = ["ledger"]  # the fixture

TIMEOUT_S: Final = 30
BLOCKING_TURNS: Final = [
    actors.ScriptedTurn(tool_calls=[("lookup", {"order_id": "A1", "block": True})]),
    actors.ScriptedTurn(text="A1 shipped, and I used pnpm."),
]


async def test_a_steer_during_a_tool_round_joins_the_run_after_its_results(
    owner: OwnerProcess, ledger: Path, tmp_path: Path
) -> None:
    app, model = build(BLOCKING_TURNS)
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, app) as client:
            conversation_id = await client.create_conversation(agent="support")
            own = await client.submit(conversation_id, kind="input", payload="Where is A1?")
            await ledger_lines(ledger, 1)  # the tool call runs, held at its gate
            steer = await client.submit(conversation_id, kind="input", payload="Use pnpm", when_busy="steer")
            assert (steer.status, steer.run_id, steer.when_busy) == ("queued", own.run_id, "steer")
            (tmp_path / "gate").touch()
            done = await client.wait_for_submission(steer.submission_id)
            run = await client.wait_for_run(own.submission_id)
            assert run.status == "completed" and run.answer is not None
            assert (done.status, done.answer, done.run_id) == ("done", run.answer, run.run_id)
            assert (await client.wait_for_submission(own.submission_id)).answer == run.answer
            entries = await client.entries(conversation_id)
            assert [kind for kind, _ in transcript(entries)] == [
                "tether.user",
                "tether.assistant",
                "tether.tool_result",
                "tether.user",
                "tether.assistant",
            ]
            assert transcript(entries)[3] == ("tether.user", "Use pnpm")
            # The second request of the run saw the steer after the round's result, and the script went on.
            assert model.asked == [(1, ["Where is A1?"]), (2, ["Where is A1?", "Use pnpm"])]


async def test_what_the_model_sees_of_writes_entries_and_summaries_and_a_stale_summary(
    owner: OwnerProcess, ledger: Path, tmp_path: Path
) -> None:
    app, model = build(BLOCKING_TURNS)
    mention = {"kind": "chat.mention", "data": {"author": "ann"}}
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, app) as client:
            conversation_id = await client.create_conversation(agent="support")
            own = await client.submit(conversation_id, kind="input", payload="Where is A1?")
            await ledger_lines(ledger, 1)  # the tool call runs, held at its gate
            seen = {"kind": "ci.status", "data": {"red": True}, "model": [{"role": "user", "text": "CI is red."}]}
            write = await client.submit(conversation_id, kind="write", payload=seen)
            steer = await client.submit(
                conversation_id, kind="input", payload="ann: and B?", when_busy="steer", entry=mention
            )
            assert (write.status, steer.entry) == ("queued", mention)
            (tmp_path / "gate").touch()
            assert own.run_id is not None
            assert (await client.wait_for_run(own.run_id)).status == "completed"
            # The run's next request saw the write, then the steer (placed as the app's entry), after the results.
            assert model.asked[1] == (2, ["Where is A1?", "CI is red.", "ann: and B?"])
            entries = await client.entries(conversation_id)
            assert [entry.kind for entry in entries][2:5] == ["tether.tool_result", "ci.status", "chat.mention"]
            # A summary: the context starts at the run's last answer, the summary's message first.
            last = entries[-1]
            summary = {"kind": "app.summary", "model": [{"role": "user", "text": "Summary: A1 shipped."}]}
            placed = await client.submit(conversation_id, kind="write", payload={**summary, "head": last.entry_id})
            assert placed.status == "done"
            follow = await client.submit(conversation_id, kind="input", payload="And B?")
            assert follow.run_id is not None
            assert (await client.wait_for_run(follow.run_id)).status == "completed"
            assert model.asked[-1][1] == ["Summary: A1 shipped.", "And B?"]  # (its script's tool round again)
            # After a reset, a summary naming an entry before it is stale: nothing placed.
            await client.reset(conversation_id)
            count = len(await client.entries(conversation_id))
            stale = await client.submit(conversation_id, kind="write", payload={**summary, "head": last.entry_id})
            assert (stale.status, stale.reason) == ("unanswered", "stale")
            assert len(await client.entries(conversation_id)) == count


async def test_a_steer_after_the_last_tool_round_gets_one_more_request_of_the_same_run(
    owner: OwnerProcess, ledger: Path
) -> None:
    turns = [
        actors.ScriptedTurn(text="A slow first answer.", delay_s=0.4, chunk_chars=4),
        actors.ScriptedTurn(text="And B is fine too."),
    ]
    app, model = build(turns)
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, app) as client:
            conversation_id = await client.create_conversation(agent="support")
            own = await client.submit(conversation_id, kind="input", payload="Is A fine?")
            assert own.run_id is not None
            await run_in(client, own.run_id, "running")
            steer = await client.submit(conversation_id, kind="input", payload="And B?", when_busy="steer")
            run = await client.wait_for_run(own.run_id)
            assert run.answer is not None and run.answer.text == "And B is fine too."
            assert (await client.wait_for_submission(steer.submission_id)).answer == run.answer
            assert [text for kind, text in transcript(await client.entries(conversation_id))] == [
                "Is A fine?",
                ("A slow first answer.", []),
                "And B?",
                ("And B is fine too.", []),
            ]
            assert [turn for turn, _ in model.asked] == [1, 2]
            assert len(await client.runs(conversation_id=conversation_id)) == 1


async def test_inputs_that_may_only_join_a_run_writes_and_withdrawal(
    owner: OwnerProcess, ledger: Path, tmp_path: Path
) -> None:
    app, _ = build(BLOCKING_TURNS)
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, app) as client:
            conversation_id = await client.create_conversation(agent="support")
            with pytest.raises(actors.Conflict, match="refused while idle"):
                await client.submit(conversation_id, kind="input", payload="only if busy", when_idle="reject")
            assert await client.entries(conversation_id) == []
            own = await client.submit(conversation_id, kind="input", payload="Where is A1?")
            await ledger_lines(ledger, 1)
            note = await client.submit(
                conversation_id, kind="write", payload={"kind": "app.note", "data": {"by": "ann"}}
            )
            assert note.status == "done"
            assert (await client.entries(conversation_id))[-1].kind == "app.note"  # at once, mid-run
            follow = await client.submit(conversation_id, kind="input", payload="and then?", when_idle="reject")
            steer = await client.submit(conversation_id, kind="input", payload="never mind", when_busy="steer")
            assert await client.withdraw(steer.submission_id) == "withdrawn"
            assert await client.withdraw(follow.submission_id) == "withdrawn"
            assert await client.withdraw(own.submission_id) == "already_placed"
            withdrawn = await client.wait_for_submission(follow.submission_id)
            assert (withdrawn.status, withdrawn.reason) == ("unanswered", "withdrawn")
            assert follow.run_id is not None and (await client.run(follow.run_id)).status == "cancelled"
            (tmp_path / "gate").touch()
            assert own.run_id is not None and (await client.wait_for_run(own.run_id)).status == "completed"
            texts = [
                entry.data["text"] for entry in await client.entries(conversation_id) if entry.kind == "tether.user"
            ]  # type: ignore[index]
            assert texts == ["Where is A1?"]


async def test_a_cancelled_run_holds_nothing_behind_it_and_steering_all_places_both_steers(
    owner: OwnerProcess, ledger: Path, tmp_path: Path
) -> None:
    app, model = build(BLOCKING_TURNS)
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, app) as client:
            conversation_id = await client.create_conversation(agent="support")
            own = await client.submit(conversation_id, kind="input", payload="Where is A1?")
            await ledger_lines(ledger, 1)
            follow = await client.submit(conversation_id, kind="input", payload="And A2?")
            assert own.run_id is not None and follow.run_id is not None
            await client.cancel_run(own.run_id)
            assert (await client.wait_for_run(own.run_id)).status == "cancelled"
            # Someone stopped it: the follow-up starts at once (after_failed_run="wait" holds only after a failure).
            await ledger_lines(ledger, 2)  # the follow-up's tool call blocks at the gate
            started = await client.run(follow.run_id)
            assert (started.status, started.reason) == ("running", None)
            await client.configure(conversation_id, steering="all")
            first = await client.submit(conversation_id, kind="input", payload="use pnpm", when_busy="steer")
            second = await client.submit(conversation_id, kind="input", payload="and be brief", when_busy="steer")
            (tmp_path / "gate").touch()
            answered = await client.wait_for_run(follow.run_id)
            assert answered.status == "completed"
            for steer in (first, second):
                assert (await client.wait_for_submission(steer.submission_id)).answer == answered.answer
            # The follow-up answered, both steers placed at its one boundary.
            assert [users for _, users in model.asked][1:] == [
                ["Where is A1?", "And A2?"],
                ["Where is A1?", "And A2?", "use pnpm", "and be brief"],
            ]


async def test_a_steer_after_the_answer_at_the_turn_limit_gets_a_run_of_its_own(
    owner: OwnerProcess, ledger: Path
) -> None:
    app, model = build([actors.ScriptedTurn(text="A slow first answer.", delay_s=0.2, chunk_chars=8)])
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, app) as client:
            conversation_id = await client.create_conversation(agent="support")
            await client.configure(conversation_id, max_turns=1)
            own = await client.submit(conversation_id, kind="input", payload="Is A fine?")
            assert own.run_id is not None
            await run_in(client, own.run_id, "running")
            steer = await client.submit(conversation_id, kind="input", payload="And B?", when_busy="steer")
            assert (steer.status, steer.run_id) == ("queued", own.run_id)  # it came while the run answered
            # The run answered at its last allowed turn: an answer always ends the run, never cut off by the limit.
            run = await client.wait_for_run(own.run_id)
            assert (run.status, run.answer is not None and run.answer.text) == ("completed", "A slow first answer.")
            # The steer it never reached, with nothing queued behind: a run of its own, which answers it.
            done = await client.wait_for_submission(steer.submission_id)
            assert (done.status, done.run_id) == ("done", steer.submission_id)
            assert (await client.wait_for_run(steer.submission_id)).status == "completed"
            assert model.asked == [(1, ["Is A fine?"]), (1, ["Is A fine?", "And B?"])]


async def test_abort_conversation_withdraws_what_waits_keeps_writes_and_cancels_the_run(
    owner: OwnerProcess, ledger: Path
) -> None:
    app, _ = build(BLOCKING_TURNS)
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, app) as client:
            conversation_id = await client.create_conversation(agent="support")
            own = await client.submit(conversation_id, kind="input", payload="Where is A1?")
            await ledger_lines(ledger, 1)
            follow = await client.submit(conversation_id, kind="input", payload="And A2?")
            steer = await client.submit(conversation_id, kind="input", payload="use pnpm", when_busy="steer")
            reset = await client.reset(conversation_id)
            note = await client.submit(conversation_id, kind="write", payload={"kind": "app.note", "data": 1})
            assert note.status == "queued"  # behind the reset
            aborted = await client.abort_conversation(conversation_id)
            assert sorted(aborted.withdrawn) == sorted([follow.submission_id, steer.submission_id, reset.submission_id])
            assert own.run_id is not None and (await client.wait_for_run(own.run_id)).status == "cancelled"
            for record in (follow, steer, reset):
                settled = await client.wait_for_submission(record.submission_id)
                assert (settled.status, settled.reason) == ("unanswered", "withdrawn")
            assert (await client.wait_for_submission(note.submission_id)).status == "done"
            kinds = [entry.kind for entry in await client.entries(conversation_id)]
            assert "app.note" in kinds and "tether.reset" not in kinds


async def test_the_command_line_steers_writes_lists_and_withdraws(
    owner: OwnerProcess, ledger: Path, tmp_path: Path
) -> None:
    app, _ = build(BLOCKING_TURNS)
    db = owner.db
    with trio.fail_after(TIMEOUT_S):
        async with serving(db, app) as client:
            conversation_id = await client.create_conversation(agent="support")
            own = await client.submit(conversation_id, kind="input", payload="Where is A1?")
            await ledger_lines(ledger, 1)
            base = ("--db", db, "--conversation", conversation_id)
            steered = await run_tether("submit", *base, "--when-busy", "steer", "--json", "Use pnpm")
            assert steered.returncode == 0, steered.stderr
            steer = json.loads(steered.stdout)["submission"]
            assert (steer["status"], steer["when_busy"], steer["run_id"]) == ("queued", "steer", own.run_id)
            wrote = await run_tether("submit", *base, "--write", "app.note", "--data", '{"by": "ann"}')
            assert wrote.returncode == 0 and b"entry app.note appended" in wrote.stdout, wrote.stderr
            follow = json.loads((await run_tether("submit", *base, "--json", "and then?")).stdout)["submission"]
            withdrawn = await run_tether("withdraw", "--db", db, follow["submission_id"])
            assert withdrawn.returncode == 0 and b"withdrawn" in withdrawn.stdout, withdrawn.stderr
            again = await run_tether("withdraw", "--db", db, follow["submission_id"])
            assert again.returncode == 1 and b"already settled (unanswered)" in again.stdout
            neither = await run_tether("submit", *base)
            assert neither.returncode == 2 and b"give TEXT to say, --write KIND" in neither.stderr
            (tmp_path / "gate").touch()
            assert own.run_id is not None
            await client.wait_for_run(own.run_id)
            listed = json.loads(
                (await run_tether("submissions", "--db", db, "--conversation", conversation_id, "--json")).stdout
            )
            assert [(s["kind"], s["when_busy"], s["status"], s["reason"]) for s in listed["submissions"]] == [
                ("input", "follow_up", "done", None),
                ("input", "steer", "done", None),
                ("write", "follow_up", "done", None),
                ("input", "follow_up", "unanswered", "withdrawn"),
            ]
            table = await run_tether("submissions", "--db", db, "--conversation", conversation_id)
            assert [line.split()[1:3] for line in nonblank_lines(table.stdout)[1:]] == [
                ["input", "done"],
                ["steer", "done"],
                ["write", "done"],
                ["input", "unanswered"],
            ]


async def test_the_command_line_writes_what_the_model_sees_and_places_an_input_as_an_entry(
    owner: OwnerProcess, ledger: Path, tmp_path: Path
) -> None:
    app, model = build([actors.ScriptedTurn(text="Hello, ann.")])
    db = owner.db
    with trio.fail_after(TIMEOUT_S):
        async with serving(db, app) as client:
            conversation_id = await client.create_conversation(agent="support")
            base = ("--db", db, "--conversation", conversation_id)
            seen = await run_tether("submit", *base, "--write", "ci.status", "--seen", "CI is red.")
            assert seen.returncode == 0 and b"entry ci.status appended" in seen.stdout, seen.stderr
            said = await run_tether(
                "submit", *base, "--entry", "chat.mention", "--data", '{"author": "ann"}', "--wait", "ann: hi"
            )
            assert said.returncode == 0 and b"Hello, ann." in said.stdout, said.stderr
            assert model.asked == [(1, ["CI is red.", "ann: hi"])]
            entries = await client.entries(conversation_id)
            assert [(entry.kind, entry.data) for entry in entries][:2] == [
                ("ci.status", None),
                ("chat.mention", {"author": "ann"}),
            ]
            await client.reset(conversation_id)
            stale = await run_tether(
                "submit", *base, "--write", "app.summary", "--seen", "S", "--head", entries[0].entry_id
            )
            assert stale.returncode == 1 and b"not placed: unanswered (stale" in stale.stdout, stale.stdout
            unknown = await run_tether("submit", *base, "--write", "app.summary", "--head", "no-such-entry")
            assert unknown.returncode == 1 and b"names no entry of conversation" in unknown.stderr, unknown.stderr
            misplaced = await run_tether("submit", *base, "--seen", "S", "hi")
            assert misplaced.returncode == 2 and b"--seen and --head are a --write entry's" in misplaced.stderr


async def test_a_conversations_configuration_applies_from_the_next_model_request(
    owner: OwnerProcess, ledger: Path, tmp_path: Path
) -> None:
    turns = [
        actors.ScriptedTurn(tool_calls=[("lookup", {"order_id": "A1", "block": True})]),
        actors.ScriptedTurn(tool_calls=[("lookup", {"order_id": "A2"})]),
        actors.ScriptedTurn(text="never asked"),
    ]
    app, model = build(turns)
    db = owner.db
    with trio.fail_after(TIMEOUT_S):
        async with serving(db, app) as client:
            conversation_id = await client.create_conversation(agent="support")
            own = await client.submit(conversation_id, kind="input", payload="Where are A1 and A2?")
            await ledger_lines(ledger, 1)  # the first request was prepared with the agent's definition
            changed = await run_tether(
                "configure", "--db", db, conversation_id, "--instructions", "Be brief.", "--tools", "lookup,track"
            )
            assert changed.returncode == 0 and b"configuration version 1" in changed.stdout, changed.stderr
            document = await client.configure(conversation_id, max_turns=2)
            assert document is not None and document.version == 2
            assert await client.configuration(conversation_id) == {
                "instructions": "Be brief.",
                "tools": ["lookup", "track"],
                "max_turns": 2,
            }
            with pytest.raises(actors.InvalidRequest, match="steering is one of first, all"):
                await client.configure(conversation_id, steering="some")  # type: ignore[arg-type]
            (tmp_path / "gate").touch()
            assert own.run_id is not None
            run = await client.wait_for_run(own.run_id)
            # The second request took the new instructions and tools; the turn limit ended the run after its round.
            assert model.prepared == [("Be helpful.", ["lookup"]), ("Be brief.", ["lookup", "track"])]
            assert (run.status, run.reason) == ("failed", "max_turns")
            assert (await client.wait_for_submission(own.submission_id)).reason == "turn_limit"
            shown = await run_tether("configure", "--db", db, conversation_id)
            assert b"max_turns 2; steering" not in shown.stdout and b"max_turns 2" in shown.stdout


async def test_a_conversation_moved_to_a_model_mid_run_waits_for_a_worker_naming_it_and_records_it(
    owner: OwnerProcess, ledger: Path, tmp_path: Path
) -> None:
    turns = [actors.ScriptedTurn(tool_calls=[("lookup", {"order_id": "A1", "block": True})])]
    # (A scripted model answers a run's turn n with its n-th turn: the fast model is first asked turn 2.)
    fast_turns = [actors.ScriptedTurn(text="never asked"), actors.ScriptedTurn(text="Fast answer.")]
    plain, fast, fast_model = build_with_models(turns, fast_turns)
    db = owner.db
    with trio.fail_after(TIMEOUT_S):
        async with serving(db, plain, name="plain") as client:
            conversation_id = await client.create_conversation(agent="support")
            own = await client.submit(conversation_id, kind="input", payload="Where is A1?")
            assert own.run_id is not None
            await ledger_lines(ledger, 1)  # the first turn ran with the agent's model, its tool blocks
            document = await client.configure(conversation_id, model="fast", force=True)  # no worker names it yet
            assert document is not None and document.value == {"model": "fast"}
            (tmp_path / "gate").touch()
            # The plain worker, at the next model request, gives the lease back: no attached worker names "fast".
            stuck = await client.wait_for_run(own.run_id)
            assert (stuck.status, stuck.reason) == ("needs_attention", "no_model")
            shown = await run_tether("runs", "--db", db, "--conversation", conversation_id)
            assert b"no_model" in shown.stdout, shown.stdout
            async with served(db, fast, name="fast"):
                run = await client.wait_for_run(own.run_id)
                assert run.status == "completed" and run.answer is not None and run.answer.text == "Fast answer."
            assert [turn for turn, _ in fast_model.asked] == [2]
            operations = [op for op in await client.operations(own.run_id) if op.kind == "model"]
            assert [(op.turn, op.name) for op in operations] == [(1, "recording"), (2, "fast-model")]
            assert operations[0].arguments is None  # no configuration then
            assert operations[1].arguments == {"configuration": {"version": 1, "value": {"model": "fast"}}}


async def test_configure_checks_names_and_a_model_nobody_names_fails_the_run_once_the_grace_is_over(
    manual_owner: OwnerProcess, ledger: Path
) -> None:
    plain, fast, _ = build_with_models(
        [actors.ScriptedTurn(text="never asked")], [actors.ScriptedTurn(text="Fast answer.")]
    )
    db = manual_owner.db
    with trio.fail_after(TIMEOUT_S):
        async with serving(db, plain, name="plain") as client:
            conversation_id = await client.create_conversation(agent="support")
            with pytest.raises(actors.InvalidRequest, match=r"tools 'nope': .*\(they name 'lookup', 'track'\)"):
                await client.configure(conversation_id, tools=["lookup", "nope"])
            with pytest.raises(actors.InvalidRequest, match=r"model 'fast': .*\(they name no model\)"):
                await client.configure(conversation_id, model="fast")
            assert await client.configuration(conversation_id) == {}  # nothing was changed
            await client.configure(conversation_id, model="fast", force=True)  # a deploy brings it
            own = await client.submit(conversation_id, kind="input", payload="Hi?")
            assert own.run_id is not None
            stuck = await run_in(client, own.run_id, "needs_attention")
            assert stuck.reason == "no_model"
            await client.advance_clock(MODEL_GRACE_MS - 1)  # within the grace it waits
            async with served(db, fast, name="fast"):
                run = await client.wait_for_run(own.run_id)
                assert run.status == "completed" and run.answer is not None and run.answer.text == "Fast answer."
                # A model no worker names, forced: the run waits out the grace, then fails no_model.
                other = await client.create_conversation(agent="support")
                with pytest.raises(actors.InvalidRequest, match=r"model 'slow': .*\(they name 'fast'\)"):
                    await client.configure(other, model="slow")
                await client.configure(other, model="slow", force=True)
                lost = await client.submit(other, kind="input", payload="Hi?")
                follow = await client.submit(other, kind="input", payload="And then?")
                assert lost.run_id is not None and follow.run_id is not None
                await run_in(client, lost.run_id, "needs_attention")
                await client.advance_clock(MODEL_GRACE_MS)
                failed = await client.wait_for_run(lost.run_id)
                assert (failed.status, failed.reason) == ("failed", "no_model")
                assert failed.error is not None and "names the model 'slow'" in failed.error, failed.error
                settled = await client.wait_for_submission(lost.submission_id)
                assert (settled.status, settled.reason) == ("unanswered", "no_model")
                held = await client.run(follow.run_id)
                assert (held.status, held.reason) == ("queued", "held")  # a failure holds what follows


async def test_continue_answers_what_a_failed_run_left_and_ends_at_once_with_nothing_to_answer(
    owner: OwnerProcess, ledger: Path, tmp_path: Path
) -> None:
    app, model = build_gated([actors.ScriptedTurn(text="Now I can answer.")])
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, app) as client:
            conversation_id = await client.create_conversation(agent="support")
            own = await client.submit(conversation_id, kind="input", payload="Hello?")
            assert own.run_id is not None
            failed = await client.wait_for_run(own.run_id)
            assert (failed.status, failed.reason) == ("failed", "model_error")
            (tmp_path / "gate").touch()
            resumed = await client.submit(conversation_id, kind="continue")
            assert resumed.run_id == resumed.submission_id
            with pytest.raises(actors.Conflict, match="a continue is never queued"):
                await client.submit(conversation_id, kind="continue")
            done = await client.wait_for_submission(resumed.submission_id)
            run = await client.wait_for_run(resumed.submission_id)
            assert run.status == "completed" and done.answer == run.answer
            assert [kind for kind, _ in transcript(await client.entries(conversation_id))] == [
                "tether.user",
                "tether.assistant",
            ]  # the continue placed no message of its own
            asked = len(model.asked)
            nothing = await client.submit(conversation_id, kind="continue")
            settled = await client.wait_for_submission(nothing.submission_id)
            assert (settled.status, settled.reason) == ("unanswered", "nothing_to_answer")
            assert (await client.run(nothing.submission_id)).reason == "nothing_to_answer"
            assert len(model.asked) == asked  # no request was made
            by_hand = await run_tether(
                "submit", "--db", owner.db, "--conversation", conversation_id, "--continue", "--wait"
            )
            assert by_hand.returncode == 1 and b"nothing_to_answer" in by_hand.stdout, (by_hand.stdout, by_hand.stderr)


async def test_a_reset_during_a_tool_round_ends_the_run_and_the_next_runs_in_the_new_context(
    owner: OwnerProcess, ledger: Path, tmp_path: Path
) -> None:
    turns = [
        actors.ScriptedTurn(tool_calls=[("lookup", {"order_id": "A1", "block": True})]),
        actors.ScriptedTurn(text="answered"),
    ]
    app, model = build(turns)
    db = owner.db
    with trio.fail_after(TIMEOUT_S):
        async with serving(db, app) as client:
            conversation_id = await client.create_conversation(agent="support")
            own = await client.submit(conversation_id, kind="input", payload="Where is A1?")
            await ledger_lines(ledger, 1)
            reset = await run_tether("reset", "--db", db, conversation_id, "--handoff", "We looked A1 up already.")
            assert reset.returncode == 0 and b"queued" in reset.stdout, reset.stderr
            follow = await client.submit(conversation_id, kind="input", payload="What next?")
            (tmp_path / "gate").touch()
            assert own.run_id is not None and follow.run_id is not None
            ended = await client.wait_for_run(own.run_id)
            assert (ended.status, ended.reason) == ("failed", "reset")
            assert (await client.wait_for_submission(own.submission_id)).reason == "reset"
            after = await client.wait_for_run(follow.run_id)
            assert after.status == "completed"
            # The follow-up's requests (its tool round, then its answer) saw the new context only: the handoff, then
            # its own message.
            new_context = ["We looked A1 up already.", "What next?"]
            assert model.asked[-2:] == [(1, new_context), (2, new_context)]
            idle = await run_tether("reset", "--db", db, conversation_id)
            assert idle.returncode == 0 and b"placed at once" in idle.stdout, idle.stdout


async def test_tx_submit_admits_a_steer_with_the_commits_own_writes(
    owner: OwnerProcess, ledger: Path, tmp_path: Path
) -> None:
    app, model = build(BLOCKING_TURNS)
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, app) as client:
            conversation_id = await client.create_conversation(agent="support")
            own = await client.submit(conversation_id, kind="input", payload="Where is A1?")
            await ledger_lines(ledger, 1)
            async with client.commit() as tx:
                tx.put_document("chat.sent", {"by": "ann"}, conversation_id=conversation_id)
                steer_id = tx.submit(conversation_id, kind="input", payload="Use pnpm", when_busy="steer")
            with pytest.raises(actors.Conflict):
                async with client.commit() as tx:
                    tx.put_document("chat.sent", {"by": "bob"}, conversation_id=conversation_id)
                    tx.submit(conversation_id, kind="input", payload="only if idle", when_busy="reject")
            document = await client.document("chat.sent", conversation_id=conversation_id)
            assert document is not None and document.value == {"by": "ann"}  # the refused commit wrote nothing
            (tmp_path / "gate").touch()
            done = await client.wait_for_submission(steer_id)
            assert own.run_id is not None and done.answer == (await client.wait_for_run(own.run_id)).answer
            assert model.asked[-1] == (2, ["Where is A1?", "Use pnpm"])
