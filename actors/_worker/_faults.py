"""Fault injection for crash tests: a worker that SIGKILLs itself (or SIGSTOPs itself: a paused process, which a test
continues with SIGCONT) at a chosen commit of the phases it runs (``tether worker --fault-kill
[SIGSTOP:]POINT:N[:KIND[:NAME]]``, ``actors.serve(fault_kill=...)``; ``actors.testing`` starts such workers). The
owner has its own points (``tether owner --fault-kill-*``, docs/operations.md).

The points count what this process commits under its leases, never time: a test that runs the same app the same way
is killed at the same place every time. Partial output (a model's text as it streams, a tool's progress) is stored
in batches whose number depends on timing, so its commits are never counted.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence
from typing import Final, Literal, Protocol, get_args

import attrs

from protocol import FinishOperation, StartOperation, UsageError, Write

KillPoint = Literal["before_commit", "after_commit", "intent_sent", "after_intent", "before_result", "after_result"]
"""Where a worker kills itself: around its N-th phase commit (``before_commit``: it is never sent;
``after_commit``: acknowledged, nothing after it runs), right after the commit holding its N-th operation intent has
gone out on its connection (``intent_sent``: its acknowledgement, if the owner sends one, is not read yet), right
after that commit is acknowledged (``after_intent``: a tool's handler or a model's request has not started; for a
call whose intent the model result's commit wrote with its task, as that task's lease starts the call), right before
sending the commit holding its N-th operation result (``before_result``: the effect happened, its result never
reaches the owner) or right after it is acknowledged (``after_result``)."""
KILL_POINTS: Final[tuple[str, ...]] = get_args(KillPoint)
OPERATION_POINTS: Final = frozenset({"intent_sent", "after_intent", "before_result", "after_result"})
KillSignal = Literal["SIGKILL", "SIGSTOP"]
"""What a worker does to itself at its point: dies (``SIGKILL``), or pauses (``SIGSTOP``: a stopped process, as a
``kill -STOP``, a debugger or a frozen VM leaves it; the test continues it with SIGCONT)."""
KILL_SIGNALS: Final[tuple[str, ...]] = get_args(KillSignal)
OperationKind = Literal["model", "tool"]
OPERATION_KINDS: Final[tuple[str, ...]] = get_args(OperationKind)


def _check_point(instance: object, attribute: object, value: object) -> None:
    if value not in KILL_POINTS:
        raise UsageError(f"a worker kill point is one of {', '.join(KILL_POINTS)}; not {value!r}")


def _check_nth(instance: object, attribute: object, value: object) -> None:
    if type(value) is not int or value < 1:
        raise UsageError(f"a worker kill point's nth counts from 1 (a whole number): not {value!r}")


@attrs.frozen
class WorkerKill:
    """Kill the worker (SIGKILL, no clean-up) at ``point``, the ``nth`` time it is reached (from 1), counting only
    operations of ``kind`` (``"model"`` or ``"tool"``) and, if given, ``name`` (the tool's name, or the model's) for
    the operation points. ``WorkerKill("after_intent", kind="tool", name="refund")`` dies as the first ``refund``
    call's handler would start; ``WorkerKill("before_result", 2)`` once the second operation (model requests and
    tool calls alike) is done, before its result is sent.

    Counted per process, over what it commits: a call whose intent and result are one commit (arguments a tool's
    schema refuses, a denial) counts as both. Calls running side by side (a model asking for several tools in one
    turn) reach their points in an order the test does not choose: filter by ``name`` to pin one. ``signal``
    ``"SIGSTOP"`` pauses the process there instead of killing it (``WorkerKill("intent_sent", kind="tool",
    signal="SIGSTOP")``: a worker stopped with its call's intent sent, its acknowledgement unread). Bad values raise
    :class:`~protocol.UsageError` saying which.
    """

    point: KillPoint = attrs.field(validator=_check_point)
    nth: int = attrs.field(default=1, validator=_check_nth)
    kind: OperationKind | None = attrs.field(default=None, kw_only=True)
    name: str | None = attrs.field(default=None, kw_only=True)
    signal: KillSignal = attrs.field(default="SIGKILL", kw_only=True)

    def __attrs_post_init__(self) -> None:
        if self.signal not in KILL_SIGNALS:
            raise UsageError(f"a worker kill point's signal is SIGKILL or SIGSTOP, not {self.signal!r}")
        if self.kind is not None and self.kind not in OPERATION_KINDS:
            raise UsageError(f"a worker kill point's kind is 'model' or 'tool' (or None: both): not {self.kind!r}")
        if self.name is not None and (not isinstance(self.name, str) or not self.name or ":" in self.name):
            raise UsageError(f"a worker kill point's name is a tool's or model's name, without ':': not {self.name!r}")
        if self.name is not None and self.kind is None:
            raise UsageError("a worker kill point that names an operation says its kind too: kind='tool' or 'model'")
        if self.kind is not None and self.point not in OPERATION_POINTS:
            raise UsageError(
                f"{self.point} counts commits, not operations: kind and name go with "
                f"{', '.join(sorted(OPERATION_POINTS))}"
            )

    @classmethod
    def parse(cls, text: str) -> WorkerKill:
        """The kill point ``[SIGSTOP:]POINT:N[:KIND[:NAME]]`` (what :meth:`__str__` gives, and ``tether worker
        --fault-kill`` takes): ``after_intent:1:tool:refund``, ``before_result:2``, ``SIGSTOP:intent_sent:1:tool``.
        Raises :class:`~protocol.UsageError`."""
        parts = text.split(":")
        signal_name = parts.pop(0) if parts and parts[0].startswith("SIG") else "SIGKILL"
        if not 2 <= len(parts) <= 4 or not parts[1].isdigit():
            raise UsageError(
                "a worker kill point reads [SIGSTOP:]POINT:N[:KIND[:NAME]], such as after_intent:1:tool:refund: "
                f"not {text!r}"
            )
        kind = parts[2] if len(parts) > 2 else None
        name = parts[3] if len(parts) > 3 else None
        return cls(parts[0], int(parts[1]), kind=kind, name=name, signal=signal_name)  # type: ignore[arg-type]

    def __str__(self) -> str:
        parts = (None if self.signal == "SIGKILL" else self.signal, self.point, self.nth, self.kind, self.name)
        return ":".join(str(part) for part in parts if part is not None)

    def switch(self, log: Callable[[str], None]) -> KillSwitch:
        return KillSwitch(self, log, _stop_this_process if self.signal == "SIGSTOP" else _kill_this_process)


def _kill_this_process() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _stop_this_process() -> None:
    os.kill(os.getpid(), signal.SIGSTOP)  # returns once a SIGCONT continues the process


class ArmSent(Protocol):
    """What the ``intent_sent`` point needs of the connection: call ``callback`` once the next request it queues has
    gone out (:meth:`actors._client._connection.Connection.after_next_sent`)."""

    def __call__(self, callback: Callable[[], None]) -> None: ...


class KillSwitch:
    """Counts a worker's phase commits against its :class:`WorkerKill` and kills (or stops) the process when it is
    reached. One per :func:`actors.serve`, across reconnections; ``die`` is for unit tests."""

    def __init__(
        self, kill: WorkerKill, log: Callable[[str], None], die: Callable[[], None] = _kill_this_process
    ) -> None:
        self.kill = kill
        self.seen = 0
        self._log = log
        self._die = die
        self._operations: dict[str, tuple[str, str]] = {}
        """What this process committed intents for: kind and name by operation id, to count results by them."""
        self._fired = False
        """Whether the point was reached: a process SIGSTOPped there and continued goes on without stopping again."""

    def before(self, writes: Sequence[Write], task_kind: str, arm_sent: ArmSent | None = None) -> None:
        """A phase commit of a task of ``task_kind`` about to be sent (``arm_sent``: its connection's, for the
        ``intent_sent`` point, which acts once the commit has gone out)."""
        self._remember(writes)
        if self.kill.point == "before_commit":
            self._count(1)
        elif self.kill.point == "before_result":
            self._count(self._results(writes, task_kind))
        elif self.kill.point == "intent_sent" and arm_sent is not None and not self._fired:
            found = self._intents(writes)
            if found and self.seen + found >= self.kill.nth:
                arm_sent(lambda: self._count(found))
            else:
                self._count(found)

    def after(self, writes: Sequence[Write], task_kind: str) -> None:
        """That commit, acknowledged."""
        if self.kill.point == "after_commit":
            self._count(1)
        elif self.kill.point == "after_intent":
            self._count(self._intents(writes))
        elif self.kill.point == "after_result":
            self._count(self._results(writes, task_kind))

    def call_started(self, name: str) -> None:
        """A tool task's lease starts the call whose intent the model result's commit wrote with it: its
        ``after_intent`` point, the handler not started yet."""
        if self.kill.point == "after_intent":
            self._count(self._matches("tool", name))

    def _intents(self, writes: Sequence[Write]) -> int:
        """The intents of ``writes`` this point counts. One committed with its tool task (``task_id``) is reached
        when that task starts its call (:meth:`call_started`)."""
        return sum(
            isinstance(w, StartOperation) and w.task_id is None and self._matches(w.kind, w.name) for w in writes
        )

    def _remember(self, writes: Sequence[Write]) -> None:
        for write in writes:
            if isinstance(write, StartOperation):
                self._operations[write.operation_id] = (write.kind, write.name)

    def _results(self, writes: Sequence[Write], task_kind: str) -> int:
        found = 0
        for write in writes:
            if isinstance(write, FinishOperation):
                # An operation whose intent another worker committed: its kind from the task that finishes it.
                kind, name = self._operations.get(write.operation_id) or _kind_of_task(task_kind)
                found += self._matches(kind, name)
        return found

    def _matches(self, kind: str, name: str | None) -> bool:
        return (self.kill.kind is None or kind == self.kill.kind) and (self.kill.name is None or name == self.kill.name)

    def _count(self, found: int) -> None:
        if not found or self._fired:
            return
        self.seen += found
        if self.seen >= self.kill.nth:
            self._fired = True
            self._log(f"tether worker: fault injection: {self.kill.signal} at {self.kill} (pid {os.getpid()})")
            self._die()


def _kind_of_task(task_kind: str) -> tuple[str, str | None]:
    if task_kind.startswith("tool:"):
        return "tool", task_kind.removeprefix("tool:")
    return "model", None
