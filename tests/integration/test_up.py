"""``tether up``, ``tether worker``, ``tether status`` and ``tether stop`` as processes: a supervisor with an owner
and workers, its status from any shell, clean stops, single supervision per database, bad ``--app`` paths, and a
worker attached from a script."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

import actors
from protocol import DEFAULT_HEARTBEAT_TIMEOUT_S, HEARTBEATS_PER_SILENCE, Capability, runtime_path
from runtime import kill_and_reap, stop_gracefully
from runtime._exits import EXIT_ALREADY_RUNNING, EXIT_FAILED, EXIT_OK, EXIT_USAGE
from runtime._parent import DEFAULT_LIVENESS_TIMEOUT_S, PARENT_HEARTBEAT_S
from runtime._supervisor import PROBES_PER_LIVENESS_TIMEOUT, read_state, state_path
from storage_owner.store import lock_path
from tests.conftest import OwnerProcess
from tests.integration._up_helpers import (
    CHILD_ENV,
    CONSOLE_SCRIPT,
    all_up,
    cpu_used_s,
    describe,
    lock_has_waiter,
    nonblank_lines,
    pid_gone,
    processes_naming,
    run_tether,
    supervised,
    tether_up,
    thread_cpu_ns,
    wait_for,
)

IDLE_WARM_UP_S = 5.0
"""Left out of the measurement: the first rounds of each periodic path (heartbeats, the supervisor's probe) run
slower until Python has specialised their code (3.11's adaptive interpreter), about a third more for a few seconds."""
IDLE_PERIODS_S = (
    DEFAULT_LIVENESS_TIMEOUT_S / PROBES_PER_LIVENESS_TIMEOUT,  # the supervisor's probe: 2.5 s
    DEFAULT_HEARTBEAT_TIMEOUT_S / HEARTBEATS_PER_SILENCE,  # each worker's ping: 5 s
    PARENT_HEARTBEAT_S,  # the supervisor's heartbeat to each child: 7.5 s
)
IDLE_WINDOW_S = 15.0
"""One measurement: a whole number of every idle period, so that each window holds the same wake-ups whatever its
phase."""
assert all(IDLE_WINDOW_S % period_s == 0 for period_s in IDLE_PERIODS_S)
IDLE_WINDOWS = 2
"""Windows measured one after the other; the lowest counts. Other work on a shared machine can only add to what the
idle processes use (cache and frequency), never take from it, while every window holds the same wake-ups."""
IDLE_CPU_BOUND = 0.005
"""What an idle ``tether up`` (supervisor, owner, standby, two workers) may use together: half a percent of a core."""
STATUS_KEYS = {"db", "schema_version", "size_bytes", "url", "supervisor", "owner", "standby", "workers", "clients"}
WORKER_KEYS = {"name", "pid", "alive", "attached", "restarts", "supervised"}


async def test_up_runs_an_owner_and_two_workers_and_stops_cleanly_on_sigterm(db_path: str, tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with tether_up(db_path, tmp_path, "--workers", "2") as up:
            status = await up.wait_status(all_up(2), "owner and two attached workers")
            startup_s = time.monotonic() - up.started_at
            print(f"tether up --workers 2: all workers attached {startup_s:.2f} s after starting tether up")

            assert status["supervisor"] == {"pid": up.pid}
            assert status["owner"]["alive"] is True
            assert status["owner"]["restarts"] == 0
            assert status["url"].startswith("ws://127.0.0.1:")
            assert status["db"] == os.path.abspath(db_path)
            workers = supervised(status)
            assert [worker["name"] for worker in workers] == ["worker-1", "worker-2"]
            for worker in workers:
                assert set(worker) == WORKER_KEYS
                assert worker["alive"] and worker["attached"] and worker["restarts"] == 0
            assert len({status["owner"]["pid"], *(worker["pid"] for worker in workers), up.pid}) == 4
            assert state_path(db_path).exists()
            assert runtime_path(db_path).exists()

            as_json = await run_tether("status", "--db", db_path, "--json")
            assert as_json.returncode == EXIT_OK, as_json.stderr
            lines = nonblank_lines(as_json.stdout)
            assert len(lines) == 1, lines
            printed: dict[str, Any] = json.loads(lines[0])
            assert set(printed) == STATUS_KEYS
            assert printed["supervisor"] == {"pid": up.pid}
            assert printed["owner"]["pid"] == status["owner"]["pid"]
            assert printed["url"] == status["url"]
            assert [(w["name"], w["pid"], w["attached"]) for w in printed["workers"]] == [
                (w["name"], w["pid"], True) for w in workers
            ]
            assert printed["clients"] == 0

            human = await run_tether("status", "--db", db_path)
            assert human.returncode == EXIT_OK, human.stderr
            assert nonblank_lines(human.stdout)

            up.process.send_signal(signal.SIGTERM)
            assert await up.wait_exit() == EXIT_OK, up.stderr_text()
            await up.assert_everything_gone(timeout_s=0.5)  # the supervisor reaped its children before exiting
            assert not state_path(db_path).exists()
            assert not runtime_path(db_path).exists()


async def test_an_idle_up_with_two_workers_uses_under_half_a_percent_of_a_core(db_path: str, tmp_path: Path) -> None:
    with trio.fail_after(120):
        async with tether_up(db_path, tmp_path, "--workers", "2") as up:
            await up.wait_status(all_up(2), "owner and two attached workers")
            # The standby has imported everything and waits in flock (it does not poll).
            await wait_for(lambda: lock_has_waiter(lock_path(db_path)), "standby waiting for the ownership lock")
            pids = processes_naming(db_path)
            assert len(pids) == 5, describe(pids)  # the supervisor, the owner, the standby, two workers
            await trio.sleep(IDLE_WARM_UP_S)
            windows = []
            for _ in range(IDLE_WINDOWS):
                before = {pid: thread_cpu_ns(pid) for pid in pids}
                started = time.monotonic()
                await trio.sleep(IDLE_WINDOW_S)  # the measurement window itself: idle time is what is measured
                elapsed_s = time.monotonic() - started
                used = {pid: cpu_used_s(before[pid], thread_cpu_ns(pid)) / elapsed_s for pid in pids}
                report = "\n".join(f"  {share:7.3%}  {describe({pid})}" for pid, share in used.items())
                print(f"idle tether up, {elapsed_s:.1f} s: {sum(used.values()):.3%} of one core\n{report}")
                windows.append((sum(used.values()), report))
            lowest = min(share for share, _ in windows)
            assert lowest < IDLE_CPU_BOUND, "\n".join(f"{share:.3%} of one core:\n{text}" for share, text in windows)
            up.process.send_signal(signal.SIGTERM)
            assert await up.wait_exit() == EXIT_OK, up.stderr_text()
            await up.assert_everything_gone(timeout_s=0.5)


async def test_ctrl_c_in_the_terminal_of_up_reaches_the_supervisor_alone_which_stops_its_children(
    db_path: str, tmp_path: Path
) -> None:
    with trio.fail_after(60):
        async with tether_up(db_path, tmp_path, "--workers", "2", own_process_group=True) as up:
            status = await up.wait_status(all_up(2), "owner and two attached workers")
            children = {status["owner"]["pid"], *(worker["pid"] for worker in supervised(status))}
            assert status["standby"] is not None
            children.add(status["standby"]["pid"])
            # Each child in a session of its own: the terminal's SIGINT to the job's group reaches none of them.
            assert {pid: os.getpgid(pid) == os.getpgid(up.pid) for pid in children} == dict.fromkeys(children, False)
            os.killpg(os.getpgid(up.pid), signal.SIGINT)  # what Ctrl-C in its terminal does
            assert await up.wait_exit() == EXIT_OK, up.stderr_text()
            await up.assert_everything_gone(timeout_s=0.5)
            assert "tether up: stopping: the workers finish what they run" in up.stdout_text()


async def test_status_says_an_owner_that_holds_its_lock_but_does_not_answer_is_not_answering(
    owner: OwnerProcess,
) -> None:
    with trio.fail_after(60):
        answering = json.loads((await run_tether("status", "--db", owner.db, "--json")).stdout)
        os.kill(owner.pid, signal.SIGSTOP)  # hung, as a deadlock or a stalled disk leaves it
        results: dict[str, subprocess.CompletedProcess[bytes]] = {}

        async def run(name: str, *args: str) -> None:
            results[name] = await run_tether(*args)

        try:
            async with trio.open_nursery() as nursery:  # each waits out its own answer timeout: side by side
                nursery.start_soon(run, "json", "status", "--db", owner.db, "--json")
                nursery.start_soon(run, "human", "status", "--db", owner.db)
                nursery.start_soon(run, "tasks", "tasks", "--db", owner.db)
        finally:
            os.kill(owner.pid, signal.SIGCONT)
        as_json, human, tasks = results["json"], results["human"], results["tasks"]
    assert answering["owner"] == {"pid": owner.pid, "alive": True, "answering": True, "restarts": 0}
    assert json.loads(as_json.stdout)["owner"] == {"pid": owner.pid, "alive": True, "answering": False, "restarts": 0}
    [line] = [line for line in nonblank_lines(human.stdout) if line.startswith("owner")]
    assert line == (
        f"owner       pid {owner.pid} on {answering['url']}, NOT ANSWERING (it holds the database but did not reply: "
        "stopped or hung), 0 restarts"
    )
    assert tasks.returncode == EXIT_OK, tasks.stderr
    assert nonblank_lines(tasks.stdout)[1] == (
        "(the owner did not answer: stopped or hung; read from the database, as last committed; blocked reasons need "
        "an owner that answers)"
    )


async def test_tether_stop_stops_a_running_up_and_fails_when_nothing_runs(db_path: str, tmp_path: Path) -> None:
    with trio.fail_after(60):
        nothing = await run_tether("stop", "--db", str(tmp_path / "never-created.db"))
        assert nothing.returncode == EXIT_FAILED
        assert len(nonblank_lines(nothing.stderr)) == 1, nothing.stderr

        async with tether_up(db_path, tmp_path, "--workers", "2") as up:
            status = await up.wait_status(all_up(2), "owner and two attached workers")
            children = {status["owner"]["pid"], *(worker["pid"] for worker in supervised(status))}
            # tether stop waits, by default, as long as the supervisor says its stop may take (the workers' drain,
            # then each child's stop timeout) and a margin: what tether up --drain-timeout changes, it follows.
            assert read_state(db_path)["stop_within_s"] == 30 + 3 * 10
            stopped = await run_tether("stop", "--db", db_path)
            assert stopped.returncode == EXIT_OK, stopped.stderr
            # tether stop returns once the supervisor let go of its lock: its children are gone by then.
            assert [pid for pid in children if not pid_gone(pid)] == []
            assert await up.wait_exit() == EXIT_OK, up.stderr_text()
            await up.assert_everything_gone(timeout_s=0.5)
            assert not state_path(db_path).exists()
            assert not runtime_path(db_path).exists()

        again = await run_tether("stop", "--db", db_path)
        assert again.returncode == EXIT_FAILED
        assert len(nonblank_lines(again.stderr)) == 1, again.stderr


async def test_second_up_on_the_same_db_exits_3_naming_the_running_supervisor(db_path: str, tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with tether_up(db_path, tmp_path, "--workers", "1") as up:
            before = await up.wait_status(all_up(1), "owner and an attached worker")
            started = time.monotonic()
            second = await run_tether("up", "--db", db_path, "--workers", "1", timeout_s=20)
            elapsed = time.monotonic() - started
            assert second.returncode == EXIT_ALREADY_RUNNING, second.stderr
            assert elapsed < 10
            assert f"supervisor pid {up.pid}" in second.stderr.decode(), second.stderr
            assert len(nonblank_lines(second.stderr)) == 1, second.stderr
            assert second.stdout == b""  # no banner: it never started serving anything
            # The first one's banner counts its one worker in the singular.
            [banner, *_] = nonblank_lines(up.stdout_path.read_bytes())
            db = os.path.abspath(db_path)
            assert banner == f"tether up: {db}, 1 worker serving runtime.demo_app:app (pid {up.pid})"

            # The first one is untouched: same supervisor, owner and worker, all still up.
            after = await up.wait_status(all_up(1), "owner and an attached worker")
            assert up.process.poll() is None
            assert after["supervisor"] == before["supervisor"]
            assert after["owner"] == before["owner"]
            assert supervised(after) == supervised(before)
            assert state_path(db_path).exists()

            up.process.send_signal(signal.SIGTERM)
            assert await up.wait_exit() == EXIT_OK, up.stderr_text()
            await up.assert_everything_gone(timeout_s=0.5)


SHADOWS = ("runtime", "protocol", "actors")
"""Module names of Tether's packages, which a user's project may well use for files of its own."""


def _project(tmp_path: Path) -> Path:
    """A user's project directory: ``myapp.py`` (an ``actors.App``), and a ``runtime.py``, ``protocol.py`` and
    ``actors.py`` that leave a ``.imported`` file beside them and exit if anything imports them."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "myapp.py").write_text('import actors\n\napp = actors.App("myapp")\n')
    for name in SHADOWS:
        (project / f"{name}.py").write_text(
            f"open(__file__ + '.imported', 'w').close()\nraise SystemExit('the project\\'s {name}.py ran')\n"
        )
    return project


async def _worker_apps(db: str) -> list[str]:
    async with actors.connect(db=db, role="reader") as client:
        return [peer.app for peer in await client.peers() if peer.role == "worker" and peer.announced]


async def test_up_run_in_a_project_with_files_named_like_tethers_packages_serves_the_projects_app(
    db_path: str, tmp_path: Path
) -> None:
    project = _project(tmp_path)
    with trio.fail_after(60):
        command = [*CONSOLE_SCRIPT, "up", "--db", db_path, "--workers", "1", "--app", "myapp:app"]
        async with tether_up(db_path, tmp_path, command=command, cwd=project) as up:
            await up.wait_status(all_up(1), "owner and an attached worker")
            assert await _worker_apps(db_path) == ["myapp"]  # found in the working directory, as documented
            assert sorted(path.name for path in project.glob("*.imported")) == []
            up.process.send_signal(signal.SIGTERM)
            assert await up.wait_exit() == EXIT_OK, up.stderr_text()
            await up.assert_everything_gone(timeout_s=0.5)
    assert "ran" not in up.stderr_text()


async def test_the_worker_console_script_finds_the_app_module_in_its_working_directory(
    owner: OwnerProcess, tmp_path: Path
) -> None:
    project = _project(tmp_path)
    stderr_path = tmp_path / "worker.stderr"
    with trio.fail_after(60):
        with open(stderr_path, "wb") as stderr:
            worker = await trio.lowlevel.open_process(
                [*CONSOLE_SCRIPT, "worker", "--db", owner.db, "--app", "myapp:app"],
                cwd=project,
                env=CHILD_ENV,
                stderr=stderr,
            )
        try:
            while await _worker_apps(owner.db) != ["myapp"]:
                assert worker.poll() is None, f"the worker exited with {worker.returncode}: {stderr_path.read_text()}"
                await trio.sleep(0.05)
            worker.send_signal(signal.SIGTERM)
            assert await worker.wait() == EXIT_OK
        finally:
            await kill_and_reap(worker)
    assert sorted(path.name for path in project.glob("*.imported")) == []


@pytest.mark.parametrize("command", ["up", "owner"])
async def test_a_db_in_a_missing_directory_is_refused_naming_the_directory(command: str, tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such"
    db = str(missing / "x.db")
    with trio.fail_after(30):
        result = await run_tether(command, "--db", db)
    assert result.returncode == EXIT_FAILED, result.stderr
    assert result.stdout == b""
    [line] = nonblank_lines(result.stderr)
    assert line == (
        f"tether: {command}: the directory of the database does not exist: {missing} (--db {db}); create it, or "
        "give another --db; nothing was started"
    )
    assert not tmp_path.joinpath("no").exists()


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("no_such_module:app", "no_such_module"),
        ("runtime.demo_app:nope", "nope"),
        ("json:dumps", "not an actors.App"),
    ],
)
async def test_worker_with_a_bad_app_exits_at_once_without_attaching(
    owner: OwnerProcess, spec: str, problem: str
) -> None:
    with trio.fail_after(30):
        started = time.monotonic()
        result = await run_tether("worker", "--db", owner.db, "--app", spec, "--name", "bad-worker")
        elapsed = time.monotonic() - started
        async with actors.connect(db=owner.db, role="reader") as client:
            peers = await client.peers()
    assert result.returncode == EXIT_USAGE  # retrying cannot change it: tether up stops on this status
    assert elapsed < 10
    lines = nonblank_lines(result.stderr)
    assert len(lines) == 1, lines
    assert problem in lines[0]
    assert [peer for peer in peers if peer.role == "worker"] == []


async def test_worker_check_app_loads_the_app_as_a_worker_would_and_attaches_nothing(db_path: str) -> None:
    # tether up's check before it starts workers: no owner is needed, nothing attaches.
    with trio.fail_after(30):
        good = await run_tether("worker", "--check-app", "--db", db_path, "--app", "runtime.demo_app:app")
        bad = await run_tether("worker", "--check-app", "--db", db_path, "--app", "runtime.demo_app:nope")
    assert (good.returncode, good.stdout, good.stderr) == (EXIT_OK, b"", b"")
    assert bad.returncode == EXIT_USAGE
    assert nonblank_lines(bad.stderr) == [
        "tether: module 'runtime.demo_app' has no attribute 'nope' (--app runtime.demo_app:nope)"
    ]
    assert not os.path.exists(db_path)


async def _run_x(state: Any) -> None:
    return None


async def test_a_script_worker_attaches_announces_its_app_and_shows_as_unsupervised(
    db_path: str, tmp_path: Path
) -> None:
    app = actors.App("script-app")
    app.define_task("t.x", version=3, initial=lambda payload: {}, phases={"run": _run_x})
    with trio.fail_after(60):
        async with tether_up(db_path, tmp_path, "--workers", "1") as up:
            await up.wait_status(all_up(1), "owner and an attached worker")
            async with trio.open_nursery() as nursery:
                await nursery.start(partial(actors.serve, app, db=db_path, name="script-worker"))
                async with actors.connect(db=db_path, role="reader") as client:
                    peers = await client.peers()
                status = await up.wait_status(
                    lambda status: any(not worker["supervised"] for worker in status["workers"]),
                    "the script worker in the status",
                )
                nursery.cancel_scope.cancel()

            [mine] = [peer for peer in peers if peer.pid == os.getpid()]
            assert mine.role == "worker"
            assert mine.peer_name == "script-worker"
            assert mine.announced is True
            assert mine.app == "script-app"
            assert mine.capabilities == (Capability(kind="task", name="t.x", version=3),)
            [supervised_peer] = [peer for peer in peers if peer.role == "worker" and peer.pid != os.getpid()]
            assert supervised_peer.app == "demo"

            assert [w for w in status["workers"] if not w["supervised"]] == [
                {
                    "name": "script-worker",
                    "pid": os.getpid(),
                    "alive": True,
                    "attached": True,
                    "restarts": 0,
                    "supervised": False,
                }
            ]
            assert [(w["name"], w["attached"]) for w in supervised(status)] == [("worker-1", True)]

            # Once the script stops serving, it leaves the status; the supervised worker stays.
            await up.wait_status(
                lambda status: [w["name"] for w in status["workers"]] == ["worker-1"], "the script worker gone"
            )
            up.process.send_signal(signal.SIGTERM)
            assert await up.wait_exit() == EXIT_OK, up.stderr_text()
            await up.assert_everything_gone(timeout_s=0.5)


async def test_every_command_has_help() -> None:
    commands: list[tuple[str, ...]] = [
        ("--help",),
        *((command, "--help") for command in ("owner", "demo", "up", "worker", "status", "stop")),
    ]
    results: dict[tuple[str, ...], Any] = {}

    async def run(args: tuple[str, ...]) -> None:
        results[args] = await run_tether(*args)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for args in commands:
                nursery.start_soon(run, args)
    for args, result in results.items():
        assert result.returncode == EXIT_OK, (args, result.stderr)
        assert result.stdout.decode().startswith("usage: tether"), (args, result.stdout)
    assert len(results) == len(commands)


SLEEPER = "import time; print('ready', flush=True); time.sleep(60)"
IGNORES_SIGTERM = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + SLEEPER


@pytest.mark.parametrize("ignores_sigterm", [False, True])
async def test_stop_gracefully_kills_only_what_outlives_sigterm_and_says_so(ignores_sigterm: bool) -> None:
    # The supervisor stops its children this way: a child that ignores SIGTERM is killed after the timeout.
    script = IGNORES_SIGTERM if ignores_sigterm else SLEEPER
    killed: list[bool] = []
    with trio.fail_after(20):
        process = await trio.lowlevel.open_process([sys.executable, "-c", script], stdout=subprocess.PIPE)
        try:
            assert process.stdout is not None
            received = b""
            while not received.endswith(b"\n"):  # one line, however the child's writes were split
                chunk = await process.stdout.receive_some(16)
                assert chunk, f"the child ended before saying ready (it said {received!r})"
                received += chunk
            assert received == b"ready\n"
            status = await stop_gracefully(process, timeout_s=0.5, on_kill=lambda: killed.append(True))
        finally:
            await kill_and_reap(process)
    assert status == (-signal.SIGKILL if ignores_sigterm else -signal.SIGTERM)
    assert killed == ([True] if ignores_sigterm else [])


BROKEN_APP = """\
import actors


def price_list():
    return {"tea": 1 / 0}


PRICES = price_list()
app = actors.App("broken")
"""


async def test_an_app_that_fails_at_import_shows_the_frames_of_its_own_file_then_the_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text(BROKEN_APP)
    with trio.fail_after(30):
        as_file = await run_tether("worker", "--db", str(tmp_path / "t.db"), "--app", f"{broken}:app")
        as_module = await run_tether(
            "worker", "--check-app", "--db", str(tmp_path / "t.db"), "--app", "broken:app", cwd=tmp_path
        )
    for done, named in ((as_file, str(broken)), (as_module, "broken")):
        assert done.returncode == EXIT_USAGE
        assert nonblank_lines(done.stderr) == [
            f"tether: importing {named!r} for --app {named}:app failed:",
            f'  File "{broken}", line 8, in <module>',
            "    PRICES = price_list()",
            f'  File "{broken}", line 5, in price_list',
            '    return {"tea": 1 / 0}',
            "ZeroDivisionError: division by zero",
        ]
    assert sorted(os.listdir(tmp_path)) == ["broken.py"]


@pytest.mark.parametrize(
    ("app", "problem"),
    [
        ("no_such_module:app", "cannot import module 'no_such_module'"),
        ("{dir}/shop.py:missing", "file '{dir}/shop.py' has no attribute 'missing'"),
        ("{dir}/nothing.py:app", "there is no file {dir}/nothing.py"),
        ("{dir}/broken.py:app", 'File "{dir}/broken.py", line 5, in price_list'),
    ],
)
async def test_up_with_an_app_that_cannot_be_loaded_refuses_before_creating_anything(
    db_path: str, tmp_path: Path, app: str, problem: str
) -> None:
    (tmp_path / "shop.py").write_text("import actors\n\napp = actors.App('shop')\n")
    (tmp_path / "broken.py").write_text(BROKEN_APP)
    before = sorted(os.listdir(tmp_path))
    with trio.fail_after(30):
        done = await run_tether("up", "--db", db_path, "--app", app.format(dir=tmp_path), "--workers", "1")
    assert done.returncode == EXIT_USAGE, done.stderr
    assert problem.format(dir=tmp_path) in done.stderr.decode()
    assert sorted(os.listdir(tmp_path)) == before  # no database, no lock file, no state file
