"""orchestrator/record/note.py: the run's description in MLflow."""

from orchestrator.record.note import changes, describe, series_line
from orchestrator.record.params import public_config
from tests.helpers import make_config
from trainers.link import metrics as M


def test_b_and_w_read_as_the_values_they_took_and_where():
    # how tracking.py logs a piecewise series: the ends of each constant stretch
    b = [(1, 32.0), (99, 32.0), (100, 64.0), (219, 64.0), (220, 128.0), (300, 128.0)]
    assert changes(b) == [(1, 32), (100, 64), (220, 128)]
    assert series_line("B", b) == "B 32 -> 64 -> 128 at steps 100, 220"
    assert series_line("W", [(1, 1.0), (99, 1.0), (100, 2.0), (300, 2.0)]) == "W 1 -> 2 at step 100"
    assert series_line("W", [(1, 2.0), (300, 2.0)]) == "W 2" and series_line("W", []) is None


def test_the_description_says_what_was_trained_and_how_b_and_w_changed(tmp_path):
    cfg = make_config(tmp_path, "sqlite:///x.db", train={"epochs": 3})
    history = {
        M.TRAIN_LOSS: [(1, 2.3), (300, 0.08)],
        M.VAL_ACCURACY: [(100, 0.7), (300, 0.92)],
        M.EPOCH: [(1, 0.01), (300, 3.0)],
        M.LR: [(1, 0.05), (300, 0.1)],
        M.BATCH_GLOBAL: [(1, 32.0), (99, 32.0), (100, 64.0), (300, 64.0)],
        M.WORKERS: [(1, 1.0), (99, 1.0), (100, 2.0), (300, 2.0)],
    }
    text = describe(public_config(cfg), history, "FINISHED", resizes=1, resumes=1)
    assert text.startswith("**mlp** on **digits**: 300 steps, 3 of 3 epochs (finished, resumed 1 time)")
    assert "\n- val/accuracy **0.92**, train/loss 0.08\n" in text  # the validation result leads
    assert "B 32 -> 64 at step 100; W 1 -> 2 at step 100 (1 resize of the worker group)" in text
    assert "LR 0.05 to 0.1 (sgd, scaling rule linear)" in text
