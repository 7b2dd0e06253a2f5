"""Reports on the worker's side: an app's :class:`~actors.Report` values delivered to its ``on_report`` callback, in
the worker that saw what they report, after the commit that recorded it (docs/agents.md, "Reports").

The callback runs in the phase that reported, bounded by :data:`REPORT_TIMEOUT_S`: one that raises, or takes longer,
is one line of the worker's log and fails nothing (the commit it reports is made already). Its cancellation (the
phase's lease cancelled, the worker stopping) is not caught.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import trio

from protocol import TOOL_TASK_PREFIX

from .._app._app import App
from .._app._reports import Report, ReportKind

if TYPE_CHECKING:
    from ._phase import Phase

REPORT_TIMEOUT_S: Final = 10.0
"""The longest an ``on_report`` callback runs for one report; past it the callback is cancelled and logged."""


class Reporter:
    """Delivers ``app``'s reports to its ``on_report`` callback (read at each report: one set later is used)."""

    def __init__(self, app: App | None, log: Callable[[str], None]) -> None:
        self._app = app
        self._log = log

    async def __call__(self, report: Report) -> None:
        callback = None if self._app is None else self._app.report_callback
        if callback is None:
            return
        try:
            with trio.move_on_after(REPORT_TIMEOUT_S) as scope:
                returned = callback(report)
                if inspect.isawaitable(returned):
                    await returned
        except Exception as exc:  # the app's callback: logged, never the reporter's failure
            self._log(
                f"tether worker: on_report raised {type(exc).__name__}: {exc} (reporting {report.kind} of task "
                f"{report.task_id}); nothing else was affected"
            )
            return
        if scope.cancelled_caught:
            self._log(
                f"tether worker: on_report took longer than {REPORT_TIMEOUT_S:g} s (reporting {report.kind} of task "
                f"{report.task_id}): cancelled; nothing else was affected"
            )


def phase_report(
    rt: Phase, kind: ReportKind, error: str, *, reason: str | None = None, operation_id: str | None = None
) -> Report:
    """A report of ``kind`` about the phase ``rt`` runs (an :class:`~actors.Phase`): its task, and the run and tool
    call its input names, if any."""
    inp = rt.input if isinstance(rt.input, dict) else {}
    run_id = inp.get("run_id")
    found_operation = operation_id if operation_id is not None else inp.get("operation_id")
    return Report(
        kind=kind,
        error=error,
        task_id=rt.task_id,
        task_kind=rt.kind,
        reason=reason,
        run_id=run_id if isinstance(run_id, str) else None,
        operation_id=found_operation if isinstance(found_operation, str) else None,
        tool=rt.kind.removeprefix(TOOL_TASK_PREFIX) if rt.kind.startswith(TOOL_TASK_PREFIX) else None,
        conversation_id=rt.conversation_id,
    )
