"""``actors.serve``: attach to an owner as a worker, announce the app, run the phases the owner leases to it."""

from __future__ import annotations

import contextlib
import math
import os
import socket
import traceback
from collections.abc import Callable
from typing import Final

import attrs
import trio

from protocol import (
    DEFAULT_MAX_LEASES,
    Announce,
    BudgetExceeded,
    CancelLease,
    ConnectionLost,
    Lease,
    LeaseRef,
    Ok,
    OwnerUnavailable,
    Release,
    RequestFailed,
    StaleLease,
    TetherError,
    collapse_group,
)
from protocol.io import log_stderr

from ._app import App, TaskDefinition
from ._client import Client, connect
from ._phase import Phase
from ._runs import run_definition

MAX_ERROR_CHARS: Final = 4000
RELEASE_TIMEOUT_S: Final = 10.0


@attrs.define(eq=False)
class _Running:
    lease: LeaseRef
    scope: trio.CancelScope
    lost: bool = False
    """The connection that held the lease ended: the owner has cut it off, there is nothing to release."""


class Worker:
    """Runs leased phases of one app, each in its own cancel scope in one nursery."""

    def __init__(self, app: App, client: Client, nursery: trio.Nursery, log: Callable[[str], None]) -> None:
        self.app = app
        self.client = client
        self._nursery = nursery
        self._log = log
        self._running: dict[str, _Running] = {}

    def held(self) -> tuple[LeaseRef, ...]:
        return tuple(running.lease for running in self._running.values())

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
        running = self._running.get(frame.lease.task_id)
        if running is not None:
            running.scope.cancel(reason="the owner granted this task again")  # an older lease is void
        running = _Running(lease=frame.lease, scope=trio.CancelScope())
        self._running[frame.lease.task_id] = running
        self._nursery.start_soon(self._run, frame, running)

    async def _run(self, lease: Lease, running: _Running) -> None:
        task_id = lease.lease.task_id
        definition = self.app.tasks.get(lease.kind) or run_definition(self.app, lease.kind, log=self._log)
        scope = running.scope
        try:
            with scope:
                if definition is None:  # never leased to us unless announced; handled all the same
                    await self._release(lease, migration_error=f"this worker has no task kind {lease.kind}")
                    return
                await self._run_phase(lease, definition)
            if scope.cancelled_caught and not running.lost:
                await self._release(lease)
        except BudgetExceeded as exc:
            # The phase's expected end, not a fault: the owner ended the run failed (budget_exceeded) in the commit
            # that refused its model request. One line saying so; the refusal says which budget and how to go on.
            self._log(f"tether worker: task {task_id}: stopped by its budget, as asked: {exc}")
        except StaleLease as exc:
            self._log(f"tether worker: task {task_id}: {exc}")
        except (TetherError, OSError) as exc:
            self._log(f"tether worker: task {task_id}: gave the lease up: {type(exc).__name__}: {exc}")
        finally:
            if self._running.get(task_id) is running:
                del self._running[task_id]

    async def _run_phase(self, lease: Lease, definition: TaskDefinition) -> None:
        checkpoint = lease.checkpoint
        if checkpoint is None:
            # Nothing committed yet: the first phase starts from initial(input), and an abort handler sees the
            # checkpoint of the phase it interrupted (so its operation ids match that phase's).
            try:
                checkpoint = definition.initial(lease.input)
            except Exception as exc:
                await Phase(self.client, lease, None, definition.version).fault("phase_error", _describe(exc))
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
        rt = Phase(self.client, lease, checkpoint, definition.version)
        if lease.mode == "abort":
            function = definition.abort
            if function is None:
                await rt.aborted()
                return
        else:
            function = definition.phases.get(rt.phase or "")
            if function is None:
                known = ", ".join(sorted(definition.phases))
                await rt.fault("unknown_phase", f"checkpoint {checkpoint!r} names no phase of {lease.kind} ({known})")
                return
        try:
            await function(rt)
        except StaleLease:
            raise
        except BaseExceptionGroup as group:
            # Before ``except Exception`` (an ExceptionGroup is an Exception): a phase whose own nursery raised
            # a stale lease (or was cancelled) ends as that, not as a phase crash.
            collapsed = collapse_group(group)
            if isinstance(collapsed, trio.Cancelled | StaleLease):
                raise collapsed from None
            if not isinstance(group, Exception):
                raise
            await self._phase_raised(rt, group)
            return
        except Exception as exc:
            await self._phase_raised(rt, exc)
            return
        if not rt.ended:
            await rt.fault("no_progress", f"phase {rt.phase!r} returned without committing a new state")

    async def _phase_raised(self, rt: Phase, exc: Exception) -> None:
        error = _describe(exc)
        trace = "".join(traceback.format_exception(exc)).rstrip()
        self._log(f"tether worker: task {rt.task_id} ({rt.kind}) phase {rt.phase!r} raised: {error}\n{trace}")
        if not rt.ended:
            await rt.fault("phase_error", error)

    async def _release(self, lease: Lease, *, migration_error: str | None = None) -> None:
        request = Release(lease=lease.lease, migration_error=migration_error)
        with trio.move_on_after(RELEASE_TIMEOUT_S) as scope, contextlib.suppress(RequestFailed):
            scope.shield = True
            # RequestFailed: the lease ended already (the task was given to another worker): nothing to give back.
            await self.client.connection.call(request, Ok)


def _describe(exc: BaseException) -> str:
    """``Type: message``, as a task's error text (the traceback goes to the worker's log)."""
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]


async def serve(
    app: App,
    *,
    db: str | os.PathLike[str] | None = None,
    url: str | None = None,
    token: str | None = None,
    name: str = "",
    max_leases: int = DEFAULT_MAX_LEASES,
    log: Callable[[str], None] = log_stderr,
    ca: str | os.PathLike[str] | None = None,
    task_status: trio.TaskStatus[Client] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` as a worker until cancelled.

    Connects with role ``worker`` and announces the app's capabilities (task kinds, each with its version);
    re-announces after every reconnection, naming the leases whose phases still run here (the owner cancels those
    it gave to someone else meanwhile). Every leased phase runs in its own cancel scope: an abort from the owner
    cancels it, and the lease is released once the phase has stopped. ``task_status.started`` receives the
    connected client (for ``nursery.start``). ``ca`` verifies a ``wss://`` owner, as for :func:`connect`.
    """
    started = False
    worker_name = name or f"worker-{os.getpid()}"
    while True:
        try:
            async with (
                connect(
                    db, url=url, token=token, role="worker", name=worker_name, wait_for_owner_s=math.inf, ca=ca
                ) as client,
                trio.open_nursery() as nursery,
            ):
                worker = Worker(app, client, nursery, log)

                def announcement(worker: Worker = worker) -> Announce:
                    return Announce(
                        pid=os.getpid(),
                        host=socket.gethostname(),
                        app=app.name,
                        capabilities=app.capabilities(),
                        max_leases=max_leases,
                        leases=worker.held(),
                    )

                client.connection.on_lease = worker.on_lease
                client.connection.on_connection_lost = worker.on_connection_lost
                client.connection.announcement = announcement  # re-sent by the connection after every reconnection
                await client.announce(announcement())
                if not started:
                    started = True
                    task_status.started(client)
                await trio.sleep_forever()
        except (OwnerUnavailable, ConnectionLost):
            # OwnerUnavailable: the owner stayed away longer than a client waits for it. ConnectionLost: the owner
            # went away during the first announcement (later ones are re-sent by the client itself). Either way,
            # connect afresh, waiting for the next owner.
            continue
