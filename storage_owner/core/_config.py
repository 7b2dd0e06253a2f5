"""Per-conversation configuration, sans-IO (docs/runs.md, "Configuration").

1. A conversation's configuration is its ``tether.config`` document, written only by ``configure`` (a
   ``put_document`` of a name under ``tether.`` is refused): each change is the document's next version, so a
   reader (a worker preparing a model request) sees one version whole.
2. ``configure`` checks every field before it writes (an unknown field, or a value of the wrong kind, is refused
   ``invalid`` naming it, and nothing changes); ``changes`` sets fields, ``clear`` drops them (the agent's definition,
   or the default, applies again); a change that changes nothing writes nothing and answers the current document.
3. What the owner reads of it: the inbox's modes (``steering``: ``first`` or ``all`` steers per boundary;
   ``follow_ups``: ``first`` (a run per follow-up) or ``all`` (follow-ups queued together share one run)). Workers
   read the rest (``model``, ``tools``, ``instructions``, ``max_turns``) when they prepare each model request, so a
   change applies from the next one; and ``after_failed_run`` (``wait``, ``continue`` or ``withdraw``: what becomes
   of the runs queued behind one that fails, ``_runs`` rule 7), read when a run ends.
4. ``model`` names a model the app defines (``app.define_model``); workers announce the names theirs define. A run's
   task in a conversation configured to use one is leased only to a worker naming it (:meth:`requirement`); with
   none attached among those that run the agent, it is blocked ``missing_model`` (the run ``needs_attention``,
   ``no_model``), until one attaches or the configuration changes; past the model grace (10 s on the owner's clock:
   a restart, a deploy) the engine ends the task ``failed``, reason ``no_model`` (``_task_settle``). A worker that
   finds, at a model request, a model its app does not name gives the lease back unrun (the owner leases it again by
   the new requirement).
5. A conversation created owned by a task starts with the configuration of that task's conversation (a subagent's
   transcript runs as its caller's does), copied in the creating commit as its version 1; later changes to either
   are the conversation's own. Bound to another agent than that conversation (a subagent of another kind), it takes
   only what applies to any agent (:data:`SHARED_FIELDS`: the model and the inbox's modes), not the caller's
   instructions, tools or turn limit.
6. ``configure`` refuses (``invalid``) a ``model`` or ``tools`` name that no attached worker announces (a capability
   of kind ``model`` or ``tool``), among the workers that run the conversation's agent when some are attached (they
   prepare its model requests: a tool their app does not define is never offered), else among all: the message names
   the unknown names and the known ones. With ``force`` it is stored anyway (a deploy that brings it later); a run
   then waits for a worker naming the model up to the model grace (``_task_settle``), then fails ``no_model``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from protocol import (
    AGENT_TASK_PREFIX,
    CONFIG_DOCUMENT,
    CONFIG_FIELDS,
    Capability,
    Configure,
    DocumentRecord,
    DocumentReply,
    ErrorCode,
    Frame,
    JsonValue,
    TaskRecord,
)

from ._checks import Refusal, check_id, missing_conversation
from ._ports import ConversationStore
from ._unit import Journal, UnitOfWork

MODES: Final[Mapping[str, tuple[str, ...]]] = {
    "steering": ("first", "all"),
    "follow_ups": ("first", "all"),
    "after_failed_run": ("wait", "continue", "withdraw"),
}
"""The inbox's modes and their values; the first is the default."""
SHARED_FIELDS: Final = frozenset({"model", *MODES})
"""What a conversation owned by a task takes of its caller's configuration when it is bound to another agent."""
MAX_CACHED_MODELS: Final = 100_000
"""Conversations whose configured model the owner remembers (the cache is dropped whole past this)."""
MODEL_CAPABILITY_PREFIX: Final = "model:"
"""A worker's capability key for a model its app names (``_task_placement.task_kind``)."""
MAX_INSTRUCTIONS_CHARS: Final = 64 << 10
MAX_TOOLS: Final = 256
MAX_NAME_CHARS: Final = 128


MAX_NAMES_SHOWN: Final = 20
"""Names a refusal of ``configure`` lists (the unknown ones, the known ones), the rest only counted: its message stays
small whatever the workers announce (up to 10,000 capabilities each) or the request names (256 tools)."""


def _check_name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME_CHARS or not value.isprintable():
        raise Refusal(ErrorCode.INVALID, f"{where} is a name of 1 to {MAX_NAME_CHARS} printable characters")
    if value != value.strip():
        raise Refusal(ErrorCode.INVALID, f"{where} is a name without spaces at its ends, not {value!r}")
    return value


def _listed(names: Sequence[str]) -> str:
    """``names`` quoted and joined, at most :data:`MAX_NAMES_SHOWN` of them, the rest counted."""
    shown = ", ".join(repr(name) for name in names[:MAX_NAMES_SHOWN])
    more = len(names) - MAX_NAMES_SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


def check_field(name: str, value: Any) -> JsonValue:
    """``value`` if it is what configuration field ``name`` takes; refused ``invalid`` (naming it) otherwise."""
    where = f"configure: {name}"
    if name in MODES:
        if value not in MODES[name]:
            raise Refusal(ErrorCode.INVALID, f"{where} is one of {', '.join(MODES[name])}, not {value!r}")
    elif name == "model":
        _check_name(value, where)
    elif name == "tools":
        if not isinstance(value, list) or len(value) > MAX_TOOLS:
            raise Refusal(ErrorCode.INVALID, f"{where} is a list of at most {MAX_TOOLS} tool names")
        for index, tool in enumerate(value):
            _check_name(tool, f"{where}[{index}]")
        if len(set(value)) != len(value):
            raise Refusal(ErrorCode.INVALID, f"{where} names a tool twice")
    elif name == "instructions":
        if not isinstance(value, str) or len(value) > MAX_INSTRUCTIONS_CHARS:
            raise Refusal(ErrorCode.INVALID, f"{where} is a text of at most {MAX_INSTRUCTIONS_CHARS} characters")
    elif name == "max_turns":
        if type(value) is not int or value < 1:
            raise Refusal(ErrorCode.INVALID, f"{where} is an integer 1 or more, not {value!r}")
    else:
        known = ", ".join(CONFIG_FIELDS)
        raise Refusal(ErrorCode.INVALID, f"configure: no field {name!r} (a configuration has {known})")
    return JsonValue(value)


class Configurations:
    """The conversations' configurations. See the module docstring."""

    def __init__(
        self,
        store: ConversationStore,
        journal: Journal,
        announced: Callable[[], Iterable[Sequence[Capability]]] = lambda: (),
    ) -> None:
        self._store = store
        self._announced = announced
        """What each attached worker announced (rule 6: the names ``configure`` checks)."""
        self._models: dict[str, str | None] = {}
        """The model each conversation is configured to use (``None``: its agent's), cached as it is read."""
        journal.cache(self._models.clear)

    def model_of(self, conversation_id: str) -> str | None:
        """The model the conversation is configured to use, if any (read once, then cached: placement asks for every
        run task it places)."""
        try:
            return self._models[conversation_id]
        except KeyError:
            pass
        if len(self._models) >= MAX_CACHED_MODELS:
            self._models.clear()
        model = self.current(conversation_id).get("model")
        self._models[conversation_id] = model if isinstance(model, str) else None
        return self._models[conversation_id]

    def requirement(self, record: TaskRecord) -> str | None:
        """What a task needs of its worker (placement's ``requires``): a run's task, unless it is being aborted (its
        abort handler asks no model), in a conversation configured to use a model needs a worker naming it."""
        if record.abort is not None or not record.kind.startswith(AGENT_TASK_PREFIX):
            return None
        model = self.model_of(record.conversation_id)
        return None if model is None else MODEL_CAPABILITY_PREFIX + model

    def current(self, conversation_id: str) -> dict[str, Any]:
        document = self._store.document(conversation_id, CONFIG_DOCUMENT)
        return dict(document.value) if document is not None and isinstance(document.value, dict) else {}

    def mode(self, conversation_id: str, name: str) -> str:
        """One of the inbox's modes for the conversation (rule 3)."""
        value = self.current(conversation_id).get(name)
        return value if isinstance(value, str) and value in MODES[name] else MODES[name][0]

    def inherit(self, unit: UnitOfWork, conversation_id: str, from_conversation_id: str, same_agent: bool) -> None:
        """Rule 5, in the commit that creates ``conversation_id``."""
        value = self.current(from_conversation_id)
        if not same_agent:
            value = {name: field for name, field in value.items() if name in SHARED_FIELDS}
        if value:
            self._put(unit, conversation_id, value, None)

    def on_configure(self, unit: UnitOfWork, request: Configure) -> Frame:
        """Rules 1 and 2."""
        check_id(request.conversation_id, "conversation_id")
        conversation = self._store.conversation(request.conversation_id)
        if conversation is None:
            raise missing_conversation(request.conversation_id)
        changes = request.changes
        if changes is None:
            changes = JsonValue({})
        if not isinstance(changes, dict):
            raise Refusal(ErrorCode.INVALID, "configure: changes is an object of fields to set")
        for name in request.clear:
            if name not in CONFIG_FIELDS:
                known = ", ".join(CONFIG_FIELDS)
                raise Refusal(ErrorCode.INVALID, f"configure: no field {name!r} to clear (a configuration has {known})")
            if name in changes:
                raise Refusal(ErrorCode.INVALID, f"configure: {name!r} is both set and cleared")
        checked = {name: check_field(name, value) for name, value in changes.items()}
        if not request.force:
            self._check_announced(conversation.agent, checked)
        before = self.current(request.conversation_id)
        after = {name: value for name, value in {**before, **checked}.items() if name not in request.clear}
        if after == before:
            return DocumentReply(document=self._store.document(request.conversation_id, CONFIG_DOCUMENT))
        stored = self._store.document(request.conversation_id, CONFIG_DOCUMENT)
        return DocumentReply(document=self._put(unit, request.conversation_id, after, stored))

    def _check_announced(self, agent: str | None, checked: Mapping[str, JsonValue]) -> None:
        """Rule 6: refuse a ``model`` or ``tools`` name that none of the attached workers that run the
        conversation's agent announces (all attached workers, when none runs it), naming the unknown and the known
        names."""
        wanted: dict[str, list[str]] = {}
        model = checked.get("model")
        if isinstance(model, str):
            wanted["model"] = [model]
        tools = checked.get("tools")
        if isinstance(tools, list):
            wanted["tool"] = [str(tool) for tool in tools]
        if not wanted:
            return
        announced = [tuple(capabilities) for capabilities in self._announced()]
        runs_agent = [
            capabilities
            for capabilities in announced
            if any(one.kind == "agent" and one.name == agent for one in capabilities)
        ]
        workers = runs_agent or announced
        where = f"the attached workers that run agent {agent!r}" if runs_agent else "the attached workers"
        then = (
            "nothing was changed. Define it in the app (app.define_model, app.define_tool) and deploy its workers, "
            "or pass force=True (tether configure --force) to store it anyway: a deploy that brings it later"
        )
        for kind, names in wanted.items():
            known = sorted({one.name for capabilities in workers for one in capabilities if one.kind == kind})
            unknown = [name for name in names if name not in known]
            if not unknown:
                continue
            field = "model" if kind == "model" else "tools"
            if not announced:
                message = f"configure: {field} {_listed(unknown)}: no worker is attached to check it against; {then}"
            else:
                names_known = f"they name {_listed(known)}" if known else f"they name no {kind}"
                message = f"configure: {field} {_listed(unknown)}: named by none of {where} ({names_known}); {then}"
            if kind == "model":
                message += " (a run then waits for a worker naming it for the model grace, then fails no_model)"
            raise Refusal(ErrorCode.INVALID, message)

    def _put(
        self, unit: UnitOfWork, conversation_id: str, value: dict[str, Any], stored: DocumentRecord | None
    ) -> DocumentRecord:
        document = DocumentRecord(
            conversation_id=conversation_id,
            name=CONFIG_DOCUMENT,
            version=1 if stored is None else stored.version + 1,
            value=JsonValue(value),
            seq=unit.seq,
            updated_at_ms=unit.now_ms,
        )
        self._store.put_document(document)
        self._models.pop(conversation_id, None)
        unit.records.append(document)
        return document
