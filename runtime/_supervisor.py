"""``tether up``: the supervisor. Starts the owner, then the workers; restarts what dies; stops in order.

Restart policy, as an Erlang/OTP supervisor counts it: every restart of any child is recorded; more than
``max_restarts`` within ``restart_window_s`` and the supervisor gives up: it stops everything and exits non-zero
naming the child that tipped it over and its last output. Each child waits a little longer before each
consecutive restart (back-off), and a child that ran for a while starts over at the shortest wait.

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
from storage_owner.store import is_owned

from ._parent import PARENT_HEARTBEAT_S
from ._process import stop_gracefully, tether_command, wait_for_owner

STATE_SUFFIX: Final = ".supervisor.json"
LOCK_SUFFIX: Final = ".supervisor.lock"
TAIL_LINES: Final = 20
BACKOFF_INITIAL_S: Final = 0.1
BACKOFF_MAX_S: Final = 5.0
STABLE_AFTER_S: Final = 10.0
"""A child that ran this long before dying restarts at the shortest back-off again."""
OWNER_READY_TIMEOUT_S: Final = 30.0


class GaveUp(TetherError):
    """A child kept dying: more restarts than the intensity allows. The message names it and its last output."""


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


@attrs.define(eq=False)
class _Child:
    name: str
    argv: list[str]
    process: trio.Process | None = None
    restarts: int = 0
    started_at: float = 0.0
    started_at_ms: int = 0
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
            ),
        )
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
        self._stopping = False
        self._exits: trio.MemorySendChannel[_Child]
        self.url: str | None = None
        self.started_at_ms = int(time.time() * 1000)

    @property
    def children(self) -> list[_Child]:
        return [self.owner, *self.workers]

    # ------------------------------------------------------------------------------------------------ run

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until SIGINT/SIGTERM (clean stop) or until a child exceeds the restart intensity (``GaveUp``)."""
        lock_fd = self._lock()
        try:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async with trio.open_nursery() as nursery:
                    send, receive = trio.open_memory_channel[_Child](16)
                    self._exits = send
                    nursery.start_soon(self._feed_heartbeats)
                    try:
                        await self._start(nursery, self.owner)
                        await self._wait_owner_ready()
                        for worker in self.workers:
                            await self._start(nursery, worker)
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
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
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
        self, nursery: trio.Nursery, exits: trio.MemoryReceiveChannel[_Child], stop: trio.Event
    ) -> None:
        async def wait_stop() -> None:
            await stop.wait()
            cancel.cancel(reason="SIGINT or SIGTERM")

        with trio.CancelScope() as cancel:
            nursery.start_soon(wait_stop)
            async for child in exits:
                status = child.process.returncode if child.process is not None else None
                ran_s = trio.current_time() - child.started_at
                self._say(f"  {child.name:<10}exited with status {status} after {ran_s:.1f} s")
                self._count_restart(child)
                if ran_s >= STABLE_AFTER_S:
                    child.backoff_s = 0.0  # a child that ran well restarts at once; a crash loop backs off
                self._say(f"  {child.name:<10}restarting in {child.backoff_s:.1f} s (restart {child.restarts + 1})")
                await trio.sleep(child.backoff_s)
                child.backoff_s = min(max(child.backoff_s * 2, BACKOFF_INITIAL_S), BACKOFF_MAX_S)
                child.restarts += 1
                await self._start(nursery, child)
                if child is self.owner:
                    await self._wait_owner_ready()
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

    async def _start(self, nursery: trio.Nursery, child: _Child) -> None:
        child.exited = trio.Event()
        child.process = await trio.lowlevel.open_process(
            child.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        child.started_at = trio.current_time()
        child.started_at_ms = int(time.time() * 1000)
        detail = f" (app {self.config.app})" if child is not self.owner else ""
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
                        child.tail.append(text)
                        print(f"[{child.name}] {text}", file=sys.stderr, flush=True)
        await process.wait()
        child.exited.set()
        if not self._stopping:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await self._exits.send(child)

    async def _wait_owner_ready(self) -> None:
        """Wait until the owner published its runtime file; if it dies first, its exit is handled as a crash."""
        owner = self.owner
        assert owner.process is not None
        try:
            info = await wait_for_owner(self.db, owner.process, timeout_s=OWNER_READY_TIMEOUT_S)
        except OwnerUnavailable:
            if owner.running:
                self._say(f"  owner     did not listen within {OWNER_READY_TIMEOUT_S:g} s; killing it")
                with contextlib.suppress(ProcessLookupError):
                    owner.process.kill()
            return  # it died (or was killed): _watch_child reports the exit and _supervise restarts it
        self.url = info.url
        self._say(f"  {'owner':<10}listening on {info.url}")

    async def _feed_heartbeats(self) -> None:
        """A byte on every child's stdin each second: a child whose pipe ends or falls silent stops itself."""
        while True:
            for child in self.children:
                process = child.process
                if process is not None and process.returncode is None and process.stdin is not None:
                    with contextlib.suppress(
                        trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError
                    ):
                        await process.stdin.send_all(b".")
            await trio.sleep(PARENT_HEARTBEAT_S)

    async def _stop_all(self) -> None:
        """Workers first (they hand their work back), then the owner (it closes the database cleanly)."""
        self._stopping = True
        for group in (self.workers, [self.owner]):
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
            "workers": [_child_state(worker) for worker in self.workers],
        }
        write_private_json(state_path(self.db), state)


def _child_state(child: _Child) -> dict[str, Any]:
    return {"name": child.name, "pid": child.pid, "restarts": child.restarts, "started_at_ms": child.started_at_ms}


async def _set_on_signal(signals: Any, stop: trio.Event) -> None:
    async for _ in signals:
        stop.set()
        return
