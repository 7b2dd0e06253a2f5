"""Tether's layers, read from its sources (docs/architecture.md, "Layers"):

- no import circle among Tether's modules. Every import counts: at the top of a module, inside a function (a lazy
  import still makes one module need the other) and under ``TYPE_CHECKING``;
- a layer (``protocol``, ``storage_owner.core``, ``storage_owner.store``, ``storage_owner.io``, ``actors``,
  ``runtime``) uses another through its public surface only (what its ``__init__`` exports), never by importing one
  of its private modules;
- only the store opens SQLite (imports ``apsw``);
- in ``runtime`` only the entry point imports the command line (``runtime._cli``), which imports the rest (its
  command groups, ``runtime._cli_*``, import the modules they need).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import attrs

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("protocol", "storage_owner", "actors", "runtime")
LAYERS = ("protocol", "storage_owner.core", "storage_owner.store", "storage_owner.io", "actors", "runtime")
KNOWN_CROSSINGS: frozenset[tuple[str, str]] = frozenset()
"""Crossings still to remove, each as (importer, imported). Remove an entry once its import is gone."""


@attrs.frozen
class Import:
    importer: str
    imported: str
    """The absolute name: a module of Tether's (the longest one the import names) or a third party's."""
    line: int


def _modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for source in sorted((REPO / package).rglob("*.py")):
            parts = source.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = source
    return modules


MODULES = _modules()


def _ours(name: str) -> str:
    """``name`` as the longest module of Tether's it names (``protocol.Hello`` is ``protocol``), or as it is."""
    while name not in MODULES and "." in name:
        name = name.rpartition(".")[0]
    return name


def _imports() -> Iterator[Import]:
    for module, source in MODULES.items():
        package = module if source.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
            else:
                continue
            for name in names:
                imported = _ours(name)
                if imported != module:
                    yield Import(module, imported, node.lineno)


IMPORTS = list(_imports())


def _layer(module: str) -> str | None:
    found = [layer for layer in LAYERS if module == layer or module.startswith(layer + ".")]
    return max(found, key=len, default=None)


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(edges.get(module, ())):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def test_the_reading_of_imports_sees_each_kind_of_import() -> None:
    # What the rules below read must include lazy, relative and TYPE_CHECKING imports, or they could not fail.
    found = {(i.importer, i.imported) for i in IMPORTS}
    assert ("runtime._entry", "runtime._cli") in found  # inside a function, relative
    assert ("runtime", "runtime._cli") in found  # under TYPE_CHECKING
    assert ("runtime._cli_owner", "storage_owner.store") in found  # absolute, inside a function
    assert ("storage_owner.store._sqlite", "apsw") in found  # a third party's


def test_no_module_of_tether_imports_itself_through_a_circle() -> None:
    edges: dict[str, set[str]] = {}
    for i in IMPORTS:
        if i.imported in MODULES:
            edges.setdefault(i.importer, set()).add(i.imported)
    assert _circles(edges) == []
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check can fail


def test_a_layer_uses_another_through_its_public_surface_only() -> None:
    crossings = set()
    for i in IMPORTS:
        layer = _layer(i.imported)
        if layer is None or _layer(i.importer) == layer:
            continue
        if any(part.startswith("_") for part in i.imported[len(layer) :].split(".")):
            crossings.add((i.importer, i.imported))
    assert crossings - KNOWN_CROSSINGS == set()
    assert not KNOWN_CROSSINGS - crossings, f"gone, remove from KNOWN_CROSSINGS: {KNOWN_CROSSINGS - crossings}"


def test_only_the_store_opens_sqlite() -> None:
    importers = {i.importer for i in IMPORTS if i.imported.split(".")[0] == "apsw"}
    assert importers and all(_layer(importer) == "storage_owner.store" for importer in importers), importers


def test_only_the_entry_point_imports_the_command_line() -> None:
    # The command line imports the rest of runtime (lazily, per command); nothing imports it back.
    importers = {i.importer for i in IMPORTS if i.imported == "runtime._cli"}
    assert importers == {"runtime", "runtime._entry"}  # runtime's own lazy name build_parser, and main


def test_in_actors_only_the_test_kit_uses_runtime() -> None:
    # actors.testing starts owner and worker processes with runtime's helpers; the rest of actors stays below runtime.
    importers = {i.importer for i in IMPORTS if _layer(i.importer) == "actors" and _layer(i.imported) == "runtime"}
    assert importers == {"actors.testing._processes"}
