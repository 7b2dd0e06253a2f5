"""Helpers for process tests of ``tether up``: start it, poll its status, and make sure nothing outlives a test.

The supervisor's children (owner, workers) are grandchildren of the test process, which the autouse guard of
``tests/conftest.py`` cannot see. So every pid a test learns about (from ``collect_status`` or the supervisor's
state file) is recorded, and ``Up.assert_everything_gone`` also scans ``/proc`` for any process whose command line
names the test's database (every child of ``tether up`` gets ``--db DB``, and ``db_path`` is unique per test).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from protocol import OwnerUnavailable
from runtime import open_tether_process, stop_gracefully, tether_command
from runtime._status import collect_status
from runtime._supervisor import read_state

ROOT: Final = Path(__file__).resolve().parents[2]
"""The repository root: the working directory of every child, so that ``tests.faults._apps`` imports."""
CHILD_ENV: Final = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
}
CONSOLE_SCRIPT: Final = (str(Path(sys.executable).with_name("tether")),)
"""The ``tether`` console script of this environment, as a user runs it (not ``python -m runtime``)."""
POLL_S: Final = 0.05
GONE_TIMEOUT_S: Final = 5.0

Status = dict[str, Any]


# ------------------------------------------------------------------------------------------------ processes


def pid_gone(pid: int) -> bool:
    """Whether ``pid`` no longer runs. A zombie counts as gone: an orphaned child of a SIGKILLed supervisor is
    reaped by init, not by us, and may linger as a zombie for a moment."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return _proc_state(pid) in (None, "Z")


def _proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def processes_naming(db: str) -> set[int]:
    """Live (non-zombie) processes other than this one whose command line contains ``db``."""
    needle = os.fsencode(os.path.abspath(db))
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                argv = cmdline.read().split(b"\0")
        except OSError:
            continue
        if any(needle in arg for arg in argv) and _proc_state(int(entry)) not in (None, "Z"):
            found.add(int(entry))
    return found


def signal_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


async def wait_gone(pids: set[int], db: str | None = None, *, timeout_s: float = GONE_TIMEOUT_S) -> set[int]:
    """Wait until every pid in ``pids`` (and, given ``db``, every process naming it) is gone; return the survivors."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = {pid for pid in pids if not pid_gone(pid)} | (processes_naming(db) if db is not None else set())
        if not left or time.monotonic() > deadline:
            return left
        await trio.sleep(POLL_S)


def thread_cpu_ns(pid: int) -> dict[int, int]:
    """CPU time (user and system) that each live thread of ``pid`` used so far, in nanoseconds, by thread id.

    Read from ``/proc/PID/task/TID/schedstat`` rather than ``utime``/``stime`` of ``/proc/PID/stat``, whose clock
    ticks (10 ms) are too coarse for a bound of a fraction of a percent over a few seconds.
    """
    used: dict[int, int] = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            used[int(task)] = int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
    return used


def cpu_used_s(before: dict[int, int], after: dict[int, int]) -> float:
    """Seconds of CPU used between two :func:`thread_cpu_ns` readings of one process: what each thread alive at
    both used between them, plus all that each thread started meanwhile used. (A thread that ended between them,
    such as an idle one of trio's thread cache, no longer shows what it used: in an idle process, nothing.)"""
    return sum(used - before.get(tid, 0) for tid, used in after.items()) / 1e9


def lock_has_waiter(path: str | Path) -> bool:
    """Whether a process is blocked in ``flock`` on the file at ``path`` (a ``->`` line of ``/proc/locks``)."""
    status = os.stat(path)
    key = f"{os.major(status.st_dev):02x}:{os.minor(status.st_dev):02x}:{status.st_ino}"
    with open("/proc/locks", encoding="ascii") as table:
        return any(line.split()[1:3] == ["->", "FLOCK"] and key in line.split() for line in table)


async def wait_for(predicate: Callable[[], bool], what: str, *, timeout_s: float = 20.0) -> None:
    """Poll ``predicate`` (something only the OS shows, such as ``/proc``) until it holds; fail naming ``what``."""
    with trio.move_on_after(timeout_s):
        while True:
            if predicate():
                return
            await trio.sleep(POLL_S / 5)
    raise AssertionError(f"no {what} within {timeout_s:g} s")


def describe(pids: set[int]) -> str:
    lines = []
    for pid in sorted(pids):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            argv = "?"
        lines.append(f"{pid} ({_proc_state(pid)}): {argv}")
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------------- the CLI


async def run_tether(*args: str, timeout_s: float = 30.0, cwd: Path | str = ROOT) -> subprocess.CompletedProcess[bytes]:
    """Run ``tether ARGS`` to completion (from the repository root unless ``cwd``) and capture its output."""
    with trio.fail_after(timeout_s):
        return await trio.run_process(
            tether_command(*args), capture_stdout=True, capture_stderr=True, check=False, cwd=cwd, env=CHILD_ENV
        )


def nonblank_lines(data: bytes) -> list[str]:
    return [line for line in data.decode(errors="replace").splitlines() if line.strip()]


async def get_status(db: str) -> Status | None:
    """``collect_status(db)`` (it runs ``trio.run`` itself, hence the thread), or ``None`` before the db exists."""
    try:
        return await trio.to_thread.run_sync(collect_status, db)
    except OwnerUnavailable:
        return None


def supervised(status: Status) -> list[dict[str, Any]]:
    return [worker for worker in status["workers"] if worker["supervised"]]


def worker_named(status: Status, name: str) -> dict[str, Any]:
    [worker] = [worker for worker in status["workers"] if worker["name"] == name]
    return worker


def all_up(workers: int) -> Callable[[Status], bool]:
    """The predicate: supervisor, a live owner with a URL, and ``workers`` supervised workers alive and attached."""

    def check(status: Status) -> bool:
        children = supervised(status)
        return (
            status["supervisor"] is not None
            and status["owner"]["alive"]
            and status["url"] is not None
            and len(children) == workers
            and all(worker["alive"] and worker["attached"] for worker in children)
        )

    return check


# --------------------------------------------------------------------------------------------------- tether up


@attrs.define(eq=False)
class Up:
    """A ``tether up`` process started by a test, and every pid seen under it."""

    db: str
    process: trio.Process
    stdout_path: Path
    stderr_path: Path
    started_at: float
    pids: set[int] = attrs.Factory(set)
    last_status: Status | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def record(self, status: Status | None) -> None:
        """Remember every pid ``status`` and the state file name, so that the end of the test can check them."""
        if status is not None:
            if status["supervisor"] is not None:
                self.pids.add(status["supervisor"]["pid"])
            if status["owner"]["pid"] is not None:
                self.pids.add(status["owner"]["pid"])
            if status.get("standby") is not None:
                self.pids.add(status["standby"]["pid"])
            self.pids.update(worker["pid"] for worker in status["workers"] if worker["pid"] is not None)
        state = read_state(self.db)
        if state is not None:
            pids = [state.get("pid"), state.get("owner", {}).get("pid"), (state.get("standby") or {}).get("pid")]
            pids += [worker.get("pid") for worker in state.get("workers", [])]
            self.pids.update(pid for pid in pids if isinstance(pid, int))
        self.pids.discard(os.getpid())

    async def status(self) -> Status | None:
        status = await get_status(self.db)
        self.record(status)
        self.last_status = status
        return status

    async def wait_status(self, predicate: Callable[[Status], bool], what: str, *, timeout_s: float = 20.0) -> Status:
        """Poll the status until ``predicate`` holds; fail naming ``what`` (and the last status) after ``timeout_s``."""
        with trio.move_on_after(timeout_s):
            while True:
                if self.process.poll() is not None:
                    raise AssertionError(
                        f"tether up exited with status {self.process.returncode} while waiting for {what}:\n"
                        f"{self.stderr_text()}"
                    )
                status = await self.status()
                if status is not None and predicate(status):
                    return status
                await trio.sleep(POLL_S)
        raise AssertionError(
            f"no {what} within {timeout_s:g} s; last status: {self.last_status}\n"
            f"tether up said (the end of its stdout, then of its stderr):\n{self.stdout_text()[-3000:]}\n"
            f"{self.stderr_text()[-3000:]}"
        )

    def stdout_text(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def stderr_text(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def said(self) -> list[str]:
        """The supervisor's own lines so far (its stdout: what starts, exits, restarts and why), stripped."""
        return [line.strip() for line in self.stdout_text().splitlines() if line.strip()]

    async def wait_said(self, predicate: Callable[[str], bool], what: str, *, timeout_s: float = 20.0) -> str:
        """Wait until the supervisor says a line that ``predicate`` accepts; return it (the first such one)."""
        with trio.move_on_after(timeout_s):
            while True:
                found = [line for line in self.said() if predicate(line)]
                if found:
                    return found[0]
                if self.process.poll() is not None:
                    raise AssertionError(f"tether up exited ({self.process.returncode}) before saying {what}")
                await trio.sleep(POLL_S / 5)
        raise AssertionError(f"tether up did not say {what} within {timeout_s:g} s:\n" + "\n".join(self.said()))

    async def wait_exit(self, *, timeout_s: float = 20.0) -> int:
        with trio.fail_after(timeout_s):
            return await self.process.wait()

    async def assert_everything_gone(self, *, timeout_s: float = GONE_TIMEOUT_S) -> None:
        """Every pid seen under this ``tether up`` (supervisor, owners, workers) and every process naming its db
        is gone (waiting at most ``timeout_s`` for processes that stop by themselves)."""
        self.record(None)
        assert self.pids, "no pid was ever recorded"
        left = await wait_gone(self.pids | {self.pid}, self.db, timeout_s=timeout_s)
        assert not left, f"processes outlived tether up:\n{describe(left)}"


@contextlib.asynccontextmanager
async def tether_up(
    db: str,
    directory: Path,
    *args: str,
    label: str = "up",
    env: Mapping[str, str] | None = None,
    command: Sequence[str] | None = None,
    cwd: Path = ROOT,
    own_process_group: bool = False,
) -> AsyncIterator[Up]:
    """Start ``tether up --db DB ARGS`` in ``cwd`` (output to files in ``directory``; ``env`` added to its
    environment), or ``command``, a ``tether up`` command line of its own on the database ``db`` (a README's, as a
    person types it); with ``own_process_group``, in a process group of its own, as a shell starts a job, so that a
    test can signal the group as a Ctrl-C does. On exit SIGTERM and reap it, then SIGKILL anything left that it
    started (the test asserts separately that nothing was left)."""
    stdout_path = directory / f"{label}.stdout"
    stderr_path = directory / f"{label}.stderr"
    with open(stdout_path, "wb") as stdout, open(stderr_path, "wb") as stderr:
        process = await open_tether_process(
            list(command) if command is not None else tether_command("up", "--db", db, *args),
            stdout=stdout,
            stderr=stderr,
            cwd=cwd,
            env={**CHILD_ENV, **(env or {})},
            process_group=0 if own_process_group else None,
        )
    up = Up(db=db, process=process, stdout_path=stdout_path, stderr_path=stderr_path, started_at=time.monotonic())
    try:
        yield up
    finally:
        with trio.CancelScope(shield=True):
            # Only processes whose command line names this test's database are signalled: a recorded pid that
            # died may have been reused by an unrelated process.
            # A stopped (SIGSTOP) child would sit out the supervisor's SIGTERM: let every child run again first.
            signal_all(processes_naming(db) - {process.pid}, signal.SIGCONT)
            await stop_gracefully(process)
            signal_all(processes_naming(db), signal.SIGKILL)
