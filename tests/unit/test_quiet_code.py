"""The product code stays quiet: few linter suppressions, none that suppresses nothing."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("orchestrator", "trainers", "search")
MAX_NOQA = 40  # a module that stays light is named once in pyproject.toml, not on every line


def product_files() -> list[Path]:
    return sorted(p for pkg in PRODUCT for p in (ROOT / pkg).rglob("*.py"))


def test_few_noqa_comments_in_the_product_code():
    found = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in product_files()
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "# noqa" in line
    ]
    assert len(found) < MAX_NOQA, f"{len(found)} `# noqa` comments (at most {MAX_NOQA - 1}): {found}"


def test_no_noqa_for_a_rule_the_linter_does_not_run():
    """A suppression of a rule ruff does not select is noise (it suppresses nothing)."""
    import tomllib

    selected = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]["select"]
    stale = []
    for p in product_files():
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if "# noqa:" in line:
                rules = line.split("# noqa:", 1)[1].split(" - ", 1)[0]
                for rule in (r.strip() for r in rules.split(",")):
                    if rule and not any(rule.startswith(s) for s in selected):
                        stale.append(f"{p.relative_to(ROOT)}:{i} {rule}")
    assert not stale, f"noqa for rules ruff does not run: {stale}"


MAX_PUBLIC_METHODS = 20  # a class with more does several jobs: give each its own class


def public_names(node) -> set[str]:
    """A class's public methods and properties (``ast.ClassDef``): what its callers see.  A property
    counts as one name (a facade's properties are its surface as much as its methods); its setter
    is the same name."""
    import ast

    defs = (f for f in node.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef))
    return {f.name for f in defs if not f.name.startswith("_")}


def test_no_class_has_more_than_twenty_public_methods():
    """Hubs split into classes with one job each (:func:`public_names`)."""
    import ast

    big = []
    for p in product_files():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef) and len(public_names(node)) > MAX_PUBLIC_METHODS:
                big.append(f"{p.relative_to(ROOT)}: {node.name} ({len(public_names(node))})")
    assert not big, f"classes over {MAX_PUBLIC_METHODS} public methods and properties: {big}"


def test_a_property_is_one_public_name_and_a_private_method_none():
    import ast

    source = """
class C:
    def run(self): ...
    def _helper(self): ...
    @property
    def lost(self): ...
    @lost.setter
    def lost(self, gone): ...
    @property
    def history(self): ...
"""
    assert public_names(ast.parse(source).body[0]) == {"run", "lost", "history"}


MAX_MODULE_LINES = 800


def test_no_product_module_is_over_800_lines():
    long = [
        f"{p.relative_to(ROOT)} ({n})"
        for p in product_files()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by job): {long}"
