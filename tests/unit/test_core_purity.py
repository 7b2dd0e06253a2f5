"""The owner's core is sans-IO: importing it must pull in neither trio, nor apsw, nor sockets."""

from __future__ import annotations

import ast
import subprocess
import sys
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


def test_core_sources_import_nothing_from_io_or_storage() -> None:
    banned = (*FORBIDDEN, "storage_owner.io", "storage_owner.store", "storage_owner")
    for source in sorted(CORE_DIR.glob("*.py")):
        tree = ast.parse(source.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                assert not any(name == ban or name.startswith(ban + ".") for ban in banned), (source.name, name)
