"""``tether up``: the supervisor. Starts the owner, then the workers; restarts what dies; stops in order.

Restart policy, as an Erlang/OTP supervisor counts it: every restart of any child is recorded; more than
``max_restarts`` within ``restart_window_s`` and the supervisor gives up: it stops everything and exits non-zero
naming the child that tipped it over and its last output. A child that ran well (ready for ``STABLE_AFTER_S``: the
owner listening, a worker started) restarts at once; one that dies sooner waits a little longer before each
consecutive restart (back-off, :func:`restart_delay`). An owner that exits with a status retrying cannot change
(``EXITS_FINAL``: another owner holds the database, a newer schema, not a Tether database, a damaged one) stops the
supervisor at once with that status (:class:`OwnerRefused`). Workers start only once the owner listens.

Warm standby: once the owner listens, the supervisor starts the next owner ahead of time (``tether owner
--standby``): it loads everything, then waits for the ownership lock, which the kernel releases the moment the owner
dies, however it died. So an owner that died after it listened is replaced within milliseconds instead of a process
start (most of a second, mostly imports); the takeover counts as a restart like any other, and the restart intensity
still ends a loop of them. An owner that dies before listening has no standby: it backs off as above. The standby
is stopped first on shutdown, so that it never takes over from an owner that is being stopped.

Children notice a dead supervisor by their stdin pipe (end-of-file, or silence: see ``runtime._parent``), never by
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

from protocol import DEFAULT_MAX_LEASES, OwnerAlreadyRunning, OwnerUnavailable, TetherError, write_private_json
from storage_owner.core import DEFAULT_MAX_CONCURRENT_RUNS
from storage_owner.store import is_owned, open_lock_file

from ._cli import EXITS_FINAL
from ._entry import replay_early_signals
from ._parent import PARENT_HEARTBEAT_S
from ._process import open_tether_process, stop_gracefully, tether_command, wait_for_owner

STATE_SUFFIX: Final = ".supervisor.json"
LOCK_SUFFIX: Final = ".supervisor.lock"
TAIL_LINES: Final = 20
BACKOFF_INITIAL_S: Final = 0.1
BACKOFF_MAX_S: Final = 5.0
STABLE_AFTER_S: Final = 1.0
"""A child that was ready (the owner listening, a worker started) this long before dying ran well: it restarts at
once, and its back-off starts over."""
OWNER_READY_TIMEOUT_S: Final = 30.0


class GaveUp(TetherError):
    """A child kept dying: more restarts than the intensity allows. The message names it and its last output."""


class OwnerRefused(TetherError):
    """The owner exited with a status that retrying cannot change (see ``EXITS_FINAL``); ``tether up`` exits with the
    same ``exit_status``. The message says why, from the owner's last output."""

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
    listen: str = "127.0.0.1:0"
    sync: str = "normal"
    clock: str = "wall"
    heartbeat_timeout_s: float = 10.0
    max_restarts: int = 10
    restart_window_s: float = 60.0
    max_leases: int = DEFAULT_MAX_LEASES
    """Phases each worker runs at once."""
    stop_timeout_s: float = 10.0
    max_concurrent_runs: int = DEFAULT_MAX_CONCURRENT_RUNS
    """Runs the owner lets be busy at once (``tether owner --max-concurrent-runs``)."""
    owner_args: tuple[str, ...] = ()
    """More ``tether owner`` arguments, passed as they are (the listener's: TLS, handshake bounds)."""

    group_readable: bool = False
    """``tether owner --group-readable``: a new database is created 0640."""
    start_check_s: float = 1.0
    """``tether owner --start-check``: how long the owner's start check may take."""


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
        self.owner = _Child(
            "owner",
            tether_command(
                "owner",
                *common,
                "--listen",
                config.listen,
                "--sync",
                config.sync,
                "--clock",
                config.clock,
                "--heartbeat-timeout",
                f"{config.heartbeat_timeout_s:g}",
                "--max-concurrent-runs",
                str(config.max_concurrent_runs),
                *config.owner_args,
                "--start-check",
                f"{config.start_check_s:g}",
                *(["--group-readable"] if config.group_readable else []),
            ),
        )
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
                ),
            )
            for index in range(1, config.workers + 1)
        ]
        self._restart_times: collections.deque[float] = collections.deque()
        self._workers_started = False
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
        """Run until SIGINT/SIGTERM (clean stop) or until a child exceeds the restart intensity (``GaveUp``)."""
        lock_fd = self._lock()
        workers = len(self.workers)
        self._say(
            f"tether up: {self.db}, {workers} worker{'' if workers == 1 else 's'} serving {self.config.app} "
            f"(pid {os.getpid()})"
        )
        try:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                replay_early_signals()  # one that came while Python imported the supervisor stops it now
                async with trio.open_nursery() as nursery:
                    send, receive = trio.open_memory_channel[trio.Process](16)
                    self._exits = send
                    nursery.start_soon(self._feed_heartbeats)
                    try:
                        await self._start(nursery, self.owner)
                        if await self._wait_owner_ready():
                            await self._start_workers(nursery)
                            nursery.start_soon(self._arm_standby, nursery, self.owner.process)
                        self._write_state()
                        task_status.started()
                        stop = trio.Event()
                        nursery.start_soon(_set_on_signal, signals, stop)
                        await self._supervise(nursery, receive, stop)
                    finally:
                        with trio.CancelScope(shield=True):
                            await self._stop_all()
                        nursery.cancel_scope.cancel(reason="the supervisor stopped")
        finally:
            state_path(self.db).unlink(missing_ok=True)
            os.close(lock_fd)

    def _lock(self) -> int:
        path = supervisor_lock_path(self.db)
        fd = open_lock_file(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            state = read_state(self.db) or {}
            raise OwnerAlreadyRunning(
                f"tether up is already running for {self.db} (supervisor pid {state.get('pid', 'unknown')}); "
                f"stop it with `tether stop --db {self.db}`"
            ) from None
        if is_owned(self.db):
            os.close(fd)
            raise OwnerAlreadyRunning(
                f"an owner not started by tether up already holds {self.db}; stop it first "
                f"(`tether stop --db {self.db}`)"
            )
        return fd

    async def _supervise(
        self, nursery: trio.Nursery, exits: trio.MemoryReceiveChannel[trio.Process], stop: trio.Event
    ) -> None:
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
                    tail = "\n".join(f"    {line}" for line in child.tail) or "    (no output)"
                    raise OwnerRefused(
                        f"the owner exited with status {status}, which retrying cannot change, so it was not "
                        f"restarted and every process was stopped. Last output of the owner:\n{tail}",
                        status,
                    )
                self._count_restart(child)
                ready_s = None if child.ready_at is None else now - child.ready_at
                wait_s, child.backoff_s = restart_delay(child.backoff_s, ready_s)
                if child is self.owner and self.standby.running:
                    self._promote_standby()  # it already took the lock the kernel released: no wait can apply
                else:
                    self._say(f"  {child.name:<10}restarting in {wait_s:.1f} s (restart {child.restarts + 1})")
                    await trio.sleep(wait_s)
                    child.restarts += 1
                    await self._start(nursery, child)
                if child is self.owner and await self._wait_owner_ready():
                    if not self._workers_started:
                        await self._start_workers(nursery)
                    nursery.start_soon(self._arm_standby, nursery, self.owner.process)
                self._write_state()
        self._say("tether up: stopping (workers first, then the owner)")

    def _count_restart(self, child: _Child) -> None:
        now = trio.current_time()
        window = self.config.restart_window_s
        self._restart_times.append(now)
        while self._restart_times and now - self._restart_times[0] > window:
            self._restart_times.popleft()
        if len(self._restart_times) > self.config.max_restarts:
            tail = "\n".join(f"    {line}" for line in child.tail) or "    (no output)"
            raise GaveUp(
                f"giving up: {child.name} died again, and restarting it would make {len(self._restart_times)} "
                f"restarts within {window:g} s, past the limit of {self.config.max_restarts} "
                f"(--max-restarts, --restart-window); every process was stopped. Last output of {child.name}:\n{tail}"
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

    async def _arm_standby(self, nursery: trio.Nursery, owner_process: trio.Process | None) -> None:
        """Start the standby for ``owner_process``, which listens (unless it was replaced or died meanwhile)."""
        if self._stopping or self.owner.process is not owner_process or not self.owner.running:
            return
        if self.standby.process is None or not self.standby.running:
            await self._start(nursery, self.standby)
            self._write_state()

    async def _start_workers(self, nursery: trio.Nursery) -> None:
        """Start every worker: once, when the owner first listens (a worker then reconnects by itself)."""
        self._workers_started = True
        for worker in self.workers:
            await self._start(nursery, worker)
            worker.ready_at = worker.started_at

    async def _start(self, nursery: trio.Nursery, child: _Child) -> None:
        child.exited = trio.Event()
        child.ready_at = None
        # In a session of its own: a Ctrl-C in the terminal reaches the supervisor alone, which stops the children
        # in order (workers, standby, owner) instead of all of them at once.
        child.process = await open_tether_process(
            child.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        child.started_at = trio.current_time()
        child.started_at_ms = int(time.time() * 1000)
        detail = f" (app {self.config.app})" if child in self.workers else ""
        self._say(f"  {child.name:<10}pid {child.pid}{detail}")
        nursery.start_soon(self._watch_child, child, child.process)

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

    async def _wait_owner_ready(self) -> bool:
        """Wait until the owner published its runtime file (True); if it dies first (False), its exit is handled
        by :meth:`_supervise`: a crash, or a refusal that stops everything."""
        owner = self.owner
        assert owner.process is not None
        try:
            info = await wait_for_owner(self.db, owner.process, timeout_s=OWNER_READY_TIMEOUT_S)
        except OwnerUnavailable:
            if owner.running:
                self._say(f"  owner     did not listen within {OWNER_READY_TIMEOUT_S:g} s; killing it")
                with contextlib.suppress(ProcessLookupError):
                    owner.process.kill()
            return False  # it died (or was killed): _watch_child reports the exit to _supervise
        owner.ready_at = trio.current_time()
        self.url = info.url
        self._say(f"  {'owner':<10}listening on {info.url}")
        return True

    async def _feed_heartbeats(self) -> None:
        """A byte on every child's stdin each second: a child whose pipe ends or falls silent stops itself."""
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
        """Workers first (they hand their work back), then the standby (so that it never takes over), then the owner
        (it closes the database cleanly)."""
        self._stopping = True
        for group in (self.workers, [self.standby], [self.owner]):
            async with trio.open_nursery() as nursery:
                for child in group:
                    nursery.start_soon(self._stop_child, child)

    async def _stop_child(self, child: _Child) -> None:
        process = child.process
        if process is None:
            return
        timeout_s = self.config.stop_timeout_s
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
            "owner": _child_state(self.owner),
            "standby": _child_state(self.standby),
            "workers": [_child_state(worker) for worker in self.workers],
        }
        write_private_json(state_path(self.db), state)


def _child_state(child: _Child) -> dict[str, Any]:
    return {"name": child.name, "pid": child.pid, "restarts": child.restarts, "started_at_ms": child.started_at_ms}


async def _set_on_signal(signals: Any, stop: trio.Event) -> None:
    async for _ in signals:
        stop.set()
        return
