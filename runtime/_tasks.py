"""``tether tasks`` and ``tether abort``: the live task tree of a database, and aborting one task."""

from __future__ import annotations

import os
from typing import Any, Final

import trio

import actors
from protocol import TaskNode, TaskRecord, TetherError, converter
from storage_owner.store import is_owned, read_live_tasks

from ._connect import check_db, connect
from ._status import ask_owner

SHORT_ID: Final = 8


def task_json(record: TaskRecord, node: TaskNode | None = None) -> dict[str, Any]:
    """A task as ``tether tasks --json`` and the docs show it: the task record as the wire carries it (the one
    converter unstructures it), with who owns it and what the running owner knows (blocked reason, worker)."""
    return {
        **converter.unstructure(record),
        "owner": record.owner,
        "blocked": None if node is None else node.blocked,
        "blocked_detail": None if node is None else node.blocked_detail,
        "worker": None if node is None else node.leased_to,
        "conversation_owner": None if node is None else node.conversation_owner_task_id,
    }


def describe_node(node: TaskNode) -> str:
    """One line: kind, short id, state and what matters about it."""
    task = node.task
    parts = [f"{task.kind} {task.task_id[-SHORT_ID:]}"]
    if task.status == "waiting":
        parts.append(f"waiting on {len(task.on)} ({task.policy})")
    elif task.status == "sleeping":
        parts.append(f"sleeping until {task.until_ms}")
    elif task.status == "completing" and task.held is not None:
        parts.append(f"completing ({task.held.status})")
    else:
        parts.append(task.status)
    if task.phase is not None and task.status in ("pending", "running"):
        parts.append(f"phase {task.phase}")
    if task.abort is not None:
        parts.append("ABORTING" if task.abort == "abort" else "ABANDONED (restart)")
    if task.background:
        parts.append("background")
    if task.restarts:
        parts.append(f"restarts {task.restarts}/{'no limit' if task.restart_limit is None else task.restart_limit}")
    if node.leased_to is not None:
        parts.append(f"on {node.leased_to}")
    if node.blocked is not None:
        parts.append(f"BLOCKED {node.blocked}: {node.blocked_detail}")
    return ", ".join(parts)


def render_tree(nodes: dict[str, TaskNode]) -> list[str]:
    """The live tasks as an indented tree: each task under the task that owns it, a task of a conversation a task
    owns (a subagent's run) under that task; top-level tasks (owned by a conversation nobody live owns, or by a task
    that is no longer live) under their conversation."""
    children: dict[str | None, list[TaskNode]] = {}
    for node in nodes.values():
        owner = node.task.owner_task_id if node.task.owner_task_id is not None else node.conversation_owner_task_id
        children.setdefault(owner if owner in nodes else None, []).append(node)
    for group in children.values():
        group.sort(key=lambda node: node.task.task_id)
    lines: list[str] = []

    def walk(node: TaskNode, depth: int) -> None:
        lines.append("  " * depth + describe_node(node))
        owned_conversation = None
        for child in children.get(node.task.task_id, ()):
            if child.task.owner_task_id is None and child.task.conversation_id != owned_conversation:
                owned_conversation = child.task.conversation_id
                lines.append("  " * (depth + 1) + f"conversation {owned_conversation} (owned by it)")
            walk(child, depth + 1 + (child.task.owner_task_id is None))

    conversation = None
    for root in children.get(None, ()):
        if root.task.conversation_id != conversation:
            conversation = root.task.conversation_id
            lines.append(f"conversation {conversation}")
        walk(root, 1)
    return lines


def _graph_from_database(db: str) -> actors.TaskGraph:
    """The live tasks as stored, read-only (no owner runs: nothing is leased, blocked reasons are unknown).

    Raises :class:`~protocol.SchemaTooNew` for a database a newer engine wrote, and :class:`~protocol.StorageError`
    for a file that is not a Tether database (:func:`storage_owner.store.read_live_tasks`); neither changes the file.
    """
    stored = read_live_tasks(db)
    return actors.TaskGraph(seq=stored.seq, nodes={task.task_id: TaskNode(task=task) for task in stored.tasks})


def read_graph(db: str) -> tuple[actors.TaskGraph, str]:
    """The live task graph and where it came from: ``owner`` (with blocked reasons) or ``database``."""
    db = check_db(db)
    graph = ask_owner(db, "tether-tasks", actors.Client.task_graph)
    return (graph, "owner") if graph is not None else (_graph_from_database(db), "database")


def format_tasks(db: str, graph: actors.TaskGraph, source: str) -> str:
    lines = [f"{len(graph.nodes)} live task(s) in {os.path.abspath(db)} as of seq {graph.seq}"]
    if source == "database" and is_owned(db):  # it holds the ownership lock, but did not answer
        lines.append(
            "(the owner did not answer: stopped or hung; read from the database, as last committed; blocked reasons "
            "need an owner that answers)"
        )
    elif source == "database":
        lines.append("(no owner is running: read from the database; blocked reasons need a running owner)")
    lines.extend(render_tree(graph.nodes))
    return "\n".join(lines)


def tasks_json(db: str, graph: actors.TaskGraph, source: str) -> dict[str, Any]:
    return {
        "db": os.path.abspath(db),
        "seq": graph.seq,
        "source": source,
        "tasks": [task_json(node.task, node) for node in graph.nodes.values()],
    }


async def abort(db: str, task_id: str, *, wait_s: float | None) -> tuple[bool, TaskRecord | None]:
    """Mark ``task_id`` for abort; with ``wait_s``, also wait that long for it to end. Raises ``NotFound``."""
    async with connect(check_db(db), "tether-abort") as client:
        marked = await client.abort_task(task_id)
        if wait_s is None:
            return marked, None
        try:
            with trio.fail_after(wait_s):
                return marked, await client.wait_for_task(task_id)
        except trio.TooSlowError:
            raise TetherError(
                f"task {task_id} is marked for abort but did not end within {wait_s:g} s "
                "(its owned work or abort handler still runs; see tether tasks)"
            ) from None
