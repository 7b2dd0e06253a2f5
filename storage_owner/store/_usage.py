"""The SQL of usage totals, prices and budgets (the :class:`~storage_owner.core.UsageStore` port of
``storage_owner.core._usage``): a mixin of :class:`~storage_owner.store.SqliteStore`."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import apsw

from protocol import Budget, ModelPrice, RunUsage


@functools.cache
def _add_usage_statement(count: int) -> str:
    """The upsert of one usage into ``count`` totals: their ``(scope, key)`` pairs bound first, then the usage's six
    values once (one statement shape per count, and the owner uses one count: a result's three totals)."""
    values = ", ".join(
        f"(?{2 * index + 1}, ?{2 * index + 2}, {', '.join(f'?{2 * count + field}' for field in range(1, 7))})"
        for index in range(count)
    )
    return (
        "INSERT INTO usage (scope, key, input_tokens, output_tokens, cached_tokens, reasoning_tokens, cost, "
        f"unpriced_tokens) VALUES {values} ON CONFLICT (scope, key) DO UPDATE SET "
        "input_tokens = input_tokens + excluded.input_tokens, "
        "output_tokens = output_tokens + excluded.output_tokens, "
        "cached_tokens = cached_tokens + excluded.cached_tokens, "
        "reasoning_tokens = reasoning_tokens + excluded.reasoning_tokens, "
        "cost = CASE WHEN excluded.cost IS NULL THEN cost ELSE COALESCE(cost, 0) + excluded.cost END, "
        "unpriced_tokens = unpriced_tokens + excluded.unpriced_tokens"
    )


def _usage_row(i: int, o: int, c: int, r: int, cost: float | None, unpriced: int) -> RunUsage:
    return RunUsage(
        input_tokens=i, output_tokens=o, cached_tokens=c, reasoning_tokens=r, cost=cost, unpriced_tokens=unpriced
    )


class UsageSql:
    """The ``usage``, ``prices`` and ``budgets`` tables."""

    _db: apsw.Connection

    def add_usage(self, scope: str, key: str, usage: RunUsage) -> None:
        self.add_usages(((scope, key),), usage)

    def add_usages(self, totals: Sequence[tuple[str, str]], usage: RunUsage) -> None:
        """Add ``usage`` to each of ``totals`` (distinct ``(scope, key)`` pairs: a row is upserted once per
        statement), in one statement."""
        self._db.execute(
            _add_usage_statement(len(totals)),
            (
                *(part for total in totals for part in total),
                usage.input_tokens,
                usage.output_tokens,
                usage.cached_tokens,
                usage.reasoning_tokens,
                usage.cost,
                usage.unpriced_tokens,
            ),
        )

    def usage(self, scope: str, key: str | None) -> list[tuple[str, RunUsage]]:
        """Usage totals of ``scope`` (``conversation`` or ``model``), of one ``key`` or all, by key."""
        rows = self._db.execute(
            "SELECT key, input_tokens, output_tokens, cached_tokens, reasoning_tokens, cost, unpriced_tokens "
            "FROM usage "
            "WHERE scope = ?1 AND (?2 IS NULL OR key = ?2) ORDER BY key",
            (scope, key),
        )
        return [(key, _usage_row(i, o, c, r, cost, unpriced)) for key, i, o, c, r, cost, unpriced in rows]

    def usage_count(self, scope: str) -> int:
        """How many usage totals ``scope`` has."""
        row = self._db.execute("SELECT count(*) FROM usage WHERE scope = ?", (scope,)).fetchone()
        return int(row[0]) if row else 0

    def usage_page(self, scope: str, after_key: str | None, limit: int) -> tuple[list[tuple[str, RunUsage]], bool]:
        """Up to ``limit`` usage totals of ``scope`` in key order after ``after_key``; whether more follow."""
        rows: list[Any] = self._db.execute(
            "SELECT key, input_tokens, output_tokens, cached_tokens, reasoning_tokens, cost, unpriced_tokens "
            "FROM usage "
            "WHERE scope = ?1 AND key > ?2 ORDER BY key LIMIT ?3",
            (scope, after_key or "", limit + 1),
        ).fetchall()
        page = [(key, _usage_row(i, o, c, r, cost, unpriced)) for key, i, o, c, r, cost, unpriced in rows[:limit]]
        return page, len(rows) > limit

    def prices(self) -> list[ModelPrice]:
        rows = self._db.execute(
            "SELECT model, input_per_mtok, output_per_mtok, cached_input_per_mtok, reasoning_per_mtok FROM prices "
            "ORDER BY model"
        )
        return [
            ModelPrice(
                model=model,
                input_per_mtok=float(i),
                output_per_mtok=float(o),
                cached_input_per_mtok=None if c is None else float(c),
                reasoning_per_mtok=None if r is None else float(r),
            )
            for model, i, o, c, r in rows
        ]

    def put_price(self, price: ModelPrice) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO prices (model, input_per_mtok, output_per_mtok, cached_input_per_mtok, "
            "reasoning_per_mtok) VALUES (?, ?, ?, ?, ?)",
            (
                price.model,
                price.input_per_mtok,
                price.output_per_mtok,
                price.cached_input_per_mtok,
                price.reasoning_per_mtok,
            ),
        )

    def delete_price(self, model: str) -> None:
        self._db.execute("DELETE FROM prices WHERE model = ?", (model,))

    def budget(self, scope: str, key: str) -> Budget | None:
        row = self._db.execute(
            "SELECT max_tokens, max_cost FROM budgets WHERE scope = ? AND key = ?", (scope, key)
        ).fetchone()
        if row is None:
            return None
        max_tokens, max_cost = row
        return Budget(
            scope=scope,  # type: ignore[arg-type]
            key=key,
            max_tokens=max_tokens,
            max_cost=None if max_cost is None else float(max_cost),
        )

    def put_budget(self, budget: Budget) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO budgets (scope, key, max_tokens, max_cost) VALUES (?, ?, ?, ?)",
            (budget.scope, budget.key, budget.max_tokens, budget.max_cost),
        )

    def delete_budget(self, scope: str, key: str) -> None:
        self._db.execute("DELETE FROM budgets WHERE scope = ? AND key = ?", (scope, key))

    def budget_count(self) -> int:
        row = self._db.execute("SELECT count(*) FROM budgets").fetchone()
        return 0 if row is None else int(row[0])
