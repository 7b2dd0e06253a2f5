"""Usage, cost and budgets end to end: a real owner (``--clock manual``), a scripted agent served in this process,
and ``tether usage / prices / budget`` as processes. The model counts its calls, so a test shows that a run over
its budget ends ``failed`` (``budget_exceeded``) without the model being called again."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import pytest
import trio

import actors
from tests.conftest import OwnerProcess
from tests.integration._agent_helpers import serving
from tests.integration._up_helpers import nonblank_lines, run_tether

TIMEOUT_S: Final = 60
MODEL: Final = "counted"
TURN_USAGE: Final = actors.Usage(input_tokens=1_000_000, output_tokens=200_000, cached_tokens=400_000)
"""What each scripted turn reports: at 2 per million input, 0.5 cached, 8 output it costs 1.2 + 0.2 + 1.6 = 3.0."""
PRICE: Final = actors.ModelPrice(model=MODEL, input_per_mtok=2.0, output_per_mtok=8.0, cached_input_per_mtok=0.5)


class CountingModel:
    """A scripted model that counts the requests it was asked (a model call the budget must prevent)."""

    name = MODEL

    def __init__(self, turns: list[actors.ScriptedTurn]) -> None:
        self.inner = actors.ScriptedModel(turns, name=MODEL)
        self.calls = 0

    async def stream(self, request: actors.ModelRequest) -> AsyncIterator[Any]:
        self.calls += 1
        async for event in self.inner.stream(request):
            yield event


async def lookup(call: actors.ToolCall, args: dict[str, Any]) -> Any:
    return {"order": args["order_id"], "status": "shipped"}


def app_with(model: CountingModel) -> actors.App:
    app = actors.App("usage")
    app.define_tool(
        "lookup",
        lookup,
        description="Look an order up.",
        parameters={"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
        recovery="safe",
    )
    app.define_agent("support", version=1, model=model, tools=["lookup"])
    return app


def script() -> list[actors.ScriptedTurn]:
    return [
        actors.ScriptedTurn(tool_calls=[("lookup", {"order_id": "A1"})], usage=TURN_USAGE),
        actors.ScriptedTurn(text="Your order shipped.", usage=TURN_USAGE),
    ]


async def completed_run(client: actors.Client, conversation_id: str, request_id: str) -> str:
    """Submit ``hi`` to the conversation and wait until its run completed: the run's id."""
    submission = await client.submit(conversation_id, kind="input", payload="hi", request_id=request_id)
    assert submission.run_id is not None
    assert (await client.wait_for_run(submission.run_id)).status == "completed"
    return submission.run_id


async def tether_json(*args: str) -> Any:
    done = await run_tether(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def row(document: dict[str, Any], scope: str, key: str | None = None) -> dict[str, Any]:
    [found] = [r for r in document["totals"] if r["scope"] == scope and (key is None or r["key"] == key)]
    return found


async def test_a_run_over_its_budget_fails_before_the_next_model_call(manual_owner: OwnerProcess) -> None:
    db = manual_owner.db
    model = CountingModel(script())
    with trio.fail_after(TIMEOUT_S):
        prices = await tether_json(
            "prices", "--db", db, "set", MODEL, "--input", "2", "--output", "8", "--cached", "0.5"
        )
        assert prices["prices"] == [
            {"model": MODEL, "input": 2.0, "output": 8.0, "cached_input": 0.5, "reasoning": None}
        ]
        async with serving(db, app_with(model)) as client:
            conversation_id = await client.create_conversation(agent="support")
            # 1.2 M tokens a turn: the first request starts (0 used), the second would start past 1 M.
            budget = await tether_json(
                "budget", "--db", db, "--conversation", conversation_id, "--max-tokens", "1000000"
            )
            assert row(budget, "conversation")["budget"] == {"max_tokens": 1_000_000, "max_cost": None}
            submission = await client.submit(conversation_id, kind="input", payload="where is A1?", request_id="r-1")
            assert submission.run_id is not None
            run = await client.wait_for_run(submission.run_id)
            assert (run.status, run.reason) == ("failed", "budget_exceeded")
            assert model.calls == 1  # the second model request was never started
            journal = await client.operations(run.run_id)
            assert [(op.kind, op.status) for op in journal] == [("model", "completed"), ("tool", "completed")]
            usage = run.usage
            assert (usage.input_tokens, usage.output_tokens, usage.cached_tokens) == (1_000_000, 200_000, 400_000)
            assert usage.cost == pytest.approx(3.0)

            # tether usage --conversation: the conversation (with its budget) and its run.
            shown = await tether_json("usage", "--db", db, "--conversation", conversation_id)
            conversation = row(shown, "conversation", conversation_id)
            assert conversation["input_tokens"] == 1_000_000 and conversation["cost"] == pytest.approx(3.0)
            assert conversation["budget"] == {"max_tokens": 1_000_000, "max_cost": None}
            assert row(shown, "run", run.run_id)["output_tokens"] == 200_000
            # tether usage: every model and conversation; --run: the run, its conversation and its task tree.
            everything = await tether_json("usage", "--db", db)
            assert row(everything, "model", MODEL)["cost"] == pytest.approx(3.0)
            assert row(everything, "conversation", conversation_id)["reasoning_tokens"] == 0
            of_run = await tether_json("usage", "--db", db, "--run", run.run_id)
            assert row(of_run, "tree", run.task_id)["input_tokens"] == 1_000_000
            table = await run_tether("usage", "--db", db, "--conversation", conversation_id)
            assert table.returncode == 0, table.stderr
            lines = nonblank_lines(table.stdout)
            assert lines[0].split()[:3] == ["SCOPE", "KEY", "INPUT"]
            assert lines[1].split()[:4] == ["conversation", conversation_id, "1000000", "200000"]

            # Raised, the retried run goes on from its committed turns and completes.
            await tether_json("budget", "--db", db, "--conversation", conversation_id, "--max-tokens", "5000000")
            await client.retry(run.run_id)
            run = await client.wait_for_run(run.run_id)
            assert run.status == "completed" and model.calls == 2
            assert run.usage.cost == pytest.approx(6.0)


async def test_bad_prices_and_budgets_exit_1_and_change_nothing(manual_owner: OwnerProcess, tmp_path: Path) -> None:
    db = manual_owner.db
    with trio.fail_after(TIMEOUT_S):
        await tether_json("prices", "--db", db, "set", "kept", "--input", "1", "--output", "2")
        bad_file = tmp_path / "prices.json"
        bad_file.write_text(json.dumps({"a": {"input": 1, "output": 2}, "b": {"input": -1, "output": 2}}))
        refused = await run_tether("prices", "--db", db, "load", str(bad_file))
        assert refused.returncode == 1 and len(nonblank_lines(refused.stderr)) == 1
        unknown = tmp_path / "unknown.json"
        unknown.write_text(json.dumps({"a": {"input": 1, "output": 2, "cache": 1}}))
        refused = await run_tether("prices", "--db", db, "load", str(unknown))
        assert refused.returncode == 1 and b"unknown keys" in refused.stderr
        missing = await run_tether("prices", "--db", db, "remove", "never-priced")
        assert missing.returncode == 1
        assert (await tether_json("prices", "--db", db))["prices"] == [
            {"model": "kept", "input": 1.0, "output": 2.0, "cached_input": None, "reasoning": None}
        ]
        usage = await run_tether("prices", "--db", db, "set", "x", "--input", "-1", "--output", "2")
        assert usage.returncode == 2  # argparse: a negative price is bad usage
        good = tmp_path / "good.json"
        good.write_text(json.dumps({"a": {"input": 1, "output": 2, "cached_input": 0.5}}))
        loaded = await tether_json("prices", "--db", db, "load", str(good))
        assert [price["model"] for price in loaded["prices"]] == ["a", "kept"]

        async with actors.connect(db) as client:
            conversation_id = await client.create_conversation(agent="support")
        nowhere = await run_tether("budget", "--db", db, "--conversation", actors.new_id(), "--max-tokens", "5")
        assert nowhere.returncode == 1
        both = await run_tether("budget", "--db", db, "--conversation", conversation_id, "--clear", "--max-cost", "1")
        assert both.returncode == 1
        shown = await tether_json("budget", "--db", db, "--conversation", conversation_id)
        assert row(shown, "conversation")["budget"] is None
        await tether_json("budget", "--db", db, "--conversation", conversation_id, "--max-cost", "2.5")
        cleared = await tether_json("budget", "--db", db, "--conversation", conversation_id, "--clear")
        assert row(cleared, "conversation")["budget"] is None


async def test_a_task_owned_conversation_shows_the_tree_it_counts_toward(manual_owner: OwnerProcess) -> None:
    db = manual_owner.db
    with trio.fail_after(TIMEOUT_S):
        async with actors.connect(db) as client:
            parent = await client.create_conversation()
            task_id = await client.create_task("research.plan", {}, conversation_id=parent)
            conversation_id = await client.create_conversation(agent="support", owner_task_id=task_id)
            assert (await client.conversation(conversation_id)).owner_task_id == task_id
        await tether_json("budget", "--db", db, "--task", task_id, "--max-cost", "4")
        shown = await tether_json("usage", "--db", db, "--conversation", conversation_id)
        tree = row(shown, "tree", task_id)
        assert (tree["input_tokens"], tree["cost"]) == (0, None)
        assert tree["budget"] == {"max_tokens": None, "max_cost": 4.0}


async def test_usage_without_a_filter_shows_up_to_limit_totals_a_scope_and_how_many_more(
    manual_owner: OwnerProcess,
) -> None:
    db = manual_owner.db
    model = CountingModel([actors.ScriptedTurn(text="ok", usage=TURN_USAGE) for _ in range(3)])
    with trio.fail_after(TIMEOUT_S):
        async with serving(db, app_with(model)) as client:
            conversations = []
            for n in range(3):
                conversation_id = await client.create_conversation(agent="support")
                await completed_run(client, conversation_id, f"r-{n}")
                conversations.append(conversation_id)
            # The client reads the first N (and says how many there are), not every total.
            totals, _, count = await client.usage_listing("conversation", limit=2)
            assert ([total.key for total in totals], count) == (sorted(conversations)[:2], 3)
            with pytest.raises(ValueError, match="limit must be 1 or more"):
                await client.usage_totals("conversation", limit=0)
        shown = await tether_json("usage", "--db", db, "--limit", "1")
        assert [(r["scope"], r["key"]) for r in shown["totals"]] == [
            ("model", MODEL),
            ("conversation", sorted(conversations)[0]),
        ]
        assert shown["not_shown"] == {"model": 0, "tool": 0, "conversation": 2}
        table = await run_tether("usage", "--db", db, "--limit", "1")
        assert table.returncode == 0, table.stderr
        assert nonblank_lines(table.stdout)[-1].startswith("2 more conversation totals not shown")
        everything = await tether_json("usage", "--db", db)
        assert len(everything["totals"]) == 4 and everything["not_shown"] == {"model": 0, "tool": 0, "conversation": 0}
        refused = await run_tether("usage", "--db", db, "--limit", "0")
        assert refused.returncode == 2


async def test_usage_of_a_conversation_shows_its_first_limit_runs_and_how_many_more(
    manual_owner: OwnerProcess,
) -> None:
    db = manual_owner.db
    model = CountingModel([actors.ScriptedTurn(text="ok", usage=TURN_USAGE) for _ in range(3)])
    with trio.fail_after(TIMEOUT_S):
        async with serving(db, app_with(model)) as client:
            conversation_id = await client.create_conversation(agent="support")
            run_ids = [await completed_run(client, conversation_id, f"r-{n}") for n in range(3)]
            assert [run.run_id async for run in client.iter_runs(conversation_id=conversation_id)] == run_ids
        shown = await tether_json("usage", "--db", db, "--conversation", conversation_id, "--limit", "2")
        assert [r["key"] for r in shown["totals"] if r["scope"] == "run"] == run_ids[:2]
        assert row(shown, "conversation", conversation_id)["input_tokens"] == 3 * TURN_USAGE.input_tokens
        assert shown["not_shown"] == {"run": 1}
        table = await run_tether("usage", "--db", db, "--conversation", conversation_id, "--limit", "2")
        assert table.returncode == 0, table.stderr
        assert nonblank_lines(table.stdout)[-1].startswith("1 more run totals not shown")
        everything = await tether_json("usage", "--db", db, "--conversation", conversation_id)
        assert [r["key"] for r in everything["totals"] if r["scope"] == "run"] == run_ids
        assert everything["not_shown"] == {}


class FailsAfterUsage(CountingModel):
    """Reports the usage of its first turn, then fails finally (a provider that charged for a request it then
    refused to finish)."""

    async def stream(self, request: actors.ModelRequest) -> AsyncIterator[Any]:
        self.calls += 1
        yield actors.TextDelta(text="Half an ans")
        yield actors.UsageReport(input_tokens=1_000_000, output_tokens=200_000, cached_tokens=400_000)
        raise actors.ModelError("the provider gave up", kind="bad_request")


async def test_the_usage_a_failed_attempt_reported_is_counted(manual_owner: OwnerProcess) -> None:
    db = manual_owner.db
    with trio.fail_after(TIMEOUT_S):
        async with serving(db, app_with(FailsAfterUsage(script()))) as client:
            await client.set_prices([PRICE])
            conversation_id = await client.create_conversation(agent="support")
            submission = await client.submit(conversation_id, kind="input", payload="hi")
            assert submission.run_id is not None
            run = await client.wait_for_run(submission.run_id)
            [request] = await client.operations(submission.run_id)
    assert (run.status, run.reason) == ("failed", "model_error")
    assert (request.status, request.usage) == ("failed", run.usage)
    assert (run.usage.input_tokens, run.usage.output_tokens, run.usage.cost) == (1_000_000, 200_000, 3.0)
    shown = await tether_json("usage", "--db", db, "--conversation", conversation_id)
    assert row(shown, "conversation", conversation_id)["cost"] == 3.0
