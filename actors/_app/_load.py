"""``--app MODULE:ATTR`` (or ``--app path/to/file.py:ATTR``): finding the :class:`~actors.App` a worker serves, and
saying where an app that fails at import failed (the frames of its own files, not the import machinery's)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import sysconfig
import traceback
from pathlib import Path
from types import ModuleType
from typing import Final

from ._app import App, AppLoadError

APP_FRAMES_SHOWN: Final = 5
"""The last frames of the app's own files shown for an error raised while its module is imported."""
CODE_LINE_CHARS: Final = 200
"""A line of code longer than this is shown cut, with ``…``."""
_TETHER_PACKAGES: Final = tuple(
    str(Path(__file__).resolve().parents[2] / package) + os.sep
    for package in ("actors", "protocol", "runtime", "storage_owner")
)
"""Tether's own packages: never the app's files."""


def load_app(spec: str) -> App:
    """Import ``MODULE:ATTR`` and return the :class:`App` it names; :class:`AppLoadError` says what is wrong.

    ``MODULE`` is looked up in the working directory first, then on the import path (``PYTHONPATH``, installed
    packages), however the process was started (the ``tether`` console script, ``python -m runtime``, a child of
    ``tether up``, a script calling this), as uvicorn finds its app. The working directory is put first on the import
    path for that and stays there (the app's own later imports find its sibling modules); Tether's packages are
    imported by then, so a file of the same name there cannot replace them. ``MODULE`` may also be the path of a
    Python file (it ends in ``.py``): the file is imported as a module named after it, its directory put first on the
    import path in the same way.

    An error raised while the module is imported is reported with the last frames of the app's own files (file,
    line, code: not the import machinery's, the standard library's or Tether's), then the error.
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise AppLoadError(
            f"--app must look like MODULE:ATTR (such as myapp.tasks:app) or FILE.py:ATTR (such as ./myapp.py:app), "
            f"not {spec!r}"
        )
    working_directory = os.getcwd()
    if sys.path[:1] not in ([working_directory], [""]):
        sys.path.insert(0, working_directory)
    try:
        module = _import_file(module_name, spec) if module_name.endswith(".py") else _import(module_name, spec)
    except AppLoadError:
        raise
    except Exception as exc:  # the application's own import-time error
        where = where_it_failed(exc) or " "
        raise AppLoadError(
            f"importing {module_name!r} for --app {spec} failed:{where}{type(exc).__name__}: {exc}"
        ) from exc
    try:
        app = getattr(module, attribute)
    except AttributeError:
        what = "file" if module_name.endswith(".py") else "module"
        raise AppLoadError(f"{what} {module_name!r} has no attribute {attribute!r} (--app {spec})") from None
    if not isinstance(app, App):
        raise AppLoadError(f"--app {spec} is a {type(app).__name__}, not an actors.App")
    return app


def _import(module_name: str, spec: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name) and module_name[len(exc.name) :][:1] in ("", "."):
            raise AppLoadError(f"cannot import module {module_name!r} for --app {spec}: {exc}") from exc
        raise  # a module the app imports is missing: the app's own error, with where it failed


def _import_file(file_name: str, spec: str) -> ModuleType:
    """The Python file ``file_name`` imported as a module named after it (``app.py``: ``app``), registered in
    ``sys.modules`` like any import."""
    path = Path(file_name).resolve()
    if not path.is_file():
        raise AppLoadError(f"there is no file {path} for --app {spec}")
    name = path.stem
    held = sys.modules.get(name)
    if held is not None:
        if getattr(held, "__file__", None) == str(path):
            return held
        raise AppLoadError(
            f"--app {spec}: a module named {name!r} is imported already (from {getattr(held, '__file__', None)}); "
            f"rename the file, or give --app as MODULE:ATTR"
        )
    if sys.path[:1] != [str(path.parent)]:
        sys.path.insert(0, str(path.parent))  # its sibling modules, as for a script run with python
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None  # a .py file always has one
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def where_it_failed(exc: BaseException) -> str:
    """The last :data:`APP_FRAMES_SHOWN` frames of ``exc``'s traceback that are in the app's own files, as Python
    prints them (``File "...", line N, in NAME`` and the code), each on its own line, ending with a line break; ``""``
    when none is (the error was raised by the import machinery itself)."""
    frames = [frame for frame in traceback.extract_tb(exc.__traceback__) if _is_app_file(frame.filename)]
    if not frames:
        return ""
    lines = []
    for frame in frames[-APP_FRAMES_SHOWN:]:
        lines.append(f'\n  File "{frame.filename}", line {frame.lineno}, in {frame.name}')
        code = (frame.line or "").strip()
        if code:
            lines.append(f"\n    {code if len(code) <= CODE_LINE_CHARS else code[: CODE_LINE_CHARS - 1] + '…'}")
    return "".join(lines) + "\n"


def _is_app_file(filename: str) -> bool:
    """Whether ``filename`` is the app's own code: a file on disk, not the standard library's, an installed
    package's or Tether's."""
    if filename.startswith("<") or not os.path.isfile(filename):
        return False
    resolved = str(Path(filename).resolve())
    return not resolved.startswith((*_library_paths(), *_TETHER_PACKAGES))


def _library_paths() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(
        str(Path(paths[key]).resolve()) + os.sep
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if key in paths
    )
