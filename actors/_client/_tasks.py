"""The client's calls of tasks: creating, reading, waiting for and aborting them, and the live task graph."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Final

import attrs

from protocol import (
    OutcomesReply,
    ProtocolError,
    ReadOutcomes,
    ReadTask,
    ReadTaskGraph,
    TaskGraphReply,
    TaskNode,
    TaskOutcome,
    TaskRecord,
    TaskReply,
    WaitTask,
)

from ._base import BaseClient
from ._pages import read_pages

OUTCOMES_PAGE: Final = 1000
"""Outcomes read per request (the owner's limit)."""


class TaskCalls(BaseClient):
    """Tasks and the live task graph (a part of :class:`~actors.Client`)."""

    async def create_task(
        self,
        kind: str,
        input: Any = None,
        *,
        conversation_id: str | None = None,
        owner_task_id: str | None = None,
        task_id: str | None = None,
        version: int = 0,
        background: bool = False,
        abandon_on_restart: bool = False,
    ) -> str:
        """Create a task and return its id once durable.

        It is owned by ``owner_task_id``, or else by ``conversation_id``, or else by a new conversation created in
        the same commit. ``version`` 0 lets the first worker that runs it bind its definition's version. A
        ``task_id`` chosen by the caller makes a retry after :class:`ConnectionLost` safe (a second create is
        refused as :class:`~protocol.Duplicate`).
        """
        async with self.commit() as tx:
            task_id = tx.create_task(
                kind,
                input,
                conversation_id=conversation_id,
                owner_task_id=owner_task_id,
                task_id=task_id,
                version=version,
                background=background,
                abandon_on_restart=abandon_on_restart,
            )
        return task_id

    async def task(self, task_id: str) -> TaskRecord:
        """The task's record (live or terminal); :class:`~protocol.NotFound` if there is none."""
        return (await self.task_state(task_id)).task

    async def task_state(self, task_id: str) -> TaskReply:
        """The task's record with its input and current checkpoint."""
        return await self.connection.call(ReadTask(task_id=task_id), TaskReply)

    async def wait_for_task(self, task_id: str) -> TaskRecord:
        """Return the task's record once it is terminal (``record.outcome`` says how it ended).

        Survives reconnections and owner restarts: the wait is simply asked again. Bound it with
        ``trio.fail_after``.
        """
        reply = await self._wait(WaitTask(task_id=task_id), TaskReply)
        return reply.task

    async def abort_task(self, task_id: str) -> bool:
        """Mark the task for abort once durable; ``False`` if it was already marked or terminal.

        The abort runs bottom-up: owned work first, then the task's abort handler. Wait for its end with
        :meth:`wait_for_task`.
        """
        async with self.commit() as tx:
            tx.abort_task(task_id)
        return tx.results[0] == 1

    async def outcomes(self, task_ids: Sequence[str]) -> dict[str, TaskOutcome | None]:
        """The outcome of each task, ``None`` for one that is not terminal yet."""
        outcomes: dict[str, TaskOutcome | None] = {}
        start = 0
        while start < len(task_ids):
            page = tuple(task_ids[start : start + OUTCOMES_PAGE])
            reply = await self.connection.call(ReadOutcomes(task_ids=page), OutcomesReply)
            if not 1 <= len(reply.outcomes) <= len(page):
                raise ProtocolError(f"read_outcomes of {len(page)} tasks answered {len(reply.outcomes)} outcomes")
            # The owner answers the first ones that fit its read budget: ask again for the rest.
            outcomes.update(zip(page, reply.outcomes, strict=False))
            start += len(reply.outcomes)
        return outcomes

    async def task_graph(self) -> TaskGraph:
        """Every live task, with its owner edge, state, restarts, and why it is blocked if it is."""
        seq: int | None = None

        async def page(after: str | None) -> tuple[Sequence[TaskNode], str | None]:
            nonlocal seq
            reply = await self.connection.call(ReadTaskGraph(after_task_id=after), TaskGraphReply)
            seq = reply.seq if seq is None else seq  # later pages may be newer than the first: records carry seq
            return reply.nodes, reply.next_after_task_id

        nodes = await read_pages(page, "read_task_graph")
        assert seq is not None
        return TaskGraph(seq=seq, nodes={node.task.task_id: node for node in nodes})

    async def watch_task_graph(self) -> AsyncIterator[TaskGraph]:
        """The live task graph now, then again after every commit that changes it.

        A task appears with the commit that creates it and leaves with the commit that makes it terminal. The
        ``blocked`` reasons are those of the first read (a change carries committed state only).
        """
        graph = await self.task_graph()
        yield graph
        async with self.watch(from_seq=graph.seq) as changes:
            async for change in changes:
                nodes = dict(graph.nodes)
                touched = False
                for record in change.records:
                    if not isinstance(record, TaskRecord):
                        continue
                    previous = nodes.get(record.task_id)
                    if previous is not None and previous.task.seq > record.seq:
                        continue  # a later page of the first read showed a newer state already
                    touched = True
                    if record.status == "terminal":
                        nodes.pop(record.task_id, None)
                    else:
                        nodes[record.task_id] = (
                            TaskNode(task=record) if previous is None else attrs.evolve(previous, task=record)
                        )
                if touched:
                    graph = TaskGraph(seq=change.seq, nodes=nodes)
                    yield graph


@attrs.frozen
class TaskGraph:
    """The live tasks as of commit ``seq``, by id."""

    seq: int
    nodes: dict[str, TaskNode]
