"""Real Tether processes for tests: a scratch owner (:class:`ScratchOwner`), a worker process (:class:`WorkerProcess`),
each killable at a chosen commit and always reaped; and an app served in the test's own process (:func:`served`,
:func:`serving`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal, get_args

import attrs
import trio

from protocol import OwnerUnavailable, RuntimeInfo, UsageError
from protocol.io import log_stderr
from runtime import kill_and_reap, open_tether_process, start_owner, stop_gracefully, tether_command

from .._app._app import App
from .._client._client import Client, connect
from .._worker._faults import WorkerKill
from .._worker._serve import serve

OwnerKillPoint = Literal["before_commit", "after_commit", "before_result", "after_result"]
"""Where an owner kills itself (``tether owner --fault-kill-*``, docs/operations.md, "Fault injection"): right before
/ after its N-th COMMIT that writes something (the owner's own commits count: a timer falling due, a peer attaching),
or right before / after the COMMIT of the batch holding the N-th operation result (``finish_operation``) it
received: a point of a run however many commits each step takes."""
OWNER_KILL_POINTS: Final[tuple[str, ...]] = get_args(OwnerKillPoint)
WORKER_START_TIMEOUT_S: Final = 20.0
"""How long :meth:`WorkerProcess.start` waits for the worker to say it serves its app."""
LOG_TAIL_CHARS: Final = 4000


@attrs.frozen
class OwnerKill:
    """Kill the owner (SIGKILL: nothing after that point is stored or sent) at ``point``, the ``nth`` time (from 1).
    ``OwnerKill("after_result", 2)``: the second operation result is committed, never acknowledged."""

    point: OwnerKillPoint
    nth: int = 1

    def __attrs_post_init__(self) -> None:
        if self.point not in OWNER_KILL_POINTS:
            raise UsageError(f"an owner kill point is one of {', '.join(OWNER_KILL_POINTS)}; not {self.point!r}")
        if type(self.nth) is not int or self.nth < 1:
            raise UsageError(f"an owner kill point's nth counts from 1 (a whole number): not {self.nth!r}")

    def arguments(self) -> tuple[str, str]:
        """The ``tether owner`` flag that asks for it: ``("--fault-kill-after-result", "2")``."""
        return f"--fault-kill-{self.point.replace('_', '-')}", str(self.nth)


KILL_START_GRACE_S: Final = 0.5
"""How long a call on a process waits for a pending ``kill()`` coroutine to start (one given to ``start_soon`` starts
at the next scheduling) before it says that ``kill()`` was not awaited."""


class PendingKill:
    """The coroutine the last ``kill()`` of :class:`ScratchOwner` or :class:`WorkerProcess` returned: it kills only
    once awaited (or run by ``nursery.start_soon``). A call on that process that waits for it (``killed()``,
    ``stop()``, ``wait()``, ``start()``) while it has still not started raises :class:`~protocol.UsageError` at once
    saying that ``kill()`` was not awaited, instead of waiting for a death that never comes; so does the end of the
    process's ``async with``, and a later ``kill()``. Python warns of one never awaited (``RuntimeWarning``) as of any
    coroutine."""

    def __init__(self, who: str, process: trio.Process) -> None:
        self.who = who
        self.started = trio.Event()
        self.reported = False
        self.coroutine = self._kill(process)

    async def _kill(self, process: trio.Process) -> int:
        self.started.set()
        return await kill_and_reap(process, signal.SIGKILL)

    def _not_started(self) -> bool:
        return not self.started.is_set()

    def check_now(self) -> None:
        """Raise :class:`~protocol.UsageError` if the kill has not started (once: it is closed then)."""
        if self._not_started() and not self.reported:
            self.reported = True
            self.coroutine.close()  # reported here: no second warning when it is collected
            raise UsageError(
                f"{self.who}.kill() was not awaited, so nothing was killed: write `await {self.who}.kill()`"
            )

    async def check(self) -> None:
        """:meth:`check_now`, once a kill given to ``start_soon`` had :data:`KILL_START_GRACE_S` to start."""
        with trio.move_on_after(KILL_START_GRACE_S):
            await self.started.wait()
        self.check_now()


async def _checked(kill: PendingKill | None) -> None:
    if kill is not None:
        await kill.check()


def _log_tail(path: Path | None) -> str:
    if path is None or not path.exists():
        return "(no log)"
    text = path.read_text(encoding="utf-8", errors="replace")
    return text[-LOG_TAIL_CHARS:] or "(an empty log)"


def _status_text(status: int) -> str:
    return f"killed by {signal.Signals(-status).name}" if status < 0 else f"exit status {status}"


class ScratchOwner:
    """A real ``tether owner`` process on the database ``db`` (created if missing), on the manual clock unless
    ``clock="wall"``: durable time moves only by :meth:`advance_clock`. ``args`` are more ``tether owner`` arguments
    (``"--max-concurrent-runs", "1"``). Each start logs to its own file next to ``db`` (:meth:`log_text`).

    Restartable (:meth:`start` again once it stopped or died), killable (:meth:`kill`, or at a chosen commit:
    ``start(kill=OwnerKill(...))`` then :meth:`killed`) and always reaped: ``async with ScratchOwner(db) as owner``
    starts it and stops it at the end, whatever happened (:meth:`aclose`). Every wait is bounded.
    """

    def __init__(self, db: str | os.PathLike[str], *args: str, clock: Literal["manual", "wall"] = "manual") -> None:
        if clock not in ("manual", "wall"):
            raise UsageError(f"clock is 'manual' or 'wall', not {clock!r}")
        self.db = os.fspath(db)
        self.clock = clock
        self.args: tuple[str, ...] = ("--clock", clock, *args)
        self.process: trio.Process | None = None
        self.info: RuntimeInfo | None = None
        """The runtime file of the last start: the owner's pid, URL and token."""
        self.starts = 0
        self._log_path: Path | None = None
        self._kill: PendingKill | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    @property
    def pid(self) -> int:
        return self._process().pid

    @property
    def log_path(self) -> Path | None:
        """The stderr of the last start (``DB.owner-N.log``), or None before the first."""
        return self._log_path

    def _process(self) -> trio.Process:
        if self.process is None:
            raise UsageError(f"the owner of {self.db} was never started: await owner.start() first")
        return self.process

    async def start(self, *extra: str, kill: OwnerKill | None = None) -> RuntimeInfo:
        """Start the owner (``extra`` arguments and ``kill`` for this start only) and return once it listens: its
        runtime file. Raises :class:`~protocol.UsageError` while it still runs, :class:`~protocol.OwnerUnavailable`
        (its log's end included) if it exits or does not listen within 20 s; nothing is left running then. A
        checkpoint."""
        await _checked(self._kill)
        if self.running:
            raise UsageError(f"the owner of {self.db} (pid {self.pid}) is running: stop or kill it first")
        if kill is not None and not isinstance(kill, OwnerKill):
            raise UsageError(f"kill is an actors.testing.OwnerKill or None, not {kill!r}")
        self.starts += 1
        self._log_path = Path(f"{self.db}.owner-{self.starts}.log")
        flags = () if kill is None else kill.arguments()
        with self._log_path.open("wb") as log:
            try:
                self.process, self.info = await start_owner(
                    self.db, *self.args, *extra, *flags, stdout=subprocess.DEVNULL, stderr=log.fileno()
                )
            except OwnerUnavailable as exc:
                raise OwnerUnavailable(f"{exc}; its log ({self._log_path}) ends: {_log_tail(self._log_path)}") from exc
        return self.info

    def kill(self) -> Coroutine[Any, Any, int]:
        """SIGKILL the owner now and reap it, once awaited (``await owner.kill()``, or ``nursery.start_soon``): its
        exit status (``-9``; the status it had if it had exited). Not awaited, nothing is killed, and the next call
        on the owner says so (:class:`PendingKill`)."""
        if self._kill is not None:
            self._kill.check_now()
        self._kill = PendingKill("owner", self._process())
        return self._kill.coroutine

    async def stop(self) -> int:
        """SIGTERM (what commits in its batch lands), then SIGKILL after 10 s; reaped: its exit status (0)."""
        await _checked(self._kill)
        return await stop_gracefully(self._process())

    async def wait(self) -> int:
        """Wait for the owner to exit by itself: its exit status. Unbounded: bound it with ``trio.fail_after``."""
        await _checked(self._kill)
        return await self._process().wait()

    async def killed(self, *, timeout_s: float = 30.0) -> None:
        """Wait (at most ``timeout_s``) for the kill the last :meth:`start` asked for. Raises ``AssertionError``,
        with the end of its log, if the owner exited otherwise, or is still running then (it is killed: nothing is
        left running); the kill point was never reached."""
        await _checked(self._kill)
        await _killed(self._process(), f"the owner of {self.db}", "its kill point", self._log_path, timeout_s)

    async def advance_clock(self, by_ms: int) -> int:
        """Move the owner's manual clock forward by ``by_ms`` and return its new time: what fell due meanwhile is
        committed before it answers. A checkpoint."""
        if self.clock != "manual":
            raise UsageError("advance_clock moves a manual clock: this owner runs on the wall clock")
        async with connect(self.db) as client:
            return await client.advance_clock(by_ms)

    def log_text(self) -> str:
        """What the last start wrote to stderr so far."""
        return "" if self._log_path is None else self._log_path.read_text(encoding="utf-8", errors="replace")

    async def stderr_text(self) -> str:
        """:meth:`log_text`, as the project's tests read it. A checkpoint."""
        await trio.lowlevel.checkpoint()
        return self.log_text()

    async def aclose(self) -> None:
        """Stop the owner if it runs (SIGTERM, then SIGKILL after 10 s) and reap it. Shielded."""
        if self.process is not None and self.process.returncode is None:
            await stop_gracefully(self.process)

    close = aclose

    async def __aenter__(self) -> ScratchOwner:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
        if exc_info[0] is None:
            await _checked(self._kill)


class WorkerProcess:
    """``tether worker --db DB --app APP`` in a process of its own (``APP`` is ``MODULE:ATTR``, ``MODULE`` looked up
    in ``cwd``, by default the current directory, then on ``PYTHONPATH``), optionally killing itself at ``kill`` (an
    :class:`~actors.WorkerKill`). ``env`` is added to this process's environment; ``args`` are more ``tether
    worker`` arguments. Its stderr goes to ``DB.worker-NAME.log`` (:meth:`log_text`).

    ``async with WorkerProcess(db, "myagent:app") as worker`` starts it and returns once it serves (its app
    announced); at the end it stops it (draining) and reaps it, whatever happened. Every wait is bounded.
    """

    def __init__(
        self,
        db: str | os.PathLike[str],
        app: str,
        *,
        kill: WorkerKill | None = None,
        name: str = "",
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
    ) -> None:
        module, _, attribute = app.partition(":")
        if not module or not attribute:
            raise UsageError(f"app names an actors.App as MODULE:ATTR (such as myagent:app), not {app!r}")
        if kill is not None and not isinstance(kill, WorkerKill):
            raise UsageError(f"kill is an actors.WorkerKill or None, not {kill!r}")
        self.db = os.fspath(db)
        self.app = app
        self.kill_at = kill
        self.name = name or f"test-worker-{id(self):x}"
        self.cwd = os.fspath(cwd) if cwd is not None else os.getcwd()
        self.env = dict(env or {})
        self.args = tuple(args)
        self.process: trio.Process | None = None
        self.log_path = Path(f"{self.db}.worker-{self.name}.log")
        self._kill: PendingKill | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def _process(self) -> trio.Process:
        if self.process is None:
            raise UsageError(f"worker {self.name} was never started: await worker.start() first")
        return self.process

    async def start(self, *, timeout_s: float = WORKER_START_TIMEOUT_S) -> None:
        """Start the worker and return once it serves its app (its announcement committed: the owner may lease it
        work). Raises :class:`~protocol.UsageError` while it runs, ``AssertionError`` with its log's end if it exits
        or does not serve within ``timeout_s`` (then nothing is left running). A checkpoint."""
        await _checked(self._kill)
        if self.running:
            raise UsageError(f"worker {self.name} is running: stop or kill it first")
        command = tether_command("worker", "--db", self.db, "--app", self.app, "--name", self.name, *self.args)
        if self.kill_at is not None:
            command += ["--fault-kill", str(self.kill_at)]
        with self.log_path.open("ab") as log:
            self.process = await open_tether_process(
                command, cwd=self.cwd, env={**os.environ, **self.env}, stdout=subprocess.PIPE, stderr=log.fileno()
            )
        try:
            await self._wait_serving(timeout_s)
        except BaseException:
            await kill_and_reap(self.process)
            raise

    async def _wait_serving(self, timeout_s: float) -> None:
        process = self._process()
        assert process.stdout is not None
        said = b""
        with trio.move_on_after(timeout_s):
            while b" serving " not in said:
                piece = await process.stdout.receive_some(4096)
                if not piece:
                    status = await process.wait()
                    raise AssertionError(
                        f"worker {self.name} ({self.app}) ended with {_status_text(status)} before serving; its log "
                        f"ends: {_log_tail(self.log_path)}"
                    )
                said += piece
            return
        raise AssertionError(
            f"worker {self.name} ({self.app}) did not serve within {timeout_s:g} s; its log ends: "
            f"{_log_tail(self.log_path)}"
        )

    async def killed(self, *, timeout_s: float = 30.0) -> None:
        """Wait (at most ``timeout_s``) for the worker to die at its kill point. Raises ``AssertionError``, with
        the end of its log, if it exited otherwise or still runs then (it is killed: nothing is left running)."""
        await _checked(self._kill)
        point = f"its kill point {self.kill_at}"
        await _killed(self._process(), f"worker {self.name}", point, self.log_path, timeout_s)

    def kill(self) -> Coroutine[Any, Any, int]:
        """SIGKILL the worker now and reap it, once awaited (``await worker.kill()``, or ``nursery.start_soon``): its
        exit status. Not awaited, nothing is killed, and the next call on the worker says so (:class:`PendingKill`)."""
        if self._kill is not None:
            self._kill.check_now()
        self._kill = PendingKill("worker", self._process())
        return self._kill.coroutine

    async def stop(self, *, timeout_s: float = 10.0) -> int:
        """SIGTERM (it drains: what runs finishes and commits), then SIGKILL after ``timeout_s``; reaped."""
        await _checked(self._kill)
        return await stop_gracefully(self._process(), timeout_s=timeout_s)

    async def wait(self) -> int:
        """Wait for the worker to exit by itself. Unbounded: bound it with ``trio.fail_after``."""
        await _checked(self._kill)
        return await self._process().wait()

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""

    async def aclose(self) -> None:
        """Stop the worker if it runs and reap it. Shielded."""
        if self.process is not None and self.process.returncode is None:
            await stop_gracefully(self.process)
        if self.process is not None and self.process.stdout is not None:
            await self.process.stdout.aclose()

    async def __aenter__(self) -> WorkerProcess:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
        if exc_info[0] is None:
            await _checked(self._kill)


@contextlib.asynccontextmanager
async def served(
    db: str | os.PathLike[str], app: App, *, name: str = "in-process", log: Callable[[str], None] | None = None
) -> AsyncIterator[None]:
    """``app`` served in this process (:func:`actors.serve`) by worker ``name`` for the duration of the block,
    entered once its announcement is committed. It outlives owner restarts (it reconnects, as a worker under
    ``tether up`` does); it cannot be killed without killing the test: use :class:`WorkerProcess` for that.
    ``log`` gets its log lines (stderr by default)."""
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def run(*, task_status: trio.TaskStatus[Any]) -> None:
            with scope:
                await serve(app, db=db, name=name, log=log or log_stderr, handle_signals=False, task_status=task_status)

        await nursery.start(run)
        try:
            yield
        finally:
            scope.cancel(reason="the test is done with its in-process worker")


@contextlib.asynccontextmanager
async def serving(
    db: str | os.PathLike[str], app: App, *, name: str = "in-process", log: Callable[[str], None] | None = None
) -> AsyncIterator[Client]:
    """A client of ``db``'s owner, and ``app`` served in this process (:func:`served`) for the duration of the
    block."""
    async with connect(db) as client, served(db, app, name=name, log=log):
        yield client


async def _killed(process: trio.Process, who: str, point: str, log_path: Path | None, timeout_s: float) -> None:
    """Wait (at most ``timeout_s``) for ``process`` to die by SIGKILL at ``point``; otherwise kill it (nothing is left
    running) and raise ``AssertionError`` with the end of its log."""
    with trio.move_on_after(timeout_s):
        await process.wait()
    if process.returncode is None:
        await kill_and_reap(process)
        raise AssertionError(
            f"{who} did not reach {point} within {timeout_s:g} s (it was killed now); its log ends: "
            f"{_log_tail(log_path)}"
        )
    if process.returncode != -signal.SIGKILL:
        raise AssertionError(
            f"{who} ended with {_status_text(process.returncode)}, not at {point}; its log ends: {_log_tail(log_path)}"
        )
