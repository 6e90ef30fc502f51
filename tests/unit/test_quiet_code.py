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
