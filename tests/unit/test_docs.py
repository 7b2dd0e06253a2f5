"""README.md and docs/ stay true: docs/protocol.md has a row naming the fields of every frame and every write; every
link, named file and named section exists; every Python example is marked, and every one that is not a script (those
run in tests/integration/test_examples.py) parses or executes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

import attrs
import pytest

import actors
from protocol import FRAME_TYPES, WRITE_TYPES
from tests._docs import (
    DOCUMENTS,
    ROOT,
    Example,
    MarkerError,
    anchors,
    app_source,
    blocks,
    dangling_markers,
    example,
    examples,
    execute_app,
    headings,
    parse_fragment,
    prose,
)

PROTOCOL_DOC = Path(__file__).parents[2] / "docs" / "protocol.md"
ENVELOPE_FIELDS = {"call_id"}
"""Documented once for every request and reply, not in each row."""


def _rows() -> dict[str, list[str]]:
    """Every table row of the protocol reference, by the wire tag in its first cell."""
    rows: dict[str, list[str]] = {}
    for match in re.finditer(r"^\| `([a-z_]+)` \|.*$", PROTOCOL_DOC.read_text(encoding="utf-8"), re.MULTILINE):
        rows.setdefault(match.group(1), []).append(match.group(0))
    return rows


WIRE_TAGS = [(cls.TYPE, cls) for cls in FRAME_TYPES] + [(cls.OP, cls) for cls in WRITE_TYPES]


@pytest.mark.parametrize(("tag", "cls"), WIRE_TAGS, ids=[tag for tag, _ in WIRE_TAGS])
def test_every_frame_and_write_has_a_row_naming_its_fields(tag: str, cls: type) -> None:
    rows = _rows().get(tag)
    assert rows, f"docs/protocol.md has no table row for `{tag}` ({cls.__name__})"
    fields = [field.name for field in attrs.fields(cls) if field.name not in ENVELOPE_FIELDS]
    assert any(all(f"`{name}" in row for name in fields) for row in rows), (
        f"no row for `{tag}` in docs/protocol.md names all of {cls.__name__}'s fields {fields}"
    )


# ------------------------------------------------------------------------------------- links and named files

LINK: Final = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)\)")
NAMED_DOC: Final = re.compile(r"(?<![\w/.:-])(?P<path>[\w./-]+\.md)\b")
TOP_LEVEL: Final = "actors|protocol|runtime|storage_owner|bench|tests|docs"
NAMED_PATH: Final = re.compile(rf"(?<![\w/.-])(?P<path>(?:{TOP_LEVEL})/[\w./-]*\w)")
NAMED_SECTIONS: Final = re.compile(
    r'(?P<path>[\w./-]+\.md)`?(?:,\s*|\s+\(|\s+)"(?P<first>[^"]+)"(?P<more>(?:\s+and\s+"[^"]+")*)'
)
DOCUMENT_IDS: Final = [str(document.relative_to(ROOT)) for document in DOCUMENTS]


def _resolve(document: Path, name: str) -> Path | None:
    """A file a document names: relative to the document, else to the repository root (``docs/tasks.md`` in
    README.md and in docs/operations.md alike)."""
    for base in (document.parent, ROOT):
        if (base / name).exists():
            return base / name
    return None


@pytest.mark.parametrize("document", DOCUMENTS, ids=DOCUMENT_IDS)
def test_every_relative_link_and_its_anchor_exists(document: Path) -> None:
    broken = []
    for number, line in prose(document):
        for match in LINK.finditer(line):
            target = match.group("target")
            if re.match(r"^[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            linked = (document.parent / path) if path else document
            if not linked.exists():
                broken.append(f"{document.name}:{number}: {target}: there is no {linked.relative_to(ROOT)}")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{document.name}:{number}: {target}: {linked.name} has no heading #{anchor}")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("document", DOCUMENTS, ids=DOCUMENT_IDS)
def test_every_named_file_and_section_exists(document: Path) -> None:
    missing = []
    for number, line in enumerate(document.read_text(encoding="utf-8").splitlines(), start=1):
        for match in NAMED_DOC.finditer(line):
            if _resolve(document, match.group("path")) is None:
                missing.append(f"{document.name}:{number}: {match.group('path')} is not in the repository")
        for match in NAMED_PATH.finditer(line):
            if not (ROOT / match.group("path")).exists():
                missing.append(f"{document.name}:{number}: {match.group('path')} is not in the repository")
        for match in NAMED_SECTIONS.finditer(line):
            named = _resolve(document, match.group("path"))
            sections = [match.group("first"), *re.findall(r'"([^"]+)"', match.group("more"))]
            titles = headings(named) if named is not None else []
            missing += [
                f'{document.name}:{number}: {match.group("path")} has no section "{section}"'
                for section in sections
                if named is not None and not any(title.startswith(section) for title in titles)
            ]
    assert not missing, "\n".join(missing)


# ------------------------------------------------------------------------------------------------ examples


@pytest.mark.parametrize("document", DOCUMENTS, ids=DOCUMENT_IDS)
def test_every_python_block_is_a_marked_example(document: Path) -> None:
    problems = []
    for block in blocks(document):
        if block.is_python:
            try:
                found = example(block)
            except MarkerError as exc:
                problems.append(str(exc))
                continue
            if found.kind == "script" and found.app is not None:
                try:
                    app_source(document, found.app)
                except MarkerError as exc:
                    problems.append(f"{block.where}: a script with {found.app}: {exc}")
        elif block.marker is not None:
            problems.append(f"{block.where}: an example marker on a block that is not Python ({block.info!r})")
    problems += [f"{where}: an example marker that is not right before a fence" for where in dangling_markers(document)]
    assert not problems, "\n".join(problems)


def _examples(kind: str) -> list[Example]:
    return [found for document in DOCUMENTS for found in examples(document) if found.kind == kind]


APPS: Final = sorted({(found.block.document, found.app) for found in _examples("app") if found.app is not None})


@pytest.mark.parametrize(
    ("document", "name"), APPS, ids=[f"{document.relative_to(ROOT)}:{name}" for document, name in APPS]
)
def test_an_app_example_executes_and_defines_an_app(document: Path, name: str) -> None:
    """Every ``define_*`` call in it checks its definition, so an example that no longer fits the API fails here."""
    module = execute_app(document, name)
    assert isinstance(getattr(module, "app", None), actors.App), f"{name}: `app` is not an actors.App"


@pytest.mark.parametrize("found", _examples("fragment"), ids=lambda found: found.block.where)
def test_a_fragment_parses(found: Example) -> None:
    parse_fragment(found.block)


@pytest.mark.parametrize("found", _examples("script"), ids=lambda found: found.block.where)
def test_a_script_is_a_program(found: Example) -> None:
    """Scripts run in tests/integration/test_examples.py; here only that they compile without top-level await (a
    reader can run one as it is)."""
    compile(found.block.padded(), found.block.where, "exec")
