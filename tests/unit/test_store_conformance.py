"""The store conformance suite: the rules of the core's ports (``storage_owner/core/_ports.py``'s docstring) that every
store keeps, run against both stores, ``SqliteStore`` on a temp file and ``MemoryStore``, each case on a fresh store of
its own. Every port method is called by at least one case (:func:`test_every_port_method_is_called_by_a_case`).

The rest of the SQLite store (migrations, ownership, WAL checkpoints) is ``test_store.py``'s."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from protocol import (
    Budget,
    DocumentRecord,
    EntryRecord,
    InteractionRecord,
    JsonValue,
    ModelPrice,
    OperationRecord,
    Order,
    RunAnswer,
    RunRecord,
    RunStatus,
    RunUsage,
    SubmissionRecord,
    TaskOutcome,
    TaskStatus,
    new_id,
)
from storage_owner.core import (
    NO_CHANGE,
    ConversationReads,
    ConversationStore,
    LoggedCommit,
    LogStore,
    OperationReads,
    OperationStore,
    PartialHead,
    PartialStore,
    RunReads,
    RunStore,
    Store,
    StoreConflict,
    TaskReads,
    TaskStore,
    UsageStore,
)
from tests.unit._stores import (
    STORE_KINDS,
    StoreUnderTest,
    conversation_record,
    entry_record,
    full_task_record,
    open_store,
    reopened,
    submission_record,
    task_record,
    typed,
    with_conversation,
)

PORTS = (
    LogStore,
    ConversationReads,
    ConversationStore,
    RunReads,
    RunStore,
    OperationReads,
    OperationStore,
    TaskReads,
    TaskStore,
    UsageStore,
    PartialStore,
)
SPECIAL_KEYS = ("__proto__", "constructor", "toString", "hasOwnProperty", "")
"""Names a store might take for its own (a JavaScript object's, an empty string): data like any other."""


@pytest.fixture(params=STORE_KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreUnderTest]:
    opened = open_store(request.param, tmp_path)
    yield opened
    opened.close()


def _append(store: StoreUnderTest, conversation_id: str, count: int) -> list[EntryRecord]:
    added = []
    for _ in range(count):
        position = store.next_entry_position(conversation_id)
        assert position is not None
        entry = entry_record(conversation_id, position)
        store.insert_entry(entry)
        added.append(entry)
    return added


def _entries(store: StoreUnderTest, conversation_id: str, order: Order, cursor: int | None, limit: int) -> list[Any]:
    return store.entry_page(conversation_id, order, cursor, limit)[0]


def _run(conversation_id: str, *, run_id: str | None = None, status: RunStatus = "queued", seq: int = 1) -> RunRecord:
    run_id = run_id or new_id()
    return RunRecord(
        run_id=run_id,
        conversation_id=conversation_id,
        agent="support",
        version=1,
        status=status,
        submission_id=run_id,
        seq=seq,
        created_at_ms=50,
        updated_at_ms=50,
    )


def _operation(run: RunRecord, task_id: str, *, operation_id: str | None = None) -> OperationRecord:
    return OperationRecord(
        operation_id=operation_id or new_id(),
        run_id=run.run_id,
        conversation_id=run.conversation_id,
        task_id=task_id,
        kind="tool",
        name="refund",
        version=1,
        turn=1,
        attempt=1,
        arguments=JsonValue({"order": {"id": "42", "lines": [1, 2]}}),
        digest="d",
        status="started",
        seq=2,
        created_at_ms=60,
        updated_at_ms=60,
    )


def _interaction(op: OperationRecord, *, interaction_id: str | None = None) -> InteractionRecord:
    return InteractionRecord(
        interaction_id=interaction_id or new_id(),
        run_id=op.run_id,
        conversation_id=op.conversation_id,
        operation_id=op.operation_id,
        tool=op.name,
        task_id=new_id(),
        kind="approval",
        status="open",
        args=JsonValue({"order": {"id": "42"}}),
        digest="d",
        seq=3,
        created_at_ms=70,
        updated_at_ms=70,
    )


def _head(run: RunRecord, operation_id: str, *, pieces: int = 0, status: Any = "streaming") -> PartialHead:
    return PartialHead(
        operation_id=operation_id,
        run_id=run.run_id,
        conversation_id=run.conversation_id,
        attempt=1,
        intent_seq=2,
        status=status,
        chars=0,
        size_bytes=0,
        pieces=pieces,
        seq=2,
        created_at_ms=80,
        updated_at_ms=80,
    )


@attrs.define
class World:
    """One of every record, written by :func:`_write_world` in one batch; :func:`_snapshot` reads them all back."""

    conversation_id: str = attrs.field(factory=new_id)
    task_id: str = attrs.field(factory=new_id)
    run_id: str = attrs.field(factory=new_id)
    operation_id: str = attrs.field(factory=new_id)
    interaction_id: str = attrs.field(factory=new_id)


def _write_world(store: StoreUnderTest, world: World, seq: int) -> None:
    """A batch that writes every kind of record once (a conversation, its entries, a document, a submission, a task,
    a run, an operation and its interaction, usage, a price, a budget, a meta value, partial output) and logs it."""
    conversation = conversation_record(world.conversation_id, seq)
    store.insert_conversation(conversation)
    entries = [entry_record(world.conversation_id, position, seq=seq) for position in range(3)]
    for entry in entries:
        store.insert_entry(entry)
    store.put_document(
        DocumentRecord(
            conversation_id=world.conversation_id, name="d", version=1, value=JsonValue(1), seq=seq, updated_at_ms=1
        )
    )
    store.insert_submission(submission_record(world.conversation_id, request_id="world"))
    store.insert_task(task_record(world.conversation_id, task_id=world.task_id), {"in": 1}, {"phase": "a"})
    run = _run(world.conversation_id, run_id=world.run_id, seq=seq)
    store.insert_run(run, {"text": "hello"})
    op = _operation(run, world.task_id, operation_id=world.operation_id)
    store.insert_operation(op)
    store.insert_interaction(_interaction(op, interaction_id=world.interaction_id))
    store.add_usage("conversation", world.conversation_id, RunUsage(input_tokens=1, cost=0.5))
    store.put_price(ModelPrice(model=world.run_id, input_per_mtok=1.0, output_per_mtok=2.0))
    store.put_budget(Budget(scope="conversation", key=world.conversation_id, max_tokens=10))
    store.set_meta(world.conversation_id, seq)
    store.put_partial(_head(run, world.operation_id, pieces=1))
    store.insert_partial_piece(world.operation_id, 0, "partial")
    records = (conversation, *entries)
    store.log_commit(LoggedCommit(seq=seq, committed_at_ms=seq, records=records), frozenset({world.conversation_id}))


def _snapshot(store: StoreUnderTest, world: World) -> dict[str, Any]:
    """Everything a reader can see of ``world`` (and of the log, the runs, the tasks and the prices as a whole)."""
    task = store.task(world.task_id)
    return {
        "head": store.head_seq(),
        "log": store.read_log(0, None, 100),
        "conversation": store.conversation(world.conversation_id),
        "position": store.next_entry_position(world.conversation_id),
        "entries": store.entry_page(world.conversation_id, "asc", None, 100),
        "document": store.document(world.conversation_id, "d"),
        "submission": store.submission(world.conversation_id, "world"),
        "task": task,
        "task_data": None if task is None else store.task_data(world.task_id),
        "live_tasks": list(store.live_tasks()),
        "live_task_rows": [tuple(row) for row in store.live_task_rows()],
        "run": store.run(world.run_id),
        "runs": store.run_page(None, None, None, 100),
        "live_runs": store.live_runs(),
        "operation": store.operation(world.operation_id),
        "operations": store.operation_page(world.run_id, 0, 100),
        "open": store.open_operations(world.task_id),
        "interaction": store.interaction(world.interaction_id),
        "interactions": store.interaction_page(None, None, None, 100),
        "usage": store.usage("conversation", None),
        "prices": store.prices(),
        "budget": store.budget("conversation", world.conversation_id),
        "budgets": store.budget_count(),
        "meta": store.get_meta(world.conversation_id),
        "partial": store.partial(world.operation_id),
        "held": store.held_partials(),
        "partials": store.run_partials_from(world.run_id, None, 100),
        "text": store.partial_text(world.operation_id),
    }


# ------------------------------------------------------------------------------------- atomic batches


def test_a_mixed_batch_is_atomic_committed_whole_or_rolled_back_whole(store: StoreUnderTest) -> None:
    nothing = _snapshot(store, World())
    rolled_back = World()
    store.begin()
    _write_world(store, rolled_back, 1)
    assert _snapshot(store, rolled_back) != nothing  # seen inside the transaction
    store.rollback()
    assert _snapshot(store, rolled_back) == nothing

    committed = World()
    store.begin()
    _write_world(store, committed, 1)
    written = _snapshot(store, committed)
    store.commit()
    assert _snapshot(store, committed) == written
    assert written["head"] == 1 and written["position"] == 3 and written["text"] == "partial"


def test_a_commit_is_kept_and_a_transaction_open_at_close_is_lost(store: StoreUnderTest) -> None:
    committed, pending = World(), World()
    store.begin()
    _write_world(store, committed, 1)
    store.commit()
    written = _snapshot(store, committed)
    nothing = _snapshot(store, World())
    store.begin()
    _write_world(store, pending, 2)
    store.close()
    again = reopened(store)
    try:
        assert _snapshot(again, committed) == written
        assert _snapshot(again, pending) == nothing
    finally:
        again.close()


def test_a_rolled_back_savepoint_undoes_every_write_and_consumes_nothing_visible(store: StoreUnderTest) -> None:
    world = World()
    store.begin()
    _write_world(store, world, 1)
    store.commit()
    before = _snapshot(store, world)
    run = store.run(world.run_id)
    task = store.task(world.task_id)
    op = store.operation(world.operation_id)
    interaction = store.interaction(world.interaction_id)
    assert run is not None and task is not None and op is not None and interaction is not None

    store.begin()
    store.savepoint()
    # New records of every kind, and changes to every kind of stored one.
    _write_world(store, World(), 2)
    store.insert_entry(entry_record(world.conversation_id, 3, seq=2))
    store.put_document(attrs.evolve(before["document"], version=2, value=JsonValue("changed"), seq=2))
    store.update_task(attrs.evolve(task, status="running", epoch=1, seq=2), checkpoint={"phase": "b"})
    store.update_run(attrs.evolve(run, status="pending", task_id=world.task_id, seq=2))
    store.update_operation(attrs.evolve(op, status="completed", result=JsonValue("done"), seq=2))
    store.update_interaction(attrs.evolve(interaction, status="cancelled", seq=2))
    store.insert_operation(_operation(run, world.task_id))
    store.add_usage("conversation", world.conversation_id, RunUsage(input_tokens=5, cost=1.0))
    store.delete_price(world.run_id)
    store.delete_budget("conversation", world.conversation_id)
    store.set_meta(world.conversation_id, 99)
    store.put_partial(attrs.evolve(before["partial"], status="done", pieces=0, seq=2))
    store.delete_partial_pieces(world.operation_id)
    store.put_partial(_head(run, new_id()))
    store.rollback_savepoint()
    assert store.in_transaction  # the batch goes on
    assert _snapshot(store, world) == before

    # Nothing was consumed: the next seq, position, ordinal and place are those the rolled-back writes took.
    store.log_commit(LoggedCommit(seq=2, committed_at_ms=2, records=()), frozenset())
    assert store.next_entry_position(world.conversation_id) == 3
    later = _operation(run, world.task_id)
    store.insert_operation(later)
    assert store.operation_page(world.run_id, 1, 10) == ([later], False)
    next_head = _head(run, new_id())
    store.put_partial(next_head)
    assert store.run_partials_from(world.run_id, None, 10) == [before["partial"], next_head]
    store.commit()
    assert store.head_seq() == 2


def test_savepoints_nest_and_each_rolls_back_only_what_followed_it(store: StoreUnderTest) -> None:
    store.begin()
    store.savepoint()
    outer = with_conversation(store)
    store.savepoint()
    inner = with_conversation(store)
    store.rollback_savepoint()
    store.savepoint()
    released = with_conversation(store)
    store.release_savepoint()
    store.release_savepoint()
    store.savepoint()
    store.savepoint()
    kept_inside = with_conversation(store)
    store.release_savepoint()
    store.rollback_savepoint()  # undoes what its released inner savepoint kept, too
    store.commit()
    assert not store.in_transaction
    assert store.conversation(outer) is not None and store.conversation(released) is not None
    assert store.conversation(inner) is None and store.conversation(kept_inside) is None


def test_a_savepoint_outside_a_transaction_opens_one_that_its_release_commits(store: StoreUnderTest) -> None:
    store.savepoint()
    assert store.in_transaction
    kept = with_conversation(store)
    store.release_savepoint()
    assert not store.in_transaction
    store.savepoint()
    dropped = with_conversation(store)
    store.rollback_savepoint()
    assert not store.in_transaction
    store.close()
    again = reopened(store)
    try:
        assert again.conversation(kept) is not None and again.conversation(dropped) is None
    finally:
        again.close()


# -------------------------------------------------------------------------------------- detached copies


def test_records_read_are_detached_copies(store: StoreUnderTest) -> None:
    world = World()
    _write_world(store, world, 1)
    task = full_task_record(world.conversation_id, {"paid": [1]})
    store.insert_task(task, {"cart": [1]}, {"phase": "a"})
    op = store.operation(world.operation_id)
    assert op is not None
    store.update_operation(attrs.evolve(op, status="completed", result=JsonValue({"ok": [1]})))
    before = _snapshot(store, world)
    stored_task = (store.task(task.task_id), store.task_data(task.task_id))

    read = _snapshot(store, world)
    read_task = store.task(task.task_id)
    assert read_task is not None and read_task.outcome is not None and read_task.held is not None
    for value in (
        read["entries"][0][0].data,
        read["log"][0].records[1].data,
        read["document"].value,
        read["submission"].payload,
        read["operation"].arguments,
        read["operation"].result,
        read["interaction"].args,
        read["task_data"][0],
        read_task.outcome.result,
        read_task.held.result,
        *store.task_data(task.task_id),
        store.run_input(world.run_id),
    ):
        _mutate(value)
    assert _snapshot(store, world) == before
    assert (store.task(task.task_id), store.task_data(task.task_id)) == stored_task
    assert store.run_input(world.run_id) == {"text": "hello"}


def _mutate(value: object) -> None:
    """Change a JSON container in place (a string, immutable, is left as it is)."""
    if isinstance(value, dict):
        value["added"] = True
        for item in list(value.values())[:-1]:
            _mutate(item)
    elif isinstance(value, list):
        value.append("added")


def test_values_written_are_detached_from_the_callers_objects(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    data: dict[str, Any] = {"list": [1]}
    entry = attrs.evolve(entry_record(conversation_id, 0), data=JsonValue(data))
    store.insert_entry(entry)
    document = DocumentRecord(conversation_id=None, name="n", version=1, value=JsonValue(data), seq=1, updated_at_ms=1)
    store.put_document(document)
    store.insert_submission(attrs.evolve(submission_record(conversation_id), payload=JsonValue(data)))
    result: dict[str, Any] = {"receipt": [1]}
    task = attrs.evolve(
        task_record(conversation_id, status="terminal"),
        outcome=TaskOutcome(status="completed", result=JsonValue(result)),
    )
    store.insert_task(task, data, data)
    run = _run(conversation_id)
    store.insert_run(run, data)
    op = attrs.evolve(_operation(run, task.task_id), arguments=JsonValue(data))
    store.insert_operation(op)
    store.insert_interaction(attrs.evolve(_interaction(op), args=JsonValue(data)))
    store.log_commit(LoggedCommit(seq=1, committed_at_ms=1, records=(entry,)), frozenset({conversation_id}))

    data["list"].append(2)
    data["new"] = 1
    result["receipt"].append(2)
    assert _entries(store, conversation_id, "asc", None, 1)[0].data == {"list": [1]}
    assert store.read_log(0, None, 1)[0].records[0].data == {"list": [1]}
    stored_document = store.document(None, "n")
    assert stored_document is not None and stored_document.value == {"list": [1]}
    stored_submission = store.submission(conversation_id, "r")
    assert stored_submission is not None and stored_submission.payload == {"list": [1]}
    stored_task = store.task(task.task_id)
    assert stored_task is not None and stored_task.outcome is not None
    assert stored_task.outcome.result == {"receipt": [1]}
    assert store.task_data(task.task_id) == ({"list": [1]}, {"list": [1]})
    assert store.run_input(run.run_id) == {"list": [1]}
    stored_op = store.operation(op.operation_id)
    assert stored_op is not None and stored_op.arguments == {"list": [1]}
    stored_interaction = store.operation_interaction(op.operation_id)
    assert stored_interaction is not None and stored_interaction.args == {"list": [1]}


def test_values_read_back_with_the_types_msgpack_gives_them(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    value = {"tuple": (1, 2.0, True), "nested": [(None, "s")], "float": 1.0, "int": 1}
    store.insert_entry(attrs.evolve(entry_record(conversation_id, 0), data=JsonValue(value)))
    [entry] = _entries(store, conversation_id, "asc", None, 1)
    assert typed(entry.data) == typed({"tuple": [1, 2.0, True], "nested": [[None, "s"]], "float": 1.0, "int": 1})


# --------------------------------------------------------------------------------------- names and keys


@pytest.mark.parametrize("key", SPECIAL_KEYS, ids=repr)
def test_special_names_and_keys_round_trip_as_data(store: StoreUnderTest, key: str) -> None:
    conversation_id = with_conversation(store)
    value = JsonValue({key: {key: key}, "other": [key]})
    for scope in (None, conversation_id):
        document = DocumentRecord(conversation_id=scope, name=key, version=1, value=value, seq=1, updated_at_ms=1)
        store.put_document(document)
        assert store.document(scope, key) == document
        assert store.document(scope, key + "x") is None
    store.insert_entry(attrs.evolve(entry_record(conversation_id, 0), kind=key, data=value))
    [entry] = _entries(store, conversation_id, "asc", None, 10)
    assert (entry.kind, entry.data) == (key, value)
    submission = attrs.evolve(submission_record(conversation_id, request_id=key), kind=key, payload=value)
    store.insert_submission(submission)
    assert store.submission(conversation_id, key) == submission
    store.set_meta(key, 7)
    assert store.get_meta(key) == 7
    price = ModelPrice(model=key, input_per_mtok=1.0, output_per_mtok=2.0)
    store.put_price(price)
    assert store.prices() == [price]
    budget = Budget(scope="tree", key=key, max_tokens=5)
    store.put_budget(budget)
    assert store.budget("tree", key) == budget
    store.add_usage("model", key, RunUsage(input_tokens=1))
    assert store.usage("model", key) == [(key, RunUsage(input_tokens=1))]
    task = task_record(conversation_id)
    store.insert_task(task, value, value)
    assert store.task_data(task.task_id) == (value, value)
    store.log_commit(LoggedCommit(seq=1, committed_at_ms=1, records=(entry,)), frozenset({conversation_id}))
    assert store.read_log(0, conversation_id, 10)[0].records == (entry,)


# ----------------------------------------------------------------------------------------------- pages


def test_entry_pages_end_at_their_limit_and_say_whether_more_follow(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    added = _append(store, conversation_id, 4)
    assert store.entry_page(conversation_id, "asc", None, 4) == (added, False)
    assert store.entry_page(conversation_id, "asc", None, 3) == (added[:3], True)
    assert store.entry_page(conversation_id, "asc", 2, 1) == (added[3:], False)
    assert store.entry_page(conversation_id, "asc", 3, 5) == ([], False)
    assert store.entry_page(conversation_id, "desc", None, 4) == (added[::-1], False)
    assert store.entry_page(conversation_id, "desc", 2, 2) == ([added[1], added[0]], False)
    assert store.entry_page(conversation_id, "desc", 2, 1) == ([added[1]], True)
    assert store.entry_page(new_id(), "asc", None, 5) == ([], False)


def test_an_entry_page_ends_before_the_entry_that_would_pass_its_byte_bound(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    big = [attrs.evolve(entry_record(conversation_id, position), data=JsonValue("x" * 100)) for position in range(3)]
    for entry in big:
        store.insert_entry(entry)
    # Each entry's data is 102 bytes as msgpack stores it: two fit in 204, not in 203.
    assert store.entry_page(conversation_id, "asc", None, 10, max_data_bytes=204) == (big[:2], True)
    assert store.entry_page(conversation_id, "asc", None, 10, max_data_bytes=203) == (big[:1], True)
    assert store.entry_page(conversation_id, "asc", None, 10, max_data_bytes=1) == (big[:1], True)  # one at least
    assert store.entry_page(conversation_id, "desc", None, 10, max_data_bytes=306) == (big[::-1], False)


def test_run_pages_are_in_creation_order_filtered_and_bounded(store: StoreUnderTest) -> None:
    first, second = with_conversation(store), with_conversation(store)
    # Ids that sort against the order the runs were created (a derived id, such as a subagent's run's); the last two
    # were created by one commit: by id between them.
    ids = sorted((new_id() for _ in range(5)), reverse=True)
    runs = [
        _run(first, run_id=ids[0], seq=1),
        _run(second, run_id=ids[1], status="failed", seq=2),
        _run(first, run_id=ids[2], status="failed", seq=3),
        _run(first, run_id=ids[4], seq=4),
        _run(second, run_id=ids[3], seq=4),
    ]
    for run in runs:
        store.insert_run(run, "text")
    moved = attrs.evolve(runs[0], status="pending", seq=9)  # a later change keeps its place
    store.update_run(moved)
    runs[0] = moved
    assert store.run_page(None, None, None, 10) == (runs, False)
    assert store.run_page(None, None, None, 5) == (runs, False)
    assert store.run_page(None, None, None, 3) == (runs[:3], True)
    assert store.run_page(None, None, runs[1].run_id, 10) == (runs[2:], False)
    assert store.run_page(None, None, runs[3].run_id, 10) == (runs[4:], False)
    assert store.run_page(first, None, None, 10) == ([runs[0], runs[2], runs[3]], False)
    assert store.run_page(first, None, runs[0].run_id, 1) == ([runs[2]], True)
    assert store.run_page(None, "failed", None, 1) == ([runs[1]], True)
    assert store.run_page(first, "failed", None, 10) == ([runs[2]], False)
    assert store.run_page(None, None, runs[4].run_id, 10) == ([], False)


def test_interaction_pages_are_in_id_order_filtered_and_bounded(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    run, other_run = _run(conversation_id), _run(conversation_id)
    ops = [_operation(run, new_id()), _operation(other_run, new_id()), _operation(run, new_id())]
    interactions = [_interaction(op) for op in ops]
    interactions[1] = attrs.evolve(interactions[1], status="answered")
    for op, interaction in reversed(list(zip(ops, interactions, strict=True))):
        store.insert_operation(op)
        store.insert_interaction(interaction)
    assert store.interaction_page(None, None, None, 3) == (interactions, False)
    assert store.interaction_page(None, None, None, 2) == (interactions[:2], True)
    assert store.interaction_page(None, None, interactions[0].interaction_id, 10) == (interactions[1:], False)
    assert store.interaction_page("open", None, None, 10) == ([interactions[0], interactions[2]], False)
    assert store.interaction_page(None, run.run_id, None, 1) == ([interactions[0]], True)
    assert store.interaction_page("answered", run.run_id, None, 10) == ([], False)


def test_usage_totals_add_up_by_key_and_page_in_key_order(store: StoreUnderTest) -> None:
    keys = sorted(new_id() for _ in range(3))
    for key in reversed(keys):
        store.add_usage("conversation", key, RunUsage(input_tokens=1, output_tokens=2, cost=None))
    store.add_usage("conversation", keys[0], RunUsage(input_tokens=3, cached_tokens=1, reasoning_tokens=2, cost=1))
    store.add_usage("conversation", keys[0], RunUsage(output_tokens=1, unpriced_tokens=4, cost=None))
    store.add_usage("conversation", keys[0], RunUsage(cost=0.25))
    store.add_usage("model", "m", RunUsage(input_tokens=7, cost=2))
    first = RunUsage(input_tokens=4, output_tokens=3, cached_tokens=1, reasoning_tokens=2, cost=1.25, unpriced_tokens=4)
    rest = RunUsage(input_tokens=1, output_tokens=2)
    assert store.usage("conversation", keys[0]) == [(keys[0], first)]
    assert store.usage("conversation", new_id()) == []
    assert store.usage("conversation", None) == [(keys[0], first), (keys[1], rest), (keys[2], rest)]
    [(_, model)] = store.usage("model", None)
    assert typed(model.cost) == typed(2.0)  # a REAL column's value
    assert store.usage_count("conversation") == 3 and store.usage_count("tree") == 0
    assert store.usage_page("conversation", None, 3) == ([(keys[0], first), (keys[1], rest), (keys[2], rest)], False)
    assert store.usage_page("conversation", None, 2) == ([(keys[0], first), (keys[1], rest)], True)
    assert store.usage_page("conversation", keys[1], 2) == ([(keys[2], rest)], False)


def test_one_usage_added_to_several_totals_at_once_adds_to_each(store: StoreUnderTest) -> None:
    scopes = (("conversation", "c"), ("model", "m"), ("tree", "t"))
    store.add_usage("model", "m", RunUsage(input_tokens=1, cost=None))
    store.add_usages(scopes, RunUsage(input_tokens=2, output_tokens=1, cost=0.5, unpriced_tokens=0))
    store.add_usages(scopes, RunUsage(reasoning_tokens=3, cost=None, unpriced_tokens=3))
    twice = RunUsage(input_tokens=2, output_tokens=1, reasoning_tokens=3, cost=0.5, unpriced_tokens=3)
    assert store.usage("conversation", "c") == [("c", twice)] == [("c", store.usage("tree", "t")[0][1])]
    assert store.usage("model", "m") == [("m", attrs.evolve(twice, input_tokens=3))]


def test_run_partials_page_in_the_order_their_operations_first_streamed(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    run, other = _run(conversation_id), _run(conversation_id)
    ids = sorted((new_id() for _ in range(3)), reverse=True)  # streamed in the reverse of their id order
    heads = [_head(run, ids[0]), _head(other, new_id()), _head(run, ids[1]), _head(run, ids[2])]
    for head in heads:
        store.put_partial(head)
    mine = [heads[0], heads[2], heads[3]]
    assert store.run_partials_from(run.run_id, None, 10) == mine
    assert store.run_partials_from(run.run_id, None, 2) == mine[:2]
    assert store.run_partials_from(run.run_id, ids[1], 10) == mine[1:]
    assert store.run_partials_from(run.run_id, heads[1].operation_id, 10) == mine[1:]  # from another run's place
    assert store.run_partials_from(run.run_id, new_id(), 10) == []
    # An update keeps its place.
    replaced = attrs.evolve(heads[0], attempt=2, intent_seq=5, status="done", chars=3, size_bytes=3, seq=9)
    store.put_partial(replaced)
    assert store.run_partials_from(run.run_id, None, 10) == [replaced, *mine[1:]]
    assert store.partial(ids[0]) == replaced
    assert store.partial(new_id()) is None


# ------------------------------------------------------------------------------------------------- runs


def test_a_run_round_trips_and_an_update_keeps_its_input(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    run = _run(conversation_id)
    store.insert_run(run, {"text": "hello"})
    assert store.run(run.run_id) == run
    assert store.run(new_id()) is None
    ended = attrs.evolve(
        run,
        status="completed",
        reason="r",
        error="e",
        operation_id=new_id(),
        answer=RunAnswer(seq=4, text="done"),
        usage=RunUsage(input_tokens=3, cost=0.5),
        task_id=new_id(),
        seq=4,
        updated_at_ms=90,
    )
    store.update_run(ended)
    assert store.run(run.run_id) == ended
    assert store.run_input(run.run_id) == {"text": "hello"}
    with pytest.raises(StoreConflict) as info:
        store.insert_run(attrs.evolve(run, agent="other"), "again")
    assert (info.value.record, info.value.key) == ("run", run.run_id)
    assert store.run(run.run_id) == ended and store.run_input(run.run_id) == {"text": "hello"}


def test_live_runs_are_those_not_ended_in_the_order_they_were_created(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    ids = sorted(new_id() for _ in range(5))
    # Created in seq order 3, 1, 2, 2, 1: ties in one commit are in run id order.
    runs = [
        _run(conversation_id, run_id=ids[0], seq=3),
        _run(conversation_id, run_id=ids[1], seq=1, status="pending"),
        _run(conversation_id, run_id=ids[2], seq=2, status="completed"),
        _run(conversation_id, run_id=ids[3], seq=2, status="needs_attention"),
        _run(conversation_id, run_id=ids[4], seq=1),
    ]
    for run in (runs[4], runs[2], runs[0], runs[3], runs[1]):
        store.insert_run(run, "text")
    assert store.live_runs() == [runs[1], runs[4], runs[3], runs[0]]
    # An update keeps the run's place (its creating seq), whatever seq its record carries now.
    moved = attrs.evolve(runs[1], status="running", seq=9)
    store.update_run(moved)
    store.update_run(attrs.evolve(runs[0], status="cancelled", seq=9))
    assert store.live_runs() == [moved, runs[4], runs[3]]


def test_a_later_run_started_once_a_run_created_after_it_in_its_conversation_has_a_task(
    store: StoreUnderTest,
) -> None:
    conversation_id, other_conversation = with_conversation(store), with_conversation(store)
    first = _run(conversation_id, seq=1)
    second = _run(conversation_id, seq=2)
    elsewhere = _run(other_conversation, seq=3)
    for run in (first, second, elsewhere):
        store.insert_run(run, "text")
    assert not store.later_run_started(first.run_id)
    store.update_run(attrs.evolve(elsewhere, task_id=new_id()))
    assert not store.later_run_started(first.run_id)
    store.update_run(attrs.evolve(first, task_id=new_id()))
    assert not store.later_run_started(first.run_id) and not store.later_run_started(second.run_id)
    store.update_run(attrs.evolve(second, task_id=new_id()))
    assert store.later_run_started(first.run_id)
    assert not store.later_run_started(second.run_id)
    assert not store.later_run_started(new_id())


# ------------------------------------------------------------------------------------- operations


def test_a_runs_operations_are_journaled_in_order_and_paged_from_a_cursor(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    run, other = _run(conversation_id), _run(conversation_id)
    task_id = new_id()
    ops = [_operation(run, task_id) for _ in range(3)]
    ops.insert(1, _operation(other, task_id))
    for op in ops:
        store.insert_operation(op)
    mine = [ops[0], ops[2], ops[3]]
    assert store.operation_page(run.run_id, 0, 10) == (mine, False)
    assert store.operation_page(run.run_id, 0, 2) == (mine[:2], True)
    assert store.operation_page(run.run_id, 2, 1) == (mine[2:], False)
    assert store.operation_page(run.run_id, 3, 5) == ([], False)
    assert store.operation_page(other.run_id, 0, 5) == ([ops[1]], False)
    assert store.operation(ops[0].operation_id) == ops[0]
    assert store.operation(new_id()) is None
    with pytest.raises(StoreConflict) as info:
        store.insert_operation(attrs.evolve(ops[0], name="other"))
    assert (info.value.record, info.value.key) == ("operation", ops[0].operation_id)
    assert store.operation_page(run.run_id, 0, 10) == (mine, False)


def test_open_operations_are_a_tasks_started_ones_in_journal_order(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    run = _run(conversation_id)
    task_id, other_task = new_id(), new_id()
    ops = [_operation(run, task_id), _operation(run, other_task), _operation(run, task_id), _operation(run, task_id)]
    for op in ops:
        store.insert_operation(op)
    assert store.open_operations(task_id) == [ops[0], ops[2], ops[3]]
    finished = attrs.evolve(ops[2], status="completed", result=JsonValue({"ok": True}), seq=5, updated_at_ms=99)
    store.update_operation(finished)
    moved = attrs.evolve(ops[3], task_id=other_task, attempt=2)  # a later attempt under another lease's task
    store.update_operation(moved)
    assert store.open_operations(task_id) == [ops[0]]
    assert store.open_operations(other_task) == [ops[1], moved]
    assert store.operation(ops[2].operation_id) == finished
    assert store.operation_page(run.run_id, 0, 10) == ([ops[0], ops[1], finished, moved], False)


def test_an_interaction_is_bound_to_its_operation_once(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    run = _run(conversation_id)
    op = _operation(run, new_id())
    store.insert_operation(op)
    interaction = _interaction(op)
    store.insert_interaction(interaction)
    assert store.interaction(interaction.interaction_id) == interaction
    assert store.operation_interaction(op.operation_id) == interaction
    assert store.interaction(new_id()) is None and store.operation_interaction(new_id()) is None
    for clash in (_interaction(op), attrs.evolve(interaction, operation_id=new_id())):
        with pytest.raises(StoreConflict) as info:
            store.insert_interaction(clash)
        assert (info.value.record, info.value.key) == ("interaction", clash.interaction_id)
    answered = attrs.evolve(interaction, status="answered", seq=4, updated_at_ms=75)
    store.update_interaction(answered)
    assert store.operation_interaction(op.operation_id) == answered
    assert store.interaction_page(None, None, None, 10) == ([answered], False)


# ------------------------------------------------------------------------------------ prices and budgets


def test_prices_are_read_by_model_replaced_and_deleted(store: StoreUnderTest) -> None:
    assert store.prices() == []
    cheap = ModelPrice(model="b", input_per_mtok=1, output_per_mtok=2)
    store.put_price(cheap)
    store.put_price(ModelPrice(model="a", input_per_mtok=3.0, output_per_mtok=4.0, cached_input_per_mtok=0.5))
    replaced = ModelPrice(model="a", input_per_mtok=5.0, output_per_mtok=6.0, reasoning_per_mtok=7.0)
    store.put_price(replaced)
    prices = store.prices()
    assert prices == [replaced, ModelPrice(model="b", input_per_mtok=1.0, output_per_mtok=2.0)]
    assert typed(attrs.astuple(prices[1])) == typed(("b", 1.0, 2.0, None, None))  # REAL columns' values
    store.delete_price("a")
    store.delete_price("missing")
    assert [price.model for price in store.prices()] == ["b"]


def test_budgets_are_read_by_scope_and_key_replaced_deleted_and_counted(store: StoreUnderTest) -> None:
    key = new_id()
    assert (store.budget("conversation", key), store.budget_count()) == (None, 0)
    store.put_budget(Budget(scope="conversation", key=key, max_tokens=10))
    store.put_budget(Budget(scope="tree", key=key, max_cost=1))
    replaced = Budget(scope="conversation", key=key, max_tokens=20, max_cost=2.5)
    store.put_budget(replaced)
    assert store.budget("conversation", key) == replaced
    tree = store.budget("tree", key)
    assert tree is not None and typed(tree.max_cost) == typed(1.0)
    assert store.budget_count() == 2
    store.delete_budget("conversation", key)
    store.delete_budget("conversation", new_id())
    assert (store.budget("conversation", key), store.budget_count()) == (None, 1)


# -------------------------------------------------------------------------------------------- partials


def test_partial_pieces_join_in_offset_order_and_are_deleted_together(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    run = _run(conversation_id)
    operation_id, other = new_id(), new_id()
    store.put_partial(_head(run, operation_id, pieces=3))
    store.put_partial(_head(run, other, pieces=1))
    for offset, text in ((6, "ld"), (0, "hel"), (3, "lo wor")):
        store.insert_partial_piece(operation_id, offset, text)
    store.insert_partial_piece(other, 0, "x")
    assert store.partial_text(operation_id) == "hello world"
    store.delete_partial_pieces(operation_id)
    assert store.partial_text(operation_id) == ""
    assert store.partial_text(other) == "x"
    assert store.partial_text(new_id()) == ""


def test_held_partials_are_the_heads_that_stream_or_hold_pieces(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    run = _run(conversation_id)
    streaming = _head(run, new_id())
    holding = _head(run, new_id(), pieces=2, status="aborted")
    done = _head(run, new_id(), status="done")
    for head in (streaming, holding, done):
        store.put_partial(head)
    assert sorted(store.held_partials(), key=lambda head: head.operation_id) == sorted(
        [streaming, holding], key=lambda head: head.operation_id
    )


# ------------------------------------------------------------------------------------------------ uniqueness


def test_duplicate_conversation_id_is_a_store_conflict(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    with pytest.raises(StoreConflict) as info:
        store.insert_conversation(conversation_record(conversation_id, seq=2))
    assert (info.value.record, info.value.key) == ("conversation", conversation_id)
    assert store.conversation_count() == 1


def test_an_entry_keeps_what_the_model_sees_and_its_head_and_the_context_start_follows_resets_and_heads(
    store: StoreUnderTest,
) -> None:
    conversation_id = with_conversation(store)
    other = with_conversation(store)
    _, second, _ = _append(store, conversation_id, 3)
    assert store.context_start(conversation_id) == 0
    assert store.entry_position(conversation_id, second.entry_id) == 1
    assert store.entry_position(other, second.entry_id) is None  # another conversation's
    assert store.entry_position(conversation_id, new_id()) is None
    reset = attrs.evolve(entry_record(conversation_id, 3), kind="tether.reset", data=JsonValue({"handoff": None}))
    store.insert_entry(reset)
    assert store.context_start(conversation_id) == 4  # just after the reset
    summary = attrs.evolve(
        entry_record(conversation_id, 5),
        kind="app.summary",
        model=JsonValue([{"role": "user", "text": "so far"}]),
        head=reset.entry_id,
    )
    store.insert_entry(attrs.evolve(entry_record(conversation_id, 4), kind="app.note"))
    store.insert_entry(summary)
    [read] = store.entry_page(conversation_id, "asc", 4, 10)[0]
    assert read == summary
    assert store.context_start(conversation_id) == 4  # a head at the reset itself cuts no further
    later = attrs.evolve(entry_record(conversation_id, 6), head=summary.entry_id)
    store.insert_entry(later)
    assert store.context_start(conversation_id) == 5
    assert store.context_start(other) == 0


def test_the_unanswered_submissions_of_a_run_are_found_oldest_first(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    run_id = new_id()

    def stored(status: str, run: str | None, seq: int) -> SubmissionRecord:
        record = SubmissionRecord(
            submission_id=new_id(),
            conversation_id=conversation_id,
            request_id=new_id(),
            kind="input",
            payload=JsonValue("hi"),
            status=status,
            seq=seq,
            created_at_ms=1,
            run_id=run,
            reason="restart_limit" if status == "unanswered" else None,
        )
        store.insert_submission(record)
        return record

    first = stored("unanswered", run_id, 1)
    stored("done", run_id, 2)
    stored("unanswered", new_id(), 3)
    second = stored("unanswered", run_id, 4)
    assert store.unanswered_of_run(conversation_id, run_id) == [first, second]
    assert store.unanswered_of_run(with_conversation(store), run_id) == []


def test_a_submission_keeps_its_inputs_entry(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    record = SubmissionRecord(
        submission_id=new_id(),
        conversation_id=conversation_id,
        request_id="r",
        kind="input",
        payload=JsonValue("ann: is the build green?"),
        status="queued",
        seq=1,
        created_at_ms=1,
        entry=JsonValue({"kind": "chat.mention", "data": {"author": "ann"}}),
    )
    store.insert_submission(record)
    assert store.submission_by_id(record.submission_id) == record


def test_duplicate_entry_id_is_a_store_conflict(store: StoreUnderTest) -> None:
    first, second = with_conversation(store), with_conversation(store)
    [entry] = _append(store, first, 1)
    with pytest.raises(StoreConflict) as info:
        store.insert_entry(entry_record(second, 0, entry_id=entry.entry_id))
    assert (info.value.record, info.value.key) == ("entry", entry.entry_id)
    assert store.entry_count() == 1


def test_duplicate_submission_id_is_a_store_conflict(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    submission = submission_record(conversation_id, request_id="a")
    store.insert_submission(submission)
    with pytest.raises(StoreConflict) as info:
        store.insert_submission(
            submission_record(conversation_id, submission_id=submission.submission_id, request_id="b")
        )
    assert (info.value.record, info.value.key) == ("submission", submission.submission_id)
    assert store.submission(conversation_id, "b") is None


def test_a_submission_is_read_by_id_updated_and_listed_while_open_in_creation_order(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    first = attrs.evolve(submission_record(conversation_id, request_id="a"), seq=1)
    second = attrs.evolve(submission_record(conversation_id, request_id="b"), seq=2, when_busy="steer")
    third = attrs.evolve(submission_record(conversation_id, request_id="c"), seq=3, status="done")
    for record in (first, second, third):
        store.insert_submission(record)
    assert store.submission_by_id(second.submission_id) == second
    assert store.submission_by_id(new_id()) is None
    assert store.open_submissions() == [first, second]
    answered = attrs.evolve(first, status="done", seq=4, run_id="run", answer=RunAnswer(seq=4, text="4"))
    placed = attrs.evolve(second, status="placed", seq=4, run_id="run")
    store.update_submission(answered)
    store.update_submission(placed)
    assert store.submission(conversation_id, "a") == answered
    assert store.submission_by_id(second.submission_id) == placed
    assert store.open_submissions() == [placed]  # still in creation order, whatever its last change
    unanswered = attrs.evolve(placed, status="unanswered", seq=5, reason="withdrawn")
    store.update_submission(unanswered)
    assert store.open_submissions() == [] and store.submission(conversation_id, "b") == unanswered
    other = with_conversation(store)
    store.insert_submission(attrs.evolve(submission_record(other, request_id="a"), seq=6))
    assert store.submission_page(conversation_id, None, 2) == ([answered, unanswered], True)
    assert store.submission_page(conversation_id, unanswered.submission_id, 2) == ([third], False)
    assert store.submission_page(conversation_id, new_id(), 10) == ([answered, unanswered, third], False)


def test_duplicate_request_id_in_a_conversation_is_a_store_conflict(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    store.insert_submission(submission_record(conversation_id, request_id="same"))
    with pytest.raises(StoreConflict):
        store.insert_submission(submission_record(conversation_id, request_id="same"))


def test_same_request_id_in_another_conversation_is_allowed(store: StoreUnderTest) -> None:
    first, second = with_conversation(store), with_conversation(store)
    store.insert_submission(submission_record(first, request_id="same"))
    store.insert_submission(submission_record(second, request_id="same"))
    assert store.submission(first, "same") != store.submission(second, "same")


def test_conflict_inside_a_transaction_leaves_the_transaction_usable(store: StoreUnderTest) -> None:
    store.begin()
    conversation_id = with_conversation(store)
    with pytest.raises(StoreConflict):
        store.insert_conversation(conversation_record(conversation_id))
    other = with_conversation(store)
    store.commit()
    assert store.conversation(conversation_id) is not None
    assert store.conversation(other) is not None


# --------------------------------------------------------------------------------------- records round trip


def test_next_entry_position_follows_the_stored_entries(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    assert store.next_entry_position(conversation_id) == 0
    assert store.next_entry_position(conversation_id) == 0  # asking does not claim
    _append(store, conversation_id, 3)
    assert store.next_entry_position(conversation_id) == 3
    assert store.next_entry_position(new_id()) is None
    record = store.conversation(conversation_id)
    assert record is not None and record.entry_count == 3


def test_entry_position_is_unique_within_a_conversation(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    _append(store, conversation_id, 1)
    with pytest.raises(StoreConflict):
        store.insert_entry(entry_record(conversation_id, 0))
    assert store.entry_count() == 1


def test_documents_are_scoped_per_conversation_and_global(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    scoped = DocumentRecord(
        conversation_id=conversation_id, name="n", version=1, value=JsonValue([1]), seq=1, updated_at_ms=5
    )
    global_ = DocumentRecord(
        conversation_id=None, name="n", version=2, value=JsonValue({"g": 1.5}), seq=2, updated_at_ms=6
    )
    store.put_document(scoped)
    store.put_document(global_)
    assert store.document(conversation_id, "n") == scoped
    assert store.document(None, "n") == global_
    assert store.document(None, "other") is None
    replaced = DocumentRecord(conversation_id=None, name="n", version=3, value=JsonValue(None), seq=3, updated_at_ms=7)
    store.put_document(replaced)
    assert store.document(None, "n") == replaced


def test_submission_payload_keeps_its_types(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    payloads: tuple[tuple[str, object], ...] = (("int", 1), ("float", 1.0), ("bool", True))
    for request_id, payload in payloads:
        record = SubmissionRecord(
            submission_id=new_id(),
            conversation_id=conversation_id,
            request_id=request_id,
            kind="k",
            payload=JsonValue(payload),
            status="queued",
            seq=1,
            created_at_ms=1,
        )
        store.insert_submission(record)
        read = store.submission(conversation_id, request_id)
        assert read == record
        assert read is not None and type(read.payload) is type(payload)


def test_meta_values_round_trip(store: StoreUnderTest) -> None:
    assert store.get_meta("clock") is None
    store.set_meta("clock", 5)
    store.set_meta("clock", 7)
    assert store.get_meta("clock") == 7


# ---------------------------------------------------------------------------------------------------- reads


def test_entries_read_ascending_with_cursor(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    added = _append(store, conversation_id, 5)
    assert _entries(store, conversation_id, "asc", None, 10) == added
    assert _entries(store, conversation_id, "asc", None, 2) == added[:2]
    assert _entries(store, conversation_id, "asc", 1, 2) == added[2:4]
    assert _entries(store, conversation_id, "asc", 4, 2) == []


def test_entries_read_descending_with_cursor(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    added = _append(store, conversation_id, 5)
    newest_first = list(reversed(added))
    assert _entries(store, conversation_id, "desc", None, 10) == newest_first
    assert _entries(store, conversation_id, "desc", None, 2) == newest_first[:2]
    assert _entries(store, conversation_id, "desc", 3, 2) == [added[2], added[1]]
    assert _entries(store, conversation_id, "desc", 0, 2) == []


def test_entries_are_per_conversation(store: StoreUnderTest) -> None:
    first, second = with_conversation(store), with_conversation(store)
    in_first = _append(store, first, 2)
    in_second = _append(store, second, 3)
    assert _entries(store, first, "asc", None, 10) == in_first
    assert _entries(store, second, "asc", None, 10) == in_second
    assert [entry.position for entry in in_second] == [0, 1, 2]


def _seqs(commits: list[LoggedCommit]) -> list[int]:
    return [commit.seq for commit in commits]


def _logged_commits(store: StoreUnderTest) -> tuple[str, str, list[LoggedCommit]]:
    """Five commits: 1 creates A, 2 creates B, 3 touches both, 4 only a global document, 5 only A."""
    first, second = new_id(), new_id()
    global_document = DocumentRecord(
        conversation_id=None, name="g", version=1, value=JsonValue(1), seq=4, updated_at_ms=103
    )
    commits = [
        (LoggedCommit(seq=1, committed_at_ms=100, records=(conversation_record(first),)), frozenset({first})),
        (LoggedCommit(seq=2, committed_at_ms=101, records=(conversation_record(second, 2),)), frozenset({second})),
        (
            LoggedCommit(
                seq=3, committed_at_ms=102, records=(entry_record(first, 0, seq=3), entry_record(second, 0, seq=3))
            ),
            frozenset({first, second}),
        ),
        (LoggedCommit(seq=4, committed_at_ms=103, records=(global_document,)), frozenset()),
        (LoggedCommit(seq=5, committed_at_ms=104, records=(submission_record(first),)), frozenset({first})),
    ]
    for commit, touched in commits:
        store.log_commit(commit, touched)
    return first, second, [commit for commit, _ in commits]


def test_read_log_globally_returns_every_commit_in_order(store: StoreUnderTest) -> None:
    _, _, everything = _logged_commits(store)
    assert store.head_seq() == 5
    assert store.read_log(0, None, 100) == everything
    assert store.read_log(0, None, 2) == everything[:2]
    assert store.read_log(2, None, 2) == everything[2:4]
    assert store.read_log(5, None, 10) == []


def test_read_log_by_conversation_returns_every_commit_that_touched_it(store: StoreUnderTest) -> None:
    first, second, everything = _logged_commits(store)
    by_seq = {commit.seq: commit for commit in everything}
    # The store may return more commits than the conversation's own (the core filters records), but never
    # misses one, never returns a commit that touched only another conversation, and keeps seq order.
    for conversation_id, own, foreign in ((first, {1, 3, 5}, {2}), (second, {2, 3}, {1, 5})):
        read = store.read_log(0, conversation_id, 100)
        assert _seqs(read) == sorted(_seqs(read))
        assert own <= set(_seqs(read))
        assert not foreign & set(_seqs(read))
        assert all(commit == by_seq[commit.seq] for commit in read)  # whole commits, records unfiltered
    assert 5 in _seqs(store.read_log(3, first, 100))
    assert not {1, 2, 3} & set(_seqs(store.read_log(3, first, 100)))
    assert _seqs(store.read_log(0, first, 1)) == [1]


def test_read_log_stops_at_until_seq(store: StoreUnderTest) -> None:
    first, _, everything = _logged_commits(store)
    assert store.read_log(0, None, 100, until_seq=3) == everything[:3]
    assert store.read_log(3, None, 100, until_seq=3) == []
    read = _seqs(store.read_log(0, first, 100, until_seq=4))
    assert {1, 3} <= set(read) and max(read) <= 4


# ---------------------------------------------------------------------------------------------------- tasks


@pytest.mark.parametrize(
    "result",
    [
        None,
        True,
        False,
        0,
        -(2**63),
        2**64 - 1,
        1.0,
        -2.5,
        "",
        "ü",
        [],
        {},
        [1, 1.0, True, None, "s"],
        {"refund": {"amount": 12.5, "items": [{"sku": "a", "qty": 2}], "ok": True, "note": None}},
    ],
    ids=repr,
)
def test_task_round_trips_every_field(store: StoreUnderTest, result: object) -> None:
    conversation_id = with_conversation(store)
    record = full_task_record(conversation_id, result)
    task_input = {"cart": [1, 2.0, "three"], "paid": False}
    checkpoint = {"phase": "charge", "attempt": 2}
    store.insert_task(record, task_input, checkpoint)
    read = store.task(record.task_id)
    assert read == record
    assert read is not None and read.held is not None and read.outcome is not None
    assert typed(read.held.result) == typed(read.outcome.result) == typed(result)
    assert store.task_data(record.task_id) == (task_input, checkpoint)
    assert typed(store.task_data(record.task_id)) == typed((task_input, checkpoint))


def test_task_with_only_required_fields_round_trips(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    record = task_record(conversation_id)
    store.insert_task(record, None, None)
    assert store.task(record.task_id) == record
    assert store.task_data(record.task_id) == (None, None)
    assert store.task(new_id()) is None
    assert store.task_count() == 1


def test_a_task_without_a_restart_limit_round_trips_as_none(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    record = attrs.evolve(task_record(conversation_id), restart_limit=None)  # the SQLite column is NOT NULL: 0
    store.insert_task(record, None, None)
    assert store.task(record.task_id) == record
    limited = attrs.evolve(record, restart_limit=1, seq=2)
    store.update_task(limited)
    assert store.task(record.task_id) == limited
    store.update_task(record)
    assert [live.restart_limit for live in store.live_tasks()] == [None]


def test_duplicate_task_id_is_a_store_conflict(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    record = task_record(conversation_id)
    store.insert_task(record, {"first": 1}, None)
    store.begin()
    with pytest.raises(StoreConflict) as info:
        store.insert_task(attrs.evolve(record, kind="other", status="running"), {"second": 2}, {"phase": "x"})
    assert (info.value.record, info.value.key) == ("task", record.task_id)
    other = task_record(conversation_id)
    store.insert_task(other, None, None)  # the transaction is still usable
    store.commit()
    assert store.task(record.task_id) == record
    assert store.task_data(record.task_id) == ({"first": 1}, None)
    assert store.task(other.task_id) == other
    assert store.task_count() == 2


def test_update_task_without_a_checkpoint_keeps_the_stored_one(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    record = task_record(conversation_id)
    store.insert_task(record, {"in": 1}, {"phase": "a"})
    waiting = attrs.evolve(
        record, status="waiting", phase="a", on=(new_id(),), policy="all_settled", epoch=1, seq=2, updated_at_ms=50
    )
    store.update_task(waiting)
    assert store.task(record.task_id) == waiting
    assert store.task_data(record.task_id) == ({"in": 1}, {"phase": "a"})
    sleeping = attrs.evolve(waiting, status="sleeping", on=(), policy=None, until_ms=99, seq=3)
    store.update_task(sleeping, checkpoint=NO_CHANGE)
    assert store.task(record.task_id) == sleeping
    assert store.task_data(record.task_id) == ({"in": 1}, {"phase": "a"})


def test_update_task_with_a_checkpoint_replaces_it_and_keeps_the_input(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    record = task_record(conversation_id)
    store.insert_task(record, {"in": 1}, None)
    running = attrs.evolve(record, status="running", phase="b", epoch=1, seq=2)
    store.update_task(running, checkpoint={"phase": "b", "n": 1.0})
    assert store.task(record.task_id) == running
    assert typed(store.task_data(record.task_id)) == typed(({"in": 1}, {"phase": "b", "n": 1.0}))
    # None is a checkpoint like any other, not "no change".
    store.update_task(running, checkpoint=None)
    assert store.task_data(record.task_id) == ({"in": 1}, None)


def test_update_task_stores_every_column_both_ways(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    full = full_task_record(conversation_id, {"x": [1, 2]})
    store.insert_task(full, None, None)
    bare = task_record(conversation_id, task_id=full.task_id)
    store.update_task(bare)  # clears on, policy, until_ms, abort, held, outcome; resets counters
    assert store.task(full.task_id) == bare
    store.update_task(full)
    assert store.task(full.task_id) == full


def test_update_task_touches_only_its_task(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    first, second = task_record(conversation_id), task_record(conversation_id)
    store.insert_task(first, {"n": 1}, {"c": 1})
    store.insert_task(second, {"n": 2}, {"c": 2})
    store.update_task(attrs.evolve(first, status="terminal", outcome=TaskOutcome(status="completed")), checkpoint=3)
    assert store.task(second.task_id) == second
    assert store.task_data(second.task_id) == ({"n": 2}, {"c": 2})


def test_live_tasks_are_the_tasks_not_terminal_in_task_id_order(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    statuses: list[TaskStatus] = ["pending", "terminal", "running", "waiting", "sleeping", "completing", "terminal"]
    task_ids = sorted(new_id() for _ in statuses)
    records = [
        task_record(conversation_id, task_id=task_id, status=status)
        for task_id, status in zip(task_ids, statuses, strict=True)
    ]
    for index in (3, 0, 6, 5, 1, 4, 2):  # not in id order
        store.insert_task(records[index], None, None)
    assert list(store.live_tasks()) == [record for record in records if record.status != "terminal"]

    ended = attrs.evolve(records[2], status="terminal", outcome=TaskOutcome(status="failed", error="e"))
    store.update_task(ended)
    assert [record.task_id for record in store.live_tasks()] == [task_ids[index] for index in (0, 3, 4, 5)]


def test_task_owned_conversations_are_those_whose_owner_is_not_terminal(store: StoreUnderTest) -> None:
    conversation_id = with_conversation(store)
    running = task_record(conversation_id, status="running")
    completing = task_record(conversation_id, status="completing")
    ended = task_record(conversation_id, status="terminal")
    for record in (running, completing, ended):
        store.insert_task(record, None, None)
    owned: dict[str, str] = {}
    for owner in (running.task_id, running.task_id, completing.task_id, ended.task_id, new_id()):
        conversation = attrs.evolve(conversation_record(new_id()), owner_task_id=owner)
        store.insert_conversation(conversation)
        assert store.conversation(conversation.conversation_id) == conversation
        owned[conversation.conversation_id] = owner
    with_conversation(store)  # owned by nobody

    expected = [
        (conversation, owner) for conversation, owner in owned.items() if owner in (running.task_id, completing.task_id)
    ]
    assert len(expected) == 3
    assert sorted(store.task_owned_conversations()) == sorted(expected)

    store.update_task(attrs.evolve(running, status="terminal", outcome=TaskOutcome(status="aborted")))
    assert store.task_owned_conversations() == [
        (conversation, owner) for conversation, owner in owned.items() if owner == completing.task_id
    ]


# ------------------------------------------------------------------------------------------------ coverage


def test_every_port_method_is_called_by_a_case() -> None:
    methods = {
        name
        for port in PORTS
        for name, member in vars(port).items()
        if not name.startswith("_") and inspect.isfunction(member)
    }
    called = {
        node.func.attr
        for node in ast.walk(ast.parse(Path(__file__).read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in ("store", "again")
    }
    ports = {base for base in Store.__mro__ if base.__module__ == Store.__module__ and base is not Store}
    assert ports == set(PORTS)  # every port of Store is listed
    assert all(any(inspect.isfunction(member) for member in vars(port).values()) for port in PORTS)
    assert sorted(methods - called) == []
