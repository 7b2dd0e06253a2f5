"""The app ``bench/steps.py`` runs on its worker (importable as ``_steps_app:app`` with ``bench/`` on the path)."""

from __future__ import annotations

import actors

app = actors.App("bench-steps")


async def step(rt: actors.Phase) -> None:
    """One durable step: the trivial work, then one new committed checkpoint (the last step completes instead)."""
    done = int(rt.checkpoint["done"]) + 1
    if done >= int(rt.input["steps"]):
        await rt.complete(done)
        return
    await rt.advance({"phase": "step", "done": done})


app.define_task("bench.steps", version=1, initial=lambda _: {"phase": "step", "done": 0}, phases={"step": step})
