"""``tether up``: the supervisor. Starts the owner, then the workers; restarts what dies; stops in order.

Restart policy, as an Erlang/OTP supervisor counts it: every restart of any child is recorded; more than
``max_restarts`` within ``restart_window_s`` and the supervisor gives up: it stops everything and exits non-zero
naming the child that tipped it over and its last output. A child that ran well (ready for ``STABLE_AFTER_S``: the
owner listening, a worker started, each time it was started) restarts at once; one that dies sooner waits a little
longer before each consecutive restart (back-off, :func:`restart_delay`). Each restart waits in a task of its own:
one child's back-off never delays another child's restart, a takeover by the standby or a new standby. An owner
that exits with a status retrying cannot change (``EXITS_FINAL``: another owner holds the database, a newer schema,
not a Tether database, a damaged one) stops the supervisor at once with that status (:class:`OwnerRefused`); so does
a worker that exits with status 2, its app failing to load (:class:`AppRefused`).

Start: first the app is loaded once by a child (``tether worker --check-app``; the supervisor never imports
application code), before anything is created beside the database (its locks, the database itself): an app that
cannot be loaded stops ``tether up`` with exit 2 and the load error, having touched nothing, instead of workers
restarted until the restart intensity ends it; so does a file that is not a Tether database (exit 5), before the
app is loaded. Then the owner starts, and the workers once it listens.

Warm standby: once the owner listens, the supervisor starts the next owner ahead of time (``tether owner
--standby``): it loads everything, then waits for the ownership lock, which the kernel hands it the moment the owner
dies, however it died. So an owner that died after it listened is replaced within milliseconds instead of a process
start (most of a second, mostly imports); the takeover counts as a restart like any other, and the restart intensity
still ends a loop of them. An owner that dies before listening has no standby: it backs off as above. The standby
is stopped first on shutdown, so that it never takes over from an owner that is being stopped.

Liveness: a hung owner (a deadlock, a stalled disk, a stopped process or VM) does not die, so the supervisor asks it
for its peers through its commit loop and kills it once it has not answered for ``--liveness-timeout``; the standby
then takes over as for any death. The same answers list the attached workers: one that attached and then stays
unattached as long (the owner dropped it: stopped, or hung) is killed and restarted (:meth:`Supervisor._watch_owner`).

Children run in sessions of their own (a Ctrl-C in the terminal reaches the supervisor alone, which stops them in
order) and notice a dead supervisor by their stdin pipe (end-of-file, or silence: see ``runtime._parent``), never by
signals. The supervisor publishes its state next to the database (``DB.supervisor.json``, mode 0600) so that
``tether status`` and ``tether stop`` work from any shell.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from protocol import (
    DEFAULT_MAX_LEASES,
    OwnerAlreadyRunning,
    OwnerUnavailable,
    PeerInfo,
    RuntimeInfo,
    TetherError,
    write_private_json,
)
from storage_owner.store import MIGRATIONS, is_owned, lock_is_held, open_lock_file, refuse_foreign

from ._exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE, EXITS_FINAL
from ._parent import DEFAULT_LIVENESS_TIMEOUT_S, PARENT_HEARTBEAT_S
from ._process import kill_and_reap, open_tether_process, stop_gracefully, tether_command, wait_for_owner
from ._signals import replay_early_signals

RELEASE_MARGIN_S: Final = 2.0
"""How long past its manual grace a stopping worker is given to release what it gave back and disconnect."""
STATE_SUFFIX: Final = ".supervisor.json"
LOCK_SUFFIX: Final = ".supervisor.lock"
TAIL_LINES: Final = 20
BACKOFF_INITIAL_S: Final = 0.1
BACKOFF_MAX_S: Final = 5.0
STABLE_AFTER_S: Final = 1.0
"""A child that was ready (the owner listening, a worker started: after each start, not only the first) this long
before dying ran well: it restarts at once, and its back-off starts over."""
OWNER_READY_TIMEOUT_S: Final = 30.0
UNANSWERED_GRACE_S: Final = 1.0
"""How long a question to the owner must have waited before its silence counts (see :func:`next_liveness_look`)."""
APP_CHECK_TIMEOUT_S: Final = 60.0
"""How long loading the app once (``tether worker --check-app``, before any worker starts) may take."""
PROBES_PER_LIVENESS_TIMEOUT: Final = 2
"""The supervisor asks its owner for its peers (a ``read_peers`` request, answered from the commit loop) this many
times per ``--liveness-timeout``, or as often as its connection would ping if that is sooner (the probes stand in
for the pings): every 2.5 s by default. Each answer costs the owner and the supervisor about 1-3 ms of CPU on a small
virtual machine (mostly waking up: trio, the WebSocket, the commit loop), so more often would take an idle ``tether
up`` past half a percent of a core (``tests/integration/test_up.py``)."""


class GaveUp(TetherError):
    """A child kept dying: more restarts than the intensity allows. The message names it and its last output."""


class OwnerRefused(TetherError):
    """The owner exited with a status that retrying cannot change (see ``EXITS_FINAL``); ``tether up`` exits with the
    same ``exit_status``. The message says why, from the owner's last output."""

    def __init__(self, message: str, exit_status: int) -> None:
        super().__init__(message)
        self.exit_status = exit_status


class AppRefused(TetherError):
    """The app cannot be loaded: the check before the workers start failed, or a worker exited with status 2 (its
    app failed to load). ``tether up`` stops everything and exits with ``exit_status``; the message quotes the
    error."""

    def __init__(self, message: str, exit_status: int) -> None:
        super().__init__(message)
        self.exit_status = exit_status


def restart_delay(backoff_s: float, ready_s: float | None) -> tuple[float, float]:
    """``(wait before restarting, back-off for the next restart)`` of a child that died after being ready for
    ``ready_s`` seconds (``None``: it never was) with back-off ``backoff_s``.

    A child that ran well restarts at once and its back-off starts over; one that dies sooner waits its back-off,
    which doubles (from ``BACKOFF_INITIAL_S`` up to ``BACKOFF_MAX_S``) with each consecutive quick death.
    """
    if ready_s is not None and ready_s >= STABLE_AFTER_S:
        return 0.0, BACKOFF_INITIAL_S
    wait_s = max(backoff_s, BACKOFF_INITIAL_S)
    return wait_s, min(wait_s * 2, BACKOFF_MAX_S)


def next_liveness_look(now_s: float, answered_s: float, asked_s: float | None, timeout_s: float) -> float | None:
    """When to look at the owner's liveness again, or ``None``: it is hung, kill it.

    ``answered_s``: when it last answered (or was first asked); ``asked_s``: since when a question (a probe, or a
    connection attempt) waits for its answer, ``None`` if none does. The owner is hung once it has not answered for
    ``timeout_s`` while a question waited at least ``UNANSWERED_GRACE_S`` (at most half the timeout). Without that
    wait the silence is the supervisor's own: stopped itself (Ctrl-Z, SIGSTOP), it asked nothing meanwhile, and the
    owner gets a question and a moment to answer it first.
    """
    grace_s = min(UNANSWERED_GRACE_S, timeout_s / 2)
    if now_s < answered_s + timeout_s:
        return answered_s + timeout_s
    if asked_s is not None and now_s - asked_s >= grace_s:
        return None
    return (now_s if asked_s is None else asked_s) + grace_s


def probe_name(supervisor_pid: int) -> str:
    """The peer name of the supervisor's connection to its owner (its liveness probe), as ``read_peers`` shows it."""
    return f"tether-up-{supervisor_pid}"


def state_path(db: str) -> Path:
    return Path(db + STATE_SUFFIX)


def supervisor_lock_path(db: str) -> Path:
    return Path(db + LOCK_SUFFIX)


def read_state(db: str) -> dict[str, Any] | None:
    """The supervisor state file of ``db``, or ``None`` if there is none (or it cannot be read)."""
    try:
        raw = json.loads(state_path(db).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) else None


@attrs.frozen(kw_only=True)
class SupervisorConfig:
    db: str
    app: str
    workers: int = 2
    max_restarts: int = 10
    restart_window_s: float = 60.0
    max_leases: int = DEFAULT_MAX_LEASES
    """Phases each worker runs at once."""
    stop_timeout_s: float = 10.0
    """How long a child may take to exit after SIGTERM (a worker: after its drain) before it is killed."""
    drain_timeout_s: float = 30.0
    """``tether worker --drain-timeout``: how long a stopping worker lets what it runs finish."""
    manual_grace_s: float = 8.0
    """``tether worker --manual-grace``: how much longer its manual and report tool calls get at that deadline."""
    owner_args: tuple[str, ...] = ()
    """The owner's options (``tether owner`` arguments but ``--db``), passed as they are to the owner and the
    standby: ``tether up`` derives them from its own (``runtime._cli_owner_options.owner_argv``); none, the owner's
    defaults."""
    liveness_timeout_s: float = DEFAULT_LIVENESS_TIMEOUT_S
    """``tether up --liveness-timeout``: an owner that has not answered the supervisor for this long (counted from
    when it listened, then from its last answer) is killed; so is a worker that attached once and has not been
    attached for this long while the owner answers."""

    @property
    def worker_stop_timeout_s(self) -> float:
        """How long a worker may take to exit after SIGTERM before it is killed: its drain, then the stop timeout,
        or its manual grace and ``RELEASE_MARGIN_S`` if that is longer."""
        return self.drain_timeout_s + max(self.stop_timeout_s, self.manual_grace_s + RELEASE_MARGIN_S)


@attrs.define(eq=False)
class _OwnerWatch:
    """The liveness watch of one owner: when it last answered, since when a question waits, when to look next."""

    answered_s: float
    timeout_s: float
    asked_s: float | None = None
    interval_s: float = attrs.field()
    """How often to ask: ``PROBES_PER_LIVENESS_TIMEOUT`` times per timeout, or as often as the probe connection would
    ping if that is sooner."""
    due: trio.CancelScope = attrs.field()
    """Ends at the next look (:func:`next_liveness_look`); each answer moves its deadline on."""

    @interval_s.default
    def _interval(self) -> float:
        return self.timeout_s / PROBES_PER_LIVENESS_TIMEOUT

    @due.default
    def _due(self) -> trio.CancelScope:
        return trio.CancelScope(deadline=self.answered_s + self.timeout_s)

    def asking(self) -> float:
        """A question goes out (unless one already waits); returns now."""
        now_s = trio.current_time()
        if self.asked_s is None:
            self.asked_s = now_s
        return now_s

    def answered(self) -> None:
        self.count_from_now()

    def count_from_now(self) -> None:
        """The owner's silence counts from now (an answer came, or the first question is about to go out)."""
        self.answered_s, self.asked_s = trio.current_time(), None
        self.due.deadline = self.answered_s + self.timeout_s


@attrs.define(eq=False)
class _Child:
    name: str
    argv: list[str]
    process: trio.Process | None = None
    restarts: int = 0
    started_at: float = 0.0
    started_at_ms: int = 0
    ready_at: float | None = None
    """When it became ready (trio clock): the owner once it listens, a worker once started; ``None`` before."""
    attached: bool = False
    """A worker: whether the owner listed it attached since it started (the supervisor's probe saw it)."""
    unattached_since: float | None = None
    """A worker that attached once: since when the owner's answers no longer list it (trio clock)."""
    backoff_s: float = BACKOFF_INITIAL_S
    tail: collections.deque[str] = attrs.Factory(lambda: collections.deque(maxlen=TAIL_LINES))
    exited: trio.Event = attrs.Factory(trio.Event)

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None


class Supervisor:
    def __init__(self, config: SupervisorConfig, *, say: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.db = os.path.abspath(config.db)
        self._say = say or (lambda line: print(line, flush=True))
        common = ["--db", self.db, "--supervised"]
        self.owner = _Child("owner", tether_command("owner", *common, *config.owner_args))
        self.standby = _Child("standby", [*self.owner.argv, "--standby"])
        """The next owner, started once the owner listens; takes over when the owner dies (see the docstring)."""
        self.workers = [
            _Child(
                f"worker-{index}",
                tether_command(
                    "worker",
                    *common,
                    "--app",
                    config.app,
                    "--name",
                    f"worker-{index}",
                    "--max-leases",
                    str(config.max_leases),
                    "--drain-timeout",
                    f"{config.drain_timeout_s:g}",
                    "--manual-grace",
                    f"{config.manual_grace_s:g}",
                ),
            )
            for index in range(1, config.workers + 1)
        ]
        self.app_check = _Child(
            "app-check", tether_command("worker", "--check-app", "--db", self.db, "--app", config.app)
        )
        """Loads the app once, as a worker would, before the owner starts: workers start only if it can be loaded."""
        self._app_checked = trio.Event()
        self._restart_times: collections.deque[float] = collections.deque()
        self._workers_started = False
        self._standby_spawning: trio.Event | None = None
        """Set while a standby's process is being started (its ``_Child.process`` is not known yet)."""
        self._stopping = False
        self._exits: trio.MemorySendChannel[trio.Process]
        self.url: str | None = None
        self.started_at_ms = int(time.time() * 1000)

    @property
    def children(self) -> list[_Child]:
        return [self.owner, *self.workers]

    def _role_of(self, process: trio.Process) -> _Child | None:
        """The child ``process`` is now (a standby becomes the owner), or ``None`` for a process replaced since."""
        for child in (self.owner, self.standby, *self.workers):
            if child.process is process:
                return child
        return None

    # ------------------------------------------------------------------------------------------------ run

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until SIGINT/SIGTERM (clean stop), a child exceeds the restart intensity (:class:`GaveUp`), or retrying
        cannot help (:class:`OwnerRefused`, :class:`AppRefused`); every process is stopped either way."""
        # Nothing is created beside the database (its locks, the state file, the database itself) before these
        # refusals: a foreign file, a database already served, an app that cannot be loaded.
        refuse_foreign(self.db, MIGRATIONS)
        self._refuse_if_served()
        workers = len(self.workers)
        self._say(
            f"tether up: {self.db}, {workers} worker{'' if workers == 1 else 's'} serving {self.config.app} "
            f"(pid {os.getpid()})"
        )
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            replay_early_signals()  # one that came while Python imported the supervisor stops it now
            send, receive = trio.open_memory_channel[trio.Process](16)
            self._exits = send
            if not await self._check_app_first(signals):
                return
            lock_fd = self._lock()
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._feed_heartbeats)
                    stop = trio.Event()
                    nursery.start_soon(self._watch_signals, signals, stop)
                    try:
                        await self._start(nursery, self.owner)
                        nursery.start_soon(self._when_listening, nursery, self.owner.process)
                        self._write_state()
                        task_status.started()
                        await self._supervise(nursery, receive, stop)
                    finally:
                        with trio.CancelScope(shield=True):
                            await self._stop_all()
                        nursery.cancel_scope.cancel(reason="the supervisor stopped")
            finally:
                state_path(self.db).unlink(missing_ok=True)
                os.close(lock_fd)

    async def _check_app_first(self, signals: Any) -> bool:
        """Load the app once (:meth:`_check_app`) before anything is started or created: True once it loaded, False
        if SIGINT or SIGTERM came first (the check is stopped, and so is ``tether up``)."""
        signalled = False
        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as check:

                async def stop_on_signal() -> None:
                    nonlocal signalled
                    async for _ in signals:
                        signalled = True
                        check.cancel(reason="SIGINT or SIGTERM while the app was loaded")
                        return

                nursery.start_soon(stop_on_signal)
                await self._check_app(nursery)
            nursery.cancel_scope.cancel(reason="the app was checked")
        return not signalled

    def _refuse_if_served(self) -> None:
        """:class:`OwnerAlreadyRunning` if a ``tether up`` or an owner holds the database (read from the locks, none
        taken or created)."""
        if lock_is_held(supervisor_lock_path(self.db)):
            raise self._already_supervised()
        if is_owned(self.db):
            raise self._already_owned()

    def _already_supervised(self) -> OwnerAlreadyRunning:
        state = read_state(self.db) or {}
        return OwnerAlreadyRunning(
            f"tether up is already running for {self.db} (supervisor pid {state.get('pid', 'unknown')}); "
            f"stop it with `tether stop --db {self.db}`"
        )

    def _already_owned(self) -> OwnerAlreadyRunning:
        return OwnerAlreadyRunning(
            f"an owner not started by tether up already holds {self.db}; stop it first (`tether stop --db {self.db}`)"
        )

    def _lock(self) -> int:
        path = supervisor_lock_path(self.db)
        fd = open_lock_file(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise self._already_supervised() from None
        if is_owned(self.db):
            os.close(fd)
            raise self._already_owned()
        return fd

    async def _supervise(
        self, nursery: trio.Nursery, exits: trio.MemoryReceiveChannel[trio.Process], stop: trio.Event
    ) -> None:
        """Handle each child's exit as it comes, never waiting here: a restart's back-off, an owner starting to listen
        and everything after run in tasks of their own, so that one child's restart never delays another's, nor a
        takeover by the standby."""

        async def wait_stop() -> None:
            await stop.wait()
            cancel.cancel(reason="SIGINT or SIGTERM")

        with trio.CancelScope() as cancel:
            nursery.start_soon(wait_stop)
            async for process in exits:
                child = self._role_of(process)
                if child is None:
                    continue
                status = process.returncode
                if child is self.standby:  # never served: not a restart; the next owner that listens gets another
                    self._say(f"  {'standby':<10}exited with status {status}")
                    child.process = None
                    continue
                now = trio.current_time()
                ran_s = now - child.started_at
                self._say(f"  {child.name:<10}exited with status {status} after {ran_s:.1f} s")
                if child is self.owner and status in EXITS_FINAL:
                    raise OwnerRefused(
                        f"the owner exited with status {status}, which retrying cannot change, so it was not "
                        f"restarted and every process was stopped. Last output of the owner:\n{_tail(child)}",
                        status,
                    )
                if child in self.workers and status == EXIT_USAGE:
                    raise AppRefused(
                        f"{child.name} exited with status {status}: its app {self.config.app} cannot be loaded (or "
                        f"its command line is wrong), which retrying cannot change, so it was not restarted and every "
                        f"process was stopped. Last output of {child.name}:\n{_tail(child)}",
                        status,
                    )
                self._count_restart(child)
                ready_s = None if child.ready_at is None else now - child.ready_at
                wait_s, child.backoff_s = restart_delay(child.backoff_s, ready_s)
                if child is self.owner and self.standby.running:
                    self._promote_standby()  # it already took the lock the kernel released: no wait can apply
                    nursery.start_soon(self._when_listening, nursery, self.owner.process)
                else:
                    nursery.start_soon(self._restart_after, nursery, child, wait_s)
                self._write_state()
        running = sum(1 for worker in self.workers if worker.running)
        self._say(
            f"tether up: stopping: the workers finish what they run (at most {self.config.drain_timeout_s:g} s), then "
            f"the standby and the owner stop; SIGINT or SIGTERM again stops at once"
            if running
            else "tether up: stopping the standby, then the owner"
        )

    async def _restart_after(self, nursery: trio.Nursery, child: _Child, wait_s: float) -> None:
        """Start ``child`` again after its back-off ``wait_s`` (a task of its own: nothing else waits for it)."""
        self._say(f"  {child.name:<10}restarting in {wait_s:.1f} s (restart {child.restarts + 1})")
        await trio.sleep(wait_s)
        if self._stopping:
            return
        if child is self.owner:
            if self._standby_spawning is not None:
                await self._standby_spawning.wait()  # the owner died while its standby was being started
                if self._stopping:
                    return
            if self.standby.running:
                # That standby takes the lock the kernel released (or already did): it is the owner now, and a new
                # owner process would only find the database owned (and stop tether up: retrying cannot change that).
                self._promote_standby()
                nursery.start_soon(self._when_listening, nursery, self.owner.process)
                self._write_state()
                return
        child.restarts += 1
        await self._start(nursery, child)
        if child is self.owner:
            nursery.start_soon(self._when_listening, nursery, child.process)
        self._write_state()

    def _count_restart(self, child: _Child) -> None:
        now = trio.current_time()
        window = self.config.restart_window_s
        self._restart_times.append(now)
        while self._restart_times and now - self._restart_times[0] > window:
            self._restart_times.popleft()
        if len(self._restart_times) > self.config.max_restarts:
            raise GaveUp(
                f"giving up: {child.name} died again, and restarting it would make {len(self._restart_times)} "
                f"restarts within {window:g} s, past the limit of {self.config.max_restarts} "
                f"(--max-restarts, --restart-window); every process was stopped. Last output of {child.name}:\n"
                f"{_tail(child)}"
            )

    # ------------------------------------------------------------------------------------------- children

    def _promote_standby(self) -> None:
        owner, standby = self.owner, self.standby
        assert standby.process is not None
        owner.process, standby.process = standby.process, None
        owner.started_at, owner.started_at_ms = standby.started_at, standby.started_at_ms
        owner.ready_at = None
        owner.restarts += 1
        self._say(f"  {'owner':<10}the standby (pid {owner.pid}) takes over (restart {owner.restarts})")

    async def _when_listening(self, nursery: trio.Nursery, process: trio.Process | None) -> None:
        """Once the owner ``process`` listens: start the workers (the first time, once the app loads), arm a standby
        behind it, and watch that it keeps answering, until it is no longer the owner."""
        assert process is not None
        info = await self._wait_listening(process)
        if info is None:
            return  # it died first (its exit is handled by _supervise), or was killed for not listening
        if not self._workers_started:
            await self._app_checked.wait()
            if self._stopping or self.owner.process is not process or not self.owner.running:
                return  # replaced while the app was checked: the next owner starts them
            await self._start_workers(nursery)
        await self._arm_standby(nursery, process)
        await self._watch_owner(process, info)

    async def _arm_standby(self, nursery: trio.Nursery, owner_process: trio.Process) -> None:
        """Start the standby for ``owner_process``, which listens (unless it was replaced or died meanwhile)."""
        if self._stopping or self.owner.process is not owner_process or not self.owner.running:
            return
        if self.standby.process is None or not self.standby.running:
            self._standby_spawning = spawning = trio.Event()
            try:
                await self._start(nursery, self.standby)
            finally:
                self._standby_spawning = None
                spawning.set()
            self._write_state()

    async def _start_workers(self, nursery: trio.Nursery) -> None:
        """Start every worker: once, when the owner first listens (a worker then reconnects by itself)."""
        self._workers_started = True
        for worker in self.workers:
            await self._start(nursery, worker)
        self._write_state()

    async def _check_app(self, nursery: trio.Nursery) -> None:
        """Load the app once, as a worker would (``tether worker --check-app``, a child: the supervisor never imports
        the app), before the owner starts. If it loads, the workers may start; else :class:`AppRefused` stops
        everything with the load error (exit 2), instead of workers restarted until the restart intensity gives
        up."""
        check = self.app_check
        await self._start(nursery, check)
        process = check.process
        assert process is not None
        try:
            with trio.move_on_after(APP_CHECK_TIMEOUT_S) as timer:
                await check.exited.wait()
        finally:
            await kill_and_reap(process)  # only if still running: timed out, or the supervisor stops
        app = self.config.app
        if timer.cancelled_caught:
            raise AppRefused(
                f"the app {app} did not load within {APP_CHECK_TIMEOUT_S:g} s (its module's import did not end), so "
                f"no worker was started and every process was stopped. Last output:\n{_tail(check)}",
                EXIT_FAILED,
            )
        status = process.returncode
        if status != EXIT_OK:
            raise AppRefused(
                f"the app {app} cannot be loaded (tether worker --app {app} exited with status {status}), so no "
                f"worker was started and every process was stopped:\n{_tail(check)}",
                EXIT_USAGE if status == EXIT_USAGE else EXIT_FAILED,
            )
        self._say(f"  {'app-check':<10}{app} loads")
        self._app_checked.set()

    async def _start(self, nursery: trio.Nursery, child: _Child) -> None:
        child.exited = trio.Event()
        child.ready_at = None
        child.attached, child.unattached_since = False, None
        # In a session of its own: a Ctrl-C in the terminal of `tether up` reaches the supervisor alone, which stops
        # the children in order (a worker signalled twice, by the terminal and by us, would not drain).
        child.process = await open_tether_process(
            child.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        child.started_at = trio.current_time()
        child.started_at_ms = int(time.time() * 1000)
        if child in self.workers:
            child.ready_at = child.started_at  # a worker runs well from its start: see restart_delay
        detail = f" (app {self.config.app})" if child in (*self.workers, self.app_check) else ""
        self._say(f"  {child.name:<10}pid {child.pid}{detail}")
        nursery.start_soon(self._watch_child, child, child.process)
        if self._stopping and child is not self.app_check:
            # The stop began while this child was being started (a restart after its back-off, a new standby), so
            # the stop may have seen the process it replaces: stop this one the same way.
            nursery.start_soon(self._stop_child, child)

    async def _watch_child(self, child: _Child, process: trio.Process) -> None:
        """Relay the child's output, keep its tail, and report its exit."""
        assert process.stdout is not None
        buffer = b""
        async with process.stdout:
            with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
                while chunk := await process.stdout.receive_some(65536):
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        text = line.decode(errors="replace")
                        role = self._role_of(process) or child  # a standby's lines become the owner's
                        role.tail.append(text)
                        print(f"[{role.name}] {text}", file=sys.stderr, flush=True)
        await process.wait()
        child.exited.set()
        if not self._stopping:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await self._exits.send(process)

    async def _wait_listening(self, process: trio.Process) -> RuntimeInfo | None:
        """Wait until the owner ``process`` published its runtime file (its listening address); ``None`` if it died
        first (its exit is handled by :meth:`_supervise`: a crash, or a refusal that stops everything) or did not
        listen within ``OWNER_READY_TIMEOUT_S`` (then it is killed, and restarted as any dead owner is)."""
        try:
            info = await wait_for_owner(self.db, process, timeout_s=OWNER_READY_TIMEOUT_S)
        except OwnerUnavailable:
            if process.returncode is None and self.owner.process is process:
                self._say(f"  owner     did not listen within {OWNER_READY_TIMEOUT_S:g} s; killing it")
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
            return None
        if self.owner.process is not process:
            return None
        self.owner.ready_at = trio.current_time()
        self.url = info.url
        self._say(f"  {'owner':<10}listening on {info.url}")
        self._write_state()
        return info

    async def _watch_owner(self, process: trio.Process, info: RuntimeInfo) -> None:
        """Make sure the owner ``process`` keeps answering, until it exits or is no longer the owner.

        A hung owner (a deadlock, a stalled disk, a stopped process or VM) does not die, so nothing else would notice
        it: clients time out one by one and the standby waits behind the lock. So the supervisor asks it for its
        peers through its commit loop (``PROBES_PER_LIVENESS_TIMEOUT``, a reader connection of its own); once no answer
        came for ``--liveness-timeout`` (counted from its first question, then from its last answer) it says so and
        SIGKILLs it (which works on a stopped process), and the standby takes over as for any death. Never while the
        supervisor stops (an owner finishing its work may be slow to answer then). The answers also tell which
        workers are attached: see :meth:`_check_workers`.
        """
        timeout_s = self.config.liveness_timeout_s
        watch = _OwnerWatch(answered_s=trio.current_time(), timeout_s=timeout_s)
        for worker in self.workers:
            worker.unattached_since = None  # counted while this owner answers, not a previous one
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_on_exit, process, nursery.cancel_scope)
            nursery.start_soon(self._probe_owner, info, watch)
            while True:
                with watch.due:  # its deadline moves on at each answer: no task wakes to look while all is well
                    await trio.sleep_forever()
                now_s = trio.current_time()
                look_s = next_liveness_look(now_s, watch.answered_s, watch.asked_s, timeout_s)
                if look_s is None:
                    break
                watch.due = trio.CancelScope(deadline=look_s)
            if not self._stopping and self.owner.process is process:
                silent_s, pid = now_s - watch.answered_s, process.pid
                self._say(
                    f"  {'owner':<10}has not answered for {silent_s:.1f} s (asked for its peers every "
                    f"{watch.interval_s:g} s; --liveness-timeout {timeout_s:g}): hung, so killing it (pid {pid})"
                )
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
            # Then wait for its exit, which cancels the probe (on a stop, the stop ends it).

    async def _probe_owner(self, info: RuntimeInfo, watch: _OwnerWatch) -> None:
        """Ask the owner at ``info.url`` for its peers every ``watch.interval_s``, noting each question and answer in
        ``watch``; connect again after a lost connection (a connection attempt counts as a question)."""
        # The first question an interval after the owner started listening, and the client imported only then: a
        # quarter of a second of CPU kept off tether up's start, its workers starting. The silence counts from that
        # question: a new owner (a standby just promoted, its workers and clients reconnecting at once) gets a whole
        # timeout to answer its first, not what is left of one counted from when it listened.
        await trio.sleep(watch.interval_s)
        import actors

        watch.count_from_now()

        while True:
            try:
                watch.asking()
                async with actors.connect(
                    url=info.url,
                    token=info.token,
                    ca=info.tls_ca,
                    role="reader",
                    name=probe_name(os.getpid()),
                    reconnect=False,
                ) as client:
                    assert client.welcome is not None
                    # At least as often as the connection would ping: the probes stand in for its pings.
                    watch.interval_s = min(watch.interval_s, client.welcome.heartbeat_ms / 1000)
                    while True:
                        asked_s = watch.asking()
                        peers = await client.peers()
                        watch.answered()
                        self._check_workers(peers)
                        await trio.sleep_until(asked_s + watch.interval_s)
            except TetherError:  # unreachable, connection lost, refused: no answer; the watch decides
                pass
            await trio.sleep(watch.interval_s)

    def _check_workers(self, peers: list[PeerInfo]) -> None:
        """From an answer of the owner: a supervised worker that attached once since it started and has not been
        attached for ``--liveness-timeout`` since (the owner dropped it: stopped past the heartbeat timeout, or
        wedged) is SIGKILLed, and restarted as any dead worker is. A worker that never attached (still importing
        its app, or waiting for an owner) is left alone."""
        attached = {peer.pid for peer in peers if peer.role == "worker" and peer.announced}
        now = trio.current_time()
        timeout_s = self.config.liveness_timeout_s
        for worker in self.workers:
            process = worker.process
            if process is None or worker.exited.is_set():  # (not process.returncode: a wait4 for each, each time)
                continue
            if process.pid in attached:
                worker.attached, worker.unattached_since = True, None
            elif worker.attached and not self._stopping:
                if worker.unattached_since is None:
                    worker.unattached_since = now
                elif now - worker.unattached_since >= timeout_s:
                    self._say(
                        f"  {worker.name:<10}not attached to the owner for {now - worker.unattached_since:.1f} s "
                        f"while the owner answers (--liveness-timeout {timeout_s:g}; the owner dropped it: stopped "
                        f"or hung), so killing it (pid {process.pid})"
                    )
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()

    async def _feed_heartbeats(self) -> None:
        """A byte on every child's stdin every ``PARENT_HEARTBEAT_S``: a child whose pipe ends or falls silent stops
        itself."""
        while True:
            for child in (*self.children, self.standby):
                process = child.process
                if process is not None and process.returncode is None and process.stdin is not None:
                    with contextlib.suppress(
                        trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError
                    ):
                        await process.stdin.send_all(b".")
            await trio.sleep(PARENT_HEARTBEAT_S)

    async def _stop_all(self) -> None:
        """Workers first (each drains: what it runs finishes and commits, for at most its drain timeout), then the
        standby (so that it never takes over), then the owner (it closes the database cleanly). A SIGINT or SIGTERM
        meanwhile is passed on to the workers, which then stop at once."""
        self._stopping = True
        for group in (self.workers, [self.standby], [self.owner]):
            async with trio.open_nursery() as nursery:
                for child in group:
                    nursery.start_soon(self._stop_child, child)

    async def _watch_signals(self, signals: Any, stop: trio.Event) -> None:
        """The first SIGINT or SIGTERM stops the supervisor (``stop``); one during the stop stops it at once."""
        async for _ in signals:
            if not self._stopping:
                stop.set()
                continue
            running = [w.process for w in self.workers if w.process is not None and w.process.returncode is None]
            if not running:
                self._say("tether up: already stopping: the workers are gone; the standby and the owner stop next")
                continue
            self._say("tether up: stopping at once: the workers cut off what they still run")
            for process in running:
                with contextlib.suppress(ProcessLookupError):
                    process.terminate()  # a worker's second SIGTERM: it stops at once

    async def _stop_child(self, child: _Child) -> None:
        process = child.process
        if process is None:
            return
        timeout_s = self.config.worker_stop_timeout_s if child in self.workers else self.config.stop_timeout_s
        await stop_gracefully(
            process,
            timeout_s=timeout_s,
            on_kill=lambda: self._say(f"  {child.name:<10}did not stop within {timeout_s:g} s; killing it"),
        )
        if process.stdin is not None:
            with contextlib.suppress(Exception):
                await process.stdin.aclose()

    # ---------------------------------------------------------------------------------------------- state

    def _write_state(self) -> None:
        state = {
            "pid": os.getpid(),
            "db": self.db,
            "app": self.config.app,
            "url": self.url,
            "started_at_ms": self.started_at_ms,
            # the longest _stop_all may take: the workers' drain and stop timeout, then the standby's, the owner's
            "stop_within_s": self.config.worker_stop_timeout_s + 2 * self.config.stop_timeout_s,
            "owner": _child_state(self.owner),
            "standby": _child_state(self.standby),
            "workers": [_child_state(worker) for worker in self.workers],
        }
        write_private_json(state_path(self.db), state)


def _child_state(child: _Child) -> dict[str, Any]:
    return {"name": child.name, "pid": child.pid, "restarts": child.restarts, "started_at_ms": child.started_at_ms}


def _tail(child: _Child) -> str:
    """The last lines ``child`` printed, indented, for a message that quotes them."""
    return "\n".join(f"    {line}" for line in child.tail) or "    (no output)"


async def _cancel_on_exit(process: trio.Process, cancel: trio.CancelScope) -> None:
    await process.wait()
    cancel.cancel(reason="the process exited")
