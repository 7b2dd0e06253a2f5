"""README.md and docs/*.md as the tests read them: fenced code blocks with their example markers, headings, links.

Every Python block carries an HTML comment on the line right before its fence (GitHub does not render it) saying
what the tests do with it:

``<!-- example: app NAME -->``
    The module ``NAME.py``, defining ``app`` (an ``actors.App``); blocks of one file marked with the same NAME
    make one module, in order. The unit tests execute it, so every definition in it is checked; the scripts that
    name it run against it.
``<!-- example: script -->``
    A program, run with ``python`` in a scratch directory while ``tether up --db tether.db`` runs there with the
    built-in demo app (``runtime.demo_app:app``); it must exit 0.
``<!-- example: script with NAME -->``
    The same, while ``tether up --db tether.db --app NAME:app`` serves the module ``NAME.py`` of the same file.
``<!-- example: fragment -->``
    A piece of a larger program (it uses names defined elsewhere): only parsed (top-level ``await`` allowed).

A Python block without a marker fails tests/unit/test_docs.py, so a new example is never left unchecked.
"""

from __future__ import annotations

import ast
import contextlib
import re
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Final, Literal

import attrs

ROOT: Final = Path(__file__).resolve().parents[1]
DOCUMENTS: Final = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
PYTHON_INFO: Final = frozenset({"python", "py", "python3"})
MARKER: Final = re.compile(r"^<!--\s*example:\s*(?P<text>.*?)\s*-->\s*$")
KINDS: Final = re.compile(r"^(?:(?P<fragment>fragment)|app (?P<app>\w+)|(?P<script>script)(?: with (?P<with>\w+))?)$")
FENCE: Final = re.compile(r"^(?P<fence>`{3,}|~{3,})(?P<info>.*)$")

Kind = Literal["app", "script", "fragment"]


@attrs.frozen(kw_only=True)
class Block:
    """A fenced code block: its document, the line of its opening fence (1-based), its info string, its text and
    the example marker on the line before the fence (``None`` without one)."""

    document: Path
    line: int
    info: str
    source: str
    marker: str | None

    @property
    def where(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"

    @property
    def is_python(self) -> bool:
        return (self.info.split() or [""])[0].lower() in PYTHON_INFO

    def padded(self) -> str:
        """The source preceded by blank lines, so that a traceback's line numbers are the document's."""
        return "\n" * self.line + self.source


@attrs.frozen(kw_only=True)
class Example:
    """A marked Python block: ``kind``, and ``app``: the module it belongs to (``app``), or the module a script runs
    against (``None``: the built-in demo app)."""

    block: Block
    kind: Kind
    app: str | None


class MarkerError(ValueError):
    """A marker that says nothing the tests understand, or a Python block with none."""


def blocks(document: Path) -> list[Block]:
    """Every fenced code block of ``document``, in order."""
    lines = document.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence = opening.group("fence")
        end = index + 1
        while end < len(lines) and not (lines[end].startswith(fence) and not lines[end].strip(fence[0]).strip()):
            end += 1
        previous = MARKER.match(lines[index - 1]) if index > 0 else None
        found.append(
            Block(
                document=document,
                line=index + 1,
                info=opening.group("info").strip(),
                source="".join(line + "\n" for line in lines[index + 1 : end]),
                marker=previous.group("text") if previous else None,
            )
        )
        index = end + 1
    return found


def dangling_markers(document: Path) -> list[str]:
    """Markers that are not on the line right before a fence: each as ``document:line``."""
    lines = document.read_text(encoding="utf-8").splitlines()
    inside = _fenced_lines(lines)
    return [
        f"{document.relative_to(ROOT)}:{number + 1}"
        for number, line in enumerate(lines)
        if number not in inside
        and MARKER.match(line)
        and (number + 1 >= len(lines) or FENCE.match(lines[number + 1]) is None)
    ]


def example(block: Block) -> Example:
    """The example a Python block is, by its marker; :class:`MarkerError` says what is wrong."""
    if block.marker is None:
        raise MarkerError(
            f"{block.where}: a Python block without an example marker: put <!-- example: app NAME -->, "
            "<!-- example: script -->, <!-- example: script with NAME --> or <!-- example: fragment --> on the line "
            "before its fence (tests/_docs.py says what each means)"
        )
    kind = KINDS.match(block.marker)
    if kind is None:
        raise MarkerError(f"{block.where}: the marker 'example: {block.marker}' is not one tests/_docs.py describes")
    if kind.group("fragment"):
        return Example(block=block, kind="fragment", app=None)
    if kind.group("app"):
        return Example(block=block, kind="app", app=kind.group("app"))
    return Example(block=block, kind="script", app=kind.group("with"))


def examples(document: Path) -> list[Example]:
    """The marked Python blocks of ``document``, in order (one without a marker is left out here:
    tests/unit/test_docs.py fails on it)."""
    found: list[Example] = []
    for block in blocks(document):
        if block.is_python:
            with contextlib.suppress(MarkerError):
                found.append(example(block))
    return found


def app_source(document: Path, name: str) -> str:
    """The module ``name`` of ``document``: its ``app NAME`` blocks joined, each at its own line numbers."""
    parts: list[str] = []
    at_line = 0
    for found in examples(document):
        if found.kind == "app" and found.app == name:
            block = found.block
            parts.append("\n" * (block.line - at_line) + block.source)
            at_line = block.line + block.source.count("\n")
    if not parts:
        raise MarkerError(f"{document.relative_to(ROOT)} has no block marked 'example: app {name}'")
    return "".join(parts)


def execute_app(document: Path, name: str) -> types.ModuleType:
    """Execute the module ``name`` of ``document`` as a fresh module (not imported: nothing is left in
    ``sys.modules``); a traceback names the document's lines."""
    module = types.ModuleType(name)
    exec(compile(app_source(document, name), str(document.relative_to(ROOT)), "exec"), module.__dict__)
    return module


def parse_fragment(block: Block) -> ast.Module:
    """A fragment parsed as Python, top-level ``await``, ``async for`` and ``async with`` allowed."""
    tree = compile(block.padded(), block.where, "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    assert isinstance(tree, ast.Module)
    return tree


# ------------------------------------------------------------------------------------------ headings, links


def _fenced_lines(lines: list[str]) -> set[int]:
    """The indexes of lines inside fenced blocks (the fences included)."""
    inside: set[int] = set()
    fence: str | None = None
    for number, line in enumerate(lines):
        opening = FENCE.match(line)
        if fence is None and opening is not None:
            fence = opening.group("fence")
            inside.add(number)
        elif fence is not None:
            inside.add(number)
            if line.startswith(fence) and not line.strip(fence[0]).strip():
                fence = None
    return inside


def prose(document: Path) -> Iterator[tuple[int, str]]:
    """The lines of ``document`` outside fenced blocks, with their numbers (1-based)."""
    lines = document.read_text(encoding="utf-8").splitlines()
    inside = _fenced_lines(lines)
    for number, line in enumerate(lines):
        if number not in inside:
            yield number + 1, line


def headings(document: Path) -> list[str]:
    """The headings' texts, in order, with code spans' backticks removed."""
    return [
        re.sub(r"^#+\s*", "", line).replace("`", "").strip()
        for _, line in prose(document)
        if re.match(r"^#{1,6}\s", line)
    ]


def anchors(document: Path) -> set[str]:
    """The anchors GitHub gives the headings: lower case, punctuation dropped, spaces as hyphens, ``-1``... for a
    repeat."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for heading in headings(document):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def section(document: Path, title: str) -> tuple[str, list[Block]]:
    """The prose of the section headed ``title`` (up to the next heading of its level or above: its lines outside
    fenced blocks, joined by spaces) and its blocks."""
    lines = document.read_text(encoding="utf-8").splitlines()
    inside = _fenced_lines(lines)
    start = level = None
    end = len(lines)
    for number, line in enumerate(lines):
        heading = re.match(r"^(#{1,6})\s+(.*)$", line) if number not in inside else None
        if heading is None:
            continue
        if start is None and heading.group(2).strip() == title:
            start, level = number, len(heading.group(1))
        elif start is not None and level is not None and len(heading.group(1)) <= level:
            end = number
            break
    if start is None:
        raise MarkerError(f"{document.relative_to(ROOT)} has no section {title!r}")
    text = " ".join(line for number, line in enumerate(lines[start:end], start=start) if number not in inside)
    return text, [block for block in blocks(document) if start < block.line <= end]
