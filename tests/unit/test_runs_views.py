"""What ``tether submit``, ``runs`` and ``interactions`` print (runtime/_runs.py), from records: no owner needed."""

from __future__ import annotations

from runtime import _runs
from tests.unit.test_watch_view import CONNECT_ERROR, RUN, run


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
