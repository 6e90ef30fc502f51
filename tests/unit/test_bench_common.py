"""bench/common.py's ``--quick``: it sets the quick values of the options left at their
defaults, and an option given on the command line wins."""

import argparse

import pytest

from bench.common import parse_args


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--models", default="cnn,resnet50")
    return ap


def test_full_form_keeps_the_defaults():
    a = parse_args(parser(), {"repeats": 1, "models": "cnn"}, argv=[])
    assert (a.quick, a.repeats, a.models) == (False, 3, "cnn,resnet50")


def test_quick_sets_its_values_and_a_given_option_wins():
    a = parse_args(parser(), {"repeats": 1, "models": "cnn"}, argv=["--quick"])
    assert (a.quick, a.repeats, a.models) == (True, 1, "cnn")
    a = parse_args(parser(), {"repeats": 1, "models": "cnn"}, argv=["--repeats", "5", "--quick"])
    assert (a.repeats, a.models) == (5, "cnn")


def test_quick_naming_an_unknown_option_is_a_bug_in_the_bench():
    with pytest.raises(ValueError, match="no_such"):
        parse_args(parser(), {"no_such": 1}, argv=["--quick"])


def test_help_lists_what_quick_sets(capsys):
    with pytest.raises(SystemExit):
        parse_args(parser(), {"repeats": 1}, argv=["--help"])
    assert "--repeats 1" in capsys.readouterr().out
