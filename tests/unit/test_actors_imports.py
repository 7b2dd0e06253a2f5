"""``actors`` never imports ``storage_owner``: both speak only through ``protocol`` (docs/architecture.md). Inside
``actors``, each room imports only the rooms before it, and only the client's room sends frames on a connection."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import actors

ACTORS_DIR = Path(actors.__file__).parent
REPO = ACTORS_DIR.parent


def _loaded_after(statement: str, prefix: str) -> list[str]:
    report = f"sorted(m for m in sys.modules if m == {prefix!r} or m.startswith({prefix + '.'!r}))"
    code = f"import sys; {statement}; print({report})"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    return ast.literal_eval(result.stdout.strip())  # type: ignore[no-any-return]


def test_importing_actors_loads_no_storage_owner_module() -> None:
    assert _loaded_after("import actors", "storage_owner") == []


def test_actors_sources_import_nothing_from_storage_owner() -> None:
    for source in sorted(ACTORS_DIR.rglob("*.py")):
        tree = ast.parse(source.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                assert name.split(".")[0] != "storage_owner", (source.name, name)


def test_importing_protocol_leaves_its_io_module_alone() -> None:
    # protocol.io imports trio and trio_websocket; the sans-IO core imports protocol.
    assert _loaded_after("import protocol", "protocol.io") == []


def test_importing_actors_leaves_the_test_kit_alone_and_the_kit_loads_what_a_test_uses() -> None:
    # A worker never loads the kit, nor a pytest session that loads its plugin and uses none of its fixtures.
    assert _loaded_after("import actors", "actors.testing") == []
    assert _loaded_after("import actors.testing.plugin", "runtime") == []
    assert _loaded_after("import actors.testing", "actors.testing") == ["actors.testing"]
    assert "actors.testing._processes" in _loaded_after("import actors.testing; actors.testing.ScratchOwner", "actors")


def test_importing_actors_leaves_httpx_until_openai_chat_is_used() -> None:
    # Every worker and every tether command imports actors; only a model server's client needs httpx.
    assert _loaded_after("import actors", "httpx") == []
    assert _loaded_after("import actors; actors.OpenAIChat", "httpx") != []


def test_building_the_tether_parser_loads_no_client() -> None:
    # `tether owner` builds the whole parser (every command's) before it runs; the client is for the other commands.
    assert _loaded_after("import runtime; runtime.build_parser()", "actors") == []


CLIENT_ROOM = ACTORS_DIR / "_client"
"""The client's room: the only modules that send frames on a connection."""


def _uses_of_the_connection(node: ast.AST) -> list[ast.Attribute]:
    """``x.connection.name = ...`` (a hook set from outside) or ``x.connection.call(...)``, ``send_nowait(...)`` (a
    frame sent past the client's typed methods) at ``node``."""
    if isinstance(node, ast.Assign):
        candidates, names = node.targets, None
    elif isinstance(node, ast.Call):
        candidates, names = [node.func], ("call", "send_nowait")
    else:
        return []
    return [
        target
        for target in candidates
        if isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Attribute)
        and target.value.attr == "connection"
        and (names is None or target.attr in names)
    ]


def test_outside_the_client_nothing_calls_the_connection_or_sets_its_hooks() -> None:
    # The worker, its phases and the run loop go through the Client's typed methods, and a worker registers its hooks
    # in one call: no module outside the client sends a frame on the connection or assigns one of its attributes.
    found = []
    for source in sorted(ACTORS_DIR.rglob("*.py")):
        if source.is_relative_to(CLIENT_ROOM):
            continue
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            found += [
                f"{source.relative_to(ACTORS_DIR)}:{node.lineno}: {ast.unparse(use)}"
                for use in _uses_of_the_connection(node)
            ]
    assert found == []


ROOMS = {
    "_models": (),
    "_app": ("_models",),
    "_client": (),
    "_worker": ("_models", "_app", "_client"),
    "testing": ("_models", "_app", "_client", "_worker"),
}
"""actors' rooms (its sub-packages) and the rooms each may import: none imports a room that imports it back. The
test kit (``actors.testing``, public) comes last: it uses every room, and no room uses it."""


def _rooms_imported(source: Path) -> set[str]:
    """The rooms of ``actors`` that a module of a room imports (type-checking imports included)."""
    rooms = set()
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 2:  # from .._room._module import ...
            rooms.add((node.module or "").split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("actors."):
            rooms.add((node.module or "").split(".")[1])
        elif isinstance(node, ast.Import):
            rooms.update(alias.name.split(".")[1] for alias in node.names if alias.name.startswith("actors."))
    return rooms


def test_every_module_is_in_a_room_that_imports_only_the_rooms_before_it() -> None:
    # Beside the rooms there is only __init__.py, which re-exports the public names of every room.
    assert [source.name for source in ACTORS_DIR.glob("*.py")] == ["__init__.py"]
    rooms = sorted(path.name for path in ACTORS_DIR.iterdir() if path.is_dir() and path.name != "__pycache__")
    assert rooms == sorted(ROOMS)
    found = []
    for room, allowed in ROOMS.items():
        for source in sorted((ACTORS_DIR / room).rglob("*.py")):
            found += [f"{room}/{source.name} imports {other}" for other in _rooms_imported(source) - {room, *allowed}]
    assert found == []


def test_every_room_is_a_package_of_the_distribution() -> None:
    # A sub-package missing from pyproject.toml's list is shipped in a wheel only as data, with a warning.
    listed = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"]
    packages = ["actors", *(f"actors.{path.parent.name}" for path in ACTORS_DIR.glob("*/__init__.py"))]
    assert sorted(set(packages) - set(listed)) == []
