"""``actors.Transaction``: writes collected by :meth:`~actors.Client.commit`, applied atomically."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

from protocol import (
    AbortTask,
    AppendEntry,
    CreateConversation,
    CreateTask,
    PutDocument,
    SubmitWrite,
    Write,
    json_value,
    new_id,
)


@attrs.define
class Transaction:
    """Writes collected by :meth:`Client.commit`, applied atomically when its block exits."""

    writes: list[Write] = attrs.Factory(list)
    seq: int | None = None
    results: tuple[int, ...] = ()
    default_owner_task_id: str | None = None
    """The owner of a task created with neither ``owner_task_id`` nor ``conversation_id`` (a phase's own task);
    without one, such a task gets a new conversation of its own."""

    def create_task(
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
        """Create a task in this commit (see :meth:`Client.create_task`) and return its id."""
        task_id = task_id or new_id()
        if conversation_id is None and owner_task_id is None:
            if self.default_owner_task_id is not None:
                owner_task_id = self.default_owner_task_id
            else:
                conversation_id = self.create_conversation()
        self.writes.append(
            CreateTask(
                task_id=task_id,
                kind=kind,
                version=version,
                input=json_value(input, "input"),
                conversation_id=conversation_id,
                owner_task_id=owner_task_id,
                background=background,
                abandon_on_restart=abandon_on_restart,
            )
        )
        return task_id

    def abort_task(self, task_id: str) -> None:
        """Mark a task for abort in this commit."""
        self.writes.append(AbortTask(task_id=task_id))

    def create_conversation(
        self, conversation_id: str | None = None, *, owner_task_id: str | None = None, agent: str | None = None
    ) -> str:
        conversation_id = conversation_id or new_id()
        write = CreateConversation(conversation_id=conversation_id, owner_task_id=owner_task_id, agent=agent)
        self.writes.append(write)
        return conversation_id

    def append(self, conversation_id: str, *, kind: str, data: Any = None, entry_id: str | None = None) -> str:
        entry_id = entry_id or new_id()
        write = AppendEntry(
            conversation_id=conversation_id, entry_id=entry_id, kind=kind, data=json_value(data, "data")
        )
        self.writes.append(write)
        return entry_id

    def put_document(
        self,
        name: str,
        value: Any,
        *,
        conversation_id: str | None = None,
        expected_version: int | None = None,
    ) -> None:
        self.writes.append(
            PutDocument(
                conversation_id=conversation_id,
                name=name,
                value=json_value(value, "value"),
                expected_version=expected_version,
            )
        )

    def submit(
        self,
        conversation_id: str,
        *,
        kind: str,
        payload: Any = None,
        request_id: str | None = None,
        submission_id: str | None = None,
        when_busy: Literal["follow_up", "steer", "reject"] = "follow_up",
        when_idle: Literal["start", "reject"] = "start",
        entry: Mapping[str, Any] | None = None,
    ) -> str:
        """Admit a submission in this commit, by the rules of :meth:`Client.submit`, atomically with the other
        writes: a refusal (busy, idle, a bad payload) refuses the whole commit, and nothing of it is written. Returns
        the submission's id (read its record with :meth:`Client.wait_for_submission`); a repeated ``request_id``
        admits nothing (its result is 0, 1 when admitted)."""
        write = submit_write(conversation_id, kind, payload, request_id, submission_id, when_busy, when_idle, entry)
        self.writes.append(write)
        return write.submission_id


def submit_write(
    conversation_id: str,
    kind: str,
    payload: Any,
    request_id: str | None,
    submission_id: str | None,
    when_busy: Literal["follow_up", "steer", "reject"],
    when_idle: Literal["start", "reject"],
    entry: Mapping[str, Any] | None,
) -> SubmitWrite:
    """A submission as a commit's write, fresh ids for those not given (``Client.submit`` sends the same fields as
    its request)."""
    return SubmitWrite(
        conversation_id=conversation_id,
        submission_id=submission_id or new_id(),
        request_id=request_id or new_id(),
        kind=kind,
        payload=json_value(payload, "payload"),
        when_busy=when_busy,
        when_idle=when_idle,
        entry=json_value(entry, "entry"),
    )
