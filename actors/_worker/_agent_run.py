"""The run loop: what a worker does with the leases of an agent's runs (``agent:<name>``), built on
:class:`~actors.Phase` (docs/agents.md says it for users, docs/runs.md what the owner decides). The calls of tools
are tasks of their own (``_tool_run.py``).

Every step is one commit, and every decision is read back from what is committed (the transcript and the run's
operation journal), so a phase that runs again after any crash goes on from the last commit, and never re-does a
committed result:

- a run's task, phase ``turn`` (checkpoint ``{"phase": "turn", "turn": n}``): reads the transcript into messages,
  commits the model request's intent (attempt from the journal), streams the model, then commits in ONE commit the
  result, the ``tether.assistant`` entry and the task's next state: its tool calls as ``tool:<name>`` tasks it waits
  on (phase ``tools``; a safe or idempotent call's intent with its task), or its completion with the answer (an
  answer cut off at its output limit, finish reason ``length``, runs none of its calls: each gets a ``cut_off`` error
  result in that commit, and the run completes). A retryable model error sleeps until the shared delay; a final one
  (or attempts spent) fails the run. What an attempt had streamed before it failed (in its failure's commit) or was
  cut off (in the commit of the next attempt's intent) is kept as a ``tether.aborted_answer`` entry, never sent to
  the model.
- a run's task, phase ``tools``: every call of the turn without a result entry (its task faulted, aborted, resolved
  by a person) gets one, and a tool's handoff its reset entry, in one commit (the round as the transcript holds it:
  ``_rounds.py``); then the next turn (or the run's answer, in that commit, when every call asked to terminate). Its
  abort handler writes the missing results too, so a cancelled run's transcript holds no call without a result.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

import attrs
import trio

from protocol import (
    ASSISTANT_ENTRY,
    CONFIG_DOCUMENT,
    RERUN_POLICIES,
    EntryRecord,
    FinishOperation,
    JsonValue,
    OperationRecord,
    StartOperation,
    TaskOutcome,
    ToolErrorCode,
    Write,
    aborted_answer_data,
    ended_code,
    has_result,
    json_value,
)
from protocol import Retry as ProtocolRetry
from protocol.io import log_stderr

from .._app._agents import AgentDefinition
from .._app._app import TaskDefinition
from .._app._tools import ToolDefinition
from .._models._model import (
    AssistantMessage,
    Message,
    Model,
    ModelError,
    StreamEvent,
    TextDelta,
    TurnBuilder,
    Usage,
)
from .._models._retry import next_delay_ms
from ._journal import (
    AGENT_PREFIX,
    TOOL_PREFIX,
    _derived,
    _fresh,
    _refused_call,
    _result_entry,
    _run_attempt,
    _start,
    content_text,
    journaled,
    model_operation_id,
    run_usage,
    tool_intent,
    tool_operation_id,
)
from ._messages import (
    CUT_OFF,
    INTERRUPTED,
    LENGTH,
    _assistant_message,
    assistant_data,
    message_fold,
    request_digest,
    was_cut_off,
)
from ._partials import aborted_answer, append_aborted_answer, partial_output
from ._phase import Phase, PhaseTransaction
from ._reports import phase_report
from ._rounds import place_handoff, reset_since_answer, round_tail, terminated
from ._transcript import transcript


class _Unread:
    """No configuration was read yet: ``_turn`` reads it."""


UNREAD: Final = _Unread()


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


class ModelUnavailable(Exception):
    """The conversation is configured to use a model this worker's app does not name: the phase gives its lease back
    unrun, and the owner leases the task to a worker that names it (or shows the run ``no_model``)."""

    def __init__(self, model: str) -> None:
        super().__init__(f"the conversation is configured to use the model {model!r}, which this app does not define")
        self.model = model


@attrs.frozen
class Configuration:
    """A conversation's configuration at one version (its ``tether.config`` document, written by ``configure``)."""

    version: int
    value: Mapping[str, Any]

    @staticmethod
    async def read(rt: Phase) -> Configuration | None:
        """The conversation's configuration now (``None``: never configured). One read per model request."""
        document = await rt.client.document(CONFIG_DOCUMENT, conversation_id=rt.conversation_id)
        if document is None or not isinstance(document.value, dict):
            return None
        return Configuration(document.version, dict(document.value))

    def to_arguments(self) -> JsonValue:
        """What a model request's intent records of it (its ``arguments``): the version and the fields."""
        return JsonValue({"configuration": {"version": self.version, "value": dict(self.value)}})

    @staticmethod
    def recorded(arguments: JsonValue) -> Configuration | None:
        """The configuration a model request's intent recorded, if any."""
        found = arguments.get("configuration") if isinstance(arguments, dict) else None
        if not isinstance(found, dict) or not isinstance(found.get("value"), dict):
            return None
        version = found.get("version")
        return Configuration(version if isinstance(version, int) else 0, dict(found["value"]))


class AgentRun:
    """The phases of an agent's run task (``agent:<name>``) for one :class:`AgentDefinition`. ``log`` is the
    worker's log: a failed model attempt is one line of it (what failed, and what comes of it)."""

    def __init__(
        self,
        agent: AgentDefinition,
        log: Callable[[str], None] = log_stderr,
        app_tools: Mapping[str, ToolDefinition] | None = None,
        app_models: Mapping[str, Model] | None = None,
    ) -> None:
        self.agent = agent
        self._log = log
        self._app_tools = app_tools or {tool.name: tool for tool in agent.tools}
        """The tools a conversation's configuration may select (the app's), by name."""
        self._app_models = app_models or {}
        """The models a conversation's configuration may select (``app.define_model``), by name."""

    def configured(self, configuration: Configuration | None) -> AgentDefinition:
        """The agent as a configuration (``configure``) has it: its ``model`` (a name of the app's models),
        ``instructions``, ``max_turns`` and ``tools`` (names of the app's tools; one the app does not define is left
        out) replace the definition's. Raises :class:`ModelUnavailable` for a model this app does not name."""
        config = {} if configuration is None else configuration.value
        changes: dict[str, Any] = {}
        if isinstance(config.get("model"), str):
            model = self._app_models.get(config["model"])
            if model is None:
                raise ModelUnavailable(config["model"])
            changes["model"] = model
        if isinstance(config.get("instructions"), str):
            changes["instructions"] = config["instructions"]
        if "max_turns" in config:
            changes["max_turns"] = config["max_turns"]
        if isinstance(config.get("tools"), list):
            changes["tools"] = tuple(self._app_tools[name] for name in config["tools"] if name in self._app_tools)
        return attrs.evolve(self.agent, **changes) if changes else self.agent

    def _max_turns(self, configuration: Configuration | None) -> int | None:
        """The turn limit a configuration gives the agent (as :meth:`configured` reads it), without its model."""
        if configuration is not None and "max_turns" in configuration.value:
            limit = configuration.value["max_turns"]
            return limit if isinstance(limit, int) else None
        return self.agent.max_turns

    def _replayed(self, op: OperationRecord | None, current: Configuration | None) -> Configuration | None:
        """The configuration a model request runs with: the one its first attempt recorded in its intent (none, if
        the conversation had none then), so a later attempt of the same turn repeats the same request; unless this
        worker cannot honour it (its model is not named here: the conversation moved to another since), then the
        current one, as a new turn would. The first attempt runs with the current one."""
        if op is None:
            return current
        recorded = Configuration.recorded(op.arguments)
        model = None if recorded is None else recorded.value.get("model")
        return current if isinstance(model, str) and model not in self._app_models else recorded

    def definition(self) -> TaskDefinition:
        return TaskDefinition(
            kind=AGENT_PREFIX + self.agent.name,
            version=self.agent.version,
            initial=lambda _input: {"phase": "turn", "turn": 1},
            phases={"turn": self.turn, "tools": self.tools},
            abort=self.abort,
            restart_limit=self.agent.restart_limit,
        )

    async def turn(self, rt: Phase) -> None:
        await self._turn(rt, int(rt.checkpoint["turn"]))

    async def _turn(
        self,
        rt: Phase,
        turn: int,
        entries: Sequence[EntryRecord] | None = None,
        *,
        guess: bool = True,
        configuration: Configuration | _Unread | None = UNREAD,
    ) -> None:
        """Model turn ``turn``, from phase ``turn`` or straight after the tools of turn ``turn - 1`` (``entries``:
        the transcript already read there; ``configuration``: the conversation's, read beside it). ``guess``: a fresh
        state may skip reading the journal (:func:`_start`)."""
        run_id = str(rt.input["run_id"])
        operation_id = model_operation_id(run_id, turn)
        current = await Configuration.read(rt) if isinstance(configuration, _Unread) else configuration
        guessed = guess and _fresh(rt)
        op = None if guessed else await journaled(rt, operation_id)
        configuration = self._replayed(op, current)
        agent = self.configured(configuration)  # (a model not named here: the lease goes back, unrun)
        if op is None and agent.max_turns is not None and turn > agent.max_turns:
            limit = f"the run reached its agent's limit of {agent.max_turns} model turns"
            await rt.fail(limit, reason="max_turns")
            return
        if op is not None and op.status == "completed":
            # Answered already (a retried run, or a commit whose reply was lost): go on from the committed result;
            # its assistant entry was written in the same commit.
            async with rt.commit() as tx:
                message = _assistant_message(op.result)
                self._next(tx, rt, agent, run_id, turn, message, fold=False, cut_off=was_cut_off(op.result))
            return
        if op is not None and has_result(op):
            await rt.fail(f"model request failed: {op.error}", reason="model_error")
            return
        retry = op.retry if op is not None and op.retry is not None else agent.model_retry.to_protocol()
        attempt = 1 if op is None else op.attempt + 1
        aborted = None
        if op is not None and op.status == "interrupted":
            # What the cut-off attempt had streamed is kept as an entry, in the commit of this attempt's intent: its
            # stored output is read before this attempt's first piece replaces it (``_partials.aborted_answer``).
            aborted = aborted_answer(op, (await rt.client.partials(operation_id=operation_id)).partials)
        if entries is None:
            entries = await transcript(rt.client, rt.conversation_id)
        if turn > 1 and op is None and reset_since_answer(entries, run_id):
            # A reset was placed when this run's tool round ended: the run ends there, unanswered.
            await rt.fail("a reset was placed at the end of the run's tool round: the run ends there", reason="reset")
            return
        fold = message_fold(rt.client, rt.conversation_id, entries)
        messages = fold.messages()
        if turn == 1 and op is None and not _answerable(messages):
            # A continue on a context with nothing to answer (empty, or ending in an answer): no request is made.
            await rt.fail("nothing to answer: the context is empty or ends in an answer", reason="nothing_to_answer")
            return
        request = agent.request(messages, attempt, turn)
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
            arguments=JsonValue(None) if configuration is None else configuration.to_arguments(),
        )
        keep = (
            None
            if aborted is None
            else functools.partial(append_aborted_answer, conversation_id=rt.conversation_id, data=aborted)
        )
        if not await _start(rt, intent, guessed, keep):
            await self._turn(rt, turn, guess=False)  # the journal has an attempt: decide from it
            return
        builder = TurnBuilder()
        failure: ModelError | None = None
        telemetry = rt._telemetry
        span = (
            None if telemetry is None else telemetry.start_model_request(agent.model.name, operation_id, turn, attempt)
        )
        try:
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
        except BaseException as exc:  # cut off while it streamed (cancelled, the connection lost)
            if span is not None:
                span.end(None, exc, builder.usage)
            raise
        if span is not None:
            span.end(None if failure is not None else result, failure, builder.usage)
        if failure is not None:
            await self._model_failed(
                rt, operation_id, turn, attempt, retry, failure, partial.final_writes(), builder.usage, builder.text
            )
            return
        message = result.message
        cut_off = result.finish_reason == LENGTH
        answer_data = {**assistant_data(message), **({"cut_off": True} if cut_off else {})}
        async with rt.commit() as tx:
            tx.writes.extend(partial.final_writes())  # the rest of the text, then the result: its output is done
            tx.finish_operation(
                FinishOperation(
                    operation_id=operation_id,
                    status="completed",
                    result=json_value(answer_data),
                    usage=run_usage(result.usage),
                )
            )
            tx.append(
                rt.conversation_id,
                kind=ASSISTANT_ENTRY,
                entry_id=_derived(operation_id, "assistant"),
                data={"run_id": run_id, "turn": turn, **answer_data},
            )
            self._next(tx, rt, agent, run_id, turn, message, cut_off=cut_off)

    async def _model_failed(
        self,
        rt: Phase,
        operation_id: str,
        turn: int,
        attempt: int,
        retry: ProtocolRetry,
        exc: ModelError,
        pieces: Sequence[Write] = (),
        usage: Usage | None = None,
        streamed: str = "",
    ) -> None:
        """One commit: the attempt's failure (with the usage the provider reported before it failed, if it did: a
        failed attempt's tokens are spent too, and count in every total), what it had ``streamed`` as a
        ``tether.aborted_answer`` entry (none when it streamed nothing), and the task's next state. A retryable error
        with attempts left sleeps until the back-off's deadline (``retry_wait``); a final one, or the policy's last
        attempt, fails the run at once: no wait is taken for a try that never comes."""
        error = f"{exc.kind}: {exc}"
        delay = next_delay_ms(retry, attempt, exc.retry_after_ms) if exc.retryable else None
        async with rt.commit() as tx:
            tx.writes.extend(pieces)  # what streamed before the failure, aborted with it
            tx.finish_operation(
                FinishOperation(operation_id=operation_id, status="failed", error=error, usage=run_usage(usage))
            )
            if streamed:
                data = aborted_answer_data(
                    run_id=str(rt.input["run_id"]),
                    turn=turn,
                    operation_id=operation_id,
                    attempt=attempt,
                    ended="failed",
                    text=streamed,
                )
                append_aborted_answer(tx, rt.conversation_id, data)
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

    def _next(
        self,
        tx: PhaseTransaction,
        rt: Phase,
        agent: AgentDefinition,
        run_id: str,
        turn: int,
        message: AssistantMessage,
        *,
        fold: bool = True,
        cut_off: bool = False,
    ) -> None:
        """The task's next state after the model's answer of ``turn``: one tool task per call it waits on, error
        results for calls that cannot run (an unknown tool, arguments that are not JSON), or its completion.
        ``fold``: a call that re-runs when cut off gets its intent in this commit (:func:`_starts_with_its_task`),
        and a call that cannot run its error result; not when going on from a result committed before (a retried run:
        its commit created the tasks and wrote those results already). ``cut_off``: the
        answer was cut off at its output limit (finish reason ``length``): its calls never run (no task, no intent),
        each gets a ``cut_off`` error result (in the result's commit only: going on from a committed result, they were
        written with it, and the owner would refuse their ids twice), and the run ends as a cut-off answer without
        calls does, with its answer; a continue goes on from those results (docs/runs.md, "Continue")."""
        if cut_off and fold:
            for call in message.tool_calls:
                _result_entry(
                    tx,
                    rt.conversation_id,
                    run_id=run_id,
                    operation_id=tool_operation_id(run_id, turn, call.call_id),
                    call_id=call.call_id,
                    name=call.name,
                    content=CUT_OFF,
                    is_error=True,
                    code="cut_off",
                )
        if cut_off or not message.tool_calls:
            value, problem = agent.parse_answer(message.text)
            if problem is not None:  # an agent with an output_schema, answered otherwise
                tx.fail(problem, reason="invalid_output")
                return
            # A steer that came after the last tool round is placed after this answer, and answered by one more
            # request of this run (the owner decides, in this commit: nothing can slip between).
            tx.answer(message.text, _steer_checkpoint(agent.max_turns, turn), value)
            return
        calls: list[dict[str, Any]] = []
        run_attempt = _run_attempt(rt.input, "attempt")
        for call in message.tool_calls:
            operation_id = tool_operation_id(run_id, turn, call.call_id)
            tool = agent.tool(call.name)
            if tool is not None and not tool.agent_callable:
                tool = None  # only other tools call it: the model was not offered it
            if tool is None or call.invalid_arguments is not None:
                if not fold:  # its error result was written with the answer, and the owner refuses its id twice
                    continue
                content = (
                    f"error: the agent has no tool {call.name!r}"
                    if tool is None
                    else f"error: the arguments are not a JSON object: {call.invalid_arguments}"
                )
                code: ToolErrorCode = "unknown_tool" if tool is None else "invalid_arguments"
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
                        code=code,
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
                    code=code,
                )
                continue
            started = fold and run_attempt == 1 and _starts_with_its_task(tool, call.arguments)
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
                    **({"started": True} if started else {}),
                },
                task_id=_derived(rt.task_id, "tool", turn, call.call_id),
                owner_task_id=rt.task_id,
                version=tool.version,
            )
            if started:  # its intent, attempt 1, in this commit: its lease runs the call with no commit first
                tx.start_operation(
                    tool_intent(
                        tool,
                        run_id=run_id,
                        operation_id=operation_id,
                        turn=turn,
                        call_id=call.call_id,
                        arguments=call.arguments,
                        task_id=task_id,
                    )
                )
            calls.append({"call_id": call.call_id, "name": call.name, "task_id": task_id, "operation_id": operation_id})
        if calls:
            tx.wait(on=[call["task_id"] for call in calls], checkpoint={"phase": "tools", "turn": turn, "calls": calls})
        else:
            tx.advance({"phase": "turn", "turn": turn + 1})

    async def tools(self, rt: Phase) -> None:
        """After the turn's tool tasks: a result entry for every call without one and the reset of the round's
        handoff (a commit only when one of them is missing), then the next turn in this same run of the phase: no
        commit of a ``turn`` state and no lease between the tools and the next model request. The task's next state
        is the one that turn commits; a run of this phase cut off after the results finds them (and the handoff) in
        the transcript and goes on to the same turn."""
        turn = int(rt.checkpoint["turn"])
        run_id = str(rt.input["run_id"])
        calls: Sequence[Mapping[str, Any]] = rt.checkpoint["calls"]
        # The next request's configuration is read beside the transcript: the two reads travel together.
        configuration, entries = await _both(
            lambda: Configuration.read(rt), lambda: transcript(rt.client, rt.conversation_id)
        )
        async with rt.commit() as tx:
            faulted = await self._missing_results(rt, tx, cancelled=False, entries=entries)
            if faulted is not None:
                # A call's task faulted (a durable step of it failed, its phase raised): no error result the model
                # may ignore, the run fails (``faulted``), naming the call, in the commit of the round's results.
                tx.fault(None, faulted)
            else:
                place_handoff(tx, rt.conversation_id, entries, calls, run_id, turn)
                answer = terminated(entries, calls, run_id)  # (a call whose result was missing did not terminate)
                if answer is not None:
                    # Every call of the round asked to end the run: no other model request; its answer is the last
                    # call's output (a steer queued meanwhile still gets one more request of this run: the owner
                    # decides), in the commit that places the round's handoff, if it has one.
                    tx.answer(answer, _steer_checkpoint(self._max_turns(configuration), turn))
                elif rt.stopping:
                    # The worker drains: the next model request is the next run's of phase ``turn`` (another
                    # worker's, or this one's once back), not a stream this stop would wait for.
                    tx.advance({"phase": "turn", "turn": turn + 1})
        if faulted is not None:
            await rt.report(phase_report(rt, "task_faulted", faulted))
            return
        if rt.ended:
            return
        await self._turn(rt, turn + 1, None if tx.writes else entries, configuration=configuration)

    async def abort(self, rt: Phase) -> None:
        """A cancelled run: the calls of its last turn without a result get an error result, then it ends."""
        async with rt.commit() as tx:
            if isinstance(rt.checkpoint, dict) and rt.checkpoint.get("phase") == "tools":
                await self._missing_results(rt, tx, cancelled=True)
            tx.aborted()

    async def _missing_results(
        self, rt: Phase, tx: PhaseTransaction, *, cancelled: bool, entries: Sequence[EntryRecord] | None = None
    ) -> str | None:
        """Add to ``tx`` a result entry for every call of the turn without one (``entries``: the transcript, read
        here when not given). Returns why the run faults, if a call's task faulted (other than at its restart limit,
        whose error result the model reads), naming the first such call."""
        run_id = str(rt.input["run_id"])
        calls: Sequence[dict[str, Any]] = rt.checkpoint["calls"]
        if entries is None:
            entries = await transcript(rt.client, rt.conversation_id)
        done, _ = round_tail(entries, run_id)  # the round's results follow its assistant entry: no whole scan
        missing = [call for call in calls if call["operation_id"] not in done]
        outcomes = await rt.outcomes([call["task_id"] for call in missing]) if missing else {}
        faulted: str | None = None
        for call in missing:
            outcome = outcomes.get(call["task_id"])
            code: ToolErrorCode | None = None
            if outcome is not None and outcome.status == "completed":
                content, is_error = content_text(outcome.result), False  # resolved by a person
            else:
                content, code = _unfinished(outcome, cancelled)
                is_error = True
                if code == "faulted" and faulted is None:
                    assert outcome is not None
                    faulted = (
                        f"the tool call {call['call_id']} (tool {call['name']!r}, operation {call['operation_id']}) "
                        f"faulted: {_why(outcome)}"
                    )
            _result_entry(
                tx,
                rt.conversation_id,
                run_id=run_id,
                operation_id=call["operation_id"],
                call_id=call["call_id"],
                name=call["name"],
                content=content,
                is_error=is_error,
                code=code,
            )
        return faulted


def _steer_checkpoint(max_turns: int | None, turn: int) -> dict[str, Any] | None:
    """Where a run answering at ``turn`` goes on if the owner finds a steer queued: one more turn, unless this was its
    last allowed one. An answer always ends the run and is never cut off by its turn limit: the steer is then left
    in the inbox, and the owner gives it a run of its own (or the run queued next places it first)."""
    if max_turns is not None and turn >= max_turns:
        return None
    return {"phase": "turn", "turn": turn + 1}


def _starts_with_its_task(tool: ToolDefinition, arguments: Any) -> bool:
    """Whether a call's intent goes in the commit that creates its tool task (the model's result) rather than in one
    of the tool task's own just before the handler runs: for a call that re-runs when cut off (``safe``,
    ``idempotent``: cut off after its lease but before its handler, it is re-run as if it had run) with valid
    arguments and no approval to ask. A ``report`` or ``manual`` call keeps its intent next to its handler, so that an
    interruption still means that it may have run."""
    if tool.recovery not in RERUN_POLICIES or not isinstance(arguments, dict) or tool.validate(arguments):
        return False
    try:
        return not tool.approval_required(arguments)
    except Exception:  # the tool task asks again, and fails the call with the error
        return False


A = TypeVar("A")
B = TypeVar("B")


async def _both(first: Callable[[], Awaitable[A]], second: Callable[[], Awaitable[B]]) -> tuple[A, B]:
    """``first()`` and ``second()`` at once (their requests leave in one message and are answered in one batch of the
    owner): both results, or the first error either raised, as itself (not in an exception group)."""
    results: dict[int, Any] = {}
    errors: list[Exception] = []

    async def run(index: int, function: Callable[[], Awaitable[Any]]) -> None:
        try:
            results[index] = await function()
        except Exception as exc:  # raised below, as it is: callers catch StaleLease, NotFound, ...
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, 0, first)
        nursery.start_soon(run, 1, second)
    if errors:
        raise errors[0]
    return results[0], results[1]


def _answerable(messages: Sequence[Message]) -> bool:
    """Whether a model has something to answer: a context that is not empty and does not end in an answer (an
    assistant message without tool calls; one with calls ends in their results, real or ``interrupted``)."""
    if not messages:
        return False
    last = messages[-1]
    return not (isinstance(last, AssistantMessage) and not last.tool_calls)


MAX_WHY_CHARS: Final = 1000
"""The most of a tool task's reason and error an unfinished call's error result quotes."""


def _unfinished(outcome: TaskOutcome | None, cancelled: bool) -> tuple[str, ToolErrorCode]:
    """The error result of a call whose task ended without writing one, and its code."""
    if cancelled:
        return "error: the run was cancelled before the tool call finished", "cancelled"
    if outcome is None:
        return INTERRUPTED, "interrupted"
    why = _why(outcome)
    code = ended_code(outcome)
    if code == "restart_limit":
        return f"error: the tool call was cut off too many times in a row and was not run again ({why})", code
    return f"error: the tool call ended {outcome.status}" + (f" ({why})" if why else ""), code


def _why(outcome: TaskOutcome) -> str:
    """A tool task's reason and error, at most :data:`MAX_WHY_CHARS` characters."""
    why = ": ".join(part for part in (outcome.reason, outcome.error) if part)
    return why if len(why) <= MAX_WHY_CHARS else why[: MAX_WHY_CHARS - 1] + "…"


def _one_line(text: str) -> str:
    return " ".join(text.splitlines())
