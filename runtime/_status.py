"""``tether status`` and ``tether stop``: what runs for a database, found from the database path alone."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import trio

import actors
from protocol import ConnectionLost, OwnerUnavailable, RuntimeInfo, TetherError, read_runtime
from storage_owner.store import is_owned, lock_is_held, lock_path, read_schema_version

from ._connect import check_db
from ._supervisor import probe_name, read_state, supervisor_lock_path

STATUS_TIMEOUT_S: Final = 5.0
STOP_POLL_S: Final = 0.5
"""How often ``tether stop`` asks the owner what still runs."""
STOP_SHOWN: Final = 5
"""At most this many running phases are named in a line of ``tether stop``."""
SHORT_ID: Final = 8
T = TypeVar("T")


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _size_bytes(db: str) -> int:
    return sum(os.path.getsize(path) for path in (db, db + "-wal") if os.path.exists(path))


def ask_owner(db: str, name: str, question: Callable[[actors.Client], Awaitable[T]]) -> T | None:
    """Ask the owner of ``db`` something as a reader named ``name``; ``None`` if no owner answers in time.

    Only an absent or silent owner is ``None``: an owner that refuses us (a wrong token, another protocol
    version) or fails the request raises, since showing it as idle would hide the problem.
    """

    async def ask() -> T:
        with trio.fail_after(STATUS_TIMEOUT_S):
            async with actors.connect(db=db, role="reader", name=name, reconnect=False) as client:
                return await question(client)

    try:
        return trio.run(ask)
    except (OwnerUnavailable, ConnectionLost, trio.TooSlowError):
        return None


def collect_status(db: str) -> dict[str, Any]:
    """The status object ``tether status --json`` prints (see the README for its keys)."""
    db = check_db(db)
    info: RuntimeInfo | None
    try:
        info = read_runtime(db)
    except OwnerUnavailable:
        info = None
    owner_alive = is_owned(db)
    state = read_state(db)
    supervisor_alive = state is not None and lock_is_held(supervisor_lock_path(db))
    peers = ask_owner(db, "tether-status", actors.Client.peers) if owner_alive else None
    # A worker counts once it announced itself (until then its pid is unknown to the owner).
    worker_peers = [peer for peer in peers or [] if peer.role == "worker" and peer.announced]
    attached_pids = {peer.pid for peer in worker_peers}

    workers: list[dict[str, Any]] = []
    supervised_pids: set[int] = set()
    for child in (state or {}).get("workers", []) if supervisor_alive else []:
        pid = child.get("pid")
        supervised_pids.add(pid)
        workers.append(
            {
                "name": child.get("name"),
                "pid": pid,
                "alive": _pid_alive(pid),
                "attached": pid in attached_pids,
                "restarts": child.get("restarts", 0),
                "supervised": True,
            }
        )
    for peer in worker_peers:
        if peer.pid not in supervised_pids:
            workers.append(
                {
                    "name": peer.peer_name,
                    "pid": peer.pid,
                    "alive": True,
                    "attached": True,
                    "restarts": 0,
                    "supervised": False,
                }
            )
    owner_state = (state or {}).get("owner", {}) if supervisor_alive else {}
    probe = probe_name(state["pid"]) if supervisor_alive and state is not None else None
    owner_pid = info.pid if info is not None and owner_alive else None
    return {
        "db": db,
        "schema_version": read_schema_version(db),
        "size_bytes": _size_bytes(db),
        "url": info.url if info is not None and owner_alive else None,
        "supervisor": {"pid": state["pid"]} if supervisor_alive and state is not None else None,
        "owner": {
            "pid": owner_pid,
            "alive": owner_alive,
            # Alive (it holds the lock) but silent: stopped or hung (tether up kills such an owner: --liveness-timeout).
            "answering": peers is not None,
            "restarts": owner_state.get("restarts", 0),
        },
        "standby": _standby(state if supervisor_alive else None, owner_pid),
        "workers": workers,
        # Every other connection but the workers; neither this status read nor the supervisor's probe counts.
        "clients": max(0, sum(1 for peer in peers or [] if peer.role != "worker" and peer.peer_name != probe) - 1),
    }


def _standby(state: dict[str, Any] | None, owner_pid: int | None) -> dict[str, Any] | None:
    """The supervisor's warm standby (the next owner, started and waiting for the ownership lock), from its state
    file: ``None`` without a live supervisor or before it started one, or when the pid named is the owner's (the
    standby took over and the state file is not rewritten yet)."""
    pid = ((state or {}).get("standby") or {}).get("pid")
    if not isinstance(pid, int) or pid == owner_pid:
        return None
    return {"pid": pid, "alive": _pid_alive(pid)}


def format_status(status: dict[str, Any]) -> str:
    lines = [
        f"database    {status['db']}  (schema {status['schema_version']}, {status['size_bytes']:,} bytes)",
        f"supervisor  {'pid ' + str(status['supervisor']['pid']) if status['supervisor'] else 'none'}",
    ]
    owner = status["owner"]
    if owner["alive"] and not owner["answering"]:
        lines.append(
            f"owner       pid {owner['pid']} on {status['url']}, NOT ANSWERING (it holds the database but did not "
            f"reply: stopped or hung), {owner['restarts']} restarts"
        )
    elif owner["alive"]:
        lines.append(f"owner       pid {owner['pid']} on {status['url']}, {owner['restarts']} restarts")
    else:
        lines.append("owner       not running")
    standby = status["standby"]
    if standby is None:
        lines.append("standby     none")
    else:
        state = "waiting to take over" if standby["alive"] else "not running"
        lines.append(f"standby     pid {standby['pid']}  {state}")
    if not status["workers"]:
        lines.append("workers     none")
    for worker in status["workers"]:
        state = "attached" if worker["attached"] else ("alive, not attached" if worker["alive"] else "not running")
        if worker["alive"] and owner["alive"] and not owner["answering"]:
            state = "alive, attached or not: the owner does not answer"
        lines.append(f"worker      {worker['name']:<12} pid {worker['pid']}  {state}, {worker['restarts']} restarts")
    lines.append(f"clients     {status['clients']} other connections")
    return "\n".join(lines)


def stop(
    db: str, *, timeout_s: float | None, margin_s: float = 10.0, say: Callable[[str], None] = lambda line: None
) -> str:
    """SIGTERM the supervisor of ``db`` (or its lone owner) and wait until it is gone, saying through ``say`` what
    it waits for (the work its workers finish first, then the owner). Returns what was stopped. ``timeout_s`` ``None``:
    as long as the supervisor says its stop may take (``stop_within_s`` in its state), plus ``margin_s``."""
    db = os.path.abspath(db)
    state = read_state(db)
    lock = supervisor_lock_path(db)
    if state is not None and lock_is_held(lock):
        target, pid = "supervisor", int(state["pid"])
    elif is_owned(db):
        target, pid, lock = "owner", read_runtime(db).pid, lock_path(db)
    else:
        raise OwnerUnavailable(f"nothing is running for {db}")
    if timeout_s is None:
        bound = state.get("stop_within_s") if target == "supervisor" and state is not None else None
        timeout_s = (float(bound) if isinstance(bound, int | float) else 60.0) + margin_s
    os.kill(pid, signal.SIGTERM)
    say(f"tether stop: sent SIGTERM to the {target} (pid {pid}) of {db}")
    deadline = time.monotonic() + timeout_s
    said: str | None = None
    asked_s = 0.0
    while lock_is_held(lock):
        now = time.monotonic()
        if now > deadline:
            raise TetherError(
                f"the {target} (pid {pid}) did not stop within {timeout_s:g} s"
                + (f"; it was still {said}" if said else "")
                + f"; wait longer (--timeout), or stop it at once: send it SIGTERM again (kill {pid})"
            )
        if now - asked_s >= STOP_POLL_S:
            asked_s = now
            waiting = _what_stop_waits_for(db)
            if waiting is not None and waiting != said:
                said = waiting
                say(f"tether stop: {waiting}")
        time.sleep(0.02)
    return f"stopped the {target} (pid {pid}) of {db}"


def _what_stop_waits_for(db: str) -> str | None:
    """What a stop waits for now, in words: the phases still leased to workers, or the owner closing."""
    if not is_owned(db):
        return None
    graph = ask_owner(db, "tether-stop", actors.Client.task_graph)
    if graph is None:
        return "waiting for the owner to stop"
    running = sorted(
        (node.leased_to or "", node.task.kind, node.task.task_id)
        for node in graph.nodes.values()
        if node.leased_to is not None
    )
    if not running:
        return "waiting for the workers and the owner to stop (nothing runs any more)"
    shown = ", ".join(
        f"{kind} (task {task_id[-SHORT_ID:]}) on {worker}" for worker, kind, task_id in running[:STOP_SHOWN]
    )
    more = f" and {len(running) - STOP_SHOWN} more" if len(running) > STOP_SHOWN else ""
    return f"waiting for {len(running)} running on the workers to finish and commit: {shown}{more}"
