"""``tether ui`` in a real browser: headless Debian ``chromium`` driven by Playwright (docs/ui.md). The page loads
behind its login token, shows an answer streaming before it is committed, a running tool call and the question it
asks, how each input was admitted, and a refusal's code; a person resolves an interrupted manual tool call (its card
names the tool and its arguments) and answers an approval by pressing its buttons; the runs then complete. Without an
owner the page says so, and comes back by itself once one runs. Without chromium or Playwright the browser tests are
skipped, saying which is missing; they share one browser (a fresh context, so no cookie, for each test). The page's
guards (login, anti-forgery, origin, bounds) are checked without a browser.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
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
from runtime._ui import OWNER_WAIT_S
from storage_owner.store import SqliteStore
from tests.conftest import OwnerProcess
from tests.integration import _agent_apps, _ui_apps
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


class Browser:
    """One headless chromium for a module's tests, driven by a thread of its own (Playwright's sync API belongs to
    the thread that started it): :meth:`run` gives each test's steps a fresh context (no cookie) and page."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[Callable[[Page], Any], list[Any], threading.Event] | None] = queue.Queue()
        self._launched = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="chromium", daemon=True)
        self._thread.start()
        self._launched.wait(timeout=BROWSER_TIMEOUT_MS / 1000)  # its processes run before a test counts its own

    def _serve(self) -> None:
        assert sync_playwright is not None and CHROMIUM is not None
        with sync_playwright() as playwright:
            try:
                launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            except BaseException as exc:  # every test that asks for the browser raises it
                self._failure = exc
                raise
            finally:
                self._launched.set()
            try:
                while (job := self._jobs.get()) is not None:
                    steps, outcome, done = job
                    context = launched.new_context()
                    try:
                        page = context.new_page()
                        page.set_default_timeout(BROWSER_TIMEOUT_MS)
                        outcome.append(steps(page))
                    except BaseException as exc:  # handed to the test, which raises it
                        outcome.append(exc)
                    finally:
                        context.close()
                        done.set()
            finally:
                launched.close()

    async def run(self, steps: Callable[[Page], Any]) -> Any:
        """Run ``steps`` against a fresh page in the browser's thread, while trio goes on; its result, or its
        error raised here."""
        if self._failure is not None:
            raise self._failure
        outcome: list[Any] = []
        done = threading.Event()
        self._jobs.put((steps, outcome, done))
        await trio.to_thread.run_sync(done.wait, abandon_on_cancel=True)  # (a test's deadline still ends it)
        [result] = outcome
        if isinstance(result, BaseException):
            raise result
        return result

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=30)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    shared = Browser()
    try:
        yield shared
    finally:
        shared.close()


async def wait_until(event: threading.Event) -> None:
    """Until the browser's thread sets ``event``."""
    while not event.is_set():  # noqa: ASYNC110 (the browser's thread sets it)
        await trio.sleep(POLL_S)


@needs_browser
async def test_the_page_shows_an_answer_streaming_before_it_is_committed(owner: OwnerProcess, browser: Browser) -> None:
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
                    result.append(await browser.run(steps))

                nursery.start_soon(browse)
                await wait_until(ready)
                await client.submit(conversation_id, kind="input", payload="Where is A1?")
            [(partial, final)] = result
    text = partial.removeprefix("streaming…")
    assert text and STREAMED_ANSWER.startswith(text) and len(text) < len(STREAMED_ANSWER)  # a piece, before the end
    assert final.endswith(STREAMED_ANSWER)


@needs_browser
async def test_a_person_resolves_an_interrupted_manual_call_from_the_page(
    owner: OwnerProcess, ledger: Path, browser: Browser
) -> None:
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

                def steps(page: Page) -> tuple[str, str, str]:
                    page.goto(url)
                    card = page.locator(f'[data-attention="{run_id}"]')
                    tool = card.locator("[data-tool]").text_content() or ""
                    arguments = card.locator("[data-arguments]").text_content() or ""
                    card.locator("input").fill(json.dumps({"order": "A1", "status": "checked by hand"}))
                    card.get_by_role("button", name="Resolve").click()
                    page.wait_for_selector(f'[data-run="{run_id}"] [data-status="completed"]')
                    return tool, arguments, page.locator(f'[data-run="{run_id}"]').text_content() or ""

                tool, arguments, row = await browser.run(steps)
            run = await client.run(run_id)
            entries = await client.entries(conversation_id)
    # The card named the call a person reconciles: its tool and its exact arguments.
    assert (tool, json.loads(arguments)) == ("lookup", {"order_id": "A1", "block": True})
    assert run.status == "completed" and "Your order shipped." in row
    [result] = [entry.data for entry in entries if entry.kind == "tether.tool_result"]
    assert isinstance(result, dict) and "checked by hand" in str(result["content"])
    assert len(read_ledger(ledger)) == 1  # the manual call never ran again


@needs_browser
async def test_a_person_approves_a_call_from_the_page(owner: OwnerProcess, ledger: Path, browser: Browser) -> None:
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

            await browser.run(steps)
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
                assert huge.status_code == 413 and huge.headers["connection"] == "close"  # its body was not read
                wrong = await http.post(
                    "/api/actions/respond", json={"interaction_id": act["interaction_id"]}, headers=headers
                )
                assert wrong.status_code == 400 and wrong.json()["error"]["code"] == "invalid"
                assert (await client.run(run_id)).status == "waiting"  # nothing of the above changed anything
                done = await http.post("/api/actions/respond", json=act, headers=headers)
                assert done.status_code == 200 and done.json()["status"] == "answered"
                again = await http.post("/api/actions/respond", json={**act, "approve": True}, headers=headers)
                error = again.json()["error"]  # the owner's refusal, in its code and its words, nothing else
                assert (
                    again.status_code == 409 and again.json() == {"error": error} and set(error) == {"code", "message"}
                )
                assert error["code"] == "conflict" and "already answered" in error["message"]
                missing = await http.get(f"/api/runs/{protocol_id()}")
                assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
                icon = await http.get("/favicon.ico")
                assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")
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


async def refused_at_once(http: httpx.AsyncClient) -> str:
    """``/api/overview`` while no owner answers: refused ``owner_unavailable`` without waiting for one (what the
    old ui did: its calls hung for the client's 30 s reconnection timeout); the refusal's message."""
    started_s = trio.current_time()
    answer = await http.get("/api/overview")
    elapsed_s = trio.current_time() - started_s
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "owner_unavailable"
    assert elapsed_s < OWNER_WAIT_S + 1
    return str(answer.json()["error"]["message"])


@needs_browser
async def test_without_an_owner_the_page_says_so_and_comes_back_by_itself(db_path: str, browser: Browser) -> None:
    SqliteStore.open(db_path).close()  # a database whose owner does not run (yet)
    owner = OwnerProcess(db_path)
    shown, back = threading.Event(), threading.Event()
    with trio.fail_after(TIMEOUT_S):
        async with ui_process(db_path) as url:  # it serves (the old ui gave up after 11 s, printing no URL)
            base, token = url.split("/?token=", 1)
            async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"}) as http:
                assert f"tether up --db {db_path}" in await refused_at_once(http)

                def steps(page: Page) -> tuple[str, str, str]:
                    page.goto(url)
                    said = page.wait_for_selector('[data-owner="down"]')
                    assert said is not None
                    header = page.wait_for_selector(".live.down")
                    assert header is not None
                    down = (said.text_content() or "", header.text_content() or "")
                    shown.set()
                    page.wait_for_selector(".live.on")  # the owner answers: the page reads again by itself
                    page.wait_for_selector("h1:has-text('Needs a person')")
                    back.set()
                    again = page.wait_for_selector('[data-owner="down"]')  # and it stopped again
                    assert again is not None
                    return *down, again.text_content() or ""

                async with trio.open_nursery() as nursery:
                    seen: list[tuple[str, str, str]] = []

                    async def browse() -> None:
                        seen.append(await browser.run(steps))

                    nursery.start_soon(browse)
                    await wait_until(shown)
                    await owner.start()
                    try:
                        await wait_until(back)
                        assert (await http.get("/api/overview")).status_code == 200
                    finally:
                        await owner.close()
                await refused_at_once(http)
    [(said, header, again)] = seen
    assert f"tether up --db {db_path}" in said and header == "owner not running"
    assert f"tether up --db {db_path}" in again


@needs_browser
async def test_the_conversation_shows_a_running_tool_its_question_and_how_each_input_was_admitted(
    owner: OwnerProcess, browser: Browser
) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, _ui_apps.asking) as client, ui_process(owner.db) as url:
            conversation_id = await client.create_conversation(agent="support")
            base = url.split("/?", 1)[0]

            def steps(page: Page) -> dict[str, Any]:
                seen: dict[str, Any] = {}
                page.goto(url)
                page.goto(f"{base}/#/conversation/{conversation_id}")
                page.wait_for_selector(".live.on")
                page.locator("textarea").fill("ask about A1")
                page.get_by_role("button", name="Send", exact=True).click()
                # Live, with no reload: the tool call running (its arguments, its progress), and its question.
                tool = page.wait_for_selector("[data-running-tool]:has([data-tool-output]:has-text('looking up A1'))")
                question = page.wait_for_selector("[data-open-question]")
                assert tool is not None and question is not None
                seen["tool"], seen["question"] = tool.text_content(), question.text_content()
                asking = page.locator("[data-open-question]")
                asking.locator("input").fill("maybe")  # not a boolean: the owner refuses it
                asking.get_by_role("button", name="Answer").click()
                refused = page.wait_for_selector("[data-open-question] [data-code]")
                assert refused is not None
                seen["code"], seen["refusal"] = refused.get_attribute("data-code"), refused.text_content()
                page.locator("textarea").fill("also B2")
                page.get_by_role("button", name="Steer the running run").click()
                page.wait_for_selector('[data-submission][data-when-busy="steer"]')
                page.locator("textarea").fill("thanks")
                page.get_by_role("button", name="Send as a follow-up").click()
                page.wait_for_selector('[data-submission][data-when-busy="follow_up"]')
                seen["inbox"] = sorted(
                    (one.get_attribute("data-when-busy"), one.text_content() or "")
                    for one in page.locator("[data-submission]").all()
                )
                page.locator("[data-open-question] input").fill("true")
                page.locator("[data-open-question]").get_by_role("button", name="Answer").click()
                page.wait_for_selector(
                    f".entry.assistant:not(.streaming):has-text('{_ui_apps.NOTED}')"
                )  # the follow-up's answer
                seen["left"] = page.locator("[data-running-tool], [data-open-question], [data-submission]").count()
                seen["users"] = [
                    (one.get_attribute("data-when-busy"), one.locator(".who").text_content(), one.text_content())
                    for one in page.locator(".entry.user").all()
                ]
                return seen

            seen = await browser.run(steps)
            [interaction] = await client.interactions(status=None)
    assert "tool confirm" in seen["tool"] and "running" in seen["tool"] and '{"order_id":"A1"}' in seen["tool"]
    assert _ui_apps.QUESTION in seen["question"]
    assert seen["code"] == "invalid" and seen["refusal"].startswith("invalid")  # the project's code, shown
    [(follow_up, queued_after), (steer, joins)] = seen["inbox"]
    assert (follow_up, steer) == ("follow_up", "steer") and "follow-up" in queued_after and "steer" in joins
    assert seen["left"] == 0  # answered: no tool running, no question open, nothing waiting
    assert [(kind, who) for kind, who, _ in seen["users"]] == [
        ("input", "user"),
        ("steer", "user · steer"),
        ("input", "user"),
    ]
    sent = ("ask about A1", "also B2", "thanks")
    assert all(text.endswith(one) for (_, _, text), one in zip(seen["users"], sent, strict=True))
    assert interaction.answer is not None and interaction.answer.value is True


async def test_tether_ui_on_a_missing_database_fails_at_once(tmp_path: Path) -> None:
    missing = tmp_path / "nosuch.db"
    with trio.fail_after(TIMEOUT_S):
        started_s = trio.current_time()
        refused = await trio.run_process(
            tether_command("ui", "--db", str(missing), "--listen", "127.0.0.1:0"),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        elapsed_s = trio.current_time() - started_s
    # At once (the old ui waited 10 s for an owner first), one line naming the file and what to do, nothing made.
    lines = refused.stderr.decode().splitlines()
    assert refused.returncode == 1 and refused.stdout == b"" and len(lines) == 1
    assert f"{missing} does not exist" in lines[0] and f"tether up --db {missing}" in lines[0]
    assert elapsed_s < 8 and list(tmp_path.iterdir()) == []


@needs_browser
async def test_the_page_keeps_what_a_failed_attempt_said_marked_not_an_answer(
    owner: OwnerProcess, browser: Browser
) -> None:
    cut_at = 40
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, build_streaming(cut_after_chars=cut_at)) as client, ui_process(owner.db) as url:
            conversation_id, run_id = await start_run(client)
            run = await client.wait_for_run(run_id)  # attempt 1 cut mid-stream, attempt 2 answered (1 s later)
            assert run.status == "completed"
            base = url.split("/?", 1)[0]

            def steps(page: Page) -> dict[str, Any]:
                page.goto(url)
                page.goto(f"{base}/#/conversation/{conversation_id}")
                aborted = page.wait_for_selector(".entry.aborted")
                answer = page.wait_for_selector(".entry.assistant:not(.streaming)")
                assert aborted is not None and answer is not None
                return {
                    "aborted": aborted.text_content() or "",
                    "ended": aborted.get_attribute("data-aborted"),
                    "answer": answer.text_content() or "",
                    "order": page.eval_on_selector_all(
                        "#transcript .entry", "nodes => nodes.map((node) => node.className)"
                    ),
                }

            seen = await browser.run(steps)
    assert seen["ended"] == "failed"
    assert seen["aborted"] == (
        "assistant · attempt 1 failed · not an answer, never sent to the model" + STREAMED_ANSWER[:cut_at]
    )
    assert seen["answer"].endswith(STREAMED_ANSWER)
    assert seen["order"] == ["entry user", "entry aborted", "entry assistant"]
