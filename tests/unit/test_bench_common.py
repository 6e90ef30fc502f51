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


# -- a quick form's sliced rows: each loop's pace after its first steps --------------------------------


def test_a_child_loop_writes_its_pace_once_after_its_first_steps(tmp_path):
    from bench.common import PACE_STEPS, read_pace, started_file, write_pace
    from bench.overhead import walk_steps

    out = str(tmp_path / "plain-b.json")
    assert read_pace(started_file(out)) is None  # not yet written
    calls = []
    times = walk_steps(lambda ids: None, n=20, batch=4, seed=0, steps=12, paced=lambda t: calls.append(list(t)))
    assert len(times) == 12 and len(calls) == 1 and len(calls[0]) == PACE_STEPS
    write_pace(started_file(out), [10.0, 10.5, 11.0, 13.0, 13.5])  # one slow step
    assert read_pace(started_file(out)) == pytest.approx(0.5)  # the median gap
    (tmp_path / "torn.started").write_text("0.")  # half a number: not a pace yet
    assert read_pace(str(tmp_path / "torn.started")) is None


def test_a_quick_slice_is_long_enough_for_the_slower_loops_measured_steps():
    from bench.overhead import MIN_STEPS, PACED_SLICE_S, paced_slice

    assert paced_slice(0.1, 0.05, 2.0) == pytest.approx(2 * (MIN_STEPS + 2) * 0.1)
    assert paced_slice(0.001, 0.002, 2.0) == PACED_SLICE_S  # fast loops: the shortest slice
    assert paced_slice(0.0, 0.05, 2.0) == pytest.approx(2 * (MIN_STEPS + 2) * 0.1)  # its pace unknown: half b's
    assert paced_slice(None, 0.05, 2.0) == 2.0 and paced_slice(0.1, None, 2.0) == 2.0  # not read in time


def test_the_header_names_the_slices():
    from bench.common import slices_text

    assert slices_text(argparse.Namespace(pairs=0, slice=2.0)) == "2 s slices"
    assert slices_text(argparse.Namespace(pairs=2, slice=2.0)) == "slices from the loops' pace"


def test_a_gpu_row_stops_slicing_once_it_has_its_pairs():
    from bench.gpu import made_or_paired

    class Run:
        slices = [("a", 0, 1), ("b", 1, 2), ("a", 2, 3)]

    assert not made_or_paired(lambda: False, Run, 2)
    assert made_or_paired(lambda: True, Run, 2)  # its steps made
    Run.slices = Run.slices + [("b", 3, 4)]
    assert made_or_paired(lambda: False, Run, 2)
