"""The owner's core is sans-IO: importing it must pull in neither trio, nor apsw, nor sockets; so is the memory store
(the core's unit tests run on it)."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import storage_owner.core

FORBIDDEN = ("trio", "apsw", "trio_websocket", "socket")
CORE_DIR = Path(storage_owner.core.__file__).parent
REPO = CORE_DIR.parent.parent

_REPORT = f"print(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r}))"


def _run(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    return result.stdout.strip()


def test_importing_the_core_loads_no_io_modules() -> None:
    assert _run(f"import storage_owner.core, sys; {_REPORT}") == "[]"


def test_the_core_modules_themselves_load_no_io_modules() -> None:
    # Bypass the parent package's __init__ so only the core (and what it imports) is loaded.
    code = (
        "import sys, types; "
        f"package = types.ModuleType('storage_owner'); package.__path__ = [{str(CORE_DIR.parent)!r}]; "
        "sys.modules['storage_owner'] = package; "
        f"import storage_owner.core; {_REPORT}"
    )
    assert _run(code) == "[]"


def test_the_protocol_package_loads_no_io_modules() -> None:
    assert _run(f"import protocol, sys; {_REPORT}") == "[]"


def _imported(source: Path) -> Iterator[str]:
    """The modules ``source`` imports by absolute name."""
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def _banned(name: str, banned: tuple[str, ...]) -> bool:
    return any(name == ban or name.startswith(ban + ".") for ban in banned)


def test_core_sources_import_nothing_from_io_or_storage() -> None:
    banned = (*FORBIDDEN, "storage_owner.io", "storage_owner.store", "storage_owner")
    for source in sorted(CORE_DIR.glob("*.py")):
        for name in _imported(source):
            assert not _banned(name, banned), (source.name, name)


STORE_DIR = CORE_DIR.parent / "store"
MEMORY_STORE_SOURCES = (
    "_memory.py",
    "_memory_tables.py",
    "_memory_log.py",
    "_memory_conversations.py",
    "_memory_runs.py",
    "_memory_operations.py",
    "_memory_tasks.py",
    "_memory_usage.py",
    "_memory_partials.py",
    "_blobs.py",
    "_schema.py",
)
"""The memory store and what it imports of its package: sans-IO like the core, so the core's unit tests run it."""


def test_the_memory_store_loads_no_io_modules() -> None:
    # Bypass the packages' __init__ (the store package's imports apsw for the SQLite store).
    code = (
        "import sys, types; "
        f"package = types.ModuleType('storage_owner'); package.__path__ = [{str(CORE_DIR.parent)!r}]; "
        f"store = types.ModuleType('storage_owner.store'); store.__path__ = [{str(STORE_DIR)!r}]; "
        "sys.modules['storage_owner'] = package; sys.modules['storage_owner.store'] = store; "
        f"import storage_owner.store._memory; {_REPORT}"
    )
    assert _run(code) == "[]"


def test_the_memory_store_sources_import_nothing_from_io() -> None:
    for name in MEMORY_STORE_SOURCES:
        for imported in _imported(STORE_DIR / name):
            assert not _banned(imported, FORBIDDEN), (name, imported)
