"""The app ``bench/tasks.py`` runs under ``tether up`` (importable as ``_task_app:app`` with ``bench/`` on the path)."""

from __future__ import annotations

import time
from typing import Any

import trio

import actors

app = actors.App("bench")


async def chain_start(rt: actors.Phase) -> None:
    """A chain: each task owns the next and waits on it; the last completes at once."""
    depth = int(rt.input["depth"])
    if depth <= 1:
        await rt.complete(depth)
        return
    async with rt.commit() as tx:
        child = tx.create_task("bench.chain", {"depth": depth - 1})
        tx.wait(on=[child], checkpoint={"phase": "done"})


async def done(rt: actors.Phase) -> None:
    await rt.complete(None)


async def fanout_start(rt: actors.Phase) -> None:
    """A parent of ``children`` leaves, waiting on them all_settled."""
    async with rt.commit() as tx:
        children = [tx.create_task("bench.leaf", None) for _ in range(int(rt.input["children"]))]
        tx.wait(on=children, policy="all_settled", checkpoint={"phase": "done"})


async def leaf(rt: actors.Phase) -> None:
    await rt.complete(None)


async def tree_start(rt: actors.Phase) -> None:
    """A tree: ``levels`` are the branching factors below this node; the leaves sleep (far in the future)."""
    levels: list[Any] = rt.input["levels"]
    if not levels:
        await rt.sleep_until(rt.now_ms() + 3_600_000, {"phase": "done"})
        return
    async with rt.commit() as tx:
        children = [tx.create_task("bench.tree", {"levels": levels[1:]}) for _ in range(int(levels[0]))]
        tx.wait(on=children, checkpoint={"phase": "done"})


async def hold(rt: actors.Phase) -> None:
    """Runs until cut off; when run again after a restart, notes the time in the file its input names."""
    if rt.restarts:
        with open(rt.input["note"], "a", encoding="utf-8") as note:
            note.write(f"{time.time()}\n")
        await rt.complete(None)
        return
    await trio.sleep_forever()


app.define_task(
    "bench.chain", version=1, initial=lambda _: {"phase": "start"}, phases={"start": chain_start, "done": done}
)
app.define_task(
    "bench.fanout", version=1, initial=lambda _: {"phase": "start"}, phases={"start": fanout_start, "done": done}
)
app.define_task("bench.leaf", version=1, initial=lambda _: {"phase": "run"}, phases={"run": leaf})
app.define_task(
    "bench.tree", version=1, initial=lambda _: {"phase": "start"}, phases={"start": tree_start, "done": done}
)
app.define_task("bench.hold", version=1, initial=lambda _: {"phase": "run"}, phases={"run": hold})
