"""search/ uses Optuna's public API only: no import from a private optuna module (``optuna.storages.
_heartbeat``), no underscore attribute of an Optuna object (``study._storage``, ``trial._trial_id``).

An ast scan of every module in search/: an underscore attribute read off anything but ``self``/``cls``
is an offence unless search/ itself defines that name (its own helpers' private parts)."""

from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEARCH = os.path.join(ROOT, "search")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _trees() -> dict[str, ast.Module]:
    out = {}
    for name in sorted(os.listdir(SEARCH)):
        if name.endswith(".py"):
            with open(os.path.join(SEARCH, name)) as f:
                out[f"search/{name}"] = ast.parse(f.read())
    return out


def own_private_names(trees: dict[str, ast.Module]) -> set[str]:
    """The underscore names search/ defines: functions, methods, classes, module and class
    variables, and attributes it sets on ``self``."""
    names: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                names.add(node.attr)
    return {n for n in names if _private(n)}


def offences(path: str, tree: ast.Module, own: set[str]) -> list[str]:
    """Each use of Optuna's private parts in ``tree``, as ``path:line: what``."""
    found = []
    for node in ast.walk(tree):
        where = f"{path}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "optuna" and any(_private(p) for p in parts):
                    found.append(f"{where}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "optuna":
            if any(_private(p) for p in node.module.split(".")):
                found.append(f"{where}: from {node.module} import ...")
            found += [f"{where}: from {node.module} import {a.name}" for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own:
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{where}: .{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
            and node.args[1].value not in own
        ):
            found.append(f"{where}: {node.func.id}(..., {node.args[1].value!r})")
    return found


def test_search_uses_only_optunas_public_api():
    trees = _trees()
    own = own_private_names(trees)
    found = [o for path, tree in trees.items() for o in offences(path, tree, own)]
    assert found == [], "search/ reaches into Optuna's internals:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "code, what",
    [
        ("study._storage.get_trial(trial._trial_id)", ".\\_storage"),
        ("from optuna.storages._heartbeat import is_heartbeat_enabled", "from optuna.storages._heartbeat"),
        ("import optuna.storages._cached_storage", "import optuna.storages._cached_storage"),
        ("from optuna.storages import _CachedStorage", "import _CachedStorage"),
        ("x = getattr(study, '_study_id')", "getattr(..., '_study_id')"),
        ("optuna.storages._heartbeat.is_heartbeat_enabled(s)", "._heartbeat"),
    ],
)
def test_the_scan_finds_each_kind_of_reach(code, what):
    found = offences("x.py", ast.parse(code), own={"_full"})
    assert found and any(what.replace("\\", "") in o for o in found), found


def test_the_scan_spares_search_s_own_private_parts():
    assert offences("x.py", ast.parse("self._stop = True\nspace._full\nself._lock.acquire()"), own={"_full"}) == []
