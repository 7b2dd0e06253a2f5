"""The ``tether`` entry point catches SIGINT and SIGTERM before the command line's imports: importing the ``runtime``
package (what the console script and ``python -m runtime`` do first) loads nothing but the entry point and its early
signal handlers."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_importing_runtime_loads_only_its_entry_point() -> None:
    code = (
        "import sys; before = set(sys.modules); import runtime; "
        "print(sorted(m for m in set(sys.modules) - before if not m.startswith('_')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    loaded = set(ast.literal_eval(result.stdout.strip()))
    entry = {"runtime", "runtime._entry", "runtime._signals"}
    assert entry <= loaded <= entry | {"signal"}
