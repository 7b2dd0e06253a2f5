"""The examples of README.md and docs/ run as a reader runs them (tests/_docs.py says how they are marked): each
script against ``tether up`` serving its app in a scratch directory, and README's "Your own agent" from the app file
to ``tether watch --plain``, with the console script, from the directory that holds the app."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest
import trio

import actors
from tests._docs import DOCUMENTS, ROOT, Example, app_source, examples, execute_app, section
from tests.integration._up_helpers import CHILD_ENV, all_up, nonblank_lines, tether_up

TIMEOUT_S: Final = 60.0
WORKERS: Final = 2
"""``tether up``'s default number of workers (the examples never pass ``--workers``)."""
README: Final = ROOT / "README.md"
YOUR_OWN_AGENT: Final = "Your own agent"
VENV_BIN: Final = Path(sys.executable).parent
"""Where ``make`` installed the console script ``tether``: on PATH as with the virtual environment activated."""
READ_BYTES: Final = 65536


def _script_groups() -> list[tuple[Path, str | None, list[Example]]]:
    groups: dict[tuple[Path, str | None], list[Example]] = {}
    for document in DOCUMENTS:
        for found in examples(document):
            if found.kind == "script":
                groups.setdefault((document, found.app), []).append(found)
    return [(document, app, scripts) for (document, app), scripts in groups.items()]


GROUPS: Final = _script_groups()


@pytest.mark.parametrize(
    ("document", "app", "scripts"),
    GROUPS,
    ids=[f"{document.relative_to(ROOT)}:{app or 'demo'}" for document, app, _ in GROUPS],
)
async def test_the_scripts_run_against_tether_up_serving_their_app(
    document: Path, app: str | None, scripts: list[Example], tmp_path: Path
) -> None:
    args: tuple[str, ...] = ()
    if app is not None:
        (tmp_path / f"{app}.py").write_text(app_source(document, app), encoding="utf-8")
        args = ("--app", f"{app}:app")
    db = str(tmp_path / "tether.db")
    with trio.fail_after(TIMEOUT_S):
        async with tether_up(db, tmp_path, *args, cwd=tmp_path) as up:
            await up.wait_status(all_up(WORKERS), f"tether up serving {app or 'the demo app'} with its workers")
            for script in scripts:
                # Blank lines first: a traceback's line numbers are the document's.
                path = tmp_path / f"{document.stem}_{script.block.line}.py"
                path.write_text(script.block.padded(), encoding="utf-8")
                done = await trio.run_process(
                    [sys.executable, str(path)],
                    cwd=tmp_path,
                    env=CHILD_ENV,
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                )
                output = (done.stdout + done.stderr).decode(errors="replace")
                assert done.returncode == 0, f"{script.block.where} exited with {done.returncode}:\n{output}"
                print(f"{script.block.where} printed:\n{output}")
        await up.assert_everything_gone()


async def _follow_until(process: trio.Process, expected: list[str], output: bytearray) -> None:
    """Read ``process``'s output into ``output`` until each of ``expected`` is in one of its lines, in order."""
    assert process.stdout is not None
    while True:
        lines = output.decode(errors="replace").splitlines()
        at = 0
        for line in lines:
            if at < len(expected) and expected[at] in line:
                at += 1
        if at == len(expected):
            return
        chunk = await process.stdout.receive_some(READ_BYTES)
        assert chunk, f"the watch ended before showing {expected[at]!r}:\n{output.decode(errors='replace')}"
        output += chunk


async def test_your_own_agent_from_the_app_file_to_tether_watch(tmp_path: Path) -> None:
    """README's "Your own agent": its app file saved in an empty directory, then its commands as printed there
    (``tether`` the console script, on PATH), ``tether up`` stopped by SIGINT as Ctrl-C does."""
    text, blocks = section(README, YOUR_OWN_AGENT)
    commands = [
        shlex.split(line, comments=True)
        for block in blocks
        if not block.is_python
        for line in block.source.splitlines()
        if line.startswith("tether ")
    ]
    [up_command] = [command for command in commands if command[1] == "up"]
    [submit] = [command for command in commands if command[1] == "submit"]
    [watch] = [command for command in commands if command[1] == "watch"]
    assert commands == [up_command, submit, watch], commands
    app_spec = up_command[up_command.index("--app") + 1]
    module_name = app_spec.partition(":")[0]
    [app_block] = [block for block in blocks if block.is_python and block.marker == f"app {module_name}"]
    (tmp_path / f"{module_name}.py").write_text(app_block.source, encoding="utf-8")

    # What the answer and the watch must show, from the app itself.
    app = getattr(execute_app(README, module_name), app_spec.partition(":")[2])
    assert isinstance(app, actors.App)
    agent = app.agents[submit[submit.index("--agent") + 1]]
    assert isinstance(agent.model, actors.ScriptedModel)
    question = submit[-1]
    answer = agent.model.turns[-1].text
    tools = [name for turn in agent.model.turns for name, _ in turn.tool_calls]
    assert answer and tools and answer in " ".join(text.split()), "README's prose names the answer of the model"

    # A person's shell: the virtual environment's bin first on PATH (as `source .venv/bin/activate` puts it), and no
    # PYTHONPATH (tether_up's CHILD_ENV has the repository on it): only the working directory can hold the app.
    env = {**os.environ, "PATH": os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", "")]), "PYTHONPATH": ""}
    tether = shutil.which("tether", path=env["PATH"])
    assert tether is not None and Path(tether).parent == VENV_BIN

    def argv(command: list[str]) -> list[str]:
        return [tether, *command[1:]]

    db = str(tmp_path / "tether.db")  # tether up's default --db, in the directory it runs from
    with trio.fail_after(TIMEOUT_S):
        async with tether_up(db, tmp_path, cwd=tmp_path, env=env, command=argv(up_command)) as up:
            await up.wait_status(all_up(WORKERS), f"tether up serving {app_spec} with its workers")

            done = await trio.run_process(
                argv(submit), cwd=tmp_path, env=env, capture_stdout=True, capture_stderr=True, check=False
            )
            printed = nonblank_lines(done.stdout)
            assert done.returncode == 0, printed + nonblank_lines(done.stderr)
            assert printed[-1] == answer, printed

            expected = [
                f"user: {question}",
                *(f"assistant calls {name}" for name in tools),
                *(f"tool {name} result:" for name in tools),
                f"assistant: {answer}",
                "completed with its answer",
            ]
            output = bytearray()
            watching = await trio.lowlevel.open_process(
                argv(watch), cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            try:
                await _follow_until(watching, expected, output)
                watching.send_signal(signal.SIGINT)  # Ctrl-C
                assert await watching.wait() == 0
            finally:
                with trio.CancelScope(shield=True):
                    if watching.returncode is None:
                        watching.kill()
                        await watching.wait()

            up.process.send_signal(signal.SIGINT)  # Ctrl-C in the shell of tether up
            assert await up.wait_exit() == 0, up.stderr_text()
        await up.assert_everything_gone()
