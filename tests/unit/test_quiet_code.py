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


def test_no_class_has_more_than_twenty_public_methods():
    """Hubs split into classes with one job each (properties are not counted: they read state)."""
    import ast

    big = []
    for p in product_files():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef):
                methods = [
                    f.name
                    for f in node.body
                    if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                    and not f.name.startswith("_")
                    and not any(isinstance(d, ast.Name) and d.id == "property" for d in f.decorator_list)
                    and not any(isinstance(d, ast.Attribute) and d.attr == "setter" for d in f.decorator_list)
                ]
                if len(methods) > MAX_PUBLIC_METHODS:
                    big.append(f"{p.relative_to(ROOT)}: {node.name} ({len(methods)})")
    assert not big, f"classes over {MAX_PUBLIC_METHODS} public methods: {big}"


MAX_MODULE_LINES = 800


def test_no_product_module_is_over_800_lines():
    long = [
        f"{p.relative_to(ROOT)} ({n})"
        for p in product_files()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by job): {long}"
