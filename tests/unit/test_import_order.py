"""The house's one-way order, read from every import in the code (also those inside functions):
no import cycle between modules, and no import against the order that docs/architecture.md
declares (its fenced ``order`` block is the single source: this test parses it)."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("trainers", "orchestrator", "search")


def declared_order() -> dict[str, list[set[str]]]:
    """``{"trainers": [{"section"}, {"link"}, ...], ..., "top": [...]}``: each line of the block is
    ``scope: a b < c < d e``, lowest first; names in one group share a level."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = re.search(r"```order\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no ```order block"
    order = {}
    for line in block.group(1).strip().splitlines():
        scope, levels = line.split(":", 1)
        order[scope.strip()] = [set(level.split()) for level in levels.split("<")]
    return order


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project's modules that ``name`` imports anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names)
    out = set()
    for target in found:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def unit(name: str) -> tuple[str, str]:
    """(top package, the unit the order names): a subpackage or module of a package (its
    ``__init__`` is the unit ``__init__``)."""
    parts = name.split(".")
    return parts[0], parts[1] if len(parts) > 1 else "__init__"


def inner(name: str) -> tuple[str, str] | None:
    """(scope, unit) inside a subpackage whose own order is declared as ``top.sub: ...``
    (``orchestrator.run.phases`` -> ``("orchestrator.run", "phases")``); None for a top-level module."""
    parts = name.split(".")
    if len(parts) < 2:
        return None
    return ".".join(parts[:2]), parts[2] if len(parts) > 2 else "__init__"


def level(levels: list[set[str]], item: str) -> int:
    for i, group in enumerate(levels):
        if item in group:
            return i
    raise AssertionError(f"{item} is not placed in docs/architecture.md's order block")


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(g[n]):
            if state.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(g):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def violations(g: dict[str, set[str]], order: dict[str, list[set[str]]]) -> list[str]:
    bad = []
    for a, targets in sorted(g.items()):
        (ta, ua) = unit(a)
        for b in sorted(targets):
            (tb, ub) = unit(b)
            if ta != tb:
                if level(order["top"], ta) < level(order["top"], tb):
                    bad.append(f"{a} -> {b}: {ta} may not import {tb}")
            elif ua != ub:
                if level(order[ta], ua) < level(order[ta], ub):
                    bad.append(f"{a} -> {b}: {ua} is below {ub} in the {ta} order")
            elif inner(a) and inner(a)[0] in order:  # two modules of one subpackage with an order of its own
                (scope, ia), (_, ib) = inner(a), inner(b)
                if level(order[scope], ia) < level(order[scope], ib):
                    bad.append(f"{a} -> {b}: {ia} is below {ib} in the {scope} order")
    return bad


def test_no_import_cycle_between_modules():
    assert find_cycle(graph()) is None


def test_every_import_follows_the_declared_order():
    assert violations(graph(), declared_order()) == []


def test_every_unit_is_placed_in_the_order():
    order = declared_order()
    for name in modules():
        top, u = unit(name)
        level(order[top], u)
        if inner(name) and inner(name)[0] in order:
            scope, i = inner(name)
            level(order[scope], i)


def test_the_checker_sees_function_level_imports_cycles_and_order_breaks(tmp_path):
    """The checks themselves can fail: a cycle and an upward import in a made-up graph."""
    g = {"trainers.data.order": {"trainers.loop.trainer"}, "trainers.loop.trainer": {"trainers.data.order"}}
    assert find_cycle(g) == ["trainers.data.order", "trainers.loop.trainer", "trainers.data.order"]
    order = {"top": [{"trainers"}], "trainers": [{"data"}, {"loop"}]}
    assert violations(g, order) == [
        "trainers.data.order -> trainers.loop.trainer: data is below loop in the trainers order"
    ]
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from trainers.loop import trainer\n")
    known = {"trainers.loop.trainer": src, "trainers.loop": src}
    assert imports_of("trainers.data.order", src, known) == {"trainers.loop.trainer"}
    inside = {"orchestrator.run.monitor": {"orchestrator.run.phases"}, "orchestrator.run.phases": set()}
    layered = {"top": [{"orchestrator"}], "orchestrator": [{"run"}], "orchestrator.run": [{"monitor"}, {"phases"}]}
    assert violations(inside, layered) == [
        "orchestrator.run.monitor -> orchestrator.run.phases: monitor is below phases in the orchestrator.run order"
    ]
