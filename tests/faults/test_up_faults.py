"""Faults under ``tether up``: SIGKILL of the owner (under a writing script), of a worker and of the supervisor
itself, a SIGSTOPped worker, and an app that cannot even be imported. The supervisor restarts what dies, gives up
past the restart intensity, and no process outlives it."""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

import actors
from actors._client._connection import CONNECT_TIMEOUT_S
from protocol import Capability, runtime_path
from runtime._exits import EXIT_OK, EXIT_USAGE
from runtime._supervisor import (
    BACKOFF_MAX_S,
    STABLE_AFTER_S,
    Supervisor,
    SupervisorConfig,
    read_state,
    state_path,
    supervisor_lock_path,
)
from storage_owner.store import is_owned, lock_path
from tests.faults import _apps
from tests.integration._up_helpers import (
    Status,
    Up,
    all_up,
    lock_has_waiter,
    pid_gone,
    supervised,
    tether_up,
    wait_for,
    wait_gone,
    worker_named,
)

APP = "tests.faults._apps:app"
CRASHING_APP = "tests.faults._crashing_app:app"
FLAKY_APP = "tests.faults._flaky_app:app"
APP_CAPABILITIES = (Capability(kind="task", name=_apps.TASK_KIND, version=_apps.TASK_VERSION),)
WRITERS = 4


@attrs.define
class ScriptWriter:
    """Appends through one client from a few tasks, retrying each entry with the same id until it is known to
    have landed (acknowledged, or ``Duplicate`` on a retry)."""

    db: str
    conversation_id: str
    attempted: set[str] = attrs.Factory(set)
    acked: dict[str, int] = attrs.Factory(dict)
    """Acknowledged entry id -> its commit seq (0: confirmed by Duplicate on a retry)."""
    retries: int = 0
    stop: trio.Event = attrs.Factory(trio.Event)
    progress: trio.Event = attrs.Factory(trio.Event)

    async def run(self) -> None:
        async with actors.connect(db=self.db) as client, trio.open_nursery() as nursery:
            for index in range(WRITERS):
                nursery.start_soon(self._write, client, index)

    async def _write(self, client: actors.Client, index: int) -> None:
        while not self.stop.is_set():
            entry_id = actors.new_id()
            self.attempted.add(entry_id)
            retried = False
            while True:
                try:
                    seq = await client.append(self.conversation_id, kind="test.n", data=index, entry_id=entry_id)
                except (actors.ConnectionLost, actors.OwnerUnavailable):
                    retried = True  # the outcome is unknown: send the same entry again
                    self.retries += 1
                    await trio.sleep(0.02)
                    continue
                except actors.Duplicate:
                    assert retried, f"Duplicate for entry {entry_id} on its first attempt"
                    seq = 0  # the lost attempt had landed
                break
            self.acked[entry_id] = seq
            self.progress.set()

    async def wait_acked(self, count: int) -> None:
        while len(self.acked) < count:
            self.progress = trio.Event()
            await self.progress.wait()


def owner_replaced(old_pid: int, workers: list[int]) -> Callable[[Status], bool]:
    def check(status: Status) -> bool:
        return (
            status["owner"]["alive"]
            and status["owner"]["pid"] not in (None, old_pid)
            and status["owner"]["restarts"] == 1
            and [worker["pid"] for worker in supervised(status)] == workers
            and all(worker["attached"] for worker in supervised(status))
        )

    return check


async def test_owner_sigkill_under_up_restarts_it_and_workers_and_a_script_carry_on(
    db_path: str, tmp_path: Path
) -> None:
    with trio.fail_after(90):
        async with tether_up(db_path, tmp_path, "--workers", "2", "--app", APP) as up:
            before = await up.wait_status(all_up(2), "owner and two attached workers")
            print(f"tether up: all workers attached {time.monotonic() - up.started_at:.2f} s after start")
            old_owner = before["owner"]["pid"]
            workers = [worker["pid"] for worker in supervised(before)]
            async with actors.connect(db=db_path) as client:
                conversation_id = await client.create_conversation()
            writer = ScriptWriter(db_path, conversation_id)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer.run)
                await writer.wait_acked(100)
                os.kill(old_owner, signal.SIGKILL)
                killed_at = time.monotonic()
                after = await up.wait_status(owner_replaced(old_owner, workers), "a new owner, both workers back")
                reattached_s = time.monotonic() - killed_at
                print(f"owner SIGKILL -> new owner and both workers attached again: {reattached_s:.2f} s")
                acked_at_restart = len(writer.acked)
                await writer.wait_acked(acked_at_restart + 100)
                writer.stop.set()
            print(
                f"script: {len(writer.acked)} acknowledged ({acked_at_restart} when the workers were back), "
                f"{writer.retries} retries"
            )

            async with actors.connect(db=db_path, role="reader") as client:
                stored = await client.entries(conversation_id)
                peers = await client.peers()

            assert pid_gone(old_owner)
            assert after["owner"]["restarts"] == 1
            assert [(w["name"], w["restarts"]) for w in supervised(after)] == [("worker-1", 0), ("worker-2", 0)]
            # The same worker processes reconnected and announced their app again to the new owner.
            worker_peers = sorted(
                (peer.pid, peer.announced, peer.capabilities) for peer in peers if peer.role == "worker"
            )
            assert worker_peers == sorted((pid, True, APP_CAPABILITIES) for pid in workers)

            counts = collections.Counter(entry.entry_id for entry in stored)
            doubled = [entry_id for entry_id, count in counts.items() if count > 1]
            assert not doubled, f"entries stored twice: {doubled}"
            missing = set(writer.acked) - set(counts)
            assert not missing, f"acknowledged entries missing: {sorted(missing)}"
            assert set(counts) <= writer.attempted

            up.process.send_signal(signal.SIGTERM)
            assert await up.wait_exit() == EXIT_OK, up.stderr_text()
            await up.assert_everything_gone(timeout_s=0.5)


async def test_worker_sigkill_under_up_restarts_it_and_it_reattaches(db_path: str, tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with tether_up(db_path, tmp_path, "--workers", "2", "--app", APP) as up:
            before = await up.wait_status(all_up(2), "owner and two attached workers")
            old = worker_named(before, "worker-1")
            other = worker_named(before, "worker-2")
            os.kill(old["pid"], signal.SIGKILL)
            after = await up.wait_status(
                lambda status: (
                    worker_named(status, "worker-1")["pid"] != old["pid"]
                    and worker_named(status, "worker-1")["restarts"] == 1
                    and all_up(2)(status)
                ),
                "worker-1 restarted and attached",
            )
            async with actors.connect(db=db_path, role="reader") as client:
                peers = await client.peers()

            restarted = worker_named(after, "worker-1")
            assert restarted["alive"] and restarted["attached"]
            assert pid_gone(old["pid"])
            assert worker_named(after, "worker-2") == other
            assert after["owner"] == before["owner"]
            [peer] = [peer for peer in peers if peer.pid == restarted["pid"]]
            assert peer.role == "worker" and peer.announced and peer.capabilities == APP_CAPABILITIES

            up.process.send_signal(signal.SIGTERM)
            assert await up.wait_exit() == EXIT_OK, up.stderr_text()
            await up.assert_everything_gone(timeout_s=0.5)


def _worker_pid(db: str, name: str) -> int | None:
    state = read_state(db) or {}
    [pid] = [worker.get("pid") for worker in state.get("workers", []) if worker.get("name") == name]
    return pid if isinstance(pid, int) and not pid_gone(pid) else None


async def _kill_started_worker(up: Up, name: str, killed: set[int]) -> int:
    """SIGKILL the process ``name`` runs as now once it is one not killed yet; its pid."""
    await wait_for(lambda: _worker_pid(up.db, name) not in (None, *killed), f"{name} started again", timeout_s=30)
    pid = _worker_pid(up.db, name)
    assert pid is not None
    up.record(None)
    os.kill(pid, signal.SIGKILL)
    killed.add(pid)
    return pid


async def test_a_restarted_worker_that_ran_well_restarts_at_once_each_time(db_path: str, tmp_path: Path) -> None:
    with trio.fail_after(90):
        async with tether_up(db_path, tmp_path, "--workers", "1", "--app", APP) as up:
            killed: set[int] = set()
            for restart in range(1, 5):
                await up.wait_status(all_up(1), "owner and an attached worker")
                state = read_state(db_path)
                assert state is not None
                [worker] = state["workers"]
                ran_s = time.time() - worker["started_at_ms"] / 1000
                await trio.sleep(max(0.0, STABLE_AFTER_S + 0.2 - ran_s))  # the rule is about real time: let it run well
                await _kill_started_worker(up, "worker-1", killed)
                line = await _restart_said(up, restart)
                # Every restarted worker that ran well restarts at once, not only the first one started.
                assert line == f"worker-1  restarting in 0.0 s (restart {restart})"
            up.process.send_signal(signal.SIGTERM)
            assert await up.wait_exit() == EXIT_OK, up.stderr_text()
            await up.assert_everything_gone(timeout_s=0.5)


async def test_an_owner_killed_during_a_workers_back_off_is_replaced_at_once_twice(
    db_path: str, tmp_path: Path
) -> None:
    """The soak of the issue: a worker's back-off ran inside the loop that also handled the owner, so an owner killed
    meanwhile got no new standby, and a second kill left the database with no owner until the back-off ended."""
    with trio.fail_after(120):
        async with tether_up(db_path, tmp_path, "--workers", "1", "--app", APP, "--max-restarts", "30") as up:
            await up.wait_status(all_up(1), "owner and an attached worker")
            await wait_for(lambda: lock_has_waiter(lock_path(db_path)), "the standby waiting for the ownership lock")
            async with actors.connect(db=db_path) as client:
                conversation_id = await client.create_conversation()
            # Kill worker-1 as soon as each restart starts it: quick deaths, so its back-off doubles up to 5 s.
            killed: set[int] = set()
            await _kill_started_worker(up, "worker-1", killed)
            while not any(line.startswith(f"worker-1  restarting in {BACKOFF_MAX_S:.1f} s") for line in up.said()):
                await _kill_started_worker(up, "worker-1", killed)
                await _restart_said(up, len(killed))
            worker_restart = f"(restart {len(killed)})"

            for _ in range(2):  # the owner, and then the standby that replaced it
                state = read_state(db_path)
                assert state is not None
                owner, standby = state["owner"]["pid"], state["standby"]["pid"]
                os.kill(owner, signal.SIGKILL)
                await wait_for(
                    lambda standby=standby: (
                        (state := read_state(db_path)) is not None
                        and state["owner"]["pid"] == standby
                        and state["standby"]["pid"] not in (None, standby)
                    ),
                    "the standby as the owner, and a new standby",
                    timeout_s=BACKOFF_MAX_S,
                )
                up.record(None)
                await wait_for(
                    lambda: lock_has_waiter(lock_path(db_path)), "the new standby waiting", timeout_s=BACKOFF_MAX_S
                )
            with trio.fail_after(2):  # the database has an owner: the second standby, already serving
                async with actors.connect(db=db_path) as client:
                    await _append_retrying(client, conversation_id)

            said = up.said()
            back_off = next(index for index, line in enumerate(said) if line.endswith(worker_restart))
            takeovers = [index for index, line in enumerate(said) if "takes over" in line]
            worker_starts = [i for i, line in enumerate(said) if line.startswith("worker-1  pid ") and i > back_off]
            # Both takeovers (and the standbys behind them) came during the worker's back-off, before its restart.
            assert len(takeovers) == 2 and back_off < takeovers[0], said
            assert not worker_starts or worker_starts[0] > takeovers[1], said
            up.process.send_signal(signal.SIGTERM)
            assert await up.wait_exit() == EXIT_OK, up.stderr_text()
            await up.assert_everything_gone(timeout_s=1)


async def _restart_said(up: Up, restart: int) -> str:
    """The supervisor's line announcing restart number ``restart`` (of any child)."""
    return await up.wait_said(lambda line: line.endswith(f"(restart {restart})"), f"restart {restart}")


async def _append_retrying(client: actors.Client, conversation_id: str) -> int:
    """One append, retried as a real client would across a lost connection or an owner being replaced; its seq (0:
    a retry found that a lost attempt had landed)."""
    entry_id = actors.new_id()
    while True:
        try:
            return await client.append(conversation_id, kind="test.n", data=1, entry_id=entry_id)
        except (actors.ConnectionLost, actors.OwnerUnavailable):
            await trio.sleep(0.02)
        except actors.Duplicate:
            return 0


async def test_sigstopped_worker_is_dropped_by_heartbeat_and_reattaches_after_sigcont(
    db_path: str, tmp_path: Path
) -> None:
    with trio.fail_after(60):
        # A liveness timeout longer than the test: the supervisor leaves the dropped worker alone (see below).
        async with tether_up(
            db_path, tmp_path, "--workers", "2", "--heartbeat-timeout", "1", "--liveness-timeout", "60"
        ) as up:
            before = await up.wait_status(all_up(2), "owner and two attached workers")
            stopped = worker_named(before, "worker-1")
            pid = stopped["pid"]
            os.kill(pid, signal.SIGSTOP)
            try:
                stopped_at = time.monotonic()
                dropped = await up.wait_status(
                    lambda status: (
                        not worker_named(status, "worker-1")["attached"]
                        and worker_named(status, "worker-2")["attached"]
                    ),
                    "the stopped worker dropped",
                    timeout_s=10,
                )
                print(f"SIGSTOP worker -> no longer attached after {time.monotonic() - stopped_at:.2f} s")
                async with actors.connect(db=db_path, role="reader") as client:
                    peers = await client.peers()
                assert pid not in {peer.pid for peer in peers}
                assert worker_named(dropped, "worker-1")["alive"] is True
                assert worker_named(dropped, "worker-1")["pid"] == pid
                assert not pid_gone(pid)
                assert worker_named(dropped, "worker-2")["attached"] is True
            finally:
                os.kill(pid, signal.SIGCONT)
            continued_at = time.monotonic()
            back = await up.wait_status(
                lambda status: worker_named(status, "worker-1")["attached"], "worker-1 attached again", timeout_s=10
            )
            print(f"SIGCONT worker -> attached again after {time.monotonic() - continued_at:.2f} s")
            # The same process re-attached by itself: its client reconnected, nothing was restarted.
            assert worker_named(back, "worker-1")["pid"] == pid
            assert worker_named(back, "worker-1")["restarts"] == 0
            assert all_up(2)(back)

            up.process.send_signal(signal.SIGTERM)
            assert await up.wait_exit() == EXIT_OK, up.stderr_text()
            await up.assert_everything_gone(timeout_s=0.5)


async def test_a_sigstopped_worker_is_killed_and_replaced_once_the_owner_dropped_it(
    db_path: str, tmp_path: Path
) -> None:
    with trio.fail_after(60):
        async with tether_up(
            db_path, tmp_path, "--workers", "2", "--heartbeat-timeout", "1", "--liveness-timeout", "2"
        ) as up:
            before = await up.wait_status(all_up(2), "owner and two attached workers")
            stopped = worker_named(before, "worker-1")["pid"]
            os.kill(stopped, signal.SIGSTOP)
            stopped_at = time.monotonic()
            try:
                line = await up.wait_said(lambda line: line.startswith("worker-1  not attached"), "the kill")
                after = await up.wait_status(
                    lambda status: all_up(2)(status) and worker_named(status, "worker-1")["pid"] != stopped,
                    "worker-1 replaced and attached",
                )
                print(f"SIGSTOP worker -> replaced and attached after {time.monotonic() - stopped_at:.2f} s")
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(stopped, signal.SIGCONT)
            assert line.startswith("worker-1  not attached to the owner for ")
            assert line.endswith(
                "s while the owner answers (--liveness-timeout 2; the owner dropped it: stopped or hung), so killing "
                f"it (pid {stopped})"
            )
            assert await wait_gone({stopped}) == set()  # SIGKILL works on a stopped process
            assert worker_named(after, "worker-1")["restarts"] == 1
            assert worker_named(after, "worker-2") == worker_named(before, "worker-2")
            assert after["owner"] == before["owner"]
            up.process.send_signal(signal.SIGTERM)
            assert await up.wait_exit() == EXIT_OK, up.stderr_text()
            await up.assert_everything_gone(timeout_s=0.5)


async def test_a_sigstopped_owner_is_killed_and_a_client_write_is_acknowledged_within_10_s(
    db_path: str, tmp_path: Path
) -> None:
    """The default liveness timeout (5 s): a hung owner is noticed by the supervisor, not by each client in turn."""
    with trio.fail_after(60):
        async with tether_up(db_path, tmp_path, "--workers", "1", "--app", APP) as up:
            before = await up.wait_status(all_up(1), "owner and an attached worker")
            await wait_for(lambda: lock_has_waiter(lock_path(db_path)), "the standby waiting for the ownership lock")
            hung = before["owner"]["pid"]
            async with actors.connect(db=db_path) as client:  # an application's client, connected all along
                conversation_id = await client.create_conversation()
                os.kill(hung, signal.SIGSTOP)
                stopped_at = time.monotonic()
                try:
                    with trio.fail_after(10):
                        seq = await _append_retrying(client, conversation_id)
                    acknowledged_s = time.monotonic() - stopped_at
                    print(f"SIGSTOP owner -> a client append acknowledged after {acknowledged_s:.2f} s")
                finally:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(hung, signal.SIGCONT)
            assert seq > 0
            [line] = [line for line in up.said() if line.startswith("owner     has not answered")]
            assert line.endswith(f"; --liveness-timeout 5): hung, so killing it (pid {hung})"), line
            assert await wait_gone({hung}) == set()
            after = await up.wait_status(owner_replaced(hung, [worker_named(before, "worker-1")["pid"]]), "takeover")
            async with actors.connect(db=db_path, role="reader") as reader:
                assert [entry.seq for entry in await reader.entries(conversation_id)] == [seq]
            assert after["owner"]["restarts"] == 1
            up.process.send_signal(signal.SIGTERM)
            assert await up.wait_exit() == EXIT_OK, up.stderr_text()
            await up.assert_everything_gone(timeout_s=0.5)


async def test_an_app_failing_at_import_stops_up_at_once_with_exit_2_and_the_error(
    db_path: str, tmp_path: Path
) -> None:
    with trio.fail_after(60):
        async with tether_up(db_path, tmp_path, "--workers", "2", "--app", CRASHING_APP) as up:
            # Keep reading the status (recording every pid it names) until the supervisor stops.
            while up.process.poll() is None:
                await up.status()
                await trio.sleep(0.05)
            status = await up.wait_exit()
            stderr = up.stderr_text()
            assert status == EXIT_USAGE, stderr
            [refusal] = [line for line in stderr.splitlines() if line.startswith("tether: ")]
            assert refusal == (
                f"tether: the app {CRASHING_APP} cannot be loaded (tether worker --app {CRASHING_APP} exited with "
                "status 2), so no worker was started and every process was stopped:"
            )
            assert "RuntimeError: boom at import" in stderr[stderr.index(refusal) :], stderr
            # The app is loaded before anything else starts: no owner, no worker, nothing created beside the db.
            assert not [line for line in up.said() if line.startswith(("owner", "worker-1", "worker-2"))]
            assert up.process.returncode == EXIT_USAGE
            assert not await wait_gone({up.pid}, db_path, timeout_s=0.5)
            assert not os.path.exists(db_path) and not lock_path(db_path).exists()
            assert not is_owned(db_path)
            assert not state_path(db_path).exists()
            assert not runtime_path(db_path).exists()


async def test_a_worker_whose_app_fails_to_load_later_stops_up_at_once_with_its_output(
    db_path: str, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    with trio.fail_after(60):
        async with tether_up(
            db_path, tmp_path, "--workers", "2", "--app", FLAKY_APP, env={"TETHER_TEST_BREAK_APP": str(broken)}
        ) as up:
            before = await up.wait_status(all_up(2), "owner and two attached workers")
            broken.touch()  # the app's module now fails at import, as after a bad deploy
            os.kill(worker_named(before, "worker-1")["pid"], signal.SIGKILL)
            status = await up.wait_exit()
            stderr = up.stderr_text()
            assert status == EXIT_USAGE, stderr
            [refusal] = [line for line in stderr.splitlines() if line.startswith("tether: ")]
            assert refusal.startswith(
                f"tether: worker-1 exited with status 2: its app {FLAKY_APP} cannot be loaded (or its command line is "
                "wrong), which retrying cannot change, so it was not restarted and every process was stopped."
            )
            assert "boom at import: the app was broken after tether up started" in stderr[stderr.index(refusal) :]
            said = up.said()
            assert [line for line in said if "(restart" in line] == [  # one restart: stopped at once, not retried
                next(line for line in said if line.startswith("worker-1  restarting in "))
            ]
            assert said[-1].startswith("worker-1  exited with status 2 after "), said  # the last thing it did
            await up.assert_everything_gone(timeout_s=0.5)
            assert not is_owned(db_path)


async def test_no_process_outlives_a_sigkilled_supervisor_and_up_can_start_again(db_path: str, tmp_path: Path) -> None:
    with trio.fail_after(90):
        async with tether_up(db_path, tmp_path, "--workers", "2", label="first") as first:
            before = await first.wait_status(all_up(2), "owner and two attached workers")
            children = {before["owner"]["pid"], *(worker["pid"] for worker in supervised(before))}
            first.process.send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            assert await first.wait_exit() == -signal.SIGKILL
            left = await wait_gone(children, db_path, timeout_s=20)
            print(f"supervisor SIGKILL -> owner and workers gone after {time.monotonic() - killed_at:.2f} s")
            assert not left, f"children outlived their supervisor: {sorted(left)}"
            await first.assert_everything_gone(timeout_s=0.5)
            after_kill = await first.status()
            assert after_kill is not None
            assert after_kill["supervisor"] is None
            assert after_kill["owner"]["alive"] is False
            assert after_kill["workers"] == []

        async with tether_up(db_path, tmp_path, "--workers", "2", label="second") as second:
            again = await second.wait_status(all_up(2), "a new owner and two attached workers")
            assert again["supervisor"] == {"pid": second.pid}
            assert not children & {again["owner"]["pid"], *(worker["pid"] for worker in supervised(again))}
            second.process.send_signal(signal.SIGTERM)
            assert await second.wait_exit() == EXIT_OK, second.stderr_text()
            await second.assert_everything_gone(timeout_s=0.5)


def _connected_to(port: int) -> bool:
    """Whether this process has an established TCP connection to ``port`` on IPv4 (read from ``/proc``: its sockets'
    inodes, then the kernel's table of TCP connections)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # a descriptor closed meanwhile
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    for line in Path("/proc/self/net/tcp").read_text().splitlines()[1:]:
        _, _, remote, state, *_, inode = line.split()[:10]
        if state == "01" and int(remote.rpartition(":")[2], 16) == port and inode in inodes:  # 01: ESTABLISHED
            return True
    return False


async def test_a_client_connecting_to_an_owner_that_dies_mid_handshake_is_told_within_the_connect_timeout(
    db_path: str, tmp_path: Path
) -> None:
    with trio.fail_after(60):
        async with tether_up(db_path, tmp_path, "--workers", "0") as up:
            before = await up.wait_status(all_up(0), "the supervisor and its owner")
            old_owner = before["owner"]["pid"]
            outcome: list[str] = []

            async def connect() -> None:
                try:
                    async with actors.connect(db=db_path, reconnect=False) as client:
                        await client.ping()
                    outcome.append("connected")
                except actors.OwnerUnavailable:
                    outcome.append("unavailable")

            # A stopped owner: the kernel completes the TCP handshake and holds the WebSocket upgrade request.
            port = int(before["url"].rpartition(":")[2])
            os.kill(old_owner, signal.SIGSTOP)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(connect)
                    await wait_for(lambda: _connected_to(port), "the client's TCP connection to the stopped owner")
                    await trio.testing.wait_all_tasks_blocked()  # its upgrade request sent, it awaits the answer
                    os.kill(old_owner, signal.SIGKILL)  # the connection is reset: the client should know now
                    killed_at = time.monotonic()
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(old_owner, signal.SIGCONT)
            told_after_s = time.monotonic() - killed_at
            print(f"connect to an owner killed mid-handshake: {outcome} {told_after_s:.2f} s after the kill")
            assert outcome == ["unavailable"]
            # The owner restarted by the supervisor is found by the next attempt.
            await up.wait_status(owner_replaced(old_owner, []), "the restarted owner")
            up.process.send_signal(signal.SIGTERM)
            assert await up.wait_exit() == EXIT_OK, up.stderr_text()
            await up.assert_everything_gone(timeout_s=0.5)
            # trio-websocket does not notice a reset during its opening handshake, so the attempt ends at the
            # client's connect timeout rather than at once; reconnection attempts use a shorter one (0.5 s first).
            assert told_after_s < CONNECT_TIMEOUT_S + 1.0


async def test_up_starts_while_status_probes_look_at_its_locks(db_path: str, tmp_path: Path) -> None:
    """`tether status` and `tether stop` look at the locks without taking them, so probing them as fast as possible
    never makes a starting supervisor or owner believe another one runs."""
    from storage_owner.store import lock_is_held

    lock = supervisor_lock_path(db_path)
    lock.touch()  # left behind by any earlier `tether up` on this database
    stop_probing = threading.Event()

    def probe() -> int:
        probes = 0
        while not stop_probing.is_set():
            lock_is_held(lock)
            is_owned(db_path)
            probes += 1
        return probes

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            probes: list[int] = []

            async def run_probe() -> None:
                probes.append(await trio.to_thread.run_sync(probe))

            nursery.start_soon(run_probe)
            try:
                async with tether_up(db_path, tmp_path, "--workers", "0") as up:
                    await up.wait_status(all_up(0), "the supervisor and its owner")
                    up.process.send_signal(signal.SIGTERM)
                    assert await up.wait_exit() == EXIT_OK, up.stderr_text()
                    await up.assert_everything_gone(timeout_s=0.5)
            finally:
                stop_probing.set()
        assert probes and probes[0] > 0


async def test_an_owner_that_dies_while_its_standby_is_being_started_is_replaced_by_that_standby(
    db_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window between the supervisor deciding to start a standby and knowing its process: the owner dies in it
    (SIGKILL), and its exit is handled before the standby's process exists. The standby then takes the lock the kernel
    released; a new owner started after the back-off would find the database taken and exit 3, which stops tether up.
    The supervisor runs in this process so that its start of the standby can be held at that point."""
    lines: list[str] = []
    supervisor = Supervisor(SupervisorConfig(db=db_path, app="runtime.demo_app:app", workers=0), say=lines.append)
    start = Supervisor._start
    killed: list[int] = []

    async def start_after_killing_the_owner(self: Supervisor, nursery: trio.Nursery, child: Any) -> None:
        if child is self.standby and not killed:
            owner = self.owner.process
            assert owner is not None
            owner.kill()
            killed.append(owner.pid)
            await wait_for(lambda: any("exited with status -9" in line for line in lines), "the owner's exit handled")
        await start(self, nursery, child)

    monkeypatch.setattr(Supervisor, "_start", start_after_killing_the_owner)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            await wait_for(lambda: any("takes over" in line for line in lines), "the standby taking over")
            await wait_for(lambda: sum("listening on" in line for line in lines) == 2, "the promoted standby listening")
            owner = supervisor.owner.process
            assert owner is not None and owner.returncode is None and supervisor.owner.restarts == 1, lines
            await wait_for(lambda: supervisor.standby.running, "a new standby behind it")
            standby = supervisor.standby.process
            assert standby is not None
            children = [owner.pid, standby.pid]
            nursery.cancel_scope.cancel()  # the supervisor stops its children in order, shielded
    assert killed and all(pid_gone(pid) for pid in (*killed, *children)), lines
    assert not any("retrying cannot change" in line for line in lines), lines
