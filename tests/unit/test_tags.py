"""The MLflow tag names a run sets live in one module (``trainers/link/tags.py``), beside the metric
names: each a constant, no two alike, and no ``"elastic.…"`` literal left elsewhere in the code."""

from __future__ import annotations

import ast
from pathlib import Path

from trainers.link import tags as T

ROOT = Path(__file__).resolve().parents[2]
# Files others own that still spell tag names out (listed for their owners; remove an entry once its
# file uses trainers.link.tags).
NOT_YET: set[str] = set()


def _names() -> dict[str, str]:
    return {k: v for k, v in vars(T).items() if k.isupper() and isinstance(v, str)}


def test_each_tag_is_named_once_under_the_runs_namespaces():
    names = _names()
    assert len(set(names.values())) == len(names), "two constants name the same tag"
    for k, v in names.items():
        assert v.startswith(("elastic.", "mlflow.")), (k, v)
    assert T.rollback(2) == "elastic.rollback.2" and T.goodput_change(3) == "elastic.goodput.change.3"
    assert not any(v.startswith(("elastic.rollback.", "elastic.goodput.change.")) for v in names.values())


def tag_literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of each string literal (an f-string's parts included) that starts with ``elastic.``."""
    return [
        (n.lineno, n.value)
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith("elastic.")
    ]


def test_the_finder_sees_plain_and_formatted_literals():
    assert tag_literals('x = {"elastic.failure": 1}\ny = f"elastic.rollback.{n}"\n"""the elastic.failure tag"""\n') == [
        (1, "elastic.failure"),
        (2, "elastic.rollback."),
    ]


def test_no_tag_name_is_spelled_out_outside_the_tags_module():
    found = [
        f"{rel}:{line}: {text}"
        for d in ("orchestrator", "trainers", "search", "bench")
        for p in sorted((ROOT / d).rglob("*.py"))
        for rel in [str(p.relative_to(ROOT))]
        if rel != "trainers/link/tags.py" and rel not in NOT_YET
        for line, text in tag_literals(p.read_text())
    ]
    assert found == []
