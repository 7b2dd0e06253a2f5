"""A worker on one connection: it runs the phases the owner leases to it, each in its own cancel scope, and gives
back what it cannot run; the task definitions of an app's runs and tool calls are made here (``run_definition``).
How it attaches, stops and drains is :func:`actors.serve` (``_serve.py``)."""

from __future__ import annotations

import contextlib
import os
import socket
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import attrs
import trio

from protocol import (
    DEFAULT_MAX_LEASES,
    Announce,
    BudgetExceeded,
    CancelLease,
    FaultReason,
    Lease,
    LeaseRef,
    RequestFailed,
    StaleLease,
    TetherError,
    collapse_group,
    raise_collapsed,
)
from protocol.io import log_stderr

from .._app._app import App, TaskDefinition
from .._client._client import Client
from ._agent_run import AgentRun, ModelUnavailable
from ._faults import KillSwitch
from ._journal import AGENT_PREFIX, TOOL_PREFIX
from ._phase import GiveBack, Phase
from ._reports import Reporter, phase_report
from ._tool_run import ToolRun

if TYPE_CHECKING:
    from ._telemetry import WorkerTelemetry

MAX_ERROR_CHARS: Final = 4000
RELEASE_TIMEOUT_S: Final = 10.0


@attrs.define(eq=False)
class _Running:
    lease: LeaseRef
    kind: str
    scope: trio.CancelScope
    received_s: float
    """When the lease arrived (``trio.current_time()``)."""
    lost: bool = False
    """The connection that held the lease ended: the owner has cut it off, there is nothing to release."""
    closing: bool = False
    """The worker stopped the phase because it is closing (its drain's deadline): released as given back by a close."""
    phase: Phase | None = None
    """What the phase sees, once it runs."""

    @property
    def manual_call(self) -> bool:
        """Whether it runs a manual or report tool call, whose cut-off would need a person (or end in its error)."""
        return self.phase is not None and self.phase._manual_call


class Worker:
    """Runs leased phases of one app, each in its own cancel scope in one nursery."""

    def __init__(
        self,
        app: App,
        client: Client,
        nursery: trio.Nursery,
        log: Callable[[str], None],
        stop: _Stop | None = None,
        *,
        max_leases: int = DEFAULT_MAX_LEASES,
        kill_switch: KillSwitch | None = None,
        telemetry: WorkerTelemetry | None = None,
    ) -> None:
        self.app = app
        self.client = client
        self._nursery = nursery
        self._log = log
        self._stop = stop or _Stop()
        self._max_leases = max_leases
        self._running: dict[str, _Running] = {}
        self._drain_announced = False
        self._kill_switch = kill_switch
        self._telemetry = telemetry
        """The worker's spans; ``None`` (the default): telemetry is off, and a phase pays this one check."""
        self._reporter = Reporter(app, log)
        """The app's ``on_report`` callback, for every phase this worker runs."""

    def held(self) -> tuple[LeaseRef, ...]:
        return tuple(running.lease for running in self._running.values())

    def running_kinds(self) -> list[str]:
        """What runs here now, as ``kind (task id)``, for the log lines of a stop."""
        return [f"{running.kind} (task {task_id})" for task_id, running in self._running.items()]

    def announcement(self) -> Announce:
        """What this worker tells the owner after every (re)connection: its app, the leases whose phases still run
        here, and how many it takes: none while it drains."""
        return Announce(
            pid=os.getpid(),
            host=socket.gethostname(),
            app=self.app.name,
            capabilities=self.app.capabilities(),
            max_leases=0 if self._stop.draining else self._max_leases,
            leases=self.held(),
        )

    def drain(self) -> None:
        """Take no new lease (told to the owner by a new announcement); the phases running go on, and the stop's
        ``drained`` is set once none runs."""
        if self._drain_announced:  # a stop asked while this worker announced itself drains it once
            return
        self._drain_announced = True
        self._nursery.start_soon(self._announce_drain)
        self._check_drained()

    async def _announce_drain(self) -> None:
        with contextlib.suppress(TetherError):  # the connection ended: its leases did too, nothing to tell
            await self.client.announce(self.announcement())

    def _check_drained(self) -> None:
        if self._stop.draining and not self._running:
            self._stop.drained.set()

    def give_back(self, *, manual_calls: bool) -> tuple[list[str], list[str]]:
        """Stop what runs here to give it back to the owner as closing (the drain's deadline passed): every phase but
        those running a manual or report tool call, and those too with ``manual_calls``. Each phase stopped releases
        its lease saying so (no restart counted; a model request it left open is sent again as the same attempt).
        What it stopped now and what it left running, as ``kind (task id)``."""
        given, kept = [], []
        for task_id, running in self._running.items():
            what = f"{running.kind} (task {task_id})"
            if running.manual_call and not manual_calls:
                kept.append(what)
            elif not running.closing:
                given.append(what)
                running.closing = True
                running.scope.cancel(reason="given back: its worker is closing (its drain's deadline passed)")
        return given, kept

    def on_connection_lost(self) -> None:
        """Every lease belonged to the connection that ended (the owner cuts them all off): stop every phase now,
        rather than let one carry on with effects that the owner will refuse to record."""
        for running in self._running.values():
            running.lost = True
            running.scope.cancel(reason="the connection to the owner was lost, and the lease with it")

    def on_lease(self, frame: Lease | CancelLease) -> None:
        if isinstance(frame, CancelLease):
            running = self._running.get(frame.lease.task_id)
            if running is not None and running.lease == frame.lease:
                running.scope.cancel(reason=frame.reason)
            return
        if self._stop.draining:
            # Granted before the owner took the announcement that this worker drains: given back unrun (the task is
            # pending again, no restart counted), for another worker, or this one once it is back.
            self._nursery.start_soon(self._give_back, frame)
            return
        running = self._running.get(frame.lease.task_id)
        if running is not None:
            running.scope.cancel(reason="the owner granted this task again")  # an older lease is void
        running = _Running(lease=frame.lease, kind=frame.kind, scope=trio.CancelScope(), received_s=trio.current_time())
        self._running[frame.lease.task_id] = running
        self._nursery.start_soon(self._run, frame, running)

    async def _give_back(self, lease: Lease) -> None:
        with contextlib.suppress(TetherError):
            await self._release(lease)

    async def _run(self, lease: Lease, running: _Running) -> None:
        task_id = lease.lease.task_id
        definition = self.app.tasks.get(lease.kind) or run_definition(self.app, lease.kind, log=self._log)
        scope = running.scope
        try:
            with scope:
                if definition is None:  # never leased to us unless announced; handled all the same
                    await self._release(lease, migration_error=f"this worker has no task kind {lease.kind}")
                    return
                await self._run_phase(lease, definition, running)
            if scope.cancelled_caught and not running.lost:
                await self._release(lease, closing=running.closing)
        except BudgetExceeded as exc:
            # The phase's expected end, not a fault: the owner ended the run failed (budget_exceeded) in the commit
            # that refused its model request. One line saying so; the refusal says which budget and how to go on.
            self._log(f"tether worker: task {task_id}: stopped by its budget, as asked: {exc}")
        except StaleLease as exc:
            self._log(f"tether worker: task {task_id}: {exc}")
            if not running.lost:
                # A lease being cancelled (its task marked for abort) is refused too, yet is still ours to give back:
                # the abort handler waits for it. One that ended is refused again, quietly.
                await self._release(lease)
        except (ModelUnavailable, GiveBack) as exc:
            # Not a fault: the conversation moved to a model this app does not name, or the phase leaves a step to the
            # next worker as this one stops. Given back unrun (no state committed, nothing left open, no restart
            # counted); the owner leases it to another worker.
            self._log(f"tether worker: task {task_id}: {exc}: given back to the owner")
            await self._release(lease)
        except (TetherError, OSError) as exc:
            self._log(f"tether worker: task {task_id}: gave the lease up: {type(exc).__name__}: {exc}")
        finally:
            if self._running.get(task_id) is running:
                del self._running[task_id]
            self._check_drained()

    async def _run_phase(self, lease: Lease, definition: TaskDefinition, running: _Running) -> None:
        checkpoint = lease.checkpoint
        if checkpoint is None:
            # Nothing committed yet: the first phase starts from initial(input), and an abort handler sees the
            # checkpoint of the phase it interrupted (so its operation ids match that phase's).
            try:
                checkpoint = definition.initial(lease.input)
            except Exception as exc:
                rt = Phase(
                    self.client, lease, None, definition.version, kill_switch=self._kill_switch, reports=self._reporter
                )
                await self._fault(rt, "phase_error", _describe(exc))
                return
        elif 0 < lease.version < definition.version:
            assert definition.migrate is not None  # the owner leases older tasks only to workers that migrate
            try:
                checkpoint = definition.migrate(lease.version, checkpoint)
            except Exception as exc:
                message = _describe(exc)
                self._log(f"tether worker: task {lease.lease.task_id}: migrate({lease.version}) failed: {message}")
                await self._release(lease, migration_error=message)
                return
        telemetry = self._telemetry
        rt = Phase(
            self.client,
            lease,
            checkpoint,
            definition.version,
            stopping=lambda: self._stop.draining,
            kill_switch=self._kill_switch,
            telemetry=telemetry,
            received_s=running.received_s,
            reports=self._reporter,
        )
        running.phase = rt
        await rt.ensure_lease()  # a lease read after a pause or a silence is confirmed before its phase starts
        if telemetry is None:
            await self._run_function(rt, definition)
            return
        with telemetry.phase(rt):
            await self._run_function(rt, definition)

    async def _run_function(self, rt: Phase, definition: TaskDefinition) -> None:
        """Run the phase (or the abort handler) ``rt`` names; a function that raised or made no progress faults the
        task."""
        checkpoint = rt.checkpoint
        if rt.mode == "abort":
            function = definition.abort
            if function is None:
                await rt.aborted()
                return
        else:
            function = definition.phases.get(rt.phase or "")
            if function is None:
                known = ", ".join(sorted(definition.phases))
                await self._fault(
                    rt, "unknown_phase", f"checkpoint {checkpoint!r} names no phase of {rt.kind} ({known})"
                )
                return
        try:
            await function(rt)
        except (StaleLease, ModelUnavailable, GiveBack):
            raise
        except BaseExceptionGroup as group:
            # Before ``except Exception`` (an ExceptionGroup is an Exception): a phase whose own nursery raised
            # a stale lease (or was cancelled) ends as that, not as a phase crash.
            if isinstance(collapse_group(group), trio.Cancelled | StaleLease):
                raise_collapsed(group)
            if not isinstance(group, Exception):
                raise
            await self._phase_raised(rt, group)
            return
        except Exception as exc:
            await self._phase_raised(rt, exc)
            return
        if not rt.ended:
            await self._fault(rt, "no_progress", f"phase {rt.phase!r} returned without committing a new state")

    async def _phase_raised(self, rt: Phase, exc: Exception) -> None:
        error = _describe(exc)
        trace = "".join(traceback.format_exception(exc)).rstrip()
        self._log(f"tether worker: task {rt.task_id} ({rt.kind}) phase {rt.phase!r} raised: {error}\n{trace}")
        if not rt.ended:
            await self._fault(rt, "phase_error", error)

    async def _fault(self, rt: Phase, reason: FaultReason, error: str) -> None:
        """End the task ``faulted`` (a phase that raised or made no progress), then report it (``task_faulted``)."""
        await rt.fault(reason, error)
        await rt.report(phase_report(rt, "task_faulted", error, reason=reason))

    async def _release(self, lease: Lease, *, migration_error: str | None = None, closing: bool = False) -> None:
        with trio.move_on_after(RELEASE_TIMEOUT_S) as scope, contextlib.suppress(RequestFailed):
            scope.shield = True
            # RequestFailed: the lease ended already (the task was given to another worker): nothing to give back.
            await self.client.release(lease.lease, migration_error=migration_error, closing=closing)


def _describe(exc: BaseException) -> str:
    """``Type: message``, as a task's error text (the traceback goes to the worker's log)."""
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]


class _Stop:
    """A worker's stop, across the connections of one :func:`serve`: asked (``asked``), then draining
    (``draining``: no new lease), then over (``drained``: nothing runs any more, or the drain timed out)."""

    def __init__(self) -> None:
        self.asked = trio.Event()
        self.drained = trio.Event()
        self.worker: Worker | None = None
        """The worker of the current connection."""

    @property
    def draining(self) -> bool:
        return self.asked.is_set()

    def running_kinds(self) -> list[str]:
        """What the current connection's worker runs (none before it attached)."""
        return [] if self.worker is None else self.worker.running_kinds()

    def give_back(self, *, manual_calls: bool) -> tuple[list[str], list[str]]:
        """:meth:`Worker.give_back` on the current connection's worker (nothing runs before it attached)."""
        return ([], []) if self.worker is None else self.worker.give_back(manual_calls=manual_calls)

    def ask(self) -> None:
        if self.asked.is_set():
            return
        self.asked.set()
        if self.worker is not None:
            self.worker.drain()
        else:  # not attached yet: nothing runs
            self.drained.set()


def run_definition(app: App, kind: str, *, log: Callable[[str], None] = log_stderr) -> TaskDefinition | None:
    """The task definition a worker of ``app`` runs for a lease of ``kind`` (``agent:<name>`` / ``tool:<name>``);
    ``log`` is the worker's log."""
    if kind.startswith(AGENT_PREFIX):
        agent = app.agents.get(kind.removeprefix(AGENT_PREFIX))
        return None if agent is None else AgentRun(agent, log, app.tools, app.models).definition()
    if kind.startswith(TOOL_PREFIX):
        tool = app.tools.get(kind.removeprefix(TOOL_PREFIX))
        return None if tool is None else ToolRun(tool).definition()
    return None
