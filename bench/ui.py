"""How soon ``tether ui``'s page shows a commit: the time from a commit's acknowledgement to its entry on the page.

    python bench/ui.py [--json] [--commits 60]

An owner (``tether owner``) and ``tether ui`` are started on a fresh database; a conversation is opened in headless
Debian ``chromium`` (Playwright); then this process appends ``--commits`` entries to the conversation, one at a time,
each with a unique text, and measures for each the time from the acknowledgement of its commit (``client.append``
returned) to:

- ``event``: the page's server-sent event naming the conversation arriving at a plain HTTP reader of ``/api/events``
  (the owner's watch, the ui's fan-out, the stream): the push alone;
- ``page``: the entry's text in the page's DOM (the event, the page reading the conversation again, its render).

Reported as p50/p99/max in milliseconds, beside the in-process commit baseline of ``bench/commit_throughput.py``
measured in the same run (its median latency per commit), so a noisy machine shows in both.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import trio

import actors
from runtime import stop_gracefully, tether_command, wait_for_owner

sys.path.insert(0, str(Path(__file__).parent))
from commit_throughput import baseline_commits_per_s

OBSERVE = """() => {
    window.__seen = {};
    new MutationObserver(() => {
        const now = Date.now();
        for (const node of document.querySelectorAll(".entry")) {
            const text = node.textContent;
            const found = text.match(/marker-[0-9]+-[0-9]+/);
            if (found && window.__seen[found[0]] === undefined) window.__seen[found[0]] = now;
        }
    }).observe(document.getElementById("main"), { childList: true, subtree: true, characterData: true });
}"""
"""Installed in the page: the wall-clock time each marker's entry first appears in its DOM."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
    }


async def measure(commits: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("bench/ui.py needs Debian's chromium (apt-get install chromium)")
    folder = tempfile.mkdtemp(prefix="tether-bench-ui-")
    db = str(Path(folder) / "bench.db")
    owner = await trio.lowlevel.open_process(tether_command("owner", "--db", db), stderr=subprocess.DEVNULL)
    ui = None
    try:
        await wait_for_owner(db, owner, timeout_s=30)
        port = _free_port()
        ui = await trio.lowlevel.open_process(
            tether_command("ui", "--db", db, "--listen", f"127.0.0.1:{port}"), stdout=subprocess.PIPE
        )
        assert ui.stdout is not None
        line = b""
        while b"\n" not in line:
            line += await ui.stdout.receive_some()
        url = line.split(b"\n", 1)[0].decode()
        base, token = url.split("/?token=", 1)
        async with actors.connect(db=db, name="bench-ui") as client:
            conversation_id = await client.create_conversation()
            ready, shown, done = threading.Event(), {}, threading.Event()
            wanted: list[str] = []

            def browse() -> None:
                with sync_playwright() as playwright:
                    browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
                    page = browser.new_page()
                    page.goto(url)
                    page.goto(f"{base}/#/conversation/{conversation_id}")
                    page.wait_for_selector("#transcript", state="attached")
                    page.wait_for_selector(".live.on")
                    # The page notes, in its own clock (the wall clock, as this process's), when each marker shows.
                    page.evaluate(OBSERVE)
                    ready.set()
                    for index in range(commits):
                        while len(wanted) <= index:
                            time.sleep(0.0005)
                        page.wait_for_function(f"window.__seen[{json.dumps(wanted[index])}] !== undefined")
                        shown[index] = page.evaluate(f"window.__seen[{json.dumps(wanted[index])}]") / 1000
                    browser.close()
                    done.set()

            arrivals: list[float] = []

            async def events() -> None:
                headers = {"Authorization": f"Bearer {token}"}
                async with (
                    httpx.AsyncClient(base_url=base, timeout=None) as http,
                    http.stream("GET", "/api/events", headers=headers) as stream,
                ):
                    async for text in stream.aiter_lines():
                        if text.startswith("data:") and '"change"' in text and conversation_id in text:
                            arrivals.append(time.time())

            acked: list[float] = []
            event_latency: list[float] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync, browse)
                nursery.start_soon(events)
                while not ready.is_set():  # (the browser thread sets it)
                    await trio.sleep(0.01)
                for index in range(commits):
                    seen = len(arrivals)
                    text = f"marker-{index}-{time.time_ns()}"
                    await client.append(conversation_id, kind="bench.note", data={"text": text})
                    acked.append(time.time())
                    wanted.append(text)
                    while len(arrivals) == seen:
                        await trio.sleep(0.0005)
                    event_latency.append(max(0.0, arrivals[seen] - acked[-1]))  # (it may beat the ack home)
                    while index not in shown:
                        await trio.sleep(0.0005)
                    await trio.sleep(0.05)  # the page idle again before the next commit
                nursery.cancel_scope.cancel()
        page_latency = [shown[index] - acked[index] for index in range(commits)]
        return {"event": _quantiles(event_latency), "page": _quantiles(page_latency)}
    finally:
        if ui is not None:
            await stop_gracefully(ui)
        await stop_gracefully(owner)
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--commits", type=int, default=60)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tether-bench-ui-baseline-") as directory:
        baseline = baseline_commits_per_s(directory, "normal", 2.0)
    result = trio.run(measure, args.commits)
    result = {"benchmark": "ui", "commits": args.commits, "baseline_commit_ms": round(1000 / baseline, 4), **result}
    if args.json:
        print(json.dumps(result))
        return
    print(f"in-process baseline: {baseline:,.0f} commits/s ({result['baseline_commit_ms']} ms per commit)")
    labels = (("event", "commit acknowledged -> its event at an SSE reader"), ("page", "-> its text on the page"))
    for name, label in labels:
        figures = result[name]
        print(
            f"{label:<52} p50 {figures['p50_ms']:>7} ms  p99 {figures['p99_ms']:>7} ms  max {figures['max_ms']:>7} ms"
        )


if __name__ == "__main__":
    main()
