"""``trainers.errors.one_line``: every error shown in one line the same way, and no other copy of
the formatter left in the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainers.errors import first_line, one_line

ROOT = Path(__file__).resolve().parents[2]


def test_the_type_and_the_first_line_of_the_message():
    assert one_line(ValueError("bad value\nmore detail\n")) == "ValueError: bad value"
    assert one_line(OSError("\n\n  disk full  \nthen more")) == "OSError: disk full"  # the first line with text


def test_a_message_without_text_gives_the_type_alone():
    assert one_line(RuntimeError()) == "RuntimeError"
    assert one_line(RuntimeError("  \n ")) == "RuntimeError"
    assert one_line(RuntimeError(), name=False) == "RuntimeError"


def test_the_limit_cuts_the_whole_line_and_none_keeps_it():
    e = ValueError("x" * 500)
    assert one_line(e) == ("ValueError: " + "x" * 500)[:200]
    assert len(one_line(e, 160)) == 160
    assert one_line(e, None) == "ValueError: " + "x" * 500
    assert one_line(ValueError("short"), 160) == "ValueError: short"


def test_without_the_name_the_line_alone():
    assert one_line(KeyError("k"), name=False) == "'k'"
    assert one_line(ValueError("a\nb"), 3, name=False) == "a"
    assert one_line(ValueError("abcdef"), 3, name=False) == "abc"


def test_first_line_of_a_text():
    assert first_line("\n  one  \ntwo") == "one"
    assert first_line("") == "" and first_line(" \n\t") == ""
    assert first_line("abcdef", 4) == "abcd" and first_line("y" * 300, None) == "y" * 300


@pytest.mark.parametrize(
    "text",
    [
        "f\"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}\"",
        'f"{type(first).__name__}: {str(first).splitlines()[0]}"',
    ],
)
def test_the_copy_finder_finds_a_hand_made_formatter(text):
    assert COPY.search(text)


# The hand-made formatter, f"{type(x).__name__}: {...str(x)...}": every site uses one_line instead.
COPY = re.compile(r"type\((\w+)\)\.__name__\}: \{[^}\n]*str\(\1\)")
# Files others own that still hold a copy (listed for their owners; remove an entry once its file uses one_line).
NOT_YET: set[str] = set()


def test_no_copy_of_the_formatter_is_left():
    found = sorted(
        f"{p.relative_to(ROOT)}:{source[: m.start()].count(chr(10)) + 1}"
        for d in ("orchestrator", "trainers", "search", "bench")
        for p in (ROOT / d).rglob("*.py")
        for source in [p.read_text()]
        for m in COPY.finditer(source)
        if str(p.relative_to(ROOT)) not in NOT_YET
    )
    assert found == []
