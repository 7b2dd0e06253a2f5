"""What ``tether submit``, ``runs`` and ``interactions`` print (runtime/_runs.py), from records: no owner needed."""

from __future__ import annotations

from runtime import _runs
from tests.unit.test_watch_view import CONNECT_ERROR, CONVERSATION, RUN, TASK, interaction, run


def test_a_failed_run_says_why_on_its_line_and_in_the_table() -> None:
    failed = run("failed", reason="model_error", error=CONNECT_ERROR)
    assert _runs.describe_run(failed) == f"run {RUN}: failed (model_error): {CONNECT_ERROR}"
    assert _runs.failure(failed) == f"run {RUN} failed (model_error): {CONNECT_ERROR}"
    header, row = _runs.format_runs([failed]).splitlines()
    assert header.split()[-1] == "ERROR" and row.endswith(CONNECT_ERROR)
    assert _runs.describe_run(run("running")) == f"run {RUN}: running"
    assert _runs.format_runs([run("running")]).splitlines()[1].split()[-1] == "12/3"  # no error: nothing after


def test_an_error_of_several_lines_is_shown_on_one() -> None:
    failed = run("failed", reason="phase_error", error="RuntimeError: boom\n  at line 3")
    assert _runs.describe_run(failed).endswith("failed (phase_error): RuntimeError: boom   at line 3")


def test_an_open_approval_names_its_tool() -> None:
    listed = _runs.format_interactions("tether.db", [interaction("open", tool="refund")]).splitlines()
    assert listed == [
        f'approval i0000000-0000-7000-8000-000000000001 (run {RUN}): refund {{"order_id":"A1"}}',
        "  tether respond --db tether.db i0000000-0000-7000-8000-000000000001 --approve   (or --deny)",
    ]


def test_a_cost_is_a_plain_decimal() -> None:
    assert _runs.tokens(run("completed", cost=0.00001)) == "12/3 $0.00001"
    assert _runs.tokens(run("completed", cost=1.5)) == "12/3 $1.5"
    assert _runs.tokens(run("completed")) == "12/3"


def test_after_a_spent_budget_the_hint_is_to_raise_it_then_retry() -> None:
    spent = run("failed", reason="budget_exceeded", error="run ...: the budget of conversation ... is spent")
    assert _runs.next_steps("t.db", spent) == [
        f"  raise the budget its error names first: tether budget --db t.db (--conversation {CONVERSATION} | --task "
        f"{TASK}) --max-tokens N | --max-cost X | --clear",
        f"  then: tether retry --db t.db {RUN}",
    ]
    assert _runs.next_steps("t.db", run("failed", reason="model_error")) == [
        f"  try it again: tether retry --db t.db {RUN}"
    ]
