"""The code says why, not where a request came from: no issue or pull-request numbers in the
sources and docs, and every module of the product opens with a one- or two-line docstring.

A number means nothing to a reader without the tracker; the reason it stood for does.  The opening
docstring is what ``help()``, editors and ``docs/architecture.md``'s readers see first.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("orchestrator", "trainers", "search", "bench")
SOURCES = (*PRODUCT, "tests", "examples")

# the word issue (or pull request, PR, gh-) before a number, and a hash before digits, but not an
# HTML entity or a colour (a hash's digits must end the word); examples in the first test below
TRACKER_NUMBER = re.compile(
    r"\bissues?\s*#?\d+|\bpr\s*#\d+|\bpull request\s*#?\d+|\bgh-\d+|(?<![\w&/#])#\d+\b", re.IGNORECASE
)


def _python_files(folders: tuple[str, ...]) -> list[Path]:
    return sorted(p for d in folders for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts)


def _docs() -> list[Path]:
    return sorted(
        [
            ROOT / "README.md",
            ROOT / "Makefile",
            ROOT / "cluster.yaml",
            *(ROOT / "docs").rglob("*.md"),
            *(ROOT / "examples").rglob("*.md"),
            *(ROOT / "configs").glob("*.yaml"),
        ]
    )


def tracker_numbers(text: str) -> list[tuple[int, str]]:
    """(line number, the matched text) of each issue or pull-request number in ``text``."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(0)) for m in TRACKER_NUMBER.finditer(text)]


def opening_problem(source: str) -> str | None:
    """Why a module's source does not open with a docstring of one or two lines (None when it does)."""
    doc = ast.get_docstring(ast.parse(source), clean=False)
    if doc is None or not doc.strip():
        return "no opening docstring; start the module with one or two lines saying what it is for"
    first = doc.strip().split("\n\n", 1)[0]
    lines = [line for line in first.splitlines() if line.strip()]
    if len(lines) > 2:
        return (
            f"the docstring's first paragraph has {len(lines)} lines; say what the module is for in one or "
            f"two, then a blank line before the longer explanation"
        )
    return None


def test_the_pattern_finds_tracker_numbers_and_leaves_colours_and_headings():
    hash_ = "#"
    for text in (
        f"see issue {20}",
        f"(issue {hash_}18, item 5)",
        f"Issues {hash_}3 and 4",
        f"fixed ({hash_}21)",
        f"{hash_}12: the bar",
        f"gh-{7}",
        f"PR {hash_}9",
    ):
        assert tracker_numbers(text), text
    for text in ("color='#1f77b4'", "## 3. Invariants", "&#39;", "x = a[1]  # 2 workers", "issue: nothing silent"):
        assert not tracker_numbers(text), text


def test_no_issue_numbers_in_code_comments_docstrings_configs_or_docs():
    found = [
        f"{p.relative_to(ROOT)}:{line}: {hit!r}"
        for p in [*_python_files(SOURCES), *_docs()]
        if p.exists()
        for line, hit in tracker_numbers(p.read_text(encoding="utf-8"))
    ]
    assert not found, "issue numbers mean nothing without the tracker; say the reason instead:\n  " + "\n  ".join(found)


def test_the_opening_check_wants_a_short_first_paragraph():
    assert opening_problem('"""What it is for."""\nx = 1\n') is None
    assert opening_problem('"""What it is for,\nin two lines.\n\nMore, as long as it needs\nto\nbe.\n"""\n') is None
    assert "no opening docstring" in opening_problem("import os\n")
    assert "no opening docstring" in opening_problem("")
    assert "3 lines" in opening_problem('"""One\ntwo\nthree.\n\nMore."""\n')


def test_every_product_module_opens_with_a_short_docstring():
    files = _python_files(PRODUCT)
    assert len(files) > 50  # the folders were found
    bad = [f"{p.relative_to(ROOT)}: {why}" for p in files if (why := opening_problem(p.read_text(encoding="utf-8")))]
    assert not bad, "\n  ".join(["modules without a short opening docstring:", *bad])
