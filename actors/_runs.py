"""The run loop: what a worker does with the leases of an agent's runs (``agent:<name>``) and of its tool calls
(``tool:<name>``), built on :class:`~actors.Phase` (docs/agents.md says it for users, docs/runs.md what the owner
decides).

Every step is one commit, and every decision is read back from what is committed (the transcript and the run's
operation journal), so a phase that runs again after any crash goes on from the last commit, and never re-does a
committed result:

- a run's task, phase ``turn`` (checkpoint ``{"phase": "turn", "turn": n}``): reads the transcript into messages,
  commits the model request's intent (attempt from the journal), streams the model, then commits in ONE commit the
  result, the ``tether.assistant`` entry and the task's next state: its tool calls as ``tool:<name>`` tasks it waits
  on (phase ``tools``), or its completion with the answer. A retryable model error sleeps until the shared delay;
  a final one (or attempts spent) fails the run.
- a run's task, phase ``tools``: every call of the turn without a result entry (its task faulted, aborted, resolved
  by a person) gets one, then the next turn. Its abort handler does the same, so a cancelled run's transcript holds
  no call without a result.
- a tool task: validates the arguments, asks for an approval if the tool wants one (and waits), then commits the
  call's intent, runs the handler, and commits its result, the ``tether.tool_result`` entry and its completion in
  ONE commit. An interrupted call is the owner's to decide (docs/runs.md); the worker follows the journal.

Ids are derived (uuid5) from the run, its task, the turn and the model's call id, never drawn at random, so a
re-run derives the same operation, task and entry ids.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any, Final

from protocol import (
    AGENT_TASK_PREFIX,
    ASSISTANT_ENTRY,
    TOOL_RESULT_ENTRY,
    TOOL_TASK_PREFIX,
    USER_ENTRY,
    Conflict,
    CreateInteraction,
    EntryRecord,
    FinishOperation,
    JsonValue,
    NotFound,
    OperationRecord,
    RunUsage,
    StartOperation,
    TaskOutcome,
    Write,
    approval_task_id,
    json_value,
)
from protocol import Retry as ProtocolRetry
from protocol.io import log_stderr

from ._app._agents import AgentDefinition
from ._app._app import DEFAULT_RESTART_LIMIT, App, TaskDefinition
from ._app._tools import ToolCall, ToolDefinition
from ._models._model import (
    AssistantMessage,
    Message,
    ModelError,
    ModelRequest,
    StreamEvent,
    TextDelta,
    ToolCallRequest,
    ToolMessage,
    TurnBuilder,
    Usage,
    UserMessage,
)
from ._models._retry import next_delay_ms
from ._partials import partial_output
from ._phase import Phase, PhaseTransaction
from ._transcript import transcript, transcript_cache

AGENT_PREFIX: Final = AGENT_TASK_PREFIX
TOOL_PREFIX: Final = TOOL_TASK_PREFIX
INTERRUPTED: Final = "interrupted: the tool call has no result (its run was interrupted before it finished)"
_IDS: Final = uuid.UUID("3f6c2a59-0d1e-4b8f-a7c4-6e2b91d05c37")


def _derived(*parts: object) -> str:
    return str(uuid.uuid5(_IDS, "/".join(str(part) for part in parts)))


def model_operation_id(run_id: str, turn: int) -> str:
    """The operation of a run's ``turn``-th model request: the same for every task of the run (a retried run finds
    the turns already answered)."""
    return _derived(run_id, "model", turn)


def tool_operation_id(run_id: str, turn: int, call_id: str) -> str:
    """The operation of the tool call ``call_id`` of a run's ``turn``: the same for every attempt of the call."""
    return _derived(run_id, "tool", turn, call_id)


def digest(value: Any) -> str:
    """The sha256 of ``value`` as canonical JSON (sorted keys, no spaces)."""
    return hashlib.sha256(_canonical(value).encode()).hexdigest()


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def content_text(value: Any) -> str:
    """A tool's result as the text a model reads: a string as is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


# ------------------------------------------------------------------------------------------------ transcript


def call_data(call: ToolCallRequest) -> dict[str, Any]:
    data: dict[str, Any] = {"call_id": call.call_id, "name": call.name, "arguments": call.arguments}
    if call.invalid_arguments is not None:
        data["invalid_arguments"] = call.invalid_arguments
    return data


def assistant_data(message: AssistantMessage) -> dict[str, Any]:
    """The normalised assistant message as JSON: the model operation's result and the entry's data."""
    return {"text": message.text, "tool_calls": [call_data(call) for call in message.tool_calls]}


def _assistant_message(data: Any) -> AssistantMessage:
    calls = tuple(
        ToolCallRequest(
            call_id=str(call["call_id"]),
            name=str(call["name"]),
            arguments=call["arguments"],
            invalid_arguments=call.get("invalid_arguments"),
        )
        for call in data.get("tool_calls") or ()
    )
    return AssistantMessage(text=str(data.get("text") or ""), tool_calls=calls)


def transcript_messages(entries: Iterable[Any]) -> list[Message]:
    """The transcript's ``tether.*`` entries as a model's messages, oldest first. Each assistant message is followed
    by the results of its calls in call order; a call without a result entry gets a synthesized error result
    (``interrupted``), so a provider never sees a dangling call. Other entry kinds are not the model's."""
    fold = MessageFold()
    fold.feed(entries)
    return fold.messages()


class MessageFold:
    """:func:`transcript_messages` fed a transcript in parts: the messages of the entries fed so far, each entry
    read once. Messages before the last user or assistant message are final; the results of the last assistant
    message's calls are settled only by :meth:`messages`, each time (a result entry may still come). The run loop
    keeps one per conversation beside the worker's transcript cache, so a turn folds only the new entries, and
    keeps each final message's canonical JSON for the request's digest."""

    def __init__(self) -> None:
        self.fed = 0
        """Entries fed so far."""
        self.final: list[Message] = []
        self.final_json: list[str] = []
        """The canonical JSON of each final message (:func:`request_digest`), computed once."""
        self.json_bytes = 0
        """The UTF-8 size of :attr:`final_json`: what the fold holds beside the transcript (its messages share the
        entries' strings), charged to the transcript cache's bound."""
        self._open_calls: tuple[ToolCallRequest, ...] = ()
        self._results: dict[str, ToolMessage] = {}

    def feed(self, entries: Iterable[Any]) -> None:
        for entry in entries:
            self.fed += 1
            data = entry.data if isinstance(entry.data, dict) else {}
            if entry.kind == USER_ENTRY:
                self._close()
                self._final(UserMessage(text=str(data.get("text") or "")))
            elif entry.kind == ASSISTANT_ENTRY:
                self._close()
                message = _assistant_message(data)
                self._final(message)
                self._open_calls = message.tool_calls
            elif entry.kind == TOOL_RESULT_ENTRY:
                call_id = str(data.get("call_id"))
                if any(call.call_id == call_id for call in self._open_calls) and call_id not in self._results:
                    self._results[call_id] = ToolMessage(
                        call_id=call_id, content=str(data.get("content", "")), is_error=bool(data.get("is_error"))
                    )

    def messages(self) -> list[Message]:
        """The messages of every entry fed so far, the last calls' results settled (or ``interrupted``)."""
        return self.final + self._settled()

    def _settled(self) -> list[Message]:
        return [
            self._results.get(call.call_id) or ToolMessage(call_id=call.call_id, content=INTERRUPTED, is_error=True)
            for call in self._open_calls
        ]

    def _close(self) -> None:
        for message in self._settled():
            self._final(message)
        self._open_calls, self._results = (), {}

    def _final(self, message: Message) -> None:
        self.final.append(message)
        text = _canonical(_message_data(message))
        self.final_json.append(text)
        self.json_bytes += len(text.encode())


def request_digest(request: ModelRequest, fold: MessageFold | None = None) -> str:
    """The sha256 of the request as canonical JSON (model, instructions, messages, tool names): what a model
    intent records. With the ``fold`` the messages came from, the final messages' JSON is not computed again (the
    same bytes as :func:`digest` of the whole request)."""
    value = {
        "model": request.model,
        "instructions": request.instructions,
        "messages": [],
        "tools": [tool.name for tool in request.tools],
    }
    messages = request.messages
    known: list[str] = []
    final = fold.final if fold is not None else []
    if fold is not None and len(messages) >= len(final) and all(a is b for a, b in zip(final, messages, strict=False)):
        known = fold.final_json
    rest = [_canonical(_message_data(message)) for message in messages[len(known) :]]
    head, tail = _canonical(value).split('"messages":[]', 1)
    return hashlib.sha256(f'{head}"messages":[{",".join(known + rest)}]{tail}'.encode()).hexdigest()


def message_fold(client: Any, conversation_id: str, entries: Sequence[EntryRecord]) -> MessageFold:
    """The conversation's :class:`MessageFold` fed ``entries`` (its whole transcript, as the worker's cache returned
    it): kept beside the cache, so only the entries after the last fold are read; a fresh one when the cache read the
    transcript whole since (its memo is then empty). What it holds is charged to the cache's byte bound."""
    cache = transcript_cache(client)
    memo = cache.memo(conversation_id)
    fold = memo.get("fold")
    if not isinstance(fold, MessageFold) or fold.fed > len(entries):
        fold = MessageFold()
    fold.feed(entries[fold.fed :])
    memo["fold"] = fold
    cache.charge(conversation_id, fold.json_bytes)
    return fold


def _result_entry(
    tx: PhaseTransaction,
    conversation_id: str,
    *,
    run_id: str,
    operation_id: str,
    call_id: str,
    name: str,
    content: str,
    is_error: bool,
) -> None:
    tx.append(
        conversation_id,
        kind=TOOL_RESULT_ENTRY,
        entry_id=_derived(operation_id, "result"),
        data={
            "run_id": run_id,
            "operation_id": operation_id,
            "call_id": call_id,
            "name": name,
            "content": content,
            "is_error": is_error,
        },
    )


async def journaled(rt: Phase, operation_id: str) -> OperationRecord | None:
    """The operation ``operation_id`` as the journal holds it, or ``None`` before its first intent. One read of one
    record: a phase never reads the whole run's journal (that made a long run quadratic)."""
    try:
        return await rt.client.operation(operation_id)
    except NotFound:
        return None


async def _start(rt: Phase, write: StartOperation, guessed: bool) -> bool:
    """Commit an operation's intent. ``guessed``: the phase did not read the journal, on the guess that a fresh state
    (never cut off) has no attempt of the operation yet; the owner checks every intent against the journal, so a
    wrong guess is refused (``conflict``, nothing written) and answers ``False``: read the journal and decide again.
    A right guess saves a read of the journal per model request and per tool call."""
    try:
        async with rt.commit() as tx:
            tx.start_operation(write)
    except Conflict:
        if not guessed:
            raise
        return False
    return True


def _fresh(rt: Phase) -> bool:
    """Whether this run of the phase is its state's first (nothing cut off: no attempt it started is journaled) in
    its run's first task: a run's task after ``retry_run`` (input ``attempt`` above 1), and the tool tasks it creates
    (input ``run_attempt``), go on from a journal the earlier tasks wrote, so a guess would be refused there."""
    return (
        rt.restarts == 0
        and rt.mode == "phase"
        and "attempt" not in rt.checkpoint
        and _run_attempt(rt.input, "attempt") == 1
        and _run_attempt(rt.input, "run_attempt") == 1
    )


def _run_attempt(value: Any, key: str) -> int:
    """Which task of its run (1 for the first) a task's input says it is or belongs to, under ``key``."""
    attempt = value.get(key, 1) if isinstance(value, dict) else 1
    return attempt if type(attempt) is int else 1


@contextlib.asynccontextmanager
async def _closing(stream: AsyncIterator[StreamEvent]) -> AsyncIterator[AsyncIterator[StreamEvent]]:
    """``stream``, closed on leaving the block however it is left (``contextlib.aclosing`` for any async iterator:
    one without ``aclose`` has nothing to close). A model's stream is an async generator holding a response and its
    HTTP client open: left by an error raised outside it (an invalid event ``TurnBuilder`` refuses) or by a
    cancellation, its ``finally`` must run here and now, not whenever the generator is collected."""
    try:
        yield stream
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


def _has_result(op: OperationRecord) -> bool:
    if op.status in ("completed", "resolved"):
        return True
    return op.status == "failed" and (op.kind == "tool" or op.attempt >= (op.retry or ProtocolRetry()).attempts)


def _run_usage(usage: Usage | None) -> RunUsage | None:
    if usage is None:
        return None
    return RunUsage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cached_tokens=usage.cached_tokens,
        reasoning_tokens=usage.reasoning_tokens,
        cost=usage.cost,
    )


# ------------------------------------------------------------------------------------------------ run task


class AgentRun:
    """The phases of an agent's run task (``agent:<name>``) for one :class:`AgentDefinition`. ``log`` is the
    worker's log: a failed model attempt is one line of it (what failed, and what comes of it)."""

    def __init__(self, agent: AgentDefinition, log: Callable[[str], None] = log_stderr) -> None:
        self.agent = agent
        self._log = log

    def definition(self) -> TaskDefinition:
        return TaskDefinition(
            kind=AGENT_PREFIX + self.agent.name,
            version=self.agent.version,
            initial=lambda _input: {"phase": "turn", "turn": 1},
            phases={"turn": self.turn, "tools": self.tools},
            abort=self.abort,
            restart_limit=DEFAULT_RESTART_LIMIT,
        )

    async def turn(self, rt: Phase) -> None:
        await self._turn(rt, int(rt.checkpoint["turn"]))

    async def _turn(
        self, rt: Phase, turn: int, entries: Sequence[EntryRecord] | None = None, *, guess: bool = True
    ) -> None:
        """Model turn ``turn``, from phase ``turn`` or straight after the tools of turn ``turn - 1`` (``entries``:
        the transcript already read there). ``guess``: a fresh state may skip reading the journal (:func:`_start`)."""
        agent = self.agent
        run_id = str(rt.input["run_id"])
        if agent.max_turns is not None and turn > agent.max_turns:
            limit = f"the run reached its agent's limit of {agent.max_turns} model turns"
            await rt.fail(limit, reason="max_turns")
            return
        operation_id = model_operation_id(run_id, turn)
        guessed = guess and _fresh(rt)
        op = None if guessed else await journaled(rt, operation_id)
        if op is not None and op.status == "completed":
            # Answered already (a retried run, or a commit whose reply was lost): go on from the committed result;
            # its assistant entry was written in the same commit.
            async with rt.commit() as tx:
                self._next(tx, rt, run_id, turn, _assistant_message(op.result))
            return
        if op is not None and _has_result(op):
            await rt.fail(f"model request failed: {op.error}", reason="model_error")
            return
        retry = op.retry if op is not None and op.retry is not None else agent.model_retry.to_protocol()
        attempt = 1 if op is None else op.attempt + 1
        if entries is None:
            entries = await transcript(rt.client, rt.conversation_id)
        fold = message_fold(rt.client, rt.conversation_id, entries)
        request = agent.request(fold.messages(), attempt)
        intent_digest = request_digest(request, fold)
        intent = StartOperation(
            operation_id=operation_id,
            run_id=run_id,
            kind="model",
            name=agent.model.name,
            version=agent.version,
            turn=turn,
            attempt=attempt,
            digest=intent_digest,
            retry=retry,
        )
        if not await _start(rt, intent, guessed):
            await self._turn(rt, turn, guess=False)  # the journal has an attempt: decide from it
            return
        builder = TurnBuilder()
        failure: ModelError | None = None
        async with partial_output(rt, operation_id, attempt, agent.partial_interval_ms) as partial:
            try:
                async with _closing(agent.model.stream(request)) as stream:
                    async for event in stream:
                        builder.feed(event)
                        if isinstance(event, TextDelta):
                            partial.feed(event.text)  # sent in pieces while it streams; never waits
                result = builder.result()
            except ModelError as exc:
                failure = exc
        if failure is not None:
            await self._model_failed(rt, operation_id, turn, attempt, retry, failure, partial.final_writes())
            return
        message = result.message
        async with rt.commit() as tx:
            tx.writes.extend(partial.final_writes())  # the rest of the text, then the result: its output is done
            tx.finish_operation(
                FinishOperation(
                    operation_id=operation_id,
                    status="completed",
                    result=json_value(assistant_data(message)),
                    usage=_run_usage(result.usage),
                )
            )
            tx.append(
                rt.conversation_id,
                kind=ASSISTANT_ENTRY,
                entry_id=_derived(operation_id, "assistant"),
                data={"run_id": run_id, "turn": turn, **assistant_data(message)},
            )
            self._next(tx, rt, run_id, turn, message)

    async def _model_failed(
        self,
        rt: Phase,
        operation_id: str,
        turn: int,
        attempt: int,
        retry: ProtocolRetry,
        exc: ModelError,
        pieces: Sequence[Write] = (),
    ) -> None:
        """One commit: the attempt's failure and the task's next state. A retryable error with attempts left sleeps
        until the back-off's deadline (``retry_wait``); a final one, or the policy's last attempt, fails the run at
        once: no wait is taken for a try that never comes."""
        error = f"{exc.kind}: {exc}"
        delay = next_delay_ms(retry, attempt, exc.retry_after_ms) if exc.retryable else None
        async with rt.commit() as tx:
            tx.writes.extend(pieces)  # what streamed before the failure, aborted with it
            tx.finish_operation(FinishOperation(operation_id=operation_id, status="failed", error=error))
            if delay is None:
                tx.fail(f"model request failed (attempt {attempt} of {retry.attempts}): {error}", reason="model_error")
            else:
                tx.sleep_until(rt.now_ms() + delay, {"phase": "turn", "turn": turn, "attempt": attempt + 1})
        if delay is not None:
            then = f"tried again in {delay} ms"
        elif exc.retryable:
            then = "that was the last attempt: the run failed"
        else:
            then = f"not tried again ({exc.kind} is final): the run failed"
        what = f"model request failed (attempt {attempt} of {retry.attempts}): {error}"
        self._log(f"tether worker: run {rt.input['run_id']} (agent {self.agent.name}): {_one_line(what)}; {then}")

    def _next(self, tx: PhaseTransaction, rt: Phase, run_id: str, turn: int, message: AssistantMessage) -> None:
        """The task's next state after the model's answer of ``turn``: one tool task per call it waits on, error
        results for calls that cannot run (an unknown tool, arguments that are not JSON), or its completion."""
        if not message.tool_calls:
            tx.complete({"text": message.text})
            return
        calls: list[dict[str, Any]] = []
        run_attempt = _run_attempt(rt.input, "attempt")
        for call in message.tool_calls:
            operation_id = tool_operation_id(run_id, turn, call.call_id)
            tool = self.agent.tool(call.name)
            if tool is None or call.invalid_arguments is not None:
                content = (
                    f"error: the agent has no tool {call.name!r}"
                    if tool is None
                    else f"error: the arguments are not a JSON object: {call.invalid_arguments}"
                )
                if tool is not None:  # an unknown tool has no version nor policy: its error is in the transcript only
                    _refused_call(
                        tx,
                        tool,
                        run_id=run_id,
                        operation_id=operation_id,
                        turn=turn,
                        call_id=call.call_id,
                        arguments=call.arguments,
                        error=content,
                    )
                _result_entry(
                    tx,
                    rt.conversation_id,
                    run_id=run_id,
                    operation_id=operation_id,
                    call_id=call.call_id,
                    name=call.name,
                    content=content,
                    is_error=True,
                )
                continue
            task_id = tx.create_task(
                TOOL_PREFIX + tool.name,
                {
                    "run_id": run_id,
                    "operation_id": operation_id,
                    "turn": turn,
                    "call_id": call.call_id,
                    "name": call.name,
                    "arguments": call.arguments,
                    **({} if run_attempt == 1 else {"run_attempt": run_attempt}),
                },
                task_id=_derived(rt.task_id, "tool", turn, call.call_id),
                owner_task_id=rt.task_id,
                version=tool.version,
            )
            calls.append({"call_id": call.call_id, "name": call.name, "task_id": task_id, "operation_id": operation_id})
        if calls:
            tx.wait(on=[call["task_id"] for call in calls], checkpoint={"phase": "tools", "turn": turn, "calls": calls})
        else:
            tx.advance({"phase": "turn", "turn": turn + 1})

    async def tools(self, rt: Phase) -> None:
        """After the turn's tool tasks: a result entry for every call without one (a commit only when one is
        missing), then the next turn in this same run of the phase: no commit of a ``turn`` state and no lease
        between the tools and the next model request. The task's next state is the one that turn commits; a run of
        this phase cut off after the results finds them in the transcript and goes on to the same turn."""
        turn = int(rt.checkpoint["turn"])
        async with rt.commit() as tx:
            entries = await self._missing_results(rt, tx, cancelled=False)
            if rt.stopping:
                # The worker drains: the next model request is the next run's of phase ``turn`` (another worker's,
                # or this one's once back), not a stream this stop would wait for.
                tx.advance({"phase": "turn", "turn": turn + 1})
        if rt.ended:
            return
        await self._turn(rt, turn + 1, None if tx.writes else entries)

    async def abort(self, rt: Phase) -> None:
        """A cancelled run: the calls of its last turn without a result get an error result, then it ends."""
        async with rt.commit() as tx:
            if isinstance(rt.checkpoint, dict) and rt.checkpoint.get("phase") == "tools":
                await self._missing_results(rt, tx, cancelled=True)
            tx.aborted()

    async def _missing_results(self, rt: Phase, tx: PhaseTransaction, *, cancelled: bool) -> Sequence[EntryRecord]:
        """Add to ``tx`` a result entry for every call of the turn without one; the transcript as read before."""
        run_id = str(rt.input["run_id"])
        calls: Sequence[dict[str, Any]] = rt.checkpoint["calls"]
        entries = await transcript(rt.client, rt.conversation_id)
        done = {
            entry.data.get("operation_id")
            for entry in entries
            if entry.kind == TOOL_RESULT_ENTRY and isinstance(entry.data, dict)
        }
        missing = [call for call in calls if call["operation_id"] not in done]
        outcomes = await rt.outcomes([call["task_id"] for call in missing]) if missing else {}
        for call in missing:
            outcome = outcomes.get(call["task_id"])
            if outcome is not None and outcome.status == "completed":
                content, is_error = content_text(outcome.result), False  # resolved by a person
            else:
                content, is_error = _unfinished(outcome, cancelled), True
            _result_entry(
                tx,
                rt.conversation_id,
                run_id=run_id,
                operation_id=call["operation_id"],
                call_id=call["call_id"],
                name=call["name"],
                content=content,
                is_error=is_error,
            )
        return entries


def _unfinished(outcome: TaskOutcome | None, cancelled: bool) -> str:
    if cancelled:
        return "error: the run was cancelled before the tool call finished"
    if outcome is None:
        return INTERRUPTED
    why = outcome.reason or outcome.error or ""
    return f"error: the tool call ended {outcome.status}" + (f" ({why})" if why else "")


def _one_line(text: str) -> str:
    return " ".join(text.splitlines())


def _message_data(message: Message) -> dict[str, Any]:
    if isinstance(message, UserMessage):
        return {"role": "user", "text": message.text}
    if isinstance(message, AssistantMessage):
        return {"role": "assistant", **assistant_data(message)}
    return {"role": "tool", "call_id": message.call_id, "content": message.content, "is_error": message.is_error}


# ------------------------------------------------------------------------------------------------ tool task


def _refused_call(
    tx: PhaseTransaction,
    tool: ToolDefinition,
    *,
    run_id: str,
    operation_id: str,
    turn: int,
    call_id: str,
    arguments: Any,
    error: str,
) -> None:
    """Journal a call of ``tool`` that runs nothing (arguments that are not JSON or fail its schema, a denial): its
    intent and its ``failed`` result (the error the model sees) in the commit that writes its result entry, so the
    journal lists it and a call and its result still land together. Never for a call that started an attempt."""
    tx.start_operation(
        StartOperation(
            operation_id=operation_id,
            run_id=run_id,
            kind="tool",
            name=tool.name,
            version=tool.version,
            turn=turn,
            attempt=1,
            digest=digest(arguments),
            tool_call_id=call_id,
            policy=tool.recovery,
            arguments=json_value(arguments),
        )
    )
    tx.finish_operation(
        FinishOperation(operation_id=operation_id, status="failed", result=JsonValue(error), is_error=True, error=error)
    )


class ToolRun:
    """The phases of a tool call's task (``tool:<name>``) for one :class:`ToolDefinition`."""

    def __init__(self, tool: ToolDefinition) -> None:
        self.tool = tool

    def definition(self) -> TaskDefinition:
        return TaskDefinition(
            kind=TOOL_PREFIX + self.tool.name,
            version=self.tool.version,
            initial=lambda _input: {"phase": "call"},
            phases={"call": self.call, "approved": self.approved},
            restart_limit=DEFAULT_RESTART_LIMIT,
        )

    async def call(self, rt: Phase) -> None:
        tool = self.tool
        run_id = str(rt.input["run_id"])
        operation_id = str(rt.input["operation_id"])
        guessed = _fresh(rt)
        op = None if guessed else await journaled(rt, operation_id)
        if op is not None and _has_result(op):
            await rt.complete(op.result)  # its result entry was committed with it
            return
        args = rt.input["arguments"]
        errors = tool.validate(args)
        if errors:
            await self._finish(rt, None, "error: invalid arguments: " + "; ".join(errors), is_error=True)
            return
        if tool.approval_required(args):
            async with rt.commit() as tx:
                tx.create_interaction(
                    CreateInteraction(
                        interaction_id=_derived(operation_id, "interaction"),
                        operation_id=operation_id,
                        run_id=run_id,
                        args=json_value(args),
                        digest=digest(args),
                    )
                )
                tx.wait(on=[approval_task_id(operation_id)], checkpoint={"phase": "approved"})
            return
        await self._execute(rt, op, guessed=guessed)

    async def approved(self, rt: Phase) -> None:
        """Resumed once the approval was answered: a denial is an error result; an approval runs exactly the
        approved arguments (the interaction's digest is of the same arguments the task holds)."""
        operation_id = str(rt.input["operation_id"])
        op = await journaled(rt, operation_id)
        if op is not None and _has_result(op):
            await rt.complete(op.result)
            return
        approval = approval_task_id(operation_id)
        outcome = (await rt.outcomes([approval]))[approval]
        answer: Any = outcome.result if outcome is not None and outcome.status == "completed" else None
        if not isinstance(answer, dict) or answer.get("approve") is not True:
            note = answer.get("note") if isinstance(answer, dict) else None
            content = "error: the call was denied by a person" + (f": {note}" if note else "")
            await self._finish(rt, None, content, is_error=True)
            return
        await self._execute(rt, op)

    async def _execute(self, rt: Phase, op: OperationRecord | None, *, guessed: bool = False) -> None:
        tool = self.tool
        inp = rt.input
        run_id = str(inp["run_id"])
        operation_id = str(inp["operation_id"])
        args = inp["arguments"]
        attempt = 1 if op is None else op.attempt + 1
        policy = tool.recovery if op is None or op.policy is None else op.policy
        intent = StartOperation(
            operation_id=operation_id,
            run_id=run_id,
            kind="tool",
            name=tool.name,
            version=tool.version,
            turn=int(inp["turn"]),
            attempt=attempt,
            digest=digest(args),
            tool_call_id=str(inp["call_id"]),
            policy=policy,
            arguments=json_value(args),
        )
        if not await _start(rt, intent, guessed):
            op = await journaled(rt, operation_id)  # the journal has an attempt: decide from it
            if op is not None and _has_result(op):
                await rt.complete(op.result)
                return
            await self._execute(rt, op)
            return
        call = ToolCall(
            operation_id=operation_id,
            run_id=run_id,
            conversation_id=rt.conversation_id,
            attempt=attempt,
            tool=tool.name,
            version=tool.version,
        )
        try:
            value = json_value(await tool.handler(call, dict(args)))
        except Exception as exc:  # the handler's failure is the model's to read
            await self._finish(rt, operation_id, f"error: {type(exc).__name__}: {exc}", is_error=True)
            return
        await self._finish(rt, operation_id, value, is_error=False)

    async def _finish(self, rt: Phase, operation_id: str | None, result: Any, *, is_error: bool) -> None:
        """ONE commit: the operation's result, the result entry and the task's completion. A call that ran nothing
        (``operation_id`` ``None``: invalid arguments, a denial) is journaled by :func:`_refused_call`."""
        inp = rt.input
        async with rt.commit() as tx:
            if operation_id is None:
                _refused_call(
                    tx,
                    self.tool,
                    run_id=str(inp["run_id"]),
                    operation_id=str(inp["operation_id"]),
                    turn=int(inp["turn"]),
                    call_id=str(inp["call_id"]),
                    arguments=inp["arguments"],
                    error=str(result),
                )
            else:
                tx.finish_operation(
                    FinishOperation(
                        operation_id=operation_id,
                        status="failed" if is_error else "completed",
                        result=JsonValue(result),
                        is_error=is_error,
                        error=result if is_error else None,
                    )
                )
            _result_entry(
                tx,
                rt.conversation_id,
                run_id=str(inp["run_id"]),
                operation_id=str(inp["operation_id"]),
                call_id=str(inp["call_id"]),
                name=str(inp["name"]),
                content=content_text(result),
                is_error=is_error,
            )
            tx.complete(result)


def run_definition(app: App, kind: str, *, log: Callable[[str], None] = log_stderr) -> TaskDefinition | None:
    """The task definition a worker of ``app`` runs for a lease of ``kind`` (``agent:<name>`` / ``tool:<name>``);
    ``log`` is the worker's log."""
    if kind.startswith(AGENT_PREFIX):
        agent = app.agents.get(kind.removeprefix(AGENT_PREFIX))
        return None if agent is None else AgentRun(agent, log).definition()
    if kind.startswith(TOOL_PREFIX):
        tool = app.tools.get(kind.removeprefix(TOOL_PREFIX))
        return None if tool is None else ToolRun(tool).definition()
    return None
