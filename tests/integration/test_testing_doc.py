"""docs/testing.md's complete example runs as a user runs it: its app block saved as ``myshop.py`` and its first
fragment (the user's tests) as ``test_myshop.py`` in a scratch directory, then ``pytest`` there in a process of its
own, with the kit's plugin and pytest-trio; every one of its tests must pass."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Final

import trio

from tests._docs import ROOT, app_source, examples
from tests.integration._up_helpers import CHILD_ENV

TESTING_DOC: Final = ROOT / "docs" / "testing.md"
TIMEOUT_S: Final = 120
TESTS: Final = 3


def users_tests() -> str:
    """The first fragment of docs/testing.md: the user's test module."""
    [first, *_] = [found for found in examples(TESTING_DOC) if found.kind == "fragment"]
    return first.block.source


async def test_the_complete_example_of_docs_testing_passes_as_a_users_test_suite(tmp_path: Path) -> None:
    (tmp_path / "myshop.py").write_text(app_source(TESTING_DOC, "myshop"), encoding="utf-8")
    (tmp_path / "test_myshop.py").write_text(users_tests(), encoding="utf-8")
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "actors.testing.plugin",  # loaded by its entry point once installed; named here for a checkout's runs
        "-o",
        "trio_mode=true",
        "--rootdir",
        str(tmp_path),
        "--basetemp",
        str(tmp_path / "basetemp"),
        "test_myshop.py",
    ]
    with trio.fail_after(TIMEOUT_S):
        done = await trio.run_process(
            command, cwd=tmp_path, env=CHILD_ENV, capture_stdout=True, stderr=subprocess.STDOUT, check=False
        )
    output = done.stdout.decode(errors="replace")
    assert done.returncode == 0, output
    assert f"{TESTS} passed" in output, output
