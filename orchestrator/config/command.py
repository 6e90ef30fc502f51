"""The command a person types to run this package's CLI again (resume a run, serve the UI): the
console script they ran, or the interpreter they ran it with, never a bare ``python`` that may be another one."""

from __future__ import annotations

import os
import shlex
import shutil
import sys

SCRIPTS = {"orchestrator": "elb-train", "search": "elb-search"}  # pyproject.toml [project.scripts]


def _same_file(a: str | None, b: str) -> bool:
    # abspath, not realpath: a virtual environment's python is a link to the system's, yet only it sees the venv
    return bool(a) and os.path.abspath(a) == os.path.abspath(b)


def _short_path(path: str) -> str:
    """``path`` as short as it stays exact: relative to the current folder when under it, ``~`` for home."""
    path = os.path.abspath(path)
    cwd = os.getcwd()
    if path.startswith(cwd + os.sep):
        return os.path.relpath(path, cwd)
    home = os.path.expanduser("~")
    if home not in ("", "/") and path.startswith(home + os.sep):
        return "~" + path[len(home) :]
    return path


def interpreter() -> str:
    """How to name this interpreter in a command: ``python``/``python3`` when that is what the
    shell finds on PATH, else its path (shortened)."""
    exe = sys.executable or "python"
    for name in ("python", "python3"):
        if _same_file(shutil.which(name), exe):
            return name
    short = _short_path(exe)
    return shlex.quote(short) if not short.startswith("~") else "~" + shlex.quote(short[1:])


def cli(package: str = "orchestrator", argv0: str | None = None) -> str:
    """The command that runs ``package``'s CLI as the user ran it: its console script (``elb-train``)
    when they ran that one, else ``<this interpreter> -m package``."""
    argv0 = sys.argv[0] if argv0 is None and sys.argv else (argv0 or "")
    script = SCRIPTS.get(package)
    if script and os.path.basename(argv0) == script:
        return script if _same_file(shutil.which(script), argv0) else shlex.quote(_short_path(argv0))
    return f"{interpreter()} -m {package}"
