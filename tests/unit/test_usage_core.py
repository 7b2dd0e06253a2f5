"""Usage and cost in the owner core, sans-IO: cost from the price table at commit, roll-ups per run, conversation,
model and task tree, no double count on a replayed result, budgets refused before the intent, and bad prices or
budgets refused changing nothing (storage_owner/core/_usage.py)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import attrs
import pytest

from protocol import (
    Budget,
    BudgetReply,
    CancelRun,
    Committed,
    CreateConversation,
    Error,
    ErrorCode,
    FinishOperation,
    ModelPrice,
    Ok,
    OperationReply,
    PricesReply,
    ReadOperation,
    ReadPrices,
    ReadUsage,
    ReadUsageTotals,
    RetryRun,
    RunReply,
    RunUsage,
    SetBudget,
    SetPrices,
    UsageReply,
    UsageTotal,
    UsageTotalsReply,
)
from storage_owner.core._usage import cost_of
from tests.unit.test_runs_core import RunSim, leased_run, model_intent, model_requested, tool_intent, with_tool
from tests.unit.test_tasks_core import Worker, completed, ended, error_code, expect, fresh_id

GPT = ModelPrice(model="scripted", input_per_mtok=2.0, output_per_mtok=8.0, cached_input_per_mtok=0.5)


@pytest.fixture
def sim() -> Iterator[RunSim]:
    opened = RunSim()
    yield opened
    opened.close()


def tokens(input_tokens: int, output_tokens: int, cached: int = 0, reasoning: int = 0) -> RunUsage:
    """A usage of no known cost: as a total, all its tokens are unpriced (a worker's ``unpriced_tokens`` is
    ignored: the owner sets it)."""
    return RunUsage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_tokens=cached,
        reasoning_tokens=reasoning,
        unpriced_tokens=input_tokens + output_tokens,
    )


def set_prices(sim: RunSim, *prices: ModelPrice, remove: tuple[str, ...] = ()) -> object:
    return sim.request(sim.client, SetPrices(prices=prices, remove=remove))


def prices(sim: RunSim) -> tuple[ModelPrice, ...]:
    return expect(sim.request(sim.client, ReadPrices()), PricesReply).prices


def model_turn(sim: RunSim, worker: Worker, task_id: str, run_id: str, usage: RunUsage) -> str:
    """One model request of the run, its intent and then its result with ``usage``: the operation id."""
    op = fresh_id()
    worker.ok(task_id, model_intent(run_id, op))
    worker.ok(task_id, FinishOperation(operation_id=op, status="completed", usage=usage))
    return op


def totals(sim: RunSim, scope: str, key: str | None = None, **fields: object) -> UsageTotalsReply:
    request = ReadUsageTotals(scope=scope, key=key, **fields)  # type: ignore[arg-type]
    return expect(sim.request(sim.client, request), UsageTotalsReply)


# ------------------------------------------------------------------------------------------------ cost


def test_cost_prices_cached_input_and_reasoning_output_at_their_own_rates() -> None:
    usage = tokens(1_000_000, 500_000, cached=400_000, reasoning=100_000)
    # 600k input at 2, 400k cached at 0.5, 500k output at 8 (reasoning counted as output: no reasoning price).
    assert cost_of(usage, GPT) == pytest.approx(1.2 + 0.2 + 4.0)
    with_reasoning = ModelPrice(model="m", input_per_mtok=2.0, output_per_mtok=8.0, reasoning_per_mtok=16.0)
    # No cached price: cached input at the input price; 400k output at 8 and 100k reasoning at 16.
    assert cost_of(usage, with_reasoning) == pytest.approx(2.0 + 3.2 + 1.6)


def test_cost_is_computed_when_the_result_commits_and_never_recomputed(sim: RunSim) -> None:
    expect(set_prices(sim, GPT), PricesReply)
    run_id, task_id, worker = leased_run(sim)
    op = model_turn(sim, worker, task_id, run_id, tokens(1_000_000, 1_000_000))
    stored = expect(sim.request(sim.client, ReadOperation(operation_id=op)), OperationReply).operation
    assert stored.usage is not None and stored.usage.cost == pytest.approx(10.0)
    assert sim.run(run_id).usage.cost == pytest.approx(10.0)
    # A later price applies to later results only: the committed cost, and every roll-up of it, stays.
    expect(set_prices(sim, ModelPrice(model="scripted", input_per_mtok=100.0, output_per_mtok=100.0)), PricesReply)
    assert sim.run(run_id).usage.cost == pytest.approx(10.0)
    model_turn(sim, worker, task_id, run_id, tokens(10_000, 0))
    assert sim.run(run_id).usage.cost == pytest.approx(11.0)
    [by_model] = expect(sim.request(sim.client, ReadUsage()), UsageReply).totals
    assert by_model.usage.cost == pytest.approx(11.0)
    # After an owner restart the table is read back from the database.
    sim.restart()
    assert prices(sim) == (ModelPrice(model="scripted", input_per_mtok=100.0, output_per_mtok=100.0),)


def test_a_model_without_a_price_has_no_cost(sim: RunSim) -> None:
    expect(set_prices(sim, ModelPrice(model="other", input_per_mtok=1.0, output_per_mtok=1.0)), PricesReply)
    run_id, task_id, worker = leased_run(sim)
    model_turn(sim, worker, task_id, run_id, tokens(100, 100))
    assert sim.run(run_id).usage == tokens(100, 100)
    assert sim.run(run_id).usage.unpriced_tokens == 200  # its cost is unknown, and the total says so


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (SetPrices(prices=(ModelPrice(model="m", input_per_mtok=-1.0, output_per_mtok=1.0),)), ErrorCode.INVALID),
        (SetPrices(prices=(ModelPrice(model="m", input_per_mtok=math.nan, output_per_mtok=1.0),)), ErrorCode.INVALID),
        (SetPrices(prices=(ModelPrice(model="m", input_per_mtok=1.0, output_per_mtok=math.inf),)), ErrorCode.INVALID),
        (
            SetPrices(
                prices=(ModelPrice(model="m", input_per_mtok=1.0, output_per_mtok=1.0, cached_input_per_mtok=-0.1),)
            ),
            ErrorCode.INVALID,
        ),
        (SetPrices(prices=(ModelPrice(model="", input_per_mtok=1.0, output_per_mtok=1.0),)), ErrorCode.INVALID),
        (SetPrices(prices=(GPT, GPT)), ErrorCode.INVALID),
        (SetPrices(prices=(GPT,), remove=("scripted",)), ErrorCode.INVALID),
        (SetPrices(remove=("never-priced",)), ErrorCode.NOT_FOUND),
    ],
)
def test_bad_prices_are_refused_and_change_nothing(sim: RunSim, request_: SetPrices, code: ErrorCode) -> None:
    kept = ModelPrice(model="kept", input_per_mtok=1.0, output_per_mtok=3.0)
    expect(set_prices(sim, kept), PricesReply)
    # The good price of the same request is not written either: a price table changes whole or not at all.
    request_ = SetPrices(
        prices=(*request_.prices, ModelPrice(model="also", input_per_mtok=1.0, output_per_mtok=1.0)),
        remove=request_.remove,
    )
    assert error_code(sim.request(sim.client, request_)) == code
    assert prices(sim) == (kept,)
    sim.restart()
    assert prices(sim) == (kept,)


def test_a_price_is_removed_and_a_reader_may_not_set_one(sim: RunSim) -> None:
    expect(set_prices(sim, GPT), PricesReply)
    assert expect(set_prices(sim, remove=("scripted",)), PricesReply).prices == ()
    reader = sim.connect("reader")
    assert error_code(sim.request(reader, SetPrices(prices=(GPT,)))) == ErrorCode.READ_ONLY
    assert prices(sim) == ()


# ----------------------------------------------------------------------------------------------- roll-ups


def test_usage_rolls_up_per_run_conversation_model_and_tree_once(sim: RunSim) -> None:
    run_id, task_id, worker = leased_run(sim)
    conversation_id = sim.run(run_id).conversation_id
    op = fresh_id()
    worker.ok(task_id, model_intent(run_id, op))
    finish = FinishOperation(operation_id=op, status="completed", usage=tokens(10, 20))
    worker.ok(task_id, finish)
    head = sim.core.head_seq
    # The same result again (a worker that lost the reply and replays its commit) is refused: counted once.
    assert error_code(worker.commit(task_id, finish)) == ErrorCode.CONFLICT
    assert sim.core.head_seq == head
    assert sim.run(run_id).usage == tokens(10, 20)
    assert totals(sim, "conversation", conversation_id).totals == (
        UsageTotal(scope="conversation", key=conversation_id, usage=tokens(10, 20)),
    )
    assert totals(sim, "model").totals == (UsageTotal(scope="model", key="scripted", usage=tokens(10, 20)),)
    # A top-level run's task is the root of its own tree; any task of the tree names it.
    assert totals(sim, "tree", task_id).totals == (UsageTotal(scope="tree", key=task_id, usage=tokens(10, 20)),)
    sim.restart()
    assert totals(sim, "tree", task_id).totals[0].usage == tokens(10, 20)


def test_a_subagent_run_counts_toward_its_parent_task_tree(sim: RunSim) -> None:
    # A parent agent run whose tool task creates a conversation it owns (a subagent) and submits to it.
    parent_run, parent_task, worker = leased_run(sim)
    tool_id, tools = with_tool(sim, worker, parent_task)
    sub_conversation = fresh_id()
    tools.ok(tool_id, CreateConversation(conversation_id=sub_conversation, owner_task_id=tool_id, agent="support"))
    sub_run = sim.start_run(sub_conversation)
    sub_task = sim.run(sub_run).task_id
    assert sub_task is not None and worker.holds(sub_task)
    model_turn(sim, worker, sub_task, sub_run, tokens(100, 50))
    # The tool's own usage (a tool may report one) counts toward the same tree, but toward no model.
    op = fresh_id()
    tools.ok(tool_id, tool_intent(parent_run, op, "safe"))
    tools.ok(tool_id, FinishOperation(operation_id=op, status="completed", usage=tokens(1, 1)))
    tree = totals(sim, "tree", sub_task).totals
    assert tree == (UsageTotal(scope="tree", key=parent_task, usage=tokens(101, 51)),)
    assert totals(sim, "tree", tool_id).totals == tree
    assert totals(sim, "conversation", sub_conversation).totals[0].usage == tokens(100, 50)
    assert totals(sim, "model").totals == (UsageTotal(scope="model", key="scripted", usage=tokens(100, 50)),)
    # Every tree in key order, paged.
    first = totals(sim, "tree", limit=1)
    assert [total.key for total in first.totals] == [parent_task] and first.next_after_key is None


def test_usage_totals_are_read_in_pages(sim: RunSim) -> None:
    worker = sim.agent_worker()
    conversations = []
    for n in range(3):
        run_id = sim.start_run(sim.agent_conversation())
        run = sim.run(run_id)
        assert run.task_id is not None
        model_turn(sim, worker, run.task_id, run_id, tokens(n + 1, 0))
        conversations.append(run.conversation_id)
    page = totals(sim, "conversation", limit=2)
    assert [total.key for total in page.totals] == sorted(conversations)[:2]
    rest = totals(sim, "conversation", limit=2, after_key=page.next_after_key)
    assert [total.key for total in rest.totals] == sorted(conversations)[2:] and rest.next_after_key is None
    # A listing's first page says how many totals there are (what a reader that stops there leaves out); later
    # pages and one key's total do not count again.
    assert (page.count, rest.count, totals(sim, "conversation", conversations[0]).count) == (3, None, None)
    assert totals(sim, "conversation", limit=5).count == 3
    assert error_code(sim.request(sim.client, ReadUsageTotals(scope="conversation", limit=0))) == ErrorCode.INVALID
    assert error_code(sim.request(sim.client, ReadUsageTotals(scope="run"))) == ErrorCode.INVALID  # type: ignore[arg-type]


def test_a_reported_usage_that_no_provider_reports_is_refused(sim: RunSim) -> None:
    run_id, task_id, worker, op = model_requested(sim)
    bad = FinishOperation(operation_id=op, status="completed", usage=tokens(-1, 5))
    assert error_code(worker.commit(task_id, bad)) == ErrorCode.INVALID
    assert sim.run(run_id).usage == RunUsage()


# ------------------------------------------------------------------------------------------------ budgets


def test_a_model_request_past_the_conversation_budget_fails_the_run_before_its_intent(sim: RunSim) -> None:
    run_id, task_id, worker = leased_run(sim)
    conversation_id = sim.run(run_id).conversation_id
    reply = sim.request(sim.client, SetBudget(scope="conversation", key=conversation_id, max_tokens=100))
    assert expect(reply, BudgetReply).budget == Budget(scope="conversation", key=conversation_id, max_tokens=100)
    model_turn(sim, worker, task_id, run_id, tokens(60, 30))  # 90 of 100: the next request may start
    model_turn(sim, worker, task_id, run_id, tokens(60, 30))  # started under the budget, ends past it
    op = fresh_id()
    head = sim.core.head_seq
    refused = worker.commit(task_id, model_intent(run_id, op))
    assert isinstance(refused, Error) and refused.code == ErrorCode.BUDGET_EXCEEDED
    # The intent was not written (no model may be called for it); the run's task ended failed in its place.
    assert error_code(sim.request(sim.client, ReadOperation(operation_id=op))) == ErrorCode.NOT_FOUND
    run = sim.run(run_id)
    assert (run.status, run.reason) == ("failed", "budget_exceeded")
    task = sim.core.tasks.record(task_id)
    assert task is not None and task.outcome is not None
    assert (task.outcome.status, task.outcome.reason) == ("failed", "budget_exceeded")
    assert sim.core.head_seq == head + 2  # the task's end, then the run's derived status
    # The lease ended with it: a late commit under it is refused and changes nothing.
    assert error_code(worker.commit(task_id, completed(task_id))) == ErrorCode.STALE_LEASE
    assert sim.run(run_id).usage == tokens(120, 60)


def test_a_tree_budget_is_kept_under_its_root_and_stops_a_subagent(sim: RunSim) -> None:
    parent_run, parent_task, worker = leased_run(sim)
    tool_id, tools = with_tool(sim, worker, parent_task)
    expect(set_prices(sim, GPT), PricesReply)
    reply = sim.request(sim.client, SetBudget(scope="tree", key=tool_id, max_cost=1.0))
    assert expect(reply, BudgetReply).key == parent_task  # any task of the tree names the root's budget
    sub_conversation = fresh_id()
    tools.ok(tool_id, CreateConversation(conversation_id=sub_conversation, owner_task_id=tool_id, agent="support"))
    sub_run = sim.start_run(sub_conversation)
    sub_task = sim.run(sub_run).task_id
    assert sub_task is not None
    model_turn(sim, worker, sub_task, sub_run, tokens(500_000, 0))  # $1.00 of $1.00
    refused = worker.commit(sub_task, model_intent(sub_run, fresh_id()))
    assert error_code(refused) == ErrorCode.BUDGET_EXCEEDED
    assert (sim.run(sub_run).status, sim.run(sub_run).reason) == ("failed", "budget_exceeded")
    read = totals(sim, "tree", sub_task)
    assert read.budgets == (Budget(scope="tree", key=parent_task, max_cost=1.0),)
    assert read.totals[0].usage.cost == pytest.approx(1.0)
    # Raised, the retried run goes on: its next model request starts.
    expect(sim.request(sim.client, SetBudget(scope="tree", key=parent_task, max_cost=5.0)), BudgetReply)
    expect(sim.request(sim.client, RetryRun(run_id=sub_run)), RunReply)
    retried = sim.run(sub_run).task_id
    assert retried is not None and retried != sub_task and worker.holds(retried)
    expect(worker.commit(retried, model_intent(sub_run, fresh_id())), Committed)
    assert sim.run(parent_run).status == "running"


def test_a_spent_budget_says_so_in_plain_decimals_and_what_to_do(sim: RunSim) -> None:
    run_id, task_id, worker = leased_run(sim)
    conversation_id = sim.run(run_id).conversation_id
    expect(set_prices(sim, GPT), PricesReply)
    expect(sim.request(sim.client, SetBudget(scope="conversation", key=conversation_id, max_cost=0.00001)), BudgetReply)
    model_turn(sim, worker, task_id, run_id, tokens(10, 0))  # 10 input tokens at 2 per million: 0.00002
    assert error_code(worker.commit(task_id, model_intent(run_id, fresh_id()))) == ErrorCode.BUDGET_EXCEEDED
    run = sim.run(run_id)
    assert run.reason == "budget_exceeded" and run.error is not None
    assert run.error.startswith(f"the budget of conversation {conversation_id} is spent ")  # the run is the record's
    assert "(a cost of 0.00002 of its max_cost 0.00001)" in run.error and "e-05" not in run.error
    assert run.error.endswith(
        f"raise it first (tether budget --conversation {conversation_id} --max-tokens N or --max-cost X, or "
        f"--clear to remove it), then tether retry {run_id}"
    )


def test_a_cost_budget_refuses_a_model_without_a_price(sim: RunSim) -> None:
    run_id, task_id, worker = leased_run(sim)
    conversation_id = sim.run(run_id).conversation_id
    expect(sim.request(sim.client, SetBudget(scope="conversation", key=conversation_id, max_cost=10.0)), BudgetReply)
    assert error_code(worker.commit(task_id, model_intent(run_id, fresh_id()))) == ErrorCode.BUDGET_EXCEEDED
    assert sim.run(run_id).reason == "budget_exceeded"


def test_a_removed_budget_no_longer_stops_a_run(sim: RunSim) -> None:
    run_id, task_id, worker = leased_run(sim)
    conversation_id = sim.run(run_id).conversation_id
    expect(sim.request(sim.client, SetBudget(scope="conversation", key=conversation_id, max_tokens=0)), BudgetReply)
    cleared = sim.request(sim.client, SetBudget(scope="conversation", key=conversation_id))
    assert expect(cleared, BudgetReply).budget is None
    expect(worker.commit(task_id, model_intent(run_id, fresh_id())), Committed)


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"max_tokens": -1}, ErrorCode.INVALID),
        ({"max_cost": -0.5}, ErrorCode.INVALID),
        ({"max_cost": math.nan}, ErrorCode.INVALID),
        ({"key": "not-an-id", "max_tokens": 5}, ErrorCode.INVALID),
        ({"key": "unknown", "max_tokens": 5}, ErrorCode.NOT_FOUND),
        ({"scope": "tree", "key": "unknown", "max_tokens": 5}, ErrorCode.NOT_FOUND),
        ({"scope": "run", "max_tokens": 5}, ErrorCode.INVALID),
    ],
)
def test_bad_budgets_are_refused_and_change_nothing(sim: RunSim, fields: dict[str, object], code: ErrorCode) -> None:
    conversation_id = sim.agent_conversation()
    kept = Budget(scope="conversation", key=conversation_id, max_tokens=7)
    expect(sim.request(sim.client, SetBudget(scope="conversation", key=conversation_id, max_tokens=7)), BudgetReply)
    if fields.get("key") == "unknown":
        fields["key"] = fresh_id()
    request = SetBudget(**{"scope": "conversation", "key": conversation_id, **fields})  # type: ignore[arg-type]
    assert error_code(sim.request(sim.client, request)) == code
    assert totals(sim, "conversation", conversation_id).budgets == (kept,)


def test_the_price_table_is_bounded(sim: RunSim, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("storage_owner.core._usage.MAX_PRICED_MODELS", 3)
    table = tuple(ModelPrice(model=f"m{n}", input_per_mtok=1.0, output_per_mtok=1.0) for n in range(3))
    expect(set_prices(sim, *table), PricesReply)
    one_more = ModelPrice(model="m3", input_per_mtok=1.0, output_per_mtok=1.0)
    assert error_code(set_prices(sim, one_more)) == ErrorCode.INVALID
    # Replacing a price, or one in and one out, stays within the bound.
    expect(set_prices(sim, one_more, remove=("m0",)), PricesReply)
    assert [price.model for price in prices(sim)] == ["m1", "m2", "m3"]


def test_the_tree_root_cache_is_bounded_and_a_root_never_changes(sim: RunSim, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("storage_owner.core._usage.MAX_CACHED_ROOTS", 2)
    accounting = sim.core.usage
    _, parent_task, worker = leased_run(sim)
    tool_id, tools = with_tool(sim, worker, parent_task)
    sub_conversation = fresh_id()
    tools.ok(tool_id, CreateConversation(conversation_id=sub_conversation, owner_task_id=tool_id, agent="support"))
    sub_task = sim.run(sim.start_run(sub_conversation)).task_id
    assert sub_task is not None
    for _ in range(3):
        assert [accounting.tree_root(task) for task in (parent_task, tool_id, sub_task)] == [parent_task] * 3
        assert len(accounting._roots) <= 2


def test_a_model_request_past_budget_under_a_lease_the_owner_cannot_end_is_only_refused(sim: RunSim) -> None:
    run_id, task_id, worker = leased_run(sim)
    tool_id, tools = with_tool(sim, worker, task_id)
    conversation_id = sim.run(run_id).conversation_id
    expect(sim.request(sim.client, SetBudget(scope="conversation", key=conversation_id, max_tokens=0)), BudgetReply)
    head = sim.core.head_seq
    # Under a tool task's lease (not the run's): refused like any bad write, and nothing ends.
    assert error_code(tools.commit(tool_id, model_intent(run_id, fresh_id()))) == ErrorCode.CONFLICT
    assert sim.core.head_seq == head and tools.holds(tool_id)
    assert sim.run(run_id).status == "running"
    # An abort handler's lease: its phase cannot end failed, so the refusal alone (the handler ends as it will).
    expect(sim.request(sim.client, CancelRun(run_id=run_id)), RunReply)
    expect(tools.release(tool_id), Ok)
    tools.ok(tool_id, ended(tool_id, "aborted"))
    assert worker.holds(task_id) and worker.lease(task_id).mode == "abort"
    assert error_code(worker.commit(task_id, model_intent(run_id, fresh_id()))) == ErrorCode.CONFLICT
    worker.ok(task_id, ended(task_id, "aborted"))
    assert sim.run(run_id).status == "cancelled"


def test_a_retried_run_stays_in_its_task_tree_and_under_its_budget(sim: RunSim) -> None:
    run_id, task_id, worker = leased_run(sim)
    expect(sim.request(sim.client, SetBudget(scope="tree", key=task_id, max_tokens=100)), BudgetReply)
    model_turn(sim, worker, task_id, run_id, tokens(80, 40))  # 120 of 100
    assert error_code(worker.commit(task_id, model_intent(run_id, fresh_id()))) == ErrorCode.BUDGET_EXCEEDED
    assert sim.run(run_id).reason == "budget_exceeded"
    # Retried without raising the budget: the new task is of the same tree, so the spent budget still stops it.
    expect(sim.request(sim.client, RetryRun(run_id=run_id)), RunReply)
    retried = sim.run(run_id).task_id
    assert retried is not None and retried != task_id and worker.holds(retried)
    assert sim.core.usage.tree_root(retried) == task_id
    assert error_code(worker.commit(retried, model_intent(run_id, fresh_id()))) == ErrorCode.BUDGET_EXCEEDED
    assert totals(sim, "tree", retried).budgets == (Budget(scope="tree", key=task_id, max_tokens=100),)
    # Raised (naming either task), the next retry goes on, and its usage adds to the one tree total.
    reply = sim.request(sim.client, SetBudget(scope="tree", key=retried, max_tokens=1_000))
    assert expect(reply, BudgetReply).key == task_id
    expect(sim.request(sim.client, RetryRun(run_id=run_id)), RunReply)
    third = sim.run(run_id).task_id
    assert third is not None and worker.holds(third)
    model_turn(sim, worker, third, run_id, tokens(10, 5))
    [total] = totals(sim, "tree", third).totals
    assert (total.key, total.usage) == (task_id, tokens(90, 45))
    assert [t.key for t in totals(sim, "tree").totals] == [task_id]


def test_the_budget_is_checked_only_when_a_new_attempt_is_written(sim: RunSim) -> None:
    run_id, task_id, worker = leased_run(sim)
    conversation_id = sim.run(run_id).conversation_id
    expect(sim.request(sim.client, SetBudget(scope="conversation", key=conversation_id, max_tokens=10)), BudgetReply)
    op = model_turn(sim, worker, task_id, run_id, tokens(80, 40))  # started under the budget, ends past it
    head = sim.core.head_seq
    # Its intent sent again (a worker replaying a turn whose result is committed): the usual conflict, and the
    # run goes on to use the committed result; no model request was needed, so the budget is not the answer.
    assert error_code(worker.commit(task_id, model_intent(run_id, op))) == ErrorCode.CONFLICT
    assert sim.core.head_seq == head and worker.holds(task_id)
    assert sim.run(run_id).status == "running"
    # A new request is where the budget stops the run.
    assert error_code(worker.commit(task_id, model_intent(run_id, fresh_id()))) == ErrorCode.BUDGET_EXCEEDED
    assert sim.run(run_id).reason == "budget_exceeded"


def test_tokens_of_unknown_cost_are_counted_and_a_cost_budget_will_not_pass_them(sim: RunSim) -> None:
    run_id, task_id, worker = leased_run(sim)
    conversation_id = sim.run(run_id).conversation_id
    # Before any price: the tokens have no cost, and they are counted as unpriced (a worker's count is ignored).
    model_turn(sim, worker, task_id, run_id, attrs.evolve(tokens(1_000_000, 0), unpriced_tokens=0))
    expect(set_prices(sim, GPT), PricesReply)
    model_turn(sim, worker, task_id, run_id, attrs.evolve(tokens(500_000, 0), unpriced_tokens=7))  # $1.00
    usage = sim.run(run_id).usage
    assert (usage.cost, usage.unpriced_tokens) == (pytest.approx(1.0), 1_000_000)
    for scope, key in (("conversation", conversation_id), ("tree", task_id), ("model", "scripted")):
        [total] = totals(sim, scope, key).totals
        assert (total.usage.cost, total.usage.unpriced_tokens) == (pytest.approx(1.0), 1_000_000), scope
    # A cost budget far above the known cost still cannot bound it: the next request is not started, and why is said.
    expect(sim.request(sim.client, SetBudget(scope="conversation", key=conversation_id, max_cost=100.0)), BudgetReply)
    refused = worker.commit(task_id, model_intent(run_id, fresh_id()))
    assert isinstance(refused, Error) and refused.code == ErrorCode.BUDGET_EXCEEDED
    assert "1000000 tokens were used with no price" in refused.message
    assert sim.run(run_id).reason == "budget_exceeded"
    # A token budget bounds it.
    expect(sim.request(sim.client, SetBudget(scope="conversation", key=conversation_id, max_tokens=10**7)), BudgetReply)
    expect(sim.request(sim.client, RetryRun(run_id=run_id)), RunReply)
    retried = sim.run(run_id).task_id
    assert retried is not None
    expect(worker.commit(retried, model_intent(run_id, fresh_id())), Committed)


def test_a_reported_cost_of_a_model_without_a_price_is_kept_and_complete(sim: RunSim) -> None:
    run_id, task_id, worker = leased_run(sim)
    model_turn(sim, worker, task_id, run_id, attrs.evolve(tokens(100, 100), cost=0.25))
    usage = sim.run(run_id).usage
    assert (usage.cost, usage.unpriced_tokens) == (0.25, 0)
