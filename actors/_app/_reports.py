"""Reports: what the runtime tells an app about its own code beside the journal (docs/agents.md, "Reports"), through
the app's ``on_report`` callback (``actors.App(name, on_report=callback)`` or ``app.on_report(callback)``).

A report is a frozen value, delivered in the worker that saw it, after the commit that recorded what it reports (a
report never announces something the database does not hold). The callback may be a plain function or an async one;
one that raises, or takes longer than its bound, is logged and never fails the call or the phase that reported.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final, Literal, TypeAlias

import attrs

ReportKind: TypeAlias = Literal["dropped_output", "task_faulted"]
"""``dropped_output``: a call the model made returned a ``structured`` value that broke its tool's ``output_schema``
(or none, from a tool that declares one): it was dropped, the call's result stands. ``task_faulted``: a phase this
worker ran raised or made no progress, or a durable step of a tool call was refused (its task faulted), or a run
failed because a tool call's task faulted."""
REPORT_KINDS: Final[tuple[str, ...]] = ("dropped_output", "task_faulted")


@attrs.frozen(kw_only=True)
class Report:
    """One report to the app's ``on_report`` callback.

    ``kind`` says what happened (:data:`ReportKind`), ``error`` in words; ``task_id`` and ``task_kind`` name the task
    it happened in, ``reason`` the fault's reason (``phase_error``, ``no_progress``, ...) for a ``task_faulted``;
    ``run_id``, ``operation_id`` and ``tool`` the run and tool call where one applies (``None`` otherwise), and
    ``conversation_id`` the conversation the task belongs to.
    """

    kind: ReportKind
    error: str
    task_id: str | None = None
    task_kind: str | None = None
    reason: str | None = None
    run_id: str | None = None
    operation_id: str | None = None
    tool: str | None = None
    conversation_id: str | None = None


ReportCallback: TypeAlias = Callable[[Report], Awaitable[object] | object]
"""``on_report(report) -> None``, plain or ``async``."""
Reports: TypeAlias = Callable[[Report], Awaitable[None]]
"""Where a worker's phase sends its reports (the worker's ``Reporter``, which calls the app's callback)."""
