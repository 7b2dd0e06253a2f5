"""``tether usage``, ``tether prices`` and ``tether budget``: token usage and cost, the price table and budgets,
from the command line, against the running owner of a database (docs/runs.md, "Usage and cost")."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from functools import partial
from typing import TYPE_CHECKING, Any, Final

import trio

from protocol import Budget, ModelPrice, RunUsage, TetherError, UsageTotal, amount_text

from ._args import amount, count, identifier, positive
from ._table import columns

if TYPE_CHECKING:
    import actors

PRICE_FILE_KEYS: Final = {
    "input": "input_per_mtok",
    "output": "output_per_mtok",
    "cached_input": "cached_input_per_mtok",
    "reasoning": "reasoning_per_mtok",
}
"""The keys of a model's entry in a prices file, and the price fields they set."""
DEFAULT_LIMIT: Final = 100
"""``tether usage`` without a filter prints at most this many totals of each scope unless ``--limit`` says."""


def add_usage_commands(commands: Any) -> None:
    """``tether usage``, ``tether prices`` and ``tether budget``."""
    usage = commands.add_parser(
        "usage",
        help="token usage and cost per model, tool, conversation, run and task tree",
        description=(
            "Print usage totals (input, output, cached and reasoning tokens; cost where the model has a price, '>= X'"
            " when some tokens had none) and the budgets set on them. Without a filter: the first --limit models, "
            "tools (the usage their results reported) and conversations. With --conversation: that conversation, its "
            "first --limit runs, and the task tree it belongs to if a task owns it (a subagent's). With --run: the "
            "run, its conversation and its task tree (a subagent's usage counts toward the tree of the task above "
            "it). Asks the running owner."
        ),
    )
    usage.set_defaults(handler=handle_usage_command)
    usage.add_argument("--db", default="tether.db", help="the database (default ./tether.db)")
    which = usage.add_mutually_exclusive_group()
    which.add_argument(
        "--conversation", type=identifier, metavar="ID", help="one conversation, its runs and its task tree"
    )
    which.add_argument("--run", type=identifier, metavar="RUN_ID", help="one run, its conversation and its task tree")
    usage.add_argument(
        "--limit",
        type=positive,
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"without a filter: the first N models, N tools and N conversations, by key; with --conversation: its "
        f"first N runs, in submission order (default {DEFAULT_LIMIT}); how many more there are is said",
    )
    usage.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: {db, totals: [one record per row], not_shown: {scope: how many left out}}",
    )

    prices = commands.add_parser(
        "prices",
        help="show or change the price table that gives usage a cost",
        description=(
            "Prices are per model, in any currency, per million tokens: input, output, and optionally cached "
            "input (else the input price) and reasoning (else counted as output). A model request's cost is computed "
            "from the table when its result commits and never changes after; a model without a price has no cost. "
            "Without an action, print the table. Asks the running owner; every change is all or nothing."
        ),
    )
    prices.set_defaults(handler=handle_usage_command)
    prices.add_argument("--db", default="tether.db", help="the database (default ./tether.db)")
    prices.add_argument("--json", action="store_true", help="print the table as one JSON object")
    actions = prices.add_subparsers(dest="action", metavar="ACTION")
    show = actions.add_parser("show", help="print the table (the default)")
    set_price = actions.add_parser("set", help="set (or replace) one model's price")
    set_price.add_argument("model", metavar="MODEL", help="the model's name, as its agent's model names it")
    set_price.add_argument("--input", type=amount, required=True, metavar="X", help="per million input tokens")
    set_price.add_argument("--output", type=amount, required=True, metavar="Y", help="per million output tokens")
    set_price.add_argument("--cached", type=amount, metavar="Z", help="per million cached input tokens")
    set_price.add_argument("--reasoning", type=amount, metavar="W", help="per million reasoning tokens")
    remove = actions.add_parser("remove", help="drop one model's price (its later results have no cost)")
    remove.add_argument("model", metavar="MODEL")
    load = actions.add_parser(
        "load",
        help="set the prices of a JSON file",
        description='FILE holds {"MODEL": {"input": X, "output": Y, "cached_input": Z, "reasoning": W}, ...} '
        "(cached_input and reasoning optional). Every model of the file is set, or none is.",
    )
    load.add_argument("file", metavar="FILE.json")
    for action in (show, set_price, remove, load):  # --db and --json before or after the action
        action.add_argument("--db", default=argparse.SUPPRESS, help="the database (default ./tether.db)")
        action.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")

    budget = commands.add_parser(
        "budget",
        help="show, set or remove the budget of a conversation or task tree",
        description=(
            "A budget bounds the usage of a conversation, or of a task tree (every run below its root task, "
            "subagents included): once the usage has reached --max-tokens (input + output) or --max-cost, a run's "
            "next model request is not started and the run ends failed (budget_exceeded). A cost budget also stops "
            "a model without a price, and a usage with tokens of no price (its cost is not known). Without a limit, "
            "print the budget and the usage; --clear removes it."
        ),
    )
    budget.set_defaults(handler=handle_usage_command)
    budget.add_argument("--db", default="tether.db", help="the database (default ./tether.db)")
    of = budget.add_mutually_exclusive_group(required=True)
    of.add_argument("--conversation", type=identifier, metavar="ID", help="a conversation's budget")
    of.add_argument(
        "--task", type=identifier, metavar="TASK_ID", help="the budget of the task tree TASK_ID belongs to (its root's)"
    )
    budget.add_argument("--max-tokens", type=count, metavar="N", help="input + output tokens")
    budget.add_argument("--max-cost", type=amount, metavar="X", help="cost, in the price table's currency")
    budget.add_argument("--clear", action="store_true", help="remove the budget")
    budget.add_argument("--json", action="store_true", help="print one JSON object")


def _connect(db: str, name: str) -> AbstractAsyncContextManager[actors.Client]:
    """A client of the owner of ``db`` (``runtime._connect.connect``). It and the client are imported here, not at
    the top: ``tether`` builds its parser with :func:`add_usage_commands` for every command, ``tether owner``
    included, which must not pay for loading the client (httpx, jsonschema)."""
    from ._connect import connect

    return connect(db, name)


def handle_usage_command(args: argparse.Namespace) -> int:
    """The handler of ``tether usage``, ``prices`` and ``budget``: :func:`run_usage_command`, printing."""
    run_usage_command(args, partial(print, flush=True))
    return 0


def run_usage_command(args: argparse.Namespace, say: Callable[[str], None]) -> None:
    """Run ``tether usage``, ``prices`` or ``budget`` (parsed ``args``); ``say`` prints."""
    from ._connect import check_db

    db = check_db(args.db)
    if args.command == "usage":
        found = partial(read_usage, db, conversation_id=args.conversation, run_id=args.run, limit=args.limit)
        rows, left_out = trio.run(found)
        if args.json:
            say(json.dumps({"db": db, "totals": [row.json() for row in rows], "not_shown": left_out}))
        else:
            say(format_usage(rows, left_out))
    elif args.command == "prices":
        table = trio.run(partial(change_prices, db, args))
        if args.json:
            say(json.dumps({"db": db, "prices": [_price_json(price) for price in table]}))
        else:
            say(format_prices(table))
    else:
        if args.clear and (args.max_tokens is not None or args.max_cost is not None):
            raise TetherError("tether budget: --clear removes the budget; give it without --max-tokens/--max-cost")
        rows = trio.run(partial(change_budget, db, args))
        say(json.dumps({"db": db, "totals": [row.json() for row in rows]}) if args.json else format_usage(rows))


# ------------------------------------------------------------------------------------------------ usage


class Row:
    """One line of ``tether usage``: what the usage is of, its totals, and the budget set on it (if any)."""

    def __init__(self, scope: str, key: str, usage: RunUsage, budget: Budget | None = None, note: str = "") -> None:
        self.scope = scope
        self.key = key
        self.usage = usage
        self.budget = budget
        self.note = note

    def json(self) -> dict[str, Any]:
        usage = self.usage
        budget = self.budget
        return {
            "scope": self.scope,
            "key": self.key,
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cached_tokens": usage.cached_tokens,
            "reasoning_tokens": usage.reasoning_tokens,
            "cost": usage.cost,
            "unpriced_tokens": usage.unpriced_tokens,
            "budget": None if budget is None else {"max_tokens": budget.max_tokens, "max_cost": budget.max_cost},
        }


def _rows(scope: str, totals: list[UsageTotal], budgets: list[Budget], note: str = "") -> list[Row]:
    by_key = {budget.key: budget for budget in budgets}
    return [Row(scope, total.key, total.usage, by_key.get(total.key), note) for total in totals]


async def read_usage(
    db: str, *, conversation_id: str | None, run_id: str | None, limit: int = DEFAULT_LIMIT
) -> tuple[list[Row], dict[str, int]]:
    """The rows ``tether usage`` prints (see its ``--help``), and, without a filter, how many totals of each scope
    ``limit`` left out."""
    async with _connect(db, "tether-usage") as client:
        rows: list[Row] = []
        left_out: dict[str, int] = {}
        if run_id is not None:
            run = await client.run(run_id)
            rows.append(Row("run", run.run_id, run.usage, note=f"{run.agent} {run.status}"))
            conversation_id = run.conversation_id
        if conversation_id is None:
            for scope in ("model", "tool", "conversation"):
                totals, budgets, count = await client.usage_listing(scope, limit=limit)
                rows += _rows(scope, totals, budgets)
                left_out[scope] = count - len(totals)
            return rows, left_out
        rows += _rows("conversation", *await client.usage_totals("conversation", conversation_id))
        if run_id is None:
            runs = 0
            async for run in client.iter_runs(conversation_id=conversation_id):  # one page held at a time
                if runs < limit:
                    rows.append(Row("run", run.run_id, run.usage, note=f"{run.agent} {run.status}"))
                runs += 1
            if runs > limit:
                left_out["run"] = runs - limit
            owner = (await client.conversation(conversation_id)).owner_task_id
            tree_of = owner
        else:
            tree_of = run.task_id
        if tree_of is not None:
            rows += _rows("tree", *await client.usage_totals("tree", tree_of), note="root task")
        return rows, left_out


def _cost(cost: float | None) -> str:
    """An amount as set or summed (``-``: none), a plain decimal (:func:`protocol.amount_text`): 0.00000001, never
    1e-08 nor 0."""
    return "-" if cost is None else amount_text(cost)


def _total_cost(usage: RunUsage) -> str:
    """A total's cost: ``>= X`` when some of its tokens have no cost (``-`` when none has one)."""
    if usage.unpriced_tokens and usage.cost is not None:
        return f">= {_cost(usage.cost)}"
    return _cost(usage.cost)


def _budget_text(budget: Budget | None) -> str:
    if budget is None:
        return "-"
    parts = []
    if budget.max_tokens is not None:
        parts.append(f"{budget.max_tokens} tokens")
    if budget.max_cost is not None:
        parts.append(f"cost {_cost(budget.max_cost)}")
    return ", ".join(parts)


def format_usage(rows: list[Row], left_out: dict[str, int] | None = None) -> str:
    """The rows as an aligned table, and a line per scope some of whose totals were left out."""
    more = [
        f"{count} more {scope} totals not shown (--limit N shows up to N of each)"
        for scope, count in (left_out or {}).items()
        if count > 0
    ]
    if not rows:
        return "\n".join(more or ["no usage yet"])
    header = ("SCOPE", "KEY", "INPUT", "OUTPUT", "CACHED", "REASONING", "COST", "BUDGET", "")
    lines = [
        (
            row.scope,
            row.key,
            str(row.usage.input_tokens),
            str(row.usage.output_tokens),
            str(row.usage.cached_tokens),
            str(row.usage.reasoning_tokens),
            _total_cost(row.usage),
            _budget_text(row.budget),
            row.note,
        )
        for row in rows
    ]
    table = columns(header, lines)
    return "\n".join(table + more)


# ----------------------------------------------------------------------------------------------- prices


def read_price_file(path: str) -> list[ModelPrice]:
    """The prices of a JSON file (see ``tether prices load --help``); :class:`TetherError` naming what is wrong."""
    try:
        with open(path, encoding="utf-8") as file:
            document = json.load(file)
    except OSError as exc:
        raise TetherError(f"cannot read the prices file {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise TetherError(f"the prices file {path} is not JSON: {exc}") from None
    if not isinstance(document, dict) or not document:
        raise TetherError(f'the prices file {path} must be an object of models: {{"MODEL": {{"input": X, ...}}}}')
    found = []
    for model, entry in document.items():
        if not isinstance(entry, dict):
            raise TetherError(f"{path}: model {model!r}: expected an object with input and output, not {entry!r}")
        unknown = sorted(set(entry) - set(PRICE_FILE_KEYS))
        if unknown:
            raise TetherError(f"{path}: model {model!r}: unknown keys {unknown}; use {sorted(PRICE_FILE_KEYS)}")
        fields: dict[str, float | None] = {}
        for key, field in PRICE_FILE_KEYS.items():
            value = entry.get(key)
            if value is None and key in ("input", "output"):
                raise TetherError(f"{path}: model {model!r}: {key} is required")
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise TetherError(f"{path}: model {model!r}: {key} must be a number, not {value!r}")
            fields[field] = None if value is None else float(value)
        found.append(ModelPrice(model=model, **fields))  # type: ignore[arg-type]
    return found


async def change_prices(db: str, args: argparse.Namespace) -> list[ModelPrice]:
    async with _connect(db, "tether-prices") as client:
        if args.action == "set":
            price = ModelPrice(
                model=args.model,
                input_per_mtok=args.input,
                output_per_mtok=args.output,
                cached_input_per_mtok=args.cached,
                reasoning_per_mtok=args.reasoning,
            )
            return await client.set_prices([price])
        if args.action == "remove":
            return await client.set_prices(remove=[args.model])
        if args.action == "load":
            return await client.set_prices(read_price_file(args.file))
        return await client.prices()


def _price_json(price: ModelPrice) -> dict[str, Any]:
    return {
        "model": price.model,
        "input": price.input_per_mtok,
        "output": price.output_per_mtok,
        "cached_input": price.cached_input_per_mtok,
        "reasoning": price.reasoning_per_mtok,
    }


def format_prices(table: list[ModelPrice]) -> str:
    if not table:
        return "no prices: usage has no cost (tether prices set MODEL --input X --output Y)"
    header = ("MODEL", "INPUT/M", "OUTPUT/M", "CACHED/M", "REASONING/M")
    lines = [
        (
            price.model,
            _cost(price.input_per_mtok),
            _cost(price.output_per_mtok),
            "as input" if price.cached_input_per_mtok is None else _cost(price.cached_input_per_mtok),
            "as output" if price.reasoning_per_mtok is None else _cost(price.reasoning_per_mtok),
        )
        for price in table
    ]
    return "\n".join(columns(header, lines))


# ----------------------------------------------------------------------------------------------- budget


async def change_budget(db: str, args: argparse.Namespace) -> list[Row]:
    """Set or clear the budget when asked, then read it back with the usage it bounds."""
    async with _connect(db, "tether-budget") as client:
        if args.clear or args.max_tokens is not None or args.max_cost is not None:
            await client.set_budget(
                conversation_id=args.conversation,
                task_id=args.task,
                max_tokens=args.max_tokens,
                max_cost=args.max_cost,
            )
        if args.conversation is not None:
            return _rows("conversation", *await client.usage_totals("conversation", args.conversation))
        return _rows("tree", *await client.usage_totals("tree", args.task), note="root task")
