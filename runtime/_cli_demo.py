"""``tether demo``: the main job, shown in five parts (``runtime._demo``)."""

from __future__ import annotations

import argparse
import os
from typing import Any

import trio

from ._args import positive
from ._cli_shared import fail
from ._exits import EXIT_USAGE


def add_demo_command(commands: Any) -> None:
    """``tether demo``."""
    demo = commands.add_parser(
        "demo",
        help=(
            "the main job: durable checkouts and a durable agent under tether up, an agent's answer streaming, "
            "the commit path surviving a SIGKILL, then an agent asking a subagent and a person"
        ),
        description=(
            "Part 1 (tasks): run tether up with two workers serving the demo app and three checkouts of four "
            "payments each, shown live: a declined card (fail_fast aborts the other payments bottom-up, each "
            "refunding its charge), a cancelled checkout (the payments' abort handlers end before the "
            "checkout's), and a worker killed with SIGKILL mid-payment; then check the fake bank's ledger: every "
            "card charged at most once. Part 2 (agents): under tether up, the demo app's support agent (a "
            "scripted model) calls a safe, an idempotent and a manual tool, one behind an approval, shown live: "
            "the approval is answered (tether respond), the worker is SIGKILLed while the tools run, the safe "
            "tool runs again, the idempotent one runs again under the same operation id (the fake desk answers "
            "the repeat from its key), the manual one stops the run as needs_attention and is resolved (tether "
            "resolve); the answer arrives, and the desk's ledger shows no effect done twice. Part 3 (agent): the "
            "demo app's agent tracker (a scripted model) looks an order up and streams its answer, shown as "
            "tether watch --plain shows it, piece by piece before the answer is committed; with --model NAME it "
            "runs on a real model (OPENAI_API_KEY or OPENAI_BASE_URL). Part 4 (commits): "
            "two writer processes append entries, the owner is SIGKILLed mid-stream and started again, and every "
            "acknowledged entry is stored exactly once. Part 5 (research): the demo app's agent analyst asks the "
            "agent researcher (a subagent), then a tool of it asks a person how much to refund and pays it through "
            "a nested call; the worker is SIGKILLed while the question is open, the question is answered (tether "
            "respond --answer), and nothing is asked, run or paid twice."
        ),
    )
    demo.set_defaults(handler=run_demo_command)
    demo.add_argument("--db", default="tether.db", help="database to use (default ./tether.db)")
    demo.add_argument(
        "--part",
        choices=("all", "tasks", "agents", "agent", "commits", "research"),
        default="all",
        help="which part to run (default all)",
    )
    demo.add_argument(
        "--model",
        metavar="NAME",
        help="part agent: run the agent on this real model (such as gpt-4o-mini) through the Chat Completions API "
        "at OPENAI_BASE_URL (default api.openai.com) with OPENAI_API_KEY; one of the two must be set",
    )
    demo.add_argument(
        "--entries", type=positive, default=400, help="part commits: entries each writer appends (default 400)"
    )


def run_demo_command(args: argparse.Namespace) -> int:
    from ._demo import run_demo
    from ._demo_stream import real_model_problem

    if args.model is not None:
        if args.part != "agent":
            return fail(f"demo: --model runs part agent only (--part agent), not --part {args.part}", EXIT_USAGE)
        problem = real_model_problem(os.environ)
        if problem is not None:
            return fail(f"demo: {problem}", EXIT_USAGE)
    status: int = trio.run(run_demo, args.db, args.entries, args.part, args.model)
    return status
