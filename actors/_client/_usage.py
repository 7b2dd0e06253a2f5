"""The client's calls of usage: totals, prices and budgets."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import trio

from protocol import (
    Budget,
    BudgetReply,
    ModelPrice,
    PricesReply,
    ProtocolError,
    ReadPrices,
    ReadUsage,
    ReadUsageTotals,
    RunUsage,
    SetBudget,
    SetPrices,
    UsageError,
    UsageReply,
    UsageTotal,
    UsageTotalsReply,
)

from ._base import BaseClient
from ._runs import RUNS_PAGE


class UsageCalls(BaseClient):
    """Usage totals, prices and budgets (a part of :class:`~actors.Client`)."""

    async def usage(self, conversation_id: str | None = None) -> dict[str, RunUsage]:
        """Token usage totals: the conversation's (keyed by its id; empty if it has used none) or, without one,
        each model's (keyed by model). :class:`~protocol.NotFound` for a conversation that does not exist."""
        reply = await self.connection.call(ReadUsage(conversation_id=conversation_id), UsageReply)
        return {total.key: total.usage for total in reply.totals}

    async def usage_totals(
        self,
        scope: Literal["model", "tool", "conversation", "tree"],
        key: str | None = None,
        *,
        limit: int | None = None,
    ) -> tuple[list[UsageTotal], list[Budget]]:
        """Usage totals of ``scope`` (every model's, tool's, conversation's or task tree's; or the one ``key`` names,
        zero when it used nothing: for ``tree`` any task of the tree, the total keyed by its root task) and the
        budgets set on them. Reads page by page: all of them, or the first ``limit`` (1 or more) in key order (see
        :meth:`usage_listing` for how many there are). A checkpoint."""
        totals, budgets, _ = await self.usage_listing(scope, key, limit=limit)
        return totals, budgets

    async def usage_listing(
        self,
        scope: Literal["model", "tool", "conversation", "tree"],
        key: str | None = None,
        *,
        limit: int | None = None,
    ) -> tuple[list[UsageTotal], list[Budget], int]:
        """As :meth:`usage_totals`, and how many totals there are in all (``limit`` may leave some out). A
        checkpoint."""
        if limit is not None and limit < 1:
            await trio.lowlevel.checkpoint()
            raise UsageError(f"limit must be 1 or more (or None: every total), not {limit}")
        totals: list[UsageTotal] = []
        budgets: list[Budget] = []
        count: int | None = None
        after: str | None = None
        while True:
            page = RUNS_PAGE if limit is None else min(RUNS_PAGE, limit - len(totals))
            request = ReadUsageTotals(scope=scope, key=key, after_key=after, limit=page)
            reply = await self.connection.call(request, UsageTotalsReply)
            count = reply.count if count is None else count
            totals.extend(reply.totals)
            budgets.extend(reply.budgets)
            if reply.next_after_key is None or (limit is not None and len(totals) >= limit):
                return totals, budgets, max(count or 0, len(totals))
            if not reply.totals or reply.next_after_key == after:  # an owner answering the same page over and over
                raise ProtocolError(f"read_usage_totals made no progress after key {after!r}")
            after = reply.next_after_key

    async def prices(self) -> list[ModelPrice]:
        """The price table (per model, per million tokens), by model. A checkpoint."""
        return list((await self.connection.call(ReadPrices(), PricesReply)).prices)

    async def set_prices(self, prices: Iterable[ModelPrice] = (), *, remove: Iterable[str] = ()) -> list[ModelPrice]:
        """Set (or replace) these models' prices and drop those in ``remove``, all at once or not at all (a bad price:
        :class:`~protocol.InvalidRequest`, nothing changed); the whole table after. Results committed from now on are
        costed with it; committed costs never change. A checkpoint."""
        request = SetPrices(prices=tuple(prices), remove=tuple(remove))
        return list((await self.connection.call(request, PricesReply)).prices)

    async def set_budget(
        self,
        *,
        conversation_id: str | None = None,
        task_id: str | None = None,
        max_tokens: int | None = None,
        max_cost: float | None = None,
    ) -> Budget | None:
        """Set the budget of a conversation, or of the task tree ``task_id`` belongs to (kept under its root task);
        without ``max_tokens`` and ``max_cost`` remove it. A run's model request past it ends the run ``failed``
        (``budget_exceeded``) before the model is called. Returns the budget as stored (``None``: removed). A
        checkpoint, even when it raises :class:`~protocol.UsageError` for a bad call."""
        if (conversation_id is None) == (task_id is None):
            await trio.lowlevel.checkpoint()
            raise UsageError("set_budget() needs exactly one of conversation_id=ID or task_id=ID")
        if conversation_id is not None:
            request = SetBudget(scope="conversation", key=conversation_id, max_tokens=max_tokens, max_cost=max_cost)
        else:
            assert task_id is not None
            request = SetBudget(scope="tree", key=task_id, max_tokens=max_tokens, max_cost=max_cost)
        return (await self.connection.call(request, BudgetReply)).budget
