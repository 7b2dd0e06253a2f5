"""``actors.serve``: attach to an owner as a worker, announce the app, run the phases the owner leases to it, and
stop by draining."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

import trio

from protocol import (
    DEFAULT_MAX_LEASES,
    ConnectionLost,
    OwnerUnavailable,
    TetherError,
    UsageError,
    otel_from_environment,
)
from protocol.io import log_stderr

from .._app._app import App
from .._client._client import Client, check_target, connect
from ._agent_run import ModelUnavailable
from ._faults import KillSwitch, WorkerKill
from ._phase import GiveBack
from ._worker import RELEASE_TIMEOUT_S, Worker, _Stop

if TYPE_CHECKING:
    from ._telemetry import WorkerTelemetry

DEFAULT_DRAIN_TIMEOUT_S: Final = 30.0
"""How long a stopping worker lets the phases it runs finish before it gives back what still runs (``tether worker
--drain-timeout``, ``tether up --drain-timeout``, ``serve(drain_timeout_s=)``)."""
DEFAULT_MANUAL_GRACE_S: Final = 8.0
"""How much longer than its drain timeout a stopping worker waits for the manual and report tool calls it runs (the
only work whose cut-off needs a person, or ends in an error result) before it cuts them off too
(``serve(manual_grace_s=)``): inside the 10 s ``tether up`` gives a worker past its drain timeout before it kills
it (its ``stop_timeout_s``), with room for the releases and the disconnection."""
RETRY_LOG_INTERVAL_S: Final = 10.0
"""While a worker cannot reach its owner, at most one log line per this many seconds says so."""


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
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
    manual_grace_s: float = DEFAULT_MANUAL_GRACE_S,
    stop: Callable[[], Awaitable[object]] | None = None,
    handle_signals: bool = True,
    fault_kill: WorkerKill | None = None,
    otel: bool | None = None,
    tracer_provider: Any = None,
    task_status: trio.TaskStatus[Client] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` as a worker until stopped.

    Connects with role ``worker`` and announces the app's capabilities (task kinds, each with its version);
    re-announces after every reconnection, naming the leases whose phases still run here (the owner cancels those
    it gave to someone else meanwhile). Every leased phase runs in its own cancel scope: an abort from the owner
    cancels it, and the lease is released once the phase has stopped. ``task_status.started`` receives the
    connected client (for ``nursery.start``). ``ca`` verifies a ``wss://`` owner, as for :func:`connect`.

    **Stopping drains; a close is not a crash.** SIGINT or SIGTERM (with ``handle_signals``, from the main thread) or
    the return of ``stop()`` (an async function, if given; it is started once ``serve`` listens for the signals) stop
    the worker: it takes no new lease and lets the phases it runs finish and commit (a tool call ends with its result,
    not as an interrupted call), for at most ``drain_timeout_s``. At that deadline it gives back what still runs,
    counting no restart: a model request is sent again (as the same attempt) by the next worker, a task phase or a
    ``safe`` / ``idempotent`` tool call runs again there. A ``manual`` or ``report`` tool call still running (the only
    work whose cut-off needs a person, or ends in its error result) is waited for ``manual_grace_s`` more before it is
    cut off too (a manual one then needs a person). Then it returns. A second SIGINT or SIGTERM, or a cancellation of
    ``serve``, stops at once, cutting off what runs as a crash would. Each step is logged.

    **Fault injection.** ``fault_kill`` (a :class:`WorkerKill`) makes this process SIGKILL itself at that point of
    the commits of the phases it runs: for crash tests of a worker process (``tether worker --fault-kill``,
    ``actors.testing``), never in a process that must survive, such as a test's own.
    **Telemetry** (the ``tether[otel]`` extra, docs/telemetry.md): with ``otel=True``, or a ``tracer_provider``, or
    ``otel`` left ``None`` and ``TETHER_OTEL=1`` in the environment, every phase, model request and tool call is a span
    on ``tracer_provider`` (the global OpenTelemetry one when ``None``). Off by default: OpenTelemetry is then never
    imported.

    Raises :class:`~protocol.UsageError` at once for what no retry can mend (see :func:`connect`) and for a negative
    ``drain_timeout_s``; an owner that is not up yet is waited for, each failed attempt logged (at most one line per
    ``RETRY_LOG_INTERVAL_S`` while it lasts).
    """
    check_target(db=db, url=url, token=token, ca=ca)
    if not drain_timeout_s >= 0:
        raise UsageError(f"drain_timeout_s is a number of seconds, 0 or more, not {drain_timeout_s!r}")
    if not manual_grace_s >= 0:
        raise UsageError(f"manual_grace_s is a number of seconds, 0 or more, not {manual_grace_s!r}")
    worker_name = name or f"worker-{os.getpid()}"
    if fault_kill is not None and not isinstance(fault_kill, WorkerKill):
        raise UsageError(f"fault_kill is an actors.WorkerKill or None, not {fault_kill!r}")
    kill_switch = None if fault_kill is None else fault_kill.switch(log)
    telemetry = _telemetry(otel, tracer_provider)
    signals = handle_signals and threading.current_thread() is threading.main_thread()
    receiver = trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) if signals else contextlib.nullcontext()
    # Listening from the start: a worker still waiting for its owner stops on SIGTERM too.
    with receiver as received:
        stopping = _Stop()
        async with trio.open_nursery() as nursery:
            if received is not None:
                nursery.start_soon(_stop_on_signals, received, stopping, nursery.cancel_scope, log, worker_name)
            if stop is not None:
                nursery.start_soon(_stop_when, stop, stopping)
            nursery.start_soon(_drain_deadline, stopping, drain_timeout_s, manual_grace_s, log, worker_name)
            nursery.start_soon(_end_if_drained_unattached, stopping, nursery.cancel_scope)

            async def connections(*, task_status: trio.TaskStatus[Client]) -> None:
                connect_args = {"db": db, "url": url, "token": token, "ca": ca, "name": worker_name}
                await _serve_connections(
                    app,
                    stopping,
                    connect_args=connect_args,
                    max_leases=max_leases,
                    log=log,
                    kill_switch=kill_switch,
                    telemetry=telemetry,
                    task_status=task_status,
                )
                nursery.cancel_scope.cancel(reason="the worker stopped")

            task_status.started(await nursery.start(connections))


def _telemetry(otel: bool | None, tracer_provider: Any) -> WorkerTelemetry | None:
    """The worker's spans, if telemetry is on (see :func:`serve`); only then is OpenTelemetry imported."""
    if otel is None:
        otel = tracer_provider is not None or otel_from_environment()
    if not otel:
        return None
    try:
        from ._telemetry import WorkerTelemetry
    except ImportError as exc:
        raise UsageError(
            f"telemetry needs OpenTelemetry, which is not installed ({exc}): pip install 'tether[otel]'"
        ) from exc
    return WorkerTelemetry(tracer_provider, given_back=(ModelUnavailable, GiveBack))


async def _stop_on_signals(
    signals: Any, stopping: _Stop, scope: trio.CancelScope, log: Callable[[str], None], name: str
) -> None:
    """The first SIGINT/SIGTERM asks the stop; a second one stops at once."""
    async for signum in signals:
        if not stopping.asked.is_set():
            stopping.ask()
            continue
        running = stopping.running_kinds()
        cut = f"; cutting off {len(running)} running: {', '.join(running)}" if running else ""
        log(f"tether worker: {name}: {signal.Signals(signum).name} again: stopping at once{cut}")
        scope.cancel(reason="a second SIGINT or SIGTERM")
        return


async def _stop_when(stop: Callable[[], Awaitable[object]], stopping: _Stop) -> None:
    await stop()
    stopping.ask()


async def _drain_deadline(
    stopping: _Stop, drain_timeout_s: float, manual_grace_s: float, log: Callable[[str], None], name: str
) -> None:
    """Once the stop is asked: say what runs; at the drain's deadline give back what still runs but the manual and
    report tool calls; at ``manual_grace_s`` past it, those too; end the drain once nothing runs (or the releases
    had their time)."""
    await stopping.asked.wait()
    running = stopping.running_kinds()
    if running:
        log(
            f"tether worker: {name}: stopping: no new work; waiting up to {drain_timeout_s:g} s for what runs to "
            f"finish and commit (SIGINT or SIGTERM again stops at once): {', '.join(running)}"
        )
    with trio.move_on_after(drain_timeout_s):
        await stopping.drained.wait()
        if running:
            log(f"tether worker: {name}: stopping: everything it ran finished and committed")
        return
    given, kept = stopping.give_back(manual_calls=False)
    if given:
        log(
            f"tether worker: {name}: stopping: the drain timeout ({drain_timeout_s:g} s) passed; giving back "
            f"{len(given)} still running (a close, not a crash: no restart counted; a model request is sent again "
            f"as the same attempt, the rest runs again, by the next worker): {', '.join(given)}"
        )
    if kept:
        log(
            f"tether worker: {name}: stopping: waiting up to {manual_grace_s:g} s more for {len(kept)} manual or "
            f"report tool call(s), whose cut-off needs a person: {', '.join(kept)}"
        )
        with trio.move_on_after(manual_grace_s):
            await stopping.drained.wait()
            log(f"tether worker: {name}: stopping: the manual and report tool calls finished and committed")
            return
        cut, _ = stopping.give_back(manual_calls=True)
        log(
            f"tether worker: {name}: stopping: {manual_grace_s:g} s more passed; cutting off {len(cut)} still "
            f"running, each follows its recovery policy (a manual call needs a person): {', '.join(cut)}"
        )
    with trio.move_on_after(RELEASE_TIMEOUT_S):  # the releases of what was given back (each bounded too)
        await stopping.drained.wait()
        return
    stopping.drained.set()


async def _end_if_drained_unattached(stopping: _Stop, scope: trio.CancelScope) -> None:
    """End :func:`serve` when its drain ends while it is not attached (it was waiting for an owner): an attached one
    closes its connection first (:func:`_serve_connections`), which cancelling would make wait for its timeout."""
    await stopping.drained.wait()
    if stopping.worker is None:
        scope.cancel(reason="the worker stopped")


async def _serve_connections(
    app: App,
    stopping: _Stop,
    *,
    connect_args: dict[str, Any],
    max_leases: int,
    log: Callable[[str], None],
    kill_switch: KillSwitch | None,
    telemetry: WorkerTelemetry | None,
    task_status: trio.TaskStatus[Client],
) -> None:
    """Serve ``app`` until the stop's drain is over, connecting afresh whenever a connection cannot be kept up."""
    started = False
    attempts = _AttemptLog(log, connect_args["name"], connect_args["db"] or connect_args["url"])
    while True:
        try:
            async with (
                connect(role="worker", wait_for_owner_s=math.inf, on_attempt=attempts, **connect_args) as client,
                trio.open_nursery() as nursery,
            ):
                worker = Worker(
                    app,
                    client,
                    nursery,
                    log,
                    stopping,
                    max_leases=max_leases,
                    kill_switch=kill_switch,
                    telemetry=telemetry,
                )
                client.connection.attach_worker(worker)  # its announcement is re-sent after every reconnection
                stopping.worker = worker
                await client.announce(worker.announcement())
                if stopping.draining:
                    worker.drain()  # asked while this connection was being made
                if not started:
                    started = True
                    task_status.started(client)
                await stopping.drained.wait()
                # Whatever still runs now is cut off, not released: the connection closes (cleanly, as the block
                # exits) with its leases, and the owner applies each task's recovery policy.
                nursery.cancel_scope.cancel(reason="the worker stopped")
            return
        except (OwnerUnavailable, ConnectionLost):
            # OwnerUnavailable: the owner stayed away longer than a client waits for it. ConnectionLost: the owner
            # went away during the first announcement (later ones are re-sent by the client itself). Either way,
            # connect afresh, waiting for the next owner.
            stopping.worker = None
            if stopping.draining:
                stopping.drained.set()  # the connection's leases ended with it: nothing runs here any more


class _AttemptLog:
    """A worker's log of its failed attempts to reach the owner: the first failure at once, then at most one line
    per ``RETRY_LOG_INTERVAL_S`` while they go on, and one when an attempt succeeds again."""

    def __init__(self, log: Callable[[str], None], name: str, target: Any) -> None:
        self._log = log
        self._name = name
        self._target = target
        self._first_s: float | None = None
        self._logged_s = 0.0
        self._attempts = 0

    def __call__(self, error: TetherError | None, backoff_s: float) -> None:
        now = trio.current_time()
        if error is None:
            if self._first_s is not None:
                self._log(
                    f"tether worker: {self._name}: reached the owner of {self._target} after "
                    f"{now - self._first_s:.1f} s ({self._attempts} failed attempt(s))"
                )
            self._first_s, self._attempts = None, 0
            return
        self._attempts += 1
        if self._first_s is None:
            self._first_s = self._logged_s = now
            self._log(
                f"tether worker: {self._name}: {error}; trying again in {backoff_s:.2g} s, and on (a line every "
                f"{RETRY_LOG_INTERVAL_S:g} s while it lasts)"
            )
        elif now - self._logged_s >= RETRY_LOG_INTERVAL_S:
            self._logged_s = now
            self._log(
                f"tether worker: {self._name}: still no owner after {now - self._first_s:.0f} s ({self._attempts} "
                f"attempts): {error}; trying again in {backoff_s:.2g} s"
            )
