"""What the demo's parts share: a live view of every commit, which a demo step can wait on."""

from __future__ import annotations

from typing import Any

import trio

import actors


class LiveView:
    """Shows the records of every commit as they are committed (from a watch of everything); a demo step waits with
    :meth:`settled` until what it caused has been shown, so the output reads in the order things happened."""

    LABEL_WIDTH = 22
    """The width of a line's label column (:meth:`line`)."""

    def __init__(self, client: actors.Client) -> None:
        self._client = client
        self._seq = 0
        self._seen = trio.Event()
        self._last: dict[str, tuple[Any, ...]] = {}

    def note(self, text: str) -> None:
        """A line of the demo's own, under the records' details."""
        print(f"     {'':<{self.LABEL_WIDTH + 2}}{text}", flush=True)

    def line(self, key: str, state: tuple[Any, ...], detail: str, label: str = "run") -> None:
        """Print ``label`` and ``detail`` unless ``key``'s last line was shown for the same ``state``."""
        if self._last.get(key) == state:
            return
        self._last[key] = state
        print(f"     {label:<{self.LABEL_WIDTH}}  {detail}", flush=True)

    async def settled(self, seq: int) -> None:
        """Wait until the watch has shown everything up to ``seq``."""
        while self._seq < seq:
            self._seen = trio.Event()
            await self._seen.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        head = (await self._client.ping()).head_seq
        async with self._client.watch(from_seq=head) as changes:
            task_status.started()
            async for change in changes:
                for record in change.records:
                    await self.show(record, change.seq)
                self._seq = change.seq
                self._seen.set()

    async def show(self, record: Any, seq: int) -> None:
        """Show one record of the commit ``seq``."""
        raise NotImplementedError
