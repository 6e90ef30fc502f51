"""The test tree itself: pytest's default import mode needs unique test-module basenames across
tiers (tests/unit/x.py and tests/integration/x.py collide at collection, which stops the run)."""

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_module_basenames_are_unique_across_tiers():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []
