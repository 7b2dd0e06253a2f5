"""Usage and cost, sans-IO: the price table, the roll-ups a model request's result adds to, and budgets
(docs/runs.md, "Usage and cost", states it for users).

1. **Cost at commit.** A model request's cost is computed from the price table when its result commits (in
   ``finish_operation``) and stored with it: a price changed later never changes a committed cost. A model without a
   price has cost ``None`` (unknown), unless the worker reported one. Tokens of unknown cost are counted as
   ``unpriced_tokens``, which totals sum: a total with some has an incomplete cost (a lower bound).
2. **Roll-ups, exactly once.** A result's usage is added, in the commit that writes it, to its operation, its run,
   its conversation, its model (model requests) or its tool (tool calls), and its **task tree**; a second result of
   the same attempt is refused, so a replay never counts twice.
3. **Task tree.** Every task is owned by a task or by a conversation, and a conversation may be owned by a task (a
   subagent's). The root of a task's tree is found by walking up: to the owner task, or, for a task owned by a
   conversation, to the task owning that conversation; the root is the first task owned by a conversation that no
   task owns. A run's usage counts toward the tree of its task's root: a subagent's run (its conversation created
   under a task) adds to the tree of the root task above it. Ownership never changes, so neither does a root.
   A run's tasks (a new one per retry) are one tree, keyed by its first task: a root that is a run's later task
   stands for its first, so a retried run's budget and totals carry over the retry.
4. **Budgets** (per conversation, or per task tree keyed by its root): before a model request's intent commits, the
   owner checks the run's conversation's and task tree's budgets; once the usage has reached ``max_tokens``
   (input + output tokens) or ``max_cost``, or a ``max_cost`` budget meets a model without a price or a total
   with ``unpriced_tokens`` (its cost could not be bounded), the intent is refused and the run's task ends
   ``failed`` (``budget_exceeded``) in that commit, so no model is called. A request that starts under its budget
   may end past it: a budget bounds when requests start, not how large one is.
"""

from __future__ import annotations

import math
from typing import Final

import attrs

from protocol import (
    Budget,
    BudgetReply,
    ErrorCode,
    Frame,
    LeaseRef,
    ModelPrice,
    PricesReply,
    ReadPrices,
    ReadUsage,
    ReadUsageTotals,
    RunRecord,
    RunUsage,
    SetBudget,
    SetPrices,
    SetTaskState,
    TaskOutcome,
    TaskRecord,
    UsageReply,
    UsageTotal,
    UsageTotalsReply,
    amount_text,
)

from ._checks import MAX_NAME_CHARS, MAX_READ_LIMIT, Refusal, check_id, no_conversation
from ._output import PeerId
from ._ports import ConversationReads, TaskReads, UsageStore
from ._run_rules import AGENT_KIND_PREFIX, run_task_id
from ._runs import Runs
from ._tasks import TaskEngine
from ._unit import Journal, UnitOfWork

TOKENS_PER_PRICE_UNIT: Final = 1_000_000
MAX_PRICED_MODELS: Final = 10_000
"""The price table holds at most this many models (the owner keeps it in memory)."""
MAX_CACHED_ROOTS: Final = 100_000
"""Tree roots the owner remembers by task (the cache is dropped whole past this)."""
MAX_TREE_DEPTH: Final = 100_000
"""A walk to a tree's root stops here (ownership has no cycles: a guard against a damaged database, not a limit)."""


class BudgetRefusal(Refusal):
    """A model request's intent refused for its budget: the core ends the run's task ``failed`` instead."""

    def __init__(self, message: str, *, task_id: str, why: str, lease: LeaseRef | None) -> None:
        super().__init__(ErrorCode.BUDGET_EXCEEDED, message)
        self.task_id = task_id
        self.lease = lease
        """The lease the refused intent was committed under (its phase ends if it is the run task's)."""
        self.why = why
        """The message without the run it names: the run's task's error (the run's own record says which run)."""


def cost_of(usage: RunUsage, price: ModelPrice) -> float:
    """What ``usage`` costs at ``price`` (per million tokens). Cached tokens are part of the input and reasoning
    tokens part of the output, as providers count them: each part at its own price when it has one."""
    cached = min(usage.cached_tokens, usage.input_tokens)
    cached_price = price.input_per_mtok if price.cached_input_per_mtok is None else price.cached_input_per_mtok
    total = (usage.input_tokens - cached) * price.input_per_mtok + cached * cached_price
    if price.reasoning_per_mtok is None:
        total += usage.output_tokens * price.output_per_mtok
    else:
        reasoning = min(usage.reasoning_tokens, usage.output_tokens)
        total += (usage.output_tokens - reasoning) * price.output_per_mtok + reasoning * price.reasoning_per_mtok
    return total / TOKENS_PER_PRICE_UNIT


def add_usage(total: RunUsage, more: RunUsage) -> RunUsage:
    cost = total.cost if more.cost is None else (total.cost or 0.0) + more.cost
    return RunUsage(
        input_tokens=total.input_tokens + more.input_tokens,
        output_tokens=total.output_tokens + more.output_tokens,
        cached_tokens=total.cached_tokens + more.cached_tokens,
        reasoning_tokens=total.reasoning_tokens + more.reasoning_tokens,
        cost=cost,
        unpriced_tokens=total.unpriced_tokens + more.unpriced_tokens,
    )


def total_tokens(usage: RunUsage) -> int:
    """The tokens a budget counts: input plus output (cached and reasoning tokens are parts of those)."""
    return usage.input_tokens + usage.output_tokens


def check_usage(usage: RunUsage | None, where: str) -> None:
    """Refuse a reported usage that no provider reports: a negative count, or a cost that is not a finite number
    of 0 or more."""
    if usage is None:
        return
    counts = (usage.input_tokens, usage.output_tokens, usage.cached_tokens, usage.reasoning_tokens)
    if min(counts) < 0:
        raise Refusal(ErrorCode.INVALID, f"{where}.usage: token counts are 0 or more, not {counts}")
    if usage.cost is not None and not (math.isfinite(usage.cost) and usage.cost >= 0):
        raise Refusal(ErrorCode.INVALID, f"{where}.usage.cost must be a finite number of 0 or more, not {usage.cost}")


def _check_amount(value: float | None, where: str, *, optional: bool) -> None:
    if value is None and optional:
        return
    if value is None or not math.isfinite(value) or value < 0:
        raise Refusal(ErrorCode.INVALID, f"{where} must be a finite number of 0 or more, not {value}")


class Usage:
    """The price table (in memory, as stored), tree roots, the budget checks of one owner, and its usage and price
    requests."""

    def __init__(
        self,
        store: UsageStore,
        tasks: TaskEngine,
        runs: Runs,
        *,
        stored_conversations: ConversationReads,
        stored_tasks: TaskReads,
        journal: Journal,
    ) -> None:
        self._store = store
        self._stored_conversations = stored_conversations
        self._stored_tasks = stored_tasks
        self._tasks = tasks
        self._runs = runs
        self.prices: dict[str, ModelPrice] = {price.model: price for price in store.prices()}
        self._has_budgets = store.budget_count() > 0
        self._roots: dict[str, str] = {}
        self._journal = journal
        self.totals: dict[tuple[str, str], RunUsage] | None = None
        """With telemetry on (``OwnerCore.observe``): the usage committed since the owner started, by kind (``model``
        or ``tool``) and name, for its token and cost counters."""

    # --------------------------------------------------------------------------------------------- trees

    def tree_root(self, task_id: str) -> str:
        """The root task of ``task_id``'s tree (rule 3); ``task_id`` must exist."""
        root = self._roots.get(task_id)
        if root is not None:
            return root
        record = self._tasks.record(task_id)
        assert record is not None, f"task {task_id} is not stored"
        for _ in range(MAX_TREE_DEPTH):
            owner = record.owner_task_id
            if owner is None:
                conversation = self._stored_conversations.conversation(record.conversation_id)
                owner = None if conversation is None else conversation.owner_task_id
            if owner is None:
                break
            upper = self._tasks.record(owner)
            if upper is None:
                break
            record = upper
        root = self._first_task(record)
        if len(self._roots) >= MAX_CACHED_ROOTS:
            self._roots.clear()
        self._roots[task_id] = root
        return root

    def _first_task(self, task: TaskRecord) -> str:
        """The first task of the run whose (later) task ``task`` is, so that a run's tasks are one task tree (rule
        3); ``task`` itself when it is no run's task."""
        if not task.kind.startswith(AGENT_KIND_PREFIX):
            return task.task_id
        input_value, _ = self._stored_tasks.task_data(task.task_id)
        run_id = input_value.get("run_id") if isinstance(input_value, dict) else None
        if not isinstance(run_id, str):
            return task.task_id
        # Its tasks are 1, 2, ... with no gap (one per admission): a task merely naming the run is not one of them.
        attempt = 2
        while (later := run_task_id(run_id, attempt)) != task.task_id:
            if self._tasks.record(later) is None:
                return task.task_id
            attempt += 1
        return run_task_id(run_id, 1)

    # ---------------------------------------------------------------------------------------- at commit

    def priced(self, kind: str, name: str, usage: RunUsage) -> RunUsage:
        """A result's ``usage`` as stored (rule 1): a model request's cost from the price table, else as reported;
        its tokens ``unpriced_tokens`` when its cost stays unknown (whatever the worker sent there)."""
        price = self.prices.get(name) if kind == "model" else None
        cost = usage.cost if price is None else cost_of(usage, price)
        return attrs.evolve(usage, cost=cost, unpriced_tokens=total_tokens(usage) if cost is None else 0)

    def add(self, run: RunRecord, task: TaskRecord, kind: str, model: str, usage: RunUsage) -> None:
        """Add a committed result's usage to its conversation, model (model requests) or tool (tool calls: the usage
        its handler reported) and task tree (rule 2)."""
        scopes = (
            ("conversation", run.conversation_id),
            ("model" if kind == "model" else "tool", model),
            ("tree", self.tree_root(task.task_id)),
        )
        self._store.add_usages(scopes, usage)  # one statement: three scopes, so three distinct rows
        totals = self.totals
        if totals is not None:
            key = ("model" if kind == "model" else "tool", model)
            before = totals.get(key)
            totals[key] = usage if before is None else add_usage(before, usage)

            def undo() -> None:
                if before is None:
                    del totals[key]
                else:
                    totals[key] = before

            self._journal.undo(undo)

    def check_budget(self, run: RunRecord, task: TaskRecord, model: str, lease: LeaseRef | None) -> None:
        """Refuse a model request's intent past the budget of the run's conversation or task tree (rule 4)."""
        if not self._has_budgets:
            return
        root = self.tree_root(task.task_id)
        for scope, key, what, option in (
            ("conversation", run.conversation_id, f"conversation {run.conversation_id}", "--conversation"),
            ("tree", root, f"the task tree of {root}", "--task"),
        ):
            budget = self._store.budget(scope, key)
            if budget is None:
                continue
            found = self._store.usage(scope, key)
            used = found[0][1] if found else RunUsage()
            spent = None
            if budget.max_tokens is not None and total_tokens(used) >= budget.max_tokens:
                spent = f"{total_tokens(used)} tokens used of its max_tokens {budget.max_tokens}"
            elif budget.max_cost is not None and (used.cost or 0.0) >= budget.max_cost:
                spent = f"a cost of {amount_text(used.cost or 0.0)} of its max_cost {amount_text(budget.max_cost)}"
            elif budget.max_cost is not None and used.unpriced_tokens:
                spent = (
                    f"its max_cost {amount_text(budget.max_cost)} cannot bound a cost that is not known: "
                    f"{used.unpriced_tokens} tokens were used with no price (the known cost is "
                    f"{amount_text(used.cost or 0.0)}); bound it with max_tokens instead"
                )
            elif budget.max_cost is not None and model not in self.prices:
                spent = (
                    f"its max_cost cannot bound model {model!r}, which has no price (set one: tether prices set "
                    f"{model} --input X --output Y; 0 for a free model)"
                )
            if spent is not None:
                why = (
                    f"the budget of {what} is spent ({spent}): the model request was not started and the run ends "
                    f"failed (budget_exceeded); raise it first (tether budget {option} {key} --max-tokens N or "
                    f"--max-cost X, or --clear to remove it), then tether retry {run.run_id}"
                )
                task_id = run.task_id or task.task_id
                raise BudgetRefusal(f"run {run.run_id}: {why}", task_id=task_id, why=why, lease=lease)

    def end_over_budget(self, unit: UnitOfWork, refusal: BudgetRefusal) -> None:
        """A run's model request was refused for its budget (rule 4): its task ends ``failed`` (``budget_exceeded``)
        in a commit of its own, in place of the refused one, which ends the phase's lease. Refused (a plain
        ``conflict``, which the phase meets as any other error) under another task's lease or an abort handler's,
        which ends as it was going to."""
        lease = refusal.lease
        if lease is None or lease.task_id != refusal.task_id:
            raise Refusal(ErrorCode.CONFLICT, refusal.message)
        outcome = TaskOutcome(status="failed", reason="budget_exceeded", error=refusal.why)
        end = SetTaskState(task_id=lease.task_id, status="terminal", outcome=outcome)
        try:
            record = self._tasks.set_state(end, lease, unit.seq, unit.now_ms, "budget")
        except Refusal:  # an abort handler's lease
            raise Refusal(ErrorCode.CONFLICT, refusal.message) from None
        unit.records.append(record)
        self._runs.tasks_changed((record,))

    # ------------------------------------------------------------------------------------------ requests

    def on_read_usage(self, peer: PeerId, call_id: int, request: ReadUsage, now_ms: int) -> Frame:
        if request.conversation_id is None:
            totals = [
                UsageTotal(scope="model", key=key, usage=usage) for key, usage in self._store.usage("model", None)
            ]
        else:
            if self._stored_conversations.conversation(request.conversation_id) is None:
                raise Refusal(ErrorCode.NOT_FOUND, no_conversation(request.conversation_id))
            found = self._store.usage("conversation", request.conversation_id)
            totals = [UsageTotal(scope="conversation", key=key, usage=usage) for key, usage in found]
        return UsageReply(totals=tuple(totals))

    def on_read_usage_totals(self, peer: PeerId, call_id: int, request: ReadUsageTotals, now_ms: int) -> Frame:
        return self.read_totals(request, MAX_READ_LIMIT)

    def on_set_prices(self, unit: UnitOfWork, request: SetPrices) -> Frame:
        """Settings, not history: a price change takes no seq (results committed from now on use it)."""
        self.set_prices(request)
        return PricesReply(prices=self.price_table())

    def on_read_prices(self, peer: PeerId, call_id: int, request: ReadPrices, now_ms: int) -> Frame:
        return PricesReply(prices=self.price_table())

    def on_set_budget(self, unit: UnitOfWork, request: SetBudget) -> Frame:
        """Settings, not history: a budget change takes no seq; the next model request of a run is checked."""
        return self.set_budget(request)

    def price_table(self) -> tuple[ModelPrice, ...]:
        return tuple(self.prices[model] for model in sorted(self.prices))

    def set_prices(self, request: SetPrices) -> None:
        """Apply a ``SetPrices`` whole, or refuse it changing nothing (checked before the first write)."""
        seen: set[str] = set()
        for index, price in enumerate(request.prices):
            where = f"prices[{index}]"
            if not 1 <= len(price.model) <= MAX_NAME_CHARS:
                raise Refusal(ErrorCode.INVALID, f"{where}.model must hold 1 to {MAX_NAME_CHARS} characters")
            if price.model in seen:
                raise Refusal(ErrorCode.INVALID, f"{where}: model {price.model!r} is priced twice")
            seen.add(price.model)
            _check_amount(price.input_per_mtok, f"{where}.input_per_mtok ({price.model})", optional=False)
            _check_amount(price.output_per_mtok, f"{where}.output_per_mtok ({price.model})", optional=False)
            _check_amount(price.cached_input_per_mtok, f"{where}.cached_input_per_mtok ({price.model})", optional=True)
            _check_amount(price.reasoning_per_mtok, f"{where}.reasoning_per_mtok ({price.model})", optional=True)
        for index, model in enumerate(request.remove):
            if model in seen:
                raise Refusal(ErrorCode.INVALID, f"remove[{index}]: model {model!r} is both priced and removed")
            if model not in self.prices:
                raise Refusal(ErrorCode.NOT_FOUND, f"remove[{index}]: model {model!r} has no price to remove")
        after = (set(self.prices) | seen) - set(request.remove)
        if len(after) > MAX_PRICED_MODELS:
            raise Refusal(ErrorCode.INVALID, f"the price table holds at most {MAX_PRICED_MODELS} models")
        for price in request.prices:
            self._store.put_price(price)
        for model in request.remove:
            self._store.delete_price(model)
        # Memory follows only once the writes succeeded (a storage error fails the owner closed anyway).
        for price in request.prices:
            self.prices[price.model] = price
        for model in request.remove:
            del self.prices[model]

    def budget_key(self, scope: str, key: str, where: str) -> str:
        """The key a budget of ``scope`` is kept under: the conversation id, or the root of the task's tree."""
        check_id(key, f"{where}.key")
        if scope == "conversation":
            if self._stored_conversations.conversation(key) is None:
                raise Refusal(ErrorCode.NOT_FOUND, no_conversation(key))
            return key
        if scope == "tree":
            if self._tasks.record(key) is None:
                raise Refusal(ErrorCode.NOT_FOUND, f"task {key} does not exist")
            return self.tree_root(key)
        raise Refusal(ErrorCode.INVALID, f"{where}.scope must be conversation or tree, not {scope!r}")

    def set_budget(self, request: SetBudget) -> BudgetReply:
        key = self.budget_key(request.scope, request.key, "set_budget")
        if request.max_tokens is not None and request.max_tokens < 0:
            raise Refusal(ErrorCode.INVALID, f"max_tokens must be 0 or more, not {request.max_tokens}")
        _check_amount(request.max_cost, "max_cost", optional=True)
        if request.max_tokens is None and request.max_cost is None:
            self._store.delete_budget(request.scope, key)
            return BudgetReply(scope=request.scope, key=key, budget=None)
        budget = Budget(scope=request.scope, key=key, max_tokens=request.max_tokens, max_cost=request.max_cost)
        self._store.put_budget(budget)
        self._has_budgets = True
        return BudgetReply(scope=request.scope, key=key, budget=budget)

    def read_totals(self, request: ReadUsageTotals, max_limit: int) -> UsageTotalsReply:
        if not 1 <= request.limit <= max_limit:
            raise Refusal(ErrorCode.INVALID, f"limit must be between 1 and {max_limit}, not {request.limit}")
        scope = request.scope
        if scope not in ("model", "tool", "conversation", "tree"):
            raise Refusal(ErrorCode.INVALID, f"scope must be model, tool, conversation or tree, not {scope!r}")
        store = self._store
        more = False
        count = None
        if request.key is None:
            found, more = store.usage_page(scope, request.after_key, request.limit)
            keys = [key for key, _ in found]
            if request.after_key is None:  # once per listing: what a reader of the first page shows beyond it
                count = len(found) if not more else store.usage_count(scope)
        else:
            key = (
                request.key if scope in ("model", "tool") else self.budget_key(scope, request.key, "read_usage_totals")
            )
            found = store.usage(scope, key) or [(key, RunUsage())]
            keys = [key]
        totals = tuple(UsageTotal(scope=scope, key=key, usage=usage) for key, usage in found)
        budgets: list[Budget] = []
        if scope != "model":
            for key in keys:
                budget = store.budget(scope, key)
                if budget is not None:
                    budgets.append(budget)
        next_after = totals[-1].key if more and totals else None
        return UsageTotalsReply(totals=totals, budgets=tuple(budgets), next_after_key=next_after, count=count)
