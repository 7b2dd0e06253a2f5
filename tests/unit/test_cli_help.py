"""Every ``tether`` command's ``--help`` text, held in a golden file, and the exit status and message of bad usage of
each command (exit 2, the reason on stderr, nothing done).

The golden, ``tests/unit/cli_help.txt``, is the help of ``tether`` and of every command and sub-command, as the
parser prints it at a fixed width (``COLUMNS`` = :data:`COLUMNS`). A change of a help text or of an option shows as
a failure here; when the change is meant, write the golden anew and read its diff before committing it::

    TETHER_WRITE_CLI_HELP=1 .venv/bin/python -m pytest -q tests/unit/test_cli_help.py
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime._cli import build_parser, main

GOLDEN = Path(__file__).with_name("cli_help.txt")
COLUMNS = 120
REWRITE = "TETHER_WRITE_CLI_HELP"
ID = "0190f3a2-7c4e-7b1a-9d3e-5f6a7b8c9d0e"
"""An id, well formed (the commands refuse a malformed one before anything else)."""


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    """Each command's path (``()`` for ``tether`` itself, ``("prices", "set")``) and its help text, depth first."""
    yield path, parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                yield from _commands(command, (*path, name))


def _help_texts(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", str(COLUMNS))
    monkeypatch.delenv("TETHER_TOKEN", raising=False)  # tether worker --token's default (not printed; still)
    parts = []
    for path, text in _commands(build_parser()):
        parts.append(f"=== tether {' '.join(path)}".rstrip() + " --help\n" + text)
    return "\n".join(parts)


def _command_names() -> list[str]:
    return [path[0] for path, _ in _commands(build_parser()) if len(path) == 1]


def test_every_commands_help_is_the_golden(monkeypatch: pytest.MonkeyPatch) -> None:
    texts = _help_texts(monkeypatch)
    if os.environ.get(REWRITE):
        GOLDEN.write_text(texts, encoding="utf-8")
    assert GOLDEN.exists(), f"no golden: write it with {REWRITE}=1 (see this module's docstring)"
    golden = GOLDEN.read_text(encoding="utf-8")
    assert texts == golden, f"a --help text changed; if meant, write the golden anew with {REWRITE}=1 and read the diff"


def test_the_golden_holds_every_command() -> None:
    golden = GOLDEN.read_text(encoding="utf-8")
    names = _command_names()
    assert len(names) >= 20  # the walk finds the commands, or this test could not fail
    for name in names:
        assert f"=== tether {name} --help\n" in golden
    assert "=== tether prices set --help\n" in golden  # and the sub-commands


# A bad use of every command: (argv, what stderr says). Each exits 2 before doing anything.
BAD_USAGE: dict[str, list[tuple[list[str], str]]] = {
    "owner": [
        (["owner"], "the following arguments are required: --db"),
        (["owner", "--db", "x", "--sync", "no"], "invalid choice: 'no'"),
    ],
    "demo": [
        (["demo", "--part", "nine"], "invalid choice: 'nine'"),
        (["demo", "--entries", "0"], "expected a whole number of 1 or more"),
    ],
    "up": [
        (["up", "--workers", "-1"], "expected a whole number of 0 or more"),
        (["up", "--listen", "nowhere"], "expected HOST:PORT"),
    ],
    "worker": [
        (["worker", "--db", "x"], "the following arguments are required: --app"),
        (["worker", "--app", "a:b"], "one of the arguments --db --url is required"),
    ],
    "status": [(["status", "extra"], "unrecognized arguments: extra")],
    "stop": [(["stop", "--timeout", "0"], "expected a number of seconds above 0")],
    "tasks": [(["tasks", "--json", "x"], "unrecognized arguments: x")],
    "abort": [
        (["abort"], "the following arguments are required: TASK_ID"),
        (["abort", ID, "--wait", "soon"], "expected a number of seconds above 0"),
    ],
    "check": [(["check", "--db"], "expected one argument")],
    "submit": [
        (["submit", "hi"], "one of the arguments --conversation --agent is required"),
        (["submit", "hi", "--agent", "a", "--when-busy", "later"], "invalid choice: 'later'"),
    ],
    "submissions": [(["submissions"], "the following arguments are required: --conversation")],
    "withdraw": [(["withdraw"], "the following arguments are required: SUBMISSION_ID")],
    "reset": [(["reset"], "the following arguments are required: CONVERSATION_ID")],
    "configure": [
        (["configure"], "the following arguments are required: CONVERSATION_ID"),
        (["configure", ID, "--max-turns", "0"], "expected a whole number of 1 or more"),
    ],
    "runs": [(["runs", "--status", "done"], "invalid choice: 'done'")],
    "resolve": [
        (["resolve", ID], "the following arguments are required: --output"),
        (["resolve", ID, "--output", "{no"], "expected a JSON value"),
    ],
    "journal": [(["journal"], "the following arguments are required: RUN_ID")],
    "retry": [(["retry"], "the following arguments are required: RUN_ID")],
    "cancel": [(["cancel"], "the following arguments are required: RUN_ID")],
    "respond": [
        (["respond", ID], "one of the arguments --approve --deny --answer is required"),
        (["respond", ID, "--approve", "--deny"], "not allowed with argument"),
    ],
    "interactions": [(["interactions", "--limit", "3"], "unrecognized arguments: --limit 3")],
    "ui": [(["ui", "--listen", "8080"], "expected HOST:PORT")],
    "watch": [
        (["watch", "--from-seq", "x"], "expected a whole number of 0 or more"),
        (["watch", "--json", "--plain"], "not allowed with argument"),
    ],
    "usage": [
        (["usage", "--limit", "0"], "expected a whole number of 1 or more"),
        (["usage", "--run", ID, "--conversation", ID], "not allowed with argument"),
    ],
    "prices": [
        (["prices", "set", "m", "--input", "1"], "the following arguments are required: --output"),
        (["prices", "set", "m", "--input", "-1", "--output", "1"], "expected a number of 0 or more"),
    ],
    "budget": [(["budget", "--max-tokens", "5"], "one of the arguments --conversation --task is required")],
}


def test_every_command_has_its_bad_usage_cases() -> None:
    assert sorted(BAD_USAGE) == sorted(_command_names())


@pytest.mark.parametrize(
    ("argv", "said"), [case for cases in BAD_USAGE.values() for case in cases], ids=lambda value: str(value)[:40]
)
def test_bad_usage_exits_2_saying_why(argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert said in captured.err
    assert captured.err.startswith("usage: tether")  # a wrong option is the top parser's to say, the rest the command's
    assert captured.out == ""


REQUIRED: dict[str, list[str]] = {
    "owner": ["--db", "x"],
    "worker": ["--db", "x", "--app", "a:b"],
    "abort": [ID],
    "submit": ["--agent", "a"],
    "submissions": ["--conversation", ID],
    "withdraw": [ID],
    "reset": [ID],
    "configure": [ID],
    "resolve": [ID, "--output", "1"],
    "journal": [ID],
    "retry": [ID],
    "cancel": [ID],
    "respond": [ID, "--approve"],
    "budget": ["--conversation", ID],
}
"""What each command needs besides its options, so that an unknown option is what it is refused for."""


@pytest.mark.parametrize("name", _command_names())
def test_an_unknown_option_of_every_command_exits_2(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([name, *REQUIRED.get(name, []), "--no-such-option"])
    assert exited.value.code == 2
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err


def test_an_unknown_command_exits_2_from_the_shell(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "runtime", "nosuch"], capture_output=True, text=True, timeout=30, cwd=tmp_path
    )
    assert done.returncode == 2
    assert "invalid choice: 'nosuch'" in done.stderr
    assert done.stdout == ""
    assert list(tmp_path.iterdir()) == []  # nothing done
    done = subprocess.run([sys.executable, "-m", "runtime"], capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert done.returncode == 2
    assert "the following arguments are required: COMMAND" in done.stderr


# Every place a command takes an id: a malformed one is refused the same way by each (exit 2, before the owner).
MALFORMED_IDS = [
    ["withdraw", "BAD"],
    ["respond", "BAD", "--approve"],
    ["resolve", "BAD", "--output", "1"],
    ["retry", "BAD"],
    ["cancel", "BAD"],
    ["journal", "BAD"],
    ["reset", "BAD"],
    ["configure", "BAD"],
    ["submissions", "--conversation", "BAD"],
    ["submit", "--conversation", "BAD", "hi"],
    ["runs", "--conversation", "BAD"],
    ["abort", "BAD"],
    ["watch", "--run", "BAD"],
    ["watch", "--conversation", "BAD"],
    ["usage", "--run", "BAD"],
    ["usage", "--conversation", "BAD"],
    ["budget", "--conversation", "BAD"],
    ["budget", "--task", "BAD"],
]


@pytest.mark.parametrize("argv", MALFORMED_IDS, ids=" ".join)
def test_a_malformed_id_is_refused_in_one_shape_by_every_command(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    [*_, last] = capsys.readouterr().err.splitlines()
    assert last.startswith(f"tether {argv[0]}: error: argument ")
    assert last.endswith(
        ": expected an id (a lower-case UUID, such as 0190f3a2-7c4e-7b1a-9d3e-5f6a7b8c9d0e), not 'BAD'"
    )


@pytest.mark.parametrize("tools", ["lookup,,track", "lookup,", " , ", ",lookup"])
def test_configure_refuses_an_empty_tool_name_before_asking_the_owner(
    tools: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["configure", ID, "--db", str(tmp_path / "absent.db"), "--tools", tools]) == 2
    assert capsys.readouterr().err == (
        f"tether: configure: --tools {tools!r}: a tool's name is empty (names are separated by single commas; give "
        "'' for no tools); nothing was changed\n"
    )


def test_configure_strips_the_tool_names() -> None:
    from runtime._cli_inbox import tool_names

    assert tool_names(" lookup, track ") == ["lookup", "track"]
    assert tool_names("") == tool_names("  ") == []
