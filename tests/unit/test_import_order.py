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
    """(top package, the unit the order names): a subpackage or module of ``trainers``, a module
    of ``orchestrator`` and ``search`` (their ``__init__`` is the unit ``__init__``)."""
    parts = name.split(".")
    return parts[0], parts[1] if len(parts) > 1 else "__init__"


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
                return stack[stack.index(m):] + [m]
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
            elif level(order[ta], ua) < level(order[ta], ub):
                bad.append(f"{a} -> {b}: {ua} is below {ub} in the {ta} order")
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


def test_the_checker_sees_function_level_imports_cycles_and_order_breaks(tmp_path):
    """The checks themselves can fail: a cycle and an upward import in a made-up graph."""
    g = {"trainers.data.order": {"trainers.loop.trainer"}, "trainers.loop.trainer": {"trainers.data.order"}}
    assert find_cycle(g) == ["trainers.data.order", "trainers.loop.trainer", "trainers.data.order"]
    order = {"top": [{"trainers"}], "trainers": [{"data"}, {"loop"}]}
    assert violations(g, order) == ["trainers.data.order -> trainers.loop.trainer: data is below loop in the "
                                    "trainers order"]
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from trainers.loop import trainer\n")
    known = {"trainers.loop.trainer": src, "trainers.loop": src}
    assert imports_of("trainers.data.order", src, known) == {"trainers.loop.trainer"}
