"""Exclusive ownership of a database: an OS lock on a sidecar file, released by the kernel when we die.

The lock file also records who holds it (pid, host, start time), so a second owner can name the holder in its
error. No pid guessing is needed after a crash: a dead holder's lock is simply free.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import socket
import stat
import threading
from pathlib import Path

from protocol import OwnerAlreadyRunning, TetherError

LOCK_SUFFIX = ".lock"
PROC_LOCKS = "/proc/locks"


def lock_path(db: str) -> Path:
    return Path(db + LOCK_SUFFIX)


class Ownership:
    """A held ownership lock. Release it with :meth:`release` (or let the process end)."""

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path

    @classmethod
    def acquire(cls, db: str, *, started_at_ms: int, instance: str) -> Ownership:
        """Take ownership of ``db`` or raise :class:`OwnerAlreadyRunning` naming the live holder."""
        path = lock_path(db)
        fd = open_lock_file(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe_holder(fd)
            os.close(fd)
            raise OwnerAlreadyRunning(
                f"database {db} is already owned by {holder} (lock {path}); stop that owner first "
                "(send it SIGTERM), or use another database"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        return cls._claim(fd, path, started_at_ms=started_at_ms, instance=instance)

    @classmethod
    def _claim(cls, fd: int, path: Path, *, started_at_ms: int, instance: str) -> Ownership:
        """Record this process as the holder in the lock file ``fd`` (locked by us) and own it from now on."""
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_at_ms": started_at_ms,
            "instance": instance,
        }
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(record).encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, path)

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the descriptor drops the flock


class OwnershipWait:
    """A standby's wait for the ownership lock of ``db``: :meth:`block` (on a thread) returns once this process holds
    the lock, which the kernel hands over the moment its holder dies, however it died. Nothing polls: the waiting
    process uses no CPU.

    ``flock(LOCK_EX)`` cannot be interrupted (a signal only restarts it), so a wait that is given up cannot stop the
    thread blocked in it. :meth:`abandon` marks the wait instead, and whichever side comes second closes the
    descriptor, which releases the lock: :meth:`abandon` itself if the thread already has the lock (or never
    started), else the thread the moment the lock is granted. So a wait given up never keeps the lock (it holds it
    for the instant between the grant and that close at most), and its thread lives until the grant or the end of
    the process, holding nothing else. Usage, on trio::

        wait = OwnershipWait(db)
        try:
            await trio.to_thread.run_sync(wait.block, abandon_on_cancel=True)
        except BaseException:
            wait.abandon()
            raise
        ownership = wait.claim(started_at_ms=..., instance=...)
    """

    def __init__(self, db: str) -> None:
        self.path = lock_path(db)
        self._fd: int | None = open_lock_file(self.path)
        self._mutex = threading.Lock()
        self._state = "new"
        """``new``, ``blocked`` (the thread waits), ``locked`` (it got the lock), then ``claimed``; or ``abandoned``
        (given up), ``failed`` (the wait raised)."""
        self.finished = threading.Event()
        """Set once :meth:`block` returned or raised: with the lock, or after letting go of everything."""

    def block(self) -> None:
        """Wait until this process holds the lock (on a thread: this blocks). Raises :class:`OSError` if the lock
        cannot be waited for (its descriptor is closed then)."""
        try:
            with self._mutex:
                if self._state != "new":  # abandoned before the thread started
                    return
                self._state = "blocked"
                fd = self._fd
            assert fd is not None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                with self._mutex:
                    self._state = "failed"
                    self._close()
                raise
            with self._mutex:
                if self._state == "abandoned":
                    self._close()  # given up while blocked: let go of the lock at once
                else:
                    self._state = "locked"
        finally:
            self.finished.set()

    def abandon(self) -> None:
        """Give the wait up: whatever it holds is let go now, or by the thread the moment the lock is granted."""
        with self._mutex:
            if self._state in ("new", "locked"):
                self._close()
            if self._state in ("new", "blocked", "locked"):
                self._state = "abandoned"

    def claim(self, *, started_at_ms: int, instance: str) -> Ownership:
        """The ownership :meth:`block` obtained, recorded in the lock file as :meth:`Ownership.acquire` does."""
        with self._mutex:
            assert self._state == "locked" and self._fd is not None, f"claiming a lock wait that is {self._state}"
            self._state = "claimed"
            fd, self._fd = self._fd, None
        return Ownership._claim(fd, self.path, started_at_ms=started_at_ms, instance=instance)

    def _close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def open_lock_file(path: Path) -> int:
    """Open (creating, 0600) the lock file at ``path`` without following a symbolic link planted there: the owner
    writes its pid into the file, and must never write through a link to somewhere else. Raises
    :class:`~protocol.TetherError` for a link or anything but a regular file."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise TetherError(
            f"refusing to use the lock file {path}: it is a symbolic link (to {os.readlink(path)!r}), and following "
            "it would let whoever planted it choose which file gets written; remove it and start again"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise TetherError(f"refusing to use the lock file {path}: it is not a regular file; remove it and start again")
    return fd


def _describe_holder(fd: int) -> str:
    try:
        raw = json.loads(os.pread(fd, 4096, 0) or b"{}")
        started = datetime.datetime.fromtimestamp(raw["started_at_ms"] / 1000, tz=datetime.UTC)
        return f"pid {raw['pid']} on {raw['host']}, started {started:%Y-%m-%d %H:%M:%S} UTC"
    except (ValueError, KeyError, TypeError, OSError):
        return "another process (its details are not readable yet)"


def lock_is_held(path: Path) -> bool:
    """Whether some live process holds the ``flock`` on ``path`` (a missing file is not held).

    On Linux this reads ``/proc/locks`` and never touches the lock itself: probing by taking the lock, even shared
    and for a moment, would make a starting owner or supervisor fail its own non-blocking attempt meanwhile.
    """
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return False
    try:
        with open(PROC_LOCKS, encoding="ascii") as stream:
            table = stream.read()
    except OSError:
        return _probe(path)
    key = f"{os.major(status.st_dev):02x}:{os.minor(status.st_dev):02x}:{status.st_ino}"
    for line in table.splitlines():
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:2146505 0 EOF"; blocked waiters are marked with "->".
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == key:
            return True
    return False


def _probe(path: Path) -> bool:
    """Where ``/proc/locks`` is missing: try the lock (shared, non-blocking) and release it at once."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def is_owned(db: str) -> bool:
    """Whether a live owner holds the database at ``db``."""
    return lock_is_held(lock_path(db))
