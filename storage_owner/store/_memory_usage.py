"""The memory store's usage totals, prices and budgets (the :class:`~storage_owner.core.UsageStore` port) over its
tables: a mixin of :class:`~storage_owner.store.MemoryStore`, the twin of ``_usage``'s SQL."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from protocol import Budget, ModelPrice, RunUsage

from ._memory_tables import Journaled


class UsageMemory(Journaled):
    """Usage totals, prices and budgets."""

    def add_usages(self, totals: Sequence[tuple[str, str]], usage: RunUsage) -> None:
        for scope, key in totals:
            self.add_usage(scope, key, usage)

    def add_usage(self, scope: str, key: str, usage: RunUsage) -> None:
        t = self._t
        total = t.usage.get((scope, key))
        if total is None:
            added = attrs.evolve(usage, cost=_real(usage.cost))
        else:
            added = RunUsage(
                input_tokens=total.input_tokens + usage.input_tokens,
                output_tokens=total.output_tokens + usage.output_tokens,
                cached_tokens=total.cached_tokens + usage.cached_tokens,
                reasoning_tokens=total.reasoning_tokens + usage.reasoning_tokens,
                cost=total.cost if usage.cost is None else (total.cost or 0.0) + usage.cost,
                unpriced_tokens=total.unpriced_tokens + usage.unpriced_tokens,
            )
        self._put(t.usage, (scope, key), added)

    def usage(self, scope: str, key: str | None) -> list[tuple[str, RunUsage]]:
        totals = self._t.usage
        if key is not None:
            total = totals.get((scope, key))
            return [] if total is None else [(key, total)]
        return sorted((key, total) for (of, key), total in totals.items() if of == scope)

    def usage_count(self, scope: str) -> int:
        return sum(1 for of, _ in self._t.usage if of == scope)

    def usage_page(self, scope: str, after_key: str | None, limit: int) -> tuple[list[tuple[str, RunUsage]], bool]:
        totals = self._t.usage
        found = sorted((key, total) for (of, key), total in totals.items() if of == scope and key > (after_key or ""))
        return found[:limit], len(found) > limit

    def prices(self) -> list[ModelPrice]:
        prices = self._t.prices
        return [prices[model] for model in sorted(prices)]

    def put_price(self, price: ModelPrice) -> None:
        stored = ModelPrice(
            model=price.model,
            input_per_mtok=float(price.input_per_mtok),
            output_per_mtok=float(price.output_per_mtok),
            cached_input_per_mtok=_real(price.cached_input_per_mtok),
            reasoning_per_mtok=_real(price.reasoning_per_mtok),
        )
        self._put(self._t.prices, price.model, stored)

    def delete_price(self, model: str) -> None:
        self._delete(self._t.prices, model)

    def budget(self, scope: str, key: str) -> Budget | None:
        return self._t.budgets.get((scope, key))

    def put_budget(self, budget: Budget) -> None:
        self._put(self._t.budgets, (budget.scope, budget.key), attrs.evolve(budget, max_cost=_real(budget.max_cost)))

    def delete_budget(self, scope: str, key: str) -> None:
        self._delete(self._t.budgets, (scope, key))

    def budget_count(self) -> int:
        return len(self._t.budgets)


def _real(value: float | None) -> float | None:
    """A value as a ``REAL`` column keeps it."""
    return None if value is None else float(value)
