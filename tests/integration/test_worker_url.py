"""A worker may attach from another host: given the owner's URL and token instead of the database path."""

from __future__ import annotations

import os
import subprocess

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
    assert result.returncode == 1
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "token" in lines[0]
