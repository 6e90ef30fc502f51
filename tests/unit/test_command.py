"""orchestrator/config/command.py: the command a summary or a hint tells a person to run."""

import os
import shutil
import sys

from orchestrator.config import command


def test_the_command_names_this_interpreter_unless_python_on_path_is_it(monkeypatch, tmp_path):
    exe = tmp_path / "venv" / "bin" / "python"
    exe.parent.mkdir(parents=True)
    exe.write_text("")
    monkeypatch.setattr(sys, "executable", str(exe))
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/python3" if name.startswith("python") else None)
    monkeypatch.chdir("/")
    assert command.cli(argv0="/x/orchestrator/__main__.py") == f"{exe} -m orchestrator"
    monkeypatch.chdir(tmp_path)  # under the current folder: relative, still exact here
    assert command.cli(argv0="-m") == os.path.join("venv", "bin", "python") + " -m orchestrator"
    monkeypatch.setattr(shutil, "which", lambda name: str(exe) if name == "python" else None)
    assert command.cli("search", argv0="-m") == "python -m search"


def test_a_console_script_is_named_as_the_user_ran_it(monkeypatch, tmp_path):
    script = tmp_path / "bin" / "elb-train"
    monkeypatch.setattr(shutil, "which", lambda name: str(script) if name == "elb-train" else None)
    assert command.cli(argv0=str(script)) == "elb-train"
    monkeypatch.setattr(shutil, "which", lambda name: None)  # not on PATH: its path
    monkeypatch.chdir("/")
    assert command.cli(argv0=str(script)) == str(script)


def test_a_path_with_spaces_is_quoted(monkeypatch, tmp_path):
    exe = tmp_path / "my env" / "python"
    monkeypatch.setattr(sys, "executable", str(exe))
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.chdir("/")
    assert command.cli(argv0="") == f"'{exe}' -m orchestrator"
