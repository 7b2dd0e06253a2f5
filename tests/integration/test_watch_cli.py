"""``tether watch`` the way a person and a script use it, under ``tether up`` with a scripted agent that asks for an
approval: on a terminal (a tmux pane, read back with ``capture-pane``), with ``--json`` through an owner SIGKILL
(no record missing or doubled), and as plain lines when its output is not a terminal."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

import actors
from runtime import kill_and_reap, tether_command
from tests.conftest import OwnerProcess
from tests.integration._up_helpers import (
    CHILD_ENV,
    ROOT,
    Status,
    all_up,
    pid_gone,
    run_tether,
    signal_all,
    tether_up,
    wait_gone,
)

APP = "tests.integration._agent_apps:approving"
POLL_S = 0.1


async def open_approval(client: actors.Client) -> actors.InteractionRecord:
    while True:
        found = await client.interactions(status="open")
        if found:
            return found[0]
        await trio.sleep(POLL_S)


# ---------------------------------------------------------------------------------------------------- tmux


class Tmux:
    """A tmux server of this test alone (its own socket, no user configuration), one 120x40 pane."""

    def __init__(self, directory: Path) -> None:
        self.socket = str(directory / "tmux.sock")
        self.config = directory / "tmux.conf"
        self.config.write_text("set -g default-size 120x40\n")

    def command(self, *args: str) -> list[str]:
        return ["tmux", "-S", self.socket, "-f", str(self.config), *args]

    async def run(self, *args: str) -> str:
        done = await trio.run_process(self.command(*args), capture_stdout=True, capture_stderr=True, check=True)
        return done.stdout.decode(errors="replace")

    async def screen(self) -> str:
        return await self.run("capture-pane", "-p", "-t", "watch")

    async def pane(self, field: str) -> str:
        return (await self.run("display-message", "-p", "-t", "watch", f"#{{{field}}}")).strip()

    async def wait_screen(self, predicate: Callable[[str], bool], what: str, timeout_s: float = 30.0) -> str:
        screen = ""
        with trio.move_on_after(timeout_s):
            while True:
                screen = await self.screen()
                if predicate(screen):
                    return screen
                await trio.sleep(POLL_S)
        raise AssertionError(f"the screen never showed {what}; it shows:\n{screen}")


@asynccontextmanager
async def tmux_server(directory: Path) -> AsyncIterator[Tmux]:
    tmux = Tmux(directory)
    try:
        yield tmux
    finally:
        with trio.CancelScope(shield=True):
            await trio.run_process(tmux.command("kill-server"), check=False, capture_stderr=True)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")
async def test_watch_in_a_terminal_shows_the_approval_and_its_command_then_the_answer(
    db_path: str, tmp_path: Path
) -> None:
    with trio.fail_after(120):
        async with tether_up(db_path, tmp_path, "--workers", "1", "--app", APP) as up:
            await up.wait_status(all_up(1), "the owner and one attached worker")
            async with actors.connect(db=db_path) as client:
                conversation_id = await client.create_conversation(agent="support")
                await client.submit(conversation_id, kind="input", payload="where is A1?", request_id="q-1")
                approval = await open_approval(client)
            pids: set[int] = set()
            try:
                async with tmux_server(tmp_path) as tmux:
                    await watch_in_tmux(tmux, tmp_path, conversation_id, approval, pids)
            finally:
                with trio.CancelScope(shield=True):
                    signal_all(await wait_gone(pids, timeout_s=5), signal.SIGKILL)  # a test failed half-way
                    assert not await wait_gone(pids, timeout_s=10)
            up.process.send_signal(signal.SIGTERM)
            assert await up.wait_exit() == 0, up.stderr_text()
            await up.assert_everything_gone()


async def watch_in_tmux(
    tmux: Tmux, directory: Path, conversation_id: str, approval: actors.InteractionRecord, pids: set[int]
) -> None:
    command = tether_command("watch", "--db", "tether.db", "--conversation", conversation_id)
    # The pane's own size, not a COLUMNS/LINES inherited from the test run, decides the view's.
    watch = shlex.join(["env", "-u", "COLUMNS", "-u", "LINES", f"PYTHONPATH={ROOT}", *command])
    # bash goes on after a child that handled SIGINT and exited (and stops if it died of it): the pane stays alive
    # to show the exit status and the cursor's state after the watch.
    shell = f'{watch}; echo "tether watch exited with status $?"; exec sleep 600'
    await tmux.run(
        "new-session", "-d", "-s", "watch", "-x", "120", "-y", "40", "-c", str(directory), "bash", "-c", shell
    )
    shell_pid = int(await tmux.pane("pane_pid"))
    pids.add(shell_pid)
    pids.add(await child_of(shell_pid))

    answer = f"tether respond --db tether.db {approval.interaction_id} --approve"
    screen = await tmux.wait_screen(lambda text: answer in text, "the command that approves")
    assert "waiting for you" in screen
    assert f'approval {approval.interaction_id}: lookup {{"order_id":"A1"}}' in screen
    assert "you: where is A1?" in screen
    assert 'tool lookup {"order_id":"A1"}  waiting for approval' in screen
    assert "tether.approval" in screen  # the task tree below the run
    assert await tmux.pane("cursor_flag") == "0"  # the live view redraws in place

    # A person types the command the screen shows, in another shell.
    [line] = [line.strip(" │") for line in screen.splitlines() if answer in line]
    typed = shlex.split(line)
    assert typed[0] == "tether"
    done = await run_tether_in(directory, *typed[1:])
    assert done.returncode == 0, done.stderr

    screen = await tmux.wait_screen(lambda text: "assistant: Your order shipped." in text, "the answer")
    assert "waiting for you" not in screen
    assert "completed" in screen and '↳ {"order": "A1", "status": "shipped"}' in screen

    await tmux.run("send-keys", "-t", "watch", "C-c")
    screen = await tmux.wait_screen(lambda text: "tether watch exited with status" in text, "the watch ending")
    assert "tether watch exited with status 0" in screen
    assert "assistant: Your order shipped." in screen  # the last view stays on the terminal
    assert await tmux.pane("cursor_flag") == "1"  # the cursor the live view hid is back


async def child_of(pid: int) -> int:
    """The first child process of ``pid`` (the shell's command, once it started)."""
    with trio.fail_after(10):
        while True:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            if children:
                return int(children[0])
            await trio.sleep(POLL_S)


async def run_tether_in(directory: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(30):
        return await trio.run_process(
            tether_command(*args), capture_stdout=True, capture_stderr=True, check=False, cwd=directory, env=CHILD_ENV
        )


# --------------------------------------------------------------------------------------------------- lines


class Reader:
    """A ``tether watch`` process whose stdout is read line by line as it arrives."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.lines: list[str] = []
        self._more = trio.Event()

    async def read(self) -> None:
        assert self.process.stdout is not None
        pending = b""
        while chunk := await self.process.stdout.receive_some(65536):
            pending += chunk
            *complete, pending = pending.split(b"\n")
            self.lines.extend(line.decode() for line in complete)
            self._more.set()
        self._more.set()

    async def wait_for(self, predicate: Callable[[list[str]], bool], what: str, timeout_s: float = 30.0) -> None:
        with trio.move_on_after(timeout_s):
            while not predicate(self.lines):
                self._more = trio.Event()
                await self._more.wait()
            return
        raise AssertionError(f"tether watch never printed {what}; it printed:\n" + "\n".join(self.lines[-30:]))


@asynccontextmanager
async def watching(*args: str) -> AsyncIterator[Reader]:
    process = await trio.lowlevel.open_process(
        tether_command("watch", *args), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT, env=CHILD_ENV
    )
    reader = Reader(process)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader.read)
            try:
                yield reader
            except BaseException:
                await kill_and_reap(process)  # its output ends, and so does the reader
                raise
            process.send_signal(signal.SIGTERM)
            with trio.fail_after(20):
                status = await process.wait()
        assert status == 0, f"tether watch exited with {status} on SIGTERM"
    finally:
        await kill_and_reap(process)


def records(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines if line.strip()]


def has_record(kind: str, **fields: Any) -> Callable[[list[str]], bool]:
    def check(lines: list[str]) -> bool:
        return any(
            record["record"] == kind and all(record.get(k) == v for k, v in fields.items()) for record in records(lines)
        )

    return check


def owner_replaced(old_pid: int) -> Callable[[Status], bool]:
    return lambda status: status["owner"]["alive"] and status["owner"]["pid"] not in (None, old_pid)


async def test_watch_json_follows_a_run_through_an_owner_sigkill_without_a_record_missing_or_doubled(
    db_path: str, tmp_path: Path
) -> None:
    with trio.fail_after(150):
        async with tether_up(db_path, tmp_path, "--workers", "1", "--app", APP) as up:
            status = await up.wait_status(all_up(1), "the owner and one attached worker")
            async with watching("--db", db_path, "--json") as live:
                async with actors.connect(db=db_path) as client:
                    conversation_id = await client.create_conversation(agent="support")
                    submission = await client.submit(conversation_id, kind="input", payload="where?", request_id="q")
                    run_id = submission.run_id
                await live.wait_for(has_record("interaction", status="open", run_id=run_id), "the open approval")

                old_owner = status["owner"]["pid"]
                os.kill(old_owner, signal.SIGKILL)
                assert not await wait_gone({old_owner}, timeout_s=10)
                await up.wait_status(owner_replaced(old_owner), "a new owner")
                async with actors.connect(db=db_path, wait_for_owner_s=10) as client:
                    approval = await open_approval(client)
                    await client.respond(approval.interaction_id, approve=True)
                    with trio.fail_after(60):
                        run = await client.wait_for_run(run_id)
                assert run.status == "completed"
                await live.wait_for(has_record("run", run_id=run_id, status="completed"), "the completed run")
                last_seq = max(record["seq"] for record in records(live.lines))
            assert pid_gone(live.process.pid)

            seen = records(live.lines)
            seqs = [record["seq"] for record in seen]
            assert seqs == sorted(seqs), "records out of commit order"
            commits = [seq for index, seq in enumerate(seqs) if index == 0 or seqs[index - 1] != seq]
            assert len(commits) == len(set(commits)), "a commit shown twice (its records not together)"
            kinds = {record["record"] for record in seen}
            assert {"conversation", "run", "entry", "task", "operation", "interaction"} <= kinds

            # Read again from the start, with no restart: the same records, none missing, none doubled.
            expected = sum(1 for seq in seqs if seq == last_seq)
            async with watching("--db", db_path, "--json") as again:
                await again.wait_for(
                    lambda lines: sum(1 for record in records(lines) if record["seq"] == last_seq) >= expected,
                    f"the records of commit {last_seq}",
                )
            replayed = [record for record in records(again.lines) if record["seq"] <= last_seq]
            assert replayed == seen

            # Off a terminal and without --json: one plain line per event, the run's only.
            async with watching("--db", db_path, "--run", run_id) as plain:
                await plain.wait_for(
                    lambda lines: any(f"run {run_id}: completed" in line for line in lines), "the run completing"
                )
            text = "\n".join(plain.lines)
            assert "user: where?" in text and 'assistant calls lookup {"order_id":"A1"}' in text
            assert f"tether respond --db {db_path} {approval.interaction_id} --approve" in text
            assert "assistant: Your order shipped." in text
            assert "\x1b[" not in text  # no terminal control sequences

            up.process.send_signal(signal.SIGTERM)
            assert await up.wait_exit() == 0, up.stderr_text()
            await up.assert_everything_gone()


async def test_watch_of_an_unknown_run_fails_with_one_line(db_path: str, tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with tether_up(db_path, tmp_path, "--workers", "0") as up:
            await up.wait_status(all_up(0), "the owner")
            run_id = actors.new_id()
            done = await run_tether("watch", "--db", db_path, "--run", run_id)
            assert done.returncode == 1
            assert done.stderr.decode().strip() == (
                f"tether: there is no run {run_id} in {db_path}; see tether runs --db {db_path}"
            )
            done = await run_tether("watch", "--db", db_path, "--conversation", "c", "--run", "r")
            assert done.returncode == 2
            up.process.send_signal(signal.SIGTERM)
            assert await up.wait_exit() == 0
            await up.assert_everything_gone()


async def test_watch_plain_shows_an_open_question_with_the_answer_command_then_its_answer(owner: OwnerProcess) -> None:
    from tests.integration._agent_helpers import serving
    from tests.integration._ui_apps import QUESTION, asking

    db = owner.db
    with trio.fail_after(60):
        async with serving(db, asking, name="asking") as client:
            conversation_id = await client.create_conversation(agent="support")
            submission = await client.submit(conversation_id, kind="input", payload="ask about A1")
            run_id = submission.run_id
            assert run_id is not None
            async with watching("--db", db, "--run", run_id, "--plain") as plain:
                await plain.wait_for(lambda lines: any("--answer JSON" in line for line in lines), "the question")
                question = await open_approval(client)  # the open interaction: here, the question
                await client.respond(question.interaction_id, answer=False)
                await plain.wait_for(
                    lambda lines: any(f"run {run_id}: completed" in line for line in lines), "the completed run"
                )
    text = "\n".join(plain.lines)
    interaction_id = question.interaction_id
    assert f"question {interaction_id} waits: confirm asks: {QUESTION}" in text
    answer = (
        f'tether respond --db {db} {interaction_id} --answer JSON   (a JSON value of the schema {{"type":"boolean"}})'
    )
    assert answer in text
    assert f"question {interaction_id} answered false" in text
    assert "--approve" not in text and "--deny" not in text and "denied" not in text
