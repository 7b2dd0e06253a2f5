"""UUIDv7 ids: canonical form, version, variant and the embedded creation time."""

from __future__ import annotations

import time
import uuid

import pytest

from protocol import _ids, is_id, new_id

TOLERANCE_MS = 2_000


def test_new_id_is_a_canonical_uuid_string() -> None:
    text = new_id()
    assert len(text) == 36
    assert str(uuid.UUID(text)) == text
    assert text == text.lower()


def test_new_id_is_version_7_with_the_rfc_variant() -> None:
    for _ in range(200):
        value = uuid.UUID(new_id())
        assert value.version == 7
        assert value.variant == uuid.RFC_4122


def test_new_id_starts_with_the_current_unix_milliseconds() -> None:
    before_ms = time.time_ns() // 1_000_000
    value = uuid.UUID(new_id())
    after_ms = time.time_ns() // 1_000_000
    embedded_ms = value.int >> 80
    assert before_ms - TOLERANCE_MS <= embedded_ms <= after_ms + TOLERANCE_MS
    assert before_ms <= embedded_ms <= after_ms  # the same clock, read in between


def test_new_ids_are_distinct() -> None:
    ids = [new_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)


@pytest.fixture
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """No id minted yet in this process (ids minted earlier would hold the time field at their later clock)."""
    monkeypatch.setattr(_ids, "_monotonic", _ids._Monotonic())


def test_new_id_embeds_exactly_the_clock_it_read(monkeypatch: pytest.MonkeyPatch, fresh_process: None) -> None:
    monkeypatch.setattr(_ids.time, "time_ns", lambda: 1_700_000_000_123_999_999)
    assert uuid.UUID(new_id()).int >> 80 == 1_700_000_000_123


def test_new_ids_sort_by_creation_millisecond(monkeypatch: pytest.MonkeyPatch, fresh_process: None) -> None:
    monkeypatch.setattr(_ids.time, "time_ns", lambda: 1_700_000_000_001_000_000)
    earlier = [new_id() for _ in range(50)]
    monkeypatch.setattr(_ids.time, "time_ns", lambda: 1_700_000_000_002_000_000)
    later = [new_id() for _ in range(50)]
    assert max(earlier) < min(later)


def test_ids_of_one_process_strictly_increase_within_a_millisecond(
    monkeypatch: pytest.MonkeyPatch, fresh_process: None
) -> None:
    monkeypatch.setattr(_ids.time, "time_ns", lambda: 1_700_000_000_001_000_000)
    ids = [new_id() for _ in range(10_000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert {uuid.UUID(i).version for i in ids} == {7}
    assert {uuid.UUID(i).int >> 80 for i in ids} == {1_700_000_000_001}  # 10,000 fit one millisecond


def test_ids_of_one_process_increase_when_the_wall_clock_steps_back(
    monkeypatch: pytest.MonkeyPatch, fresh_process: None
) -> None:
    monkeypatch.setattr(_ids.time, "time_ns", lambda: 1_700_000_000_005_000_000)
    before = new_id()
    monkeypatch.setattr(_ids.time, "time_ns", lambda: 1_700_000_000_001_000_000)  # NTP stepped the clock back
    after = new_id()
    assert before < after


def test_a_millisecond_whose_random_bits_run_out_moves_the_time_field_on(
    monkeypatch: pytest.MonkeyPatch, fresh_process: None
) -> None:
    monkeypatch.setattr(_ids.time, "time_ns", lambda: 1_700_000_000_001_000_000)
    first = new_id()
    _ids._monotonic.rand = (1 << _ids._RAND_BITS) - 1  # as if 2**42 ids had been minted this millisecond
    second = new_id()
    assert first < second and uuid.UUID(second).int >> 80 == 1_700_000_000_002


def test_is_id_accepts_new_ids_and_canonical_lower_case() -> None:
    assert is_id(new_id())
    assert is_id("01890a5d-ac96-7b3c-8f2e-3c4d5e6f7a80")
    assert is_id("00000000-0000-0000-0000-000000000000")
    assert is_id(str(uuid.uuid4()))  # any version


CANONICAL = "01890a5d-ac96-7b3c-8f2e-3c4d5e6f7a80"


@pytest.mark.parametrize(
    "text",
    [
        CANONICAL.upper(),
        "01890A5D-ac96-7b3c-8f2e-3c4d5e6f7a80",
        "{" + CANONICAL + "}",
        "urn:uuid:" + CANONICAL,
        CANONICAL.replace("-", ""),
        CANONICAL[:-1],
        CANONICAL + "0",
        CANONICAL + "\n",
        " " + CANONICAL,
        "01890a5d-ac96-7b3c-8f2e-3c4d5e6f7a8g",
        "01890a5dac96-7b3c-8f2e-3c4d5e6f7a80-",
        "",
    ],
    ids=[
        "upper",
        "mixed-case",
        "braces",
        "urn",
        "no-dashes",
        "short",
        "long",
        "trailing-newline",
        "leading-space",
        "non-hex",
        "dashes-misplaced",
        "empty",
    ],
)
def test_is_id_rejects_non_canonical_strings(text: str) -> None:
    assert not is_id(text)


@pytest.mark.parametrize(
    "value",
    [None, 1, uuid.UUID(CANONICAL), CANONICAL.encode(), [CANONICAL], 1.5],
    ids=["none", "int", "uuid-object", "bytes", "list", "float"],
)
def test_is_id_rejects_non_str(value: object) -> None:
    assert not is_id(value)
