"""Partial output as a reader sees it: the ``PartialRecord``s a watch or ``client.partials`` gives, assembled again
into one text per operation (:class:`PartialText`). docs/agents.md says it for users, docs/runs.md what the owner
stores; the worker's side, which sends the pieces while a model streams, is ``actors/_worker/_partials.py``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Final

import attrs

from protocol import MAX_PARTIAL_BYTES, Change, OperationRecord, PartialRecord, PartialStatus, UsageError

MAX_OUTPUTS: Final = 64
"""The outputs a :class:`PartialText` holds by default: past it, the least recently changed one is dropped."""
MAX_OUTPUT_CHARS: Final = MAX_PARTIAL_BYTES
"""The characters of one output a :class:`PartialText` holds by default (its tail): as many as the owner stores of
one attempt at most (a character is at least one byte), so by default no text is ever cut."""


@attrs.frozen(kw_only=True)
class PartialOutput:
    """One operation's partial output as a reader holds it: ``text`` streamed by ``attempt`` from character
    ``start`` (above 0 when the reader began in the middle, or when the text outgrew the reader's ``max_chars`` and
    its head was dropped), ``status`` and the ``seq`` of the last record taken. ``added`` is what the change that
    made this output added to the text: the new characters of a piece (all of its text when it started the text
    over), ``""`` for a change of status alone."""

    operation_id: str
    run_id: str
    conversation_id: str
    attempt: int
    start: int
    text: str
    status: PartialStatus
    seq: int
    added: str = ""

    @property
    def end(self) -> int:
        """The character the text ends at."""
        return self.start + len(self.text)


def _bound(name: str, value: object) -> int:
    if type(value) is not int or value < 1:
        raise UsageError(f"PartialText: {name} must be a whole number of 1 or more, not {value!r}")
    return value


def _replaces(held: PartialOutput, record: PartialRecord) -> bool:
    """Whether ``record``, not older than ``held``, is another attempt's (rule 2 of :class:`PartialText`)."""
    return record.attempt != held.attempt or (held.status != "streaming" and record.seq > held.seq)


class PartialText:
    """Assembles ``PartialRecord``s (from a watch's changes, or ``client.partials``) into one text per operation:

    1. A record older (by ``seq``) than what is held is ignored (a read that crossed a watch). Attempts are told
       apart by ``seq``, not by number: ``retry_run`` starts the numbers over, so a later attempt may have a
       smaller one.
    2. A record of another attempt, or any record later than the ``done`` or ``aborted`` one held (an attempt ends
       once: what follows is another's), replaces what is held (a retried attempt never shows text twice).
    3. Characters already held are skipped (overlaps after a resumed watch); a piece that starts past the end of
       what is held (the reader missed pieces, or began mid-stream) starts the text over at its offset.
    4. :meth:`settle` takes a model operation's journal record: its result marks the output ``done``; a failed or
       interrupted attempt marks it ``aborted`` (never an answer). :meth:`forget` drops an output.

    Bounded: at most ``max_outputs`` outputs (the least recently changed is dropped past it) of at most ``max_chars``
    characters each (the tail: ``start`` moves on as the head is dropped). Bad bounds raise ``UsageError``.

    ``feed`` takes one record, a ``Change``, or records (others are skipped); ``outputs`` are the held outputs by
    operation id, in the order each operation first appeared.
    """

    def __init__(self, *, max_outputs: int = MAX_OUTPUTS, max_chars: int = MAX_OUTPUT_CHARS) -> None:
        self.max_outputs = _bound("max_outputs", max_outputs)
        self.max_chars = _bound("max_chars", max_chars)
        self._outputs: dict[str, PartialOutput] = {}
        self._changed: OrderedDict[str, None] = OrderedDict()
        """The operation ids held, the least recently changed first (the one dropped past ``max_outputs``)."""

    @property
    def outputs(self) -> Mapping[str, PartialOutput]:
        """The outputs held by operation id (read-only), in the order each operation first appeared."""
        return MappingProxyType(self._outputs)

    def feed(self, records: PartialRecord | Change | Iterable[object]) -> list[PartialOutput]:
        """Take a record, a ``Change`` or any records (others than partial records are skipped); returns the
        outputs they changed (in order, one per record that changed one)."""
        items: Iterable[object]
        if isinstance(records, PartialRecord):
            items = (records,)
        elif isinstance(records, Change):
            items = records.records
        else:
            items = records
        changed = []
        for record in items:
            if isinstance(record, PartialRecord):
                output = self._take(record)
                if output is not None:
                    changed.append(output)
        return changed

    def replaces(self, record: PartialRecord) -> bool:
        """Whether ``record`` would replace the text held for its operation with another attempt's (rule 2)."""
        held = self._outputs.get(record.operation_id)
        return held is not None and record.seq >= held.seq and _replaces(held, record)

    def _take(self, record: PartialRecord) -> PartialOutput | None:
        held = self._outputs.get(record.operation_id)
        if held is not None and record.seq < held.seq:
            return None  # rule 1: older than what is held
        start, text = record.offset, record.text
        if held is not None and not _replaces(held, record) and record.offset <= held.end:  # rule 3: continue it
            end = held.end
            new = text[end - record.offset :] if record.offset + len(text) > end else ""
            if not new and record.status == held.status:
                return None  # all held already
            start, text = held.start, held.text + new
        else:  # rules 2 and 3: a text of its own
            new = text
        return self._put(
            PartialOutput(  # not attrs.evolve: this runs for every piece a watch gets, and evolve costs a third more
                operation_id=record.operation_id,
                run_id=record.run_id,
                conversation_id=record.conversation_id,
                attempt=record.attempt,
                start=start,
                text=text,
                status=record.status,
                seq=record.seq,
                added=new,
            )
        )

    def settle(self, operation: OperationRecord) -> PartialOutput | None:
        """Take an operation's journal record (rule 4), unless it is older (by ``seq``) than the text held:
        a result (``completed``, ``resolved``) marks the output ``done``, a failed or interrupted attempt marks it
        ``aborted``; its ``seq`` is then the record's (the ``aborted`` record of the same commit changes nothing
        more). Returns the output it changed (``None``: none)."""
        held = self._outputs.get(operation.operation_id)
        if held is None or operation.seq < held.seq:
            return None
        status: PartialStatus
        if operation.status in ("completed", "resolved"):
            status = "done"
        elif operation.status in ("failed", "interrupted"):
            status = "aborted"
        else:
            return None
        if held.status == status or (held.status == "done" and status == "aborted"):
            return None
        return self._put(attrs.evolve(held, status=status, seq=operation.seq, added=""))

    def forget(self, operation_id: str) -> PartialOutput | None:
        """Drop what is held for ``operation_id``; returns it (``None``: nothing was held)."""
        self._changed.pop(operation_id, None)
        return self._outputs.pop(operation_id, None)

    def _put(self, output: PartialOutput) -> PartialOutput:
        excess = len(output.text) - self.max_chars
        if excess > 0:  # keep the tail
            output = attrs.evolve(output, start=output.start + excess, text=output.text[excess:])
        operation_id = output.operation_id
        self._outputs[operation_id] = output
        self._changed[operation_id] = None
        self._changed.move_to_end(operation_id)
        while len(self._changed) > self.max_outputs:
            dropped, _ = self._changed.popitem(last=False)
            del self._outputs[dropped]
        return output

    def text(self, operation_id: str) -> str | None:
        """The text held for ``operation_id`` (``None``: nothing)."""
        output = self._outputs.get(operation_id)
        return None if output is None else output.text

    @property
    def streaming(self) -> list[PartialOutput]:
        """The outputs still streaming (what a live view shows as the answer being written)."""
        return [output for output in self._outputs.values() if output.status == "streaming"]
