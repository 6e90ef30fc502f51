"""Getting the user's code to the Ray workers: the factories' packages that are importable here
but not installed are shipped with Ray's ``py_modules``.

A factory (``data.factory``, ``model.factory``, ``model.loss``) names ``package.module:function``.
Its top-level package must be importable where the function runs: the train workers, and a
search's trial actors.  A package that this Python imports from its installed packages
(``site-packages``/``dist-packages``) is there already on a local cluster; one found elsewhere (a
source folder on ``PYTHONPATH``, a folder put on ``sys.path`` by a notebook or script, an editable
install) is shipped with Ray's runtime environment ``py_modules`` (Ray uploads the folder once per
content hash and puts it on the workers' path).  ``code.py_modules`` lists more folders explicitly.
Under ``ray job submit --working-dir .`` the working directory is already on every worker.

Ray uploads local folders only for a job's runtime environment (``ray.init(runtime_env=...)``), not
for one actor group's: so the folders are given to the ``ray.init`` of a local cluster that a run or a
search starts itself (orchestrator/run/ray_env.py), and every actor of that job (train workers, trial
actors) inherits them.  A driver that joins a running cluster (``RAY_ADDRESS``, an already
initialised Ray) relies on that cluster's job environment: ``--working-dir`` or ``py_modules`` of
``ray job submit``, or the package installed on the nodes.
"""

from __future__ import annotations

import importlib.util
import os
import sysconfig
from typing import Any

from pydantic import Field, field_validator

from trainers.section import Section

OWN_PACKAGES = ("trainers", "orchestrator", "search")  # this project: installed with it on every node


class CodeConfig(Section):
    """The ``code`` section: folders of Python packages to ship to the workers."""

    py_modules: list[str] = Field(
        default_factory=list,
        description="package folders shipped to every worker "
        "(Ray runtime_env py_modules), besides those found from the factories",
    )
    auto: bool = Field(
        default=True, description="ship the packages of the factories that are importable here but not installed"
    )

    @field_validator("py_modules")
    @classmethod
    def _folders_exist(cls, v: list[str]) -> list[str]:
        for p in v:
            if not os.path.isdir(os.path.expanduser(p)):
                raise ValueError(
                    f"code.py_modules: {p!r} is not a folder; list package folders (the folder holding __init__.py)"
                )
        return [os.path.abspath(os.path.expanduser(p)) for p in v]


def _installed_roots() -> list[str]:
    paths = sysconfig.get_paths()
    roots = {paths.get(k) for k in ("purelib", "platlib", "stdlib", "platstdlib")}
    return [os.path.realpath(r) for r in roots if r]


def factory_specs(cfg: Any) -> list[str]:
    """The ``module:function`` strings of a config's workload (factories and a user loss)."""
    specs = [cfg.data.factory, cfg.model.factory, cfg.model.loss]
    return [s for s in specs if isinstance(s, str) and ":" in s and not s.startswith("python:")]


def package_folder(module: str) -> str | None:
    """The folder of ``module``'s top-level package when it is importable but not installed, else None."""
    top = module.split(".")[0]
    if top in OWN_PACKAGES:
        return None
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:  # not found, or a single-file module
        return None
    folder = os.path.realpath(list(spec.submodule_search_locations)[0])
    if any(folder.startswith(root + os.sep) for root in _installed_roots()):
        return None
    return folder


def code_modules(cfg: Any) -> list[str]:
    """Folders to ship with ``py_modules``: ``code.py_modules`` plus the factories' packages that are
    importable here and not installed (when ``code.auto``), without repeats."""
    code = getattr(cfg, "code", None)
    out = list(code.py_modules) if code is not None else []
    if code is None or code.auto:
        for spec in factory_specs(cfg):
            folder = package_folder(spec.split(":", 1)[0].strip())
            if folder:
                out.append(folder)
    return list(dict.fromkeys(out))


def runtime_env(cfg: Any) -> dict[str, Any] | None:
    """The Ray runtime environment that ships the code, or None when there is nothing to ship."""
    mods = code_modules(cfg)
    return {"py_modules": mods} if mods else None
