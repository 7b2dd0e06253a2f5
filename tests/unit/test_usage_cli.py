"""``tether usage / prices / budget`` without an owner: how totals, costs and budgets are printed, and the command
line's amounts refused before any request (runtime/_usage.py)."""

from __future__ import annotations

import argparse

import pytest

from protocol import Budget, RunUsage
from runtime._args import amount, count, positive
from runtime._cli import build_parser
from runtime._usage import Row, format_usage

ID = "0190f3a2-7c4e-7b1a-9d3e-5f6a7b8c9d0e"


def _cells(table: str) -> list[str]:
    header, line = table.splitlines()
    starts = [index for index, char in enumerate(header) if char != " " and (index == 0 or header[index - 1] == " ")]
    bounds = [*starts, len(line) + 1]
    return [line[bounds[i] : bounds[i + 1]].strip() for i in range(len(starts))]


def test_an_incomplete_cost_is_printed_as_a_lower_bound() -> None:
    usage = RunUsage(input_tokens=10, output_tokens=5, cost=1.5, unpriced_tokens=7)
    cells = _cells(format_usage([Row("conversation", "c", usage)]))
    assert cells[6] == ">= 1.5"
    assert Row("conversation", "c", usage).json()["unpriced_tokens"] == 7
    # No known cost at all: unknown, not 0; a complete cost as it is.
    assert _cells(format_usage([Row("model", "m", RunUsage(input_tokens=3, unpriced_tokens=3))]))[6] == "-"
    assert _cells(format_usage([Row("model", "m", RunUsage(input_tokens=3, cost=0.25))]))[6] == "0.25"


def test_a_small_budget_is_not_printed_as_zero() -> None:
    budget = Budget(scope="conversation", key="c", max_tokens=5, max_cost=1e-8)
    cells = _cells(format_usage([Row("conversation", "c", RunUsage(), budget)]))
    assert cells[7] == "5 tokens, cost 0.00000001"  # a plain decimal, never exponent notation
    assert _cells(format_usage([Row("model", "m", RunUsage(cost=123456.75))]))[6] == "123456.75"
    assert _cells(format_usage([Row("model", "m", RunUsage(cost=0.00001))]))[6] == "0.00001"
    assert _cells(format_usage([Row("model", "m", RunUsage(cost=0.1 + 0.2))]))[6] == "0.3"  # 10 digits at most
    assert _cells(format_usage([Row("model", "m", RunUsage(cost=2e21))]))[6] == "2000000000000000000000"


@pytest.mark.parametrize("text", ["²", "٣", "-1", "1.0", "1e3", "", " 5"])
def test_a_whole_number_is_ascii_digits(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected a whole number of 0 or more"):
        count(text)
    with pytest.raises(argparse.ArgumentTypeError, match="expected a whole number of 1 or more"):
        positive(text)


@pytest.mark.parametrize("text", ["nan", "inf", "-0.5", "1e400", "x", ""])
def test_an_amount_is_a_finite_number_of_0_or_more(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected a number of 0 or more"):
        amount(text)


def test_the_commands_share_the_number_types(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    args = parser.parse_args(["budget", "--conversation", ID, "--max-tokens", "0", "--max-cost", "1e-8"])
    assert (args.max_tokens, args.max_cost) == (0, 1e-8)
    assert (count("0"), positive("12"), amount("0")) == (0, 12, 0.0)
    for argv in (["budget", "--conversation", ID, "--max-tokens", "²"], ["up", "--workers", "²"]):
        with pytest.raises(SystemExit) as exited:
            parser.parse_args(argv)
        assert exited.value.code == 2
        assert "expected a whole number of 0 or more, not '²'" in capsys.readouterr().err
