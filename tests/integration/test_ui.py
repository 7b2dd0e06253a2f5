"""``tether ui`` in a real browser: headless Debian ``chromium`` driven by Playwright (docs/ui.md). The page loads
behind its login token, shows an answer streaming before it is committed, and a person resolves an interrupted manual
tool call and answers an approval by pressing its buttons; the runs then complete. Without chromium or Playwright the
browser tests are skipped, saying which is missing. The page's guards (login, anti-forgery, origin, bounds) are
checked without a browser.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
import trio

import actors
from protocol import new_id as protocol_id
from runtime import stop_gracefully, tether_command
from tests.conftest import OwnerProcess
from tests.integration import _agent_apps
from tests.integration._agent_apps import STREAMED_ANSWER, build_streaming, read_ledger
from tests.integration._agent_helpers import ledger, run_in, served, serving, start_run, worker_process
from tests.integration._up_helpers import CHILD_ENV, ROOT

__all__ = ["ledger"]  # the fixture

TIMEOUT_S: Final = 60
POLL_S: Final = 0.02
BROWSER_TIMEOUT_MS: Final = 20_000
CHROMIUM: Final = shutil.which("chromium") or shutil.which("chromium-browser")
try:
    from playwright.sync_api import Page, sync_playwright
except ImportError:  # pragma: no cover - the test extra installs it
    sync_playwright = None

needs_browser = pytest.mark.skipif(
    CHROMIUM is None or sync_playwright is None,
    reason="the browser tests need Debian's chromium (apt-get install chromium; .ci/run installs it) and Playwright "
    "(the test extra)",
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.asynccontextmanager
async def ui_process(db: str, *extra: str) -> AsyncIterator[str]:
    """``tether ui`` on a free loopback port: the URL it printed first (with its login token); stopped and reaped."""
    port = free_port()
    command = tether_command("ui", "--db", db, "--listen", f"127.0.0.1:{port}", *extra)
    process = await trio.lowlevel.open_process(
        command, cwd=ROOT, env=CHILD_ENV, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        assert process.stdout is not None
        buffer = b""
        with trio.fail_after(TIMEOUT_S):
            while b"\n" not in buffer:
                chunk = await process.stdout.receive_some()
                assert chunk, f"tether ui ended before printing its URL (status {process.poll()})"
                buffer += chunk
        yield buffer.split(b"\n", 1)[0].decode()
    finally:
        await stop_gracefully(process)


@contextlib.contextmanager
def browser() -> Iterator[Page]:
    assert sync_playwright is not None and CHROMIUM is not None
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = launched.new_page()
            page.set_default_timeout(BROWSER_TIMEOUT_MS)
            yield page
        finally:
            launched.close()


async def in_browser(steps: Callable[[Page], Any]) -> Any:
    """Run ``steps`` against a fresh page in a thread (Playwright's sync API), while trio goes on."""

    def run() -> Any:
        with browser() as page:
            return steps(page)

    return await trio.to_thread.run_sync(run)


@needs_browser
async def test_the_page_shows_an_answer_streaming_before_it_is_committed(owner: OwnerProcess) -> None:
    ready = threading.Event()
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, build_streaming(delay_s=0.1)) as client, ui_process(owner.db) as url:
            conversation_id = await client.create_conversation(agent="support")
            base = url.split("/?", 1)[0]

            def steps(page: Page) -> tuple[str, str]:
                page.goto(url)
                page.goto(f"{base}/#/conversation/{conversation_id}")
                page.wait_for_selector("#transcript", state="attached")
                page.wait_for_selector(".live.on")  # the event stream is open
                ready.set()
                streaming = page.wait_for_selector("[data-stream]")
                assert streaming is not None
                partial = streaming.text_content() or ""
                answer = page.wait_for_selector(".entry.assistant:not(.streaming)")
                assert answer is not None
                return partial, answer.text_content() or ""

            async with trio.open_nursery() as nursery:
                result: list[tuple[str, str]] = []

                async def browse() -> None:
                    result.append(await in_browser(steps))

                nursery.start_soon(browse)
                while not ready.is_set():  # noqa: ASYNC110 (the browser's thread sets it)
                    await trio.sleep(POLL_S)
                await client.submit(conversation_id, kind="input", payload="Where is A1?")
            [(partial, final)] = result
    text = partial.removeprefix("streaming…")
    assert text and STREAMED_ANSWER.startswith(text) and len(text) < len(STREAMED_ANSWER)  # a piece, before the end
    assert final.endswith(STREAMED_ANSWER)


@needs_browser
async def test_a_person_resolves_an_interrupted_manual_call_from_the_page(owner: OwnerProcess, ledger: Path) -> None:
    gate = Path(os.environ["TETHER_TEST_GATE"])
    with trio.fail_after(TIMEOUT_S):
        async with actors.connect(owner.db) as client:
            async with worker_process(owner.db, "manual", ledger) as process:
                conversation_id, run_id = await start_run(client)
                while not read_ledger(ledger):  # noqa: ASYNC110 (another process writes it)
                    await trio.sleep(POLL_S)
                process.send_signal(signal.SIGKILL)
                await process.wait()
            gate.touch()
            await run_in(client, run_id, "needs_attention")
            async with served(owner.db, _agent_apps.manual, name="second"), ui_process(owner.db) as url:

                def steps(page: Page) -> str:
                    page.goto(url)
                    card = page.locator(f'[data-attention="{run_id}"]')
                    card.locator("input").fill(json.dumps({"order": "A1", "status": "checked by hand"}))
                    card.get_by_role("button", name="Resolve").click()
                    page.wait_for_selector(f'[data-run="{run_id}"] [data-status="completed"]')
                    return page.locator(f'[data-run="{run_id}"]').text_content() or ""

                row = await in_browser(steps)
            run = await client.run(run_id)
            entries = await client.entries(conversation_id)
    assert run.status == "completed" and "Your order shipped." in row
    [result] = [entry.data for entry in entries if entry.kind == "tether.tool_result"]
    assert isinstance(result, dict) and "checked by hand" in str(result["content"])
    assert len(read_ledger(ledger)) == 1  # the manual call never ran again


@needs_browser
async def test_a_person_approves_a_call_from_the_page(owner: OwnerProcess, ledger: Path) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, _agent_apps.approving) as client, ui_process(owner.db) as url:
            _, run_id = await start_run(client)
            await run_in(client, run_id, "waiting")

            def steps(page: Page) -> None:
                page.goto(url)
                card = page.locator("[data-interaction]")
                card.locator("input").fill("fine by me")
                card.get_by_role("button", name="Approve").click()
                page.wait_for_selector(f'[data-run="{run_id}"] [data-status="completed"]')

            await in_browser(steps)
            run = await client.run(run_id)
            [interaction] = await client.interactions(status=None, run_id=run_id)
    assert run.status == "completed"
    assert interaction.answer is not None
    assert (interaction.answer.approve, interaction.answer.note, interaction.answer.responded_by) == (
        True,
        "fine by me",
        "tether ui",
    )


async def test_the_page_admits_only_its_login_and_its_own_actions(owner: OwnerProcess) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, _agent_apps.approving) as client, ui_process(owner.db) as url:
            _, run_id = await start_run(client)
            await run_in(client, run_id, "waiting")
            base, token = url.split("/?token=", 1)
            async with httpx.AsyncClient(base_url=base) as http:
                for path in ("/", "/api/overview", f"/api/runs/{run_id}", "/assets/app.js", "/api/events"):
                    assert (await http.get(path)).status_code == 401, path  # no login: nothing shown
                assert (await http.get("/?token=wrong")).status_code == 401
                login = await http.get(f"/?token={token}")
                assert login.status_code == 303 and "httponly" in login.headers["set-cookie"].lower()
                assert "samesite=strict" in login.headers["set-cookie"].lower()
                page = (await http.get("/")).text
                csrf = page.split('name="tether-csrf" content="', 1)[1].split('"', 1)[0]
                overview = (await http.get("/api/overview")).json()
                [interaction] = overview["interactions"]
                act = {"interaction_id": interaction["interaction_id"], "approve": False}
                # An action without the page's anti-forgery value, or from another origin, is refused.
                assert (await http.post("/api/actions/respond", json=act)).status_code == 403
                foreign = {"X-Tether-CSRF": csrf, "Origin": "http://evil.example"}
                assert (await http.post("/api/actions/respond", json=act, headers=foreign)).status_code == 403
                headers = {"X-Tether-CSRF": csrf, "Origin": base}
                huge = await http.post("/api/actions/respond", content=b"{" + b" " * (2 << 20) + b"}", headers=headers)
                assert huge.status_code == 413
                wrong = await http.post(
                    "/api/actions/respond", json={"interaction_id": act["interaction_id"]}, headers=headers
                )
                assert wrong.status_code == 400 and "approve" in wrong.json()["error"]
                assert (await client.run(run_id)).status == "waiting"  # nothing of the above changed anything
                done = await http.post("/api/actions/respond", json=act, headers=headers)
                assert done.status_code == 200 and done.json()["status"] == "answered"
                again = await http.post("/api/actions/respond", json={**act, "approve": True}, headers=headers)
                assert again.status_code == 409 and "already answered" in again.json()["error"]
            run = await client.wait_for_run(run_id)
    assert run.status == "completed"  # denied: the model read the error and answered


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command for a certificate")
async def test_the_page_is_served_over_tls_and_beyond_loopback_only_so(owner: OwnerProcess, tmp_path: Path) -> None:
    cert, key = tmp_path / "ui.crt", tmp_path / "ui.key"
    await trio.run_process(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256"),
            *("-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost"),
            *("-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ],
        capture_stdout=True,
        capture_stderr=True,
    )
    with trio.fail_after(TIMEOUT_S):
        refused = await trio.run_process(
            tether_command("ui", "--db", owner.db, "--listen", "0.0.0.0:0"), capture_stderr=True, check=False
        )
        assert refused.returncode == 2 and b"not a loopback address" in refused.stderr  # nothing started
        async with ui_process(owner.db, "--tls-cert", str(cert), "--tls-key", str(key)) as url:
            assert url.startswith("https://127.0.0.1:")
            base, token = url.split("/?token=", 1)
            trusted = ssl.create_default_context(cafile=str(cert))
            async with httpx.AsyncClient(base_url=base, verify=trusted) as http:
                login = await http.get(f"/?token={token}")
                assert login.status_code == 303 and "secure" in login.headers["set-cookie"].lower()
                csrf = (await http.get("/")).text.split('name="tether-csrf" content="', 1)[1].split('"', 1)[0]
                headers = {"X-Tether-CSRF": csrf, "Origin": base}
                missing = await http.post("/api/actions/retry", json={"run_id": protocol_id()}, headers=headers)
                assert missing.status_code == 404  # the owner's refusal, through the page's own origin over https
                plain = {"X-Tether-CSRF": csrf, "Origin": base.replace("https://", "http://")}
                assert (await http.post("/api/actions/retry", json={"run_id": "x"}, headers=plain)).status_code == 403
