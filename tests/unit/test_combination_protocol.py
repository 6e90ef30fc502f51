"""One class per ``combine.method`` behind one protocol (``trainers/combine/base.py``): every registered
class implements all of it, the registry holds exactly the names the config accepts, and no code
outside ``trainers/combine/`` asks which method is in force."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import get_args

import pytest
import torch

from trainers.combine.base import Combination
from trainers.combine.combinations import METHODS, build_combination
from trainers.combine.config import RULES, CombineConfig, CombineMethod, MethodRules

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("trainers", "orchestrator", "search")
COMBINE = ROOT / "trainers" / "combine"


def _hooks() -> dict[str, inspect.Signature]:
    """The protocol: every public method and classmethod of the base, with its signature."""
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(Combination, callable)
        if not name.startswith("_")
    }


def _subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub} | _subclasses(sub)
    return found


def _config(name: str) -> CombineConfig:
    return CombineConfig(method=name, local_steps=2 if name == "local_sgd" else None)


def test_the_protocol_is_the_loops_and_the_checks():
    assert set(_hooks()) == {
        "check_fields",
        "check",
        "refuse",
        "plan_note",
        "attach",
        "loss_scale",
        "before_step",
        "after_step",
        "batch_stats",
        "should_checkpoint",
        "before_save",
        "evaluating",
        "metrics",
        "states",
    }


@pytest.mark.parametrize("name", list(METHODS))
def test_every_registered_class_implements_the_whole_protocol(name):
    cls = METHODS[name]
    assert issubclass(cls, Combination) and cls.name == name
    assert not inspect.isabstract(cls), f"{cls.__name__} leaves {sorted(cls.__abstractmethods__)} abstract"
    for hook, signature in _hooks().items():
        assert inspect.signature(getattr(cls, hook)) == signature, f"{cls.__name__}.{hook} differs from the base's"
    assert isinstance(cls.uses_ddp, bool) and all(
        field in CombineConfig.model_fields and isinstance(fix, str) for field, fix in cls.fields.items()
    )
    combination = build_combination(_config(name), world=2)
    assert type(combination) is cls


@pytest.mark.parametrize("name", ["mean", "adasum", "local_sgd"])
def test_a_one_model_method_runs_every_hook_of_a_step_in_one_process(name):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    combination = build_combination(_config(name), world=1)
    combination.attach(model, opt)
    model(torch.randn(4, 3)).sum().mul(combination.loss_scale(4, 4)).backward()
    combination.before_step(local_count=4, batch_size=4)
    opt.step()
    combination.after_step(1, local_count=4)
    combination.batch_stats()
    combination.should_checkpoint(True, 1)
    combination.before_save(1, final=True)
    with combination.evaluating(1):
        model(torch.randn(2, 3))
    assert isinstance(combination.metrics(), dict) and isinstance(combination.states(), dict)


def test_the_registry_holds_the_names_the_config_accepts():
    assert list(METHODS) == list(get_args(CombineMethod))
    assert {cls for cls in _subclasses(Combination) if not inspect.isabstract(cls)} == set(METHODS.values())


def test_each_method_checks_a_config_with_its_torch_free_rules():
    """The driver's checks read ``RULES`` (``trainers/combine/config.py``, no torch); each method's
    class derives from its rules, so ``METHODS[name]`` answers the same checks."""
    assert list(RULES) == list(METHODS)
    for name, cls in METHODS.items():
        assert issubclass(cls, RULES[name]) and issubclass(RULES[name], MethodRules)
        assert (cls.uses_ddp, cls.fields) == (RULES[name].uses_ddp, RULES[name].fields)
        for check in ("check_fields", "check", "refuse"):
            assert getattr(cls, check).__func__ is getattr(RULES[name], check).__func__, f"{cls.__name__}.{check}"


# --------------------------------------------------------------------------- no branch on the method outside


CLASS_NAMES = {cls.__name__ for cls in _subclasses(Combination)}
NAME_LISTS = {"DECENTRAL_METHODS"}  # trainers/combine/decentral.py's names of methods


def _names_a_method(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in METHODS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_method(e) for e in node.elts)
    return isinstance(node, ast.Name) and node.id in NAME_LISTS


def _is_the_method_field(node: ast.AST) -> bool:
    """``<...>.combine.method`` or ``combine.method``."""
    if not (isinstance(node, ast.Attribute) and node.attr == "method"):
        return False
    owner = node.value
    return (isinstance(owner, ast.Attribute) and owner.attr == "combine") or (
        isinstance(owner, ast.Name) and owner.id == "combine"
    )


def _names_a_class(node: ast.AST) -> bool:
    if isinstance(node, ast.Tuple):
        return any(_names_a_class(e) for e in node.elts)
    return (isinstance(node, ast.Name) and node.id in CLASS_NAMES) or (
        isinstance(node, ast.Attribute) and node.attr in CLASS_NAMES
    )


def branches_on_the_method(source: str, filename: str = "<source>") -> list[str]:
    """Where ``source`` asks which method is in force: a comparison with a method's name (or with
    ``combine.method``), a ``match`` on ``combine.method``, an ``isinstance``/``issubclass`` with a
    method class."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            hit = any(_names_a_method(o) or _is_the_method_field(o) for o in operands)
        elif isinstance(node, ast.Match):
            hit = _is_the_method_field(node.subject)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            hit = node.func.id in ("isinstance", "issubclass") and len(node.args) == 2 and _names_a_class(node.args[1])
        else:
            continue
        if hit:
            found.append(f"{filename}:{node.lineno}: {ast.get_source_segment(source, node)}")
    return found


def test_the_scan_sees_a_branch_on_the_method():
    source = "\n".join(
        [
            'if cfg.combine.method == "adasum": pass',
            'if c.method in ("dmsgd", "decentlam"): pass',
            "if method not in DECENTRAL_METHODS: pass",
            "if isinstance(combination, LocalSGDCombination): pass",
            "match cfg.combine.method:\n    case _: pass",
            'if a.method == "none" or policy == "fixed": pass',  # not a combination method: left alone
        ]
    )
    assert sorted(int(hit.split(":")[1]) for hit in branches_on_the_method(source)) == [1, 2, 3, 4, 5]


def test_no_code_outside_trainers_combine_branches_on_the_method():
    """The loop, the driver and the search call the protocol (``trainers/combine/base.py``) and the
    registry (``METHODS``); which method is in force is the method classes' business alone."""
    found = [
        hit
        for package in PRODUCT
        for path in sorted((ROOT / package).rglob("*.py"))
        if not path.is_relative_to(COMBINE)
        for hit in branches_on_the_method(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert not found, "branches on combine.method outside trainers/combine/:\n" + "\n".join(found)


def test_the_loop_reaches_the_method_through_the_protocol_only():
    """``<...>.combine.<name>`` outside ``trainers/combine/`` is a protocol hook or attribute, or a
    field of the ``combine`` section (``cfg.combine.local_steps``), never a method's own part."""
    config_names = set(CombineConfig.model_fields) | {
        name for name, member in vars(CombineConfig).items() if isinstance(member, property)
    }
    allowed = set(_hooks()) | {"name", "uses_ddp", "fields", "world"} | config_names
    found = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.is_relative_to(COMBINE):
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Attribute)
                    and node.value.attr == "combine"
                    and node.attr not in allowed
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: .combine.{node.attr}")
    assert not found, "reaches past the combination protocol:\n" + "\n".join(found)
