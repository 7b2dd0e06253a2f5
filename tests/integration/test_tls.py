"""Exposure: an owner listening beyond loopback serves wss:// (or was told --insecure-listen), its runtime file
names an address peers can reach and the CA they verify it with, and clients verify it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import trio

import actors
from protocol import OwnerUnavailable, runtime_path
from runtime import stop_gracefully, tether_command
from tests.conftest import OwnerProcess

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command for a certificate")


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 and localhost, and its key (made by the openssl command)."""
    cert, key = tmp_path / "owner.crt", tmp_path / "owner.key"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"),
            *("-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost"),
            *("-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return str(cert), str(key)


async def test_a_wildcard_listen_with_tls_serves_wss_and_clients_verify_it(
    db_path: str, certificate: tuple[str, str], tmp_path: Path
) -> None:
    cert, key = certificate
    owner = OwnerProcess(db_path, "--listen", "0.0.0.0:0", "--tls-cert", cert, "--tls-key", key)
    info = await owner.start()
    try:
        with trio.fail_after(60):
            async with actors.connect(db=db_path) as client:  # the runtime file's URL and CA
                conversation_id = await client.create_conversation()
                await client.append(conversation_id, kind="app.note", data={"over": "tls"})
            async with actors.connect(url=info.url, token=info.token, ca=cert) as remote:
                entries = await remote.entries(conversation_id)
            with pytest.raises(OwnerUnavailable) as unverified:  # the system's CAs do not know this certificate
                async with actors.connect(url=info.url, token=info.token, reconnect=False):
                    pass
            with pytest.raises(OwnerUnavailable):  # a plain ws:// client gets nowhere, the token never sent
                async with actors.connect(url=info.url.replace("wss://", "ws://"), token=info.token):
                    pass
            async with actors.connect(db=db_path) as still:
                assert (await still.ping()).head_seq == 2
    finally:
        await owner.close()
    assert info.url.startswith("wss://127.0.0.1:"), info.url
    assert info.tls_ca == str(Path(cert).resolve())
    assert [entry.data for entry in entries] == [{"over": "tls"}]
    assert "verified" in str(unverified.value)


async def test_a_non_loopback_listen_without_tls_is_refused_and_changes_nothing(db_path: str) -> None:
    with trio.fail_after(60):
        result = await trio.run_process(
            tether_command("owner", "--db", db_path, "--listen", "0.0.0.0:0"), capture_stderr=True, check=False
        )
    assert result.returncode == 2
    assert b"--tls-cert" in result.stderr and b"--insecure-listen" in result.stderr
    assert not Path(db_path).exists()
    assert not runtime_path(db_path).exists()


async def test_tls_files_that_cannot_be_used_are_refused_before_anything_starts(
    db_path: str, certificate: tuple[str, str], tmp_path: Path
) -> None:
    cert, _ = certificate
    other_key = tmp_path / "other.key"
    await trio.run_process(
        ["openssl", "genpkey", "-algorithm", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", str(other_key)],
        capture_stdout=True,
        capture_stderr=True,
    )
    with trio.fail_after(60):
        mismatched = await trio.run_process(
            tether_command("owner", "--db", db_path, "--tls-cert", cert, "--tls-key", str(other_key)),
            capture_stderr=True,
            check=False,
        )
        half = await trio.run_process(
            tether_command("owner", "--db", db_path, "--tls-cert", cert), capture_stderr=True, check=False
        )
    assert (mismatched.returncode, half.returncode) == (2, 2)
    assert cert.encode() in mismatched.stderr
    assert b"--tls-key" in half.stderr
    assert not Path(db_path).exists()


async def test_insecure_listen_on_a_wildcard_names_a_reachable_address(db_path: str) -> None:
    owner = OwnerProcess(db_path, "--listen", "0.0.0.0:0", "--insecure-listen")
    info = await owner.start()
    try:
        with trio.fail_after(60):
            async with actors.connect(db=db_path) as client:
                await client.create_conversation()
    finally:
        await owner.close()
    assert info.url.startswith("ws://127.0.0.1:"), info.url
    assert info.tls_ca is None


async def test_a_worker_on_another_host_attaches_over_wss_with_the_ca(
    db_path: str, certificate: tuple[str, str]
) -> None:
    cert, key = certificate
    owner = OwnerProcess(db_path, "--listen", "0.0.0.0:0", "--tls-cert", cert, "--tls-key", key)
    info = await owner.start()
    environment = {**os.environ, "TETHER_TOKEN": info.token}
    command = tether_command(
        "worker", "--url", info.url, "--ca", cert, "--app", "runtime.demo_app:app", "--name", "remote-tls"
    )
    worker = await trio.lowlevel.open_process(command, env=environment, stdout=subprocess.DEVNULL)
    try:
        with trio.fail_after(60):
            async with actors.connect(db=db_path, role="reader") as client:
                while True:
                    remote = [peer for peer in await client.peers() if peer.peer_name == "remote-tls"]
                    if remote and remote[0].announced:
                        break
                    await trio.sleep(0.05)
    finally:
        status = await stop_gracefully(worker)
        await owner.close()
    assert remote[0].role == "worker" and remote[0].pid == worker.pid
    assert status == 0


async def test_tether_up_refuses_a_non_loopback_listen_without_tls_before_starting_anything(db_path: str) -> None:
    with trio.fail_after(60):
        result = await trio.run_process(
            tether_command("up", "--db", db_path, "--listen", "0.0.0.0:0", "--workers", "0"),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 2
    assert b"--insecure-listen" in result.stderr
    assert not Path(db_path).exists()
