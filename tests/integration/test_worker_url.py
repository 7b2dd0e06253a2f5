"""A worker may attach from another host: given the owner's URL and token instead of the database path."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest
import trio

import actors
from runtime import stop_gracefully, tether_command
from tests.conftest import OwnerProcess


async def test_a_worker_attaches_by_url_and_token(owner: OwnerProcess) -> None:
    assert owner.info is not None
    environment = {**os.environ, "TETHER_TOKEN": owner.info.token}
    command = tether_command("worker", "--url", owner.info.url, "--app", "runtime.demo_app:app", "--name", "remote")
    worker = await trio.lowlevel.open_process(command, env=environment, stdout=subprocess.DEVNULL)
    try:
        with trio.fail_after(20):
            async with actors.connect(db=owner.db, role="reader") as client:
                while True:
                    remote = [peer for peer in await client.peers() if peer.peer_name == "remote"]
                    if remote and remote[0].announced:
                        break
                    await trio.sleep(0.02)
        assert remote[0].role == "worker"
        assert remote[0].pid == worker.pid
        assert remote[0].app == "demo"
    finally:
        status = await stop_gracefully(worker)
    assert status == 0


async def test_a_worker_given_a_url_without_a_token_fails_at_once(owner: OwnerProcess) -> None:
    assert owner.info is not None
    environment = {key: value for key, value in os.environ.items() if key != "TETHER_TOKEN"}
    command = tether_command("worker", "--url", owner.info.url, "--app", "runtime.demo_app:app")
    with trio.fail_after(20):
        result = await trio.run_process(command, env=environment, capture_stdout=True, capture_stderr=True, check=False)
    assert result.returncode == 2  # bad usage: no retry can mend it
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "token" in lines[0]


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (("--url", "wss://127.0.0.1:9", "--token", "t", "--ca", "/no/such/ca.pem"), "/no/such/ca.pem"),
        (("--url", "http://127.0.0.1:9", "--token", "t"), "ws:// or wss://"),
    ],
)
async def test_a_worker_that_no_retry_can_mend_fails_at_once_with_usage(extra: tuple[str, ...], said: str) -> None:
    """Before, an unreadable CA made the worker retry forever, logging nothing."""
    command = tether_command("worker", *extra, "--app", "runtime.demo_app:app")
    with trio.fail_after(20):
        result = await trio.run_process(command, capture_stdout=True, capture_stderr=True, check=False)
    assert result.returncode == 2
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and said in lines[0] and "nothing was tried" in lines[0], lines


async def test_a_worker_that_cannot_reach_its_owner_says_so_and_keeps_trying(tmp_path: Path) -> None:
    """A real connection failure is retried (the owner may come), and logged: the first failure with its back-off."""
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    stderr_path = tmp_path / "worker.stderr"
    command = tether_command(
        "worker", "--url", f"ws://127.0.0.1:{port}", "--token", "t", "--app", "runtime.demo_app:app"
    )
    with trio.fail_after(20), open(stderr_path, "wb") as stderr:
        worker = await trio.lowlevel.open_process(command, stderr=stderr, stdout=subprocess.DEVNULL)
        try:
            while True:
                text = stderr_path.read_text(errors="replace")
                if "cannot reach the owner" in text:
                    break
                assert worker.poll() is None, text
                await trio.sleep(0.05)
        finally:
            status = await stop_gracefully(worker)
    assert status == 0
    [line] = [line for line in text.splitlines() if "cannot reach the owner" in line]
    assert f"cannot reach the owner at ws://127.0.0.1:{port}" in line and "trying again in 0.05 s" in line, line
