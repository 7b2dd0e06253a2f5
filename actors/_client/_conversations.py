"""The client's calls of conversations: creating one, entries, documents, submissions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

import attrs

from protocol import (
    CONFIG_DOCUMENT,
    AbortConversation,
    Configure,
    ConversationAborted,
    ConversationRecord,
    ConversationReply,
    DocumentRecord,
    DocumentReply,
    EntriesReply,
    EntryRecord,
    Order,
    ProtocolError,
    ReadConversation,
    ReadDocument,
    ReadEntries,
    ReadSubmission,
    ReadSubmissions,
    SubmissionRecord,
    SubmissionReply,
    SubmissionsReply,
    Submit,
    Submitted,
    WaitSubmission,
    Withdraw,
    Withdrawn,
    json_value,
)

from ._base import BaseClient
from ._transaction import submit_write

ENTRY_PAGE: Final = 500

SUBMISSIONS_PAGE: Final = 1000
WhenBusy = Literal["follow_up", "steer", "reject"]
WhenIdle = Literal["start", "reject"]
WithdrawOutcome = Literal["withdrawn", "already_placed", "settled", "not_found"]
"""What an ``input`` submission does while its conversation has an active run: queue behind it, or be refused."""


class ConversationCalls(BaseClient):
    """Conversations, their entries and documents, and submissions (a part of :class:`~actors.Client`)."""

    async def create_conversation(
        self, conversation_id: str | None = None, *, agent: str | None = None, owner_task_id: str | None = None
    ) -> str:
        """Create a conversation (with a new UUIDv7 id unless one is given) and return its id once durable.

        With ``agent``, the conversation is bound to that agent: each ``input`` submitted to it starts a run. With
        ``owner_task_id``, a live task owns it (a subagent's transcript): aborting the task aborts its runs, and their
        usage counts toward that task's tree.
        """
        async with self.commit() as tx:
            conversation_id = tx.create_conversation(conversation_id, agent=agent, owner_task_id=owner_task_id)
        return conversation_id

    async def append(self, conversation_id: str, *, kind: str, data: Any = None, entry_id: str | None = None) -> int:
        """Append an entry and return the ``seq`` of its commit, once durable.

        ``entry_id`` (a new UUIDv7 by default) makes a retry after :class:`ConnectionLost` safe: the owner
        refuses a second entry with the same id (:class:`~protocol.Duplicate`). Kinds under ``tether.`` are the
        runtime's (what a model reads): the owner refuses them from a client (:class:`~protocol.InvalidRequest`).
        """
        async with self.commit() as tx:
            tx.append(conversation_id, kind=kind, data=data, entry_id=entry_id)
        assert tx.seq is not None
        return tx.seq

    async def put_document(
        self,
        name: str,
        value: Any,
        *,
        conversation_id: str | None = None,
        expected_version: int | None = None,
    ) -> int:
        """Write a document (global when ``conversation_id`` is ``None``) and return its new version.

        With ``expected_version`` the write happens only if the document is at that version (0: absent);
        otherwise :class:`~protocol.Conflict` is raised and nothing changes.
        """
        async with self.commit() as tx:
            tx.put_document(name, value, conversation_id=conversation_id, expected_version=expected_version)
        return tx.results[0]

    async def conversation(self, conversation_id: str) -> ConversationRecord:
        """The conversation's record; :class:`~protocol.NotFound` if it does not exist."""
        request = ReadConversation(conversation_id=conversation_id)
        reply = await self.connection.call(request, ConversationReply)
        return reply.conversation

    async def read_entries(
        self,
        conversation_id: str,
        *,
        order: Order = "asc",
        cursor: int | None = None,
        limit: int = ENTRY_PAGE,
    ) -> EntryPage:
        """One page of entries. ``cursor`` is exclusive; pass the page's ``next_cursor`` to continue."""
        request = ReadEntries(conversation_id=conversation_id, order=order, cursor=cursor, limit=limit)
        reply = await self.connection.call(request, EntriesReply)
        return EntryPage(entries=list(reply.entries), next_cursor=reply.next_cursor)

    async def entries(self, conversation_id: str, *, order: Order = "asc") -> list[EntryRecord]:
        """Every entry of the conversation, oldest first (``order="desc"``: newest first)."""
        result: list[EntryRecord] = []
        cursor: int | None = None
        while True:
            page = await self.read_entries(conversation_id, order=order, cursor=cursor)
            result.extend(page.entries)
            if page.next_cursor is None:
                return result
            if cursor is not None and (page.next_cursor <= cursor if order == "asc" else page.next_cursor >= cursor):
                raise ProtocolError(
                    f"read_entries ({order}) after {cursor} answered a page ending at {page.next_cursor}"
                )
            cursor = page.next_cursor

    async def document(self, name: str, *, conversation_id: str | None = None) -> DocumentRecord | None:
        """The document's current record, or ``None`` if it was never written."""
        request = ReadDocument(conversation_id=conversation_id, name=name)
        reply = await self.connection.call(request, DocumentReply)
        return reply.document

    async def submit(
        self,
        conversation_id: str,
        *,
        kind: str,
        payload: Any = None,
        request_id: str | None = None,
        submission_id: str | None = None,
        when_busy: WhenBusy = "follow_up",
        when_idle: WhenIdle = "start",
        entry: Mapping[str, Any] | None = None,
    ) -> SubmissionRecord:
        """Admit a submission, deduplicated by ``(conversation_id, request_id)`` (a fresh request id when omitted:
        pass your own to make a retry of yours safe).

        A repeat with the same kind and payload returns the original record (also after a restart); the same
        ``request_id`` with other content raises :class:`~protocol.Conflict`. An ``input`` (a text) to a conversation
        bound to an agent starts a run (``record.run_id``) when none is going (with ``when_idle="reject"``: refused
        with :class:`~protocol.Conflict` instead). While one is: ``when_busy="follow_up"`` queues a run of its own
        behind it, ``"steer"`` joins it (placed after its current tool round, or after its answer with one more model
        request, and answered by it), ``"reject"`` refuses it (:class:`~protocol.Conflict`). An input's ``entry``
        (``{"kind": KIND, "data": VALUE}``) is placed instead of ``tether.user``; the model still sees its text as the
        user message. A ``write`` (payload ``{"kind": KIND, "data": VALUE}``) appends that entry at once and never
        starts a run (``done``); with ``"model": [{"role": "user" | "assistant", "text": ...}]`` the model sees it,
        and with ``"head": ENTRY_ID`` the model's context starts at that entry from it on, its messages first (a
        summary): such a write waits for the working run's next boundary, and one whose head has left the context
        by then settles ``unanswered`` (``stale``). Follow the record with :meth:`wait_for_submission`.
        """
        write = submit_write(conversation_id, kind, payload, request_id, submission_id, when_busy, when_idle, entry)
        request = Submit(**attrs.asdict(write, recurse=False))
        reply = await self.connection.call(request, Submitted)
        return reply.submission

    async def configure(
        self,
        conversation_id: str,
        *,
        tools: Sequence[str] | None = None,
        instructions: str | None = None,
        max_turns: int | None = None,
        steering: Literal["first", "all"] | None = None,
        follow_ups: Literal["first", "all"] | None = None,
        after_failed_run: Literal["wait", "continue", "withdraw"] | None = None,
        model: str | None = None,
        clear: Sequence[str] = (),
        force: bool = False,
    ) -> DocumentRecord | None:
        """Change the conversation's configuration in one commit and return it (its ``tether.config`` document: a new
        version per change). ``None`` leaves a field as it is; ``clear`` names fields that go back to the agent's
        definition. ``model`` (a name the app gives a model with ``app.define_model``), ``tools`` (names of the app's
        tools), ``instructions`` and ``max_turns`` apply from the run's next model request (only workers whose app
        names the model run the conversation's runs; with none attached the run needs attention, ``no_model``, and
        fails ``no_model`` once none has come for the owner's model grace, 10 s by default). A ``model`` or ``tools``
        name that no attached worker announces (of those running the conversation's agent, when some are attached)
        raises :class:`~protocol.InvalidRequest` naming the unknown and the known names, unless ``force`` (a deploy
        that brings it later). ``steering="all"`` places every queued steer at a boundary (``"first"``: one per
        boundary), ``follow_ups="all"`` queues follow-ups together in one run; ``after_failed_run`` says what becomes
        of the runs queued behind one that fails: ``"wait"`` (the default: held until the next input, continue or
        retry), ``"continue"`` or ``"withdraw"``; a cancelled run holds nothing. A bad value raises
        :class:`~protocol.InvalidRequest` naming it, and nothing changes."""
        fields = {
            "tools": None if tools is None else list(tools),
            "instructions": instructions,
            "max_turns": max_turns,
            "steering": steering,
            "follow_ups": follow_ups,
            "after_failed_run": after_failed_run,
            "model": model,
        }
        changes = {name: value for name, value in fields.items() if value is not None}
        request = Configure(
            conversation_id=conversation_id, changes=json_value(changes, "changes"), clear=tuple(clear), force=force
        )
        reply = await self.connection.call(request, DocumentReply)
        return reply.document

    async def reset(
        self, conversation_id: str, handoff: str | None = None, *, request_id: str | None = None
    ) -> SubmissionRecord:
        """Start the model's context again: a reset entry after which the model no longer sees older entries (they
        stay stored), its ``handoff`` text the first user message when given. Idle: placed at once (``done``). While a
        run works: queued, placed at its next boundary; placed when a tool round ends, it ends that run there (its
        inputs ``unanswered``, reason ``reset``), and what is queued behind it runs in the new context."""
        return await self.submit(
            conversation_id,
            kind="reset",
            payload=None if handoff is None else {"handoff": handoff},
            request_id=request_id,
        )

    async def abort_conversation(self, conversation_id: str, *, background: bool = False) -> ConversationAborted:
        """Withdraw the conversation's queued inputs (steers and follow-ups; their queued runs are cancelled) and abort
        its active run bottom-up (it ends ``cancelled`` once its work has stopped: follow it with
        :meth:`wait_for_run`); with ``background``, also abort the tasks the conversation owns outside its runs.
        Returns what it withdrew, the run as the mark left it, and the tasks it marked."""
        request = AbortConversation(conversation_id=conversation_id, background=background)
        return await self.connection.call(request, ConversationAborted)

    async def configuration(self, conversation_id: str) -> dict[str, Any]:
        """The conversation's configuration: the fields set (an absent one follows the agent's definition)."""
        document = await self.document(CONFIG_DOCUMENT, conversation_id=conversation_id)
        return dict(document.value) if document is not None and isinstance(document.value, dict) else {}

    async def submissions(self, conversation_id: str) -> list[SubmissionRecord]:
        """Every submission to the conversation, in the order they were admitted (queued, placed, settled)."""
        found: list[SubmissionRecord] = []
        after: str | None = None
        seen: set[str] = set()
        while True:
            request = ReadSubmissions(
                conversation_id=conversation_id, after_submission_id=after, limit=SUBMISSIONS_PAGE
            )
            reply = await self.connection.call(request, SubmissionsReply)
            found += reply.submissions
            after = reply.next_after_submission_id
            if after is None:
                return found
            if after in seen:  # the cursor follows creation order, not id order: a repeat is the owner's error
                raise ProtocolError(f"read_submissions after {after!r} answered the same page again")
            seen.add(after)

    async def wait_for_submission(self, submission_id: str) -> SubmissionRecord:
        """Return the submission's record once it is ``done`` (``record.answer``) or ``unanswered``
        (``record.reason``). Survives reconnections and owner restarts; bound it with ``trio.fail_after``."""
        reply = await self._wait(WaitSubmission(submission_id=submission_id), SubmissionReply)
        assert reply.submission is not None
        return reply.submission

    async def withdraw(self, submission_id: str) -> WithdrawOutcome:
        """Take back a queued submission: ``"withdrawn"`` (it settles ``unanswered``, reason ``withdrawn``; a queued
        input's run is cancelled), ``"already_placed"`` (a run has it), ``"settled"`` or ``"not_found"``; only the
        first changes anything."""
        reply = await self.connection.call(Withdraw(submission_id=submission_id), Withdrawn)
        return reply.outcome

    async def submission(self, conversation_id: str, request_id: str) -> SubmissionRecord | None:
        """The submission admitted under ``request_id`` in this conversation, or ``None``."""
        request = ReadSubmission(conversation_id=conversation_id, request_id=request_id)
        reply = await self.connection.call(request, SubmissionReply)
        return reply.submission


@attrs.define
class EntryPage:
    """A page of entries and the cursor that continues after it (``None``: nothing further)."""

    entries: list[EntryRecord]
    next_cursor: int | None
