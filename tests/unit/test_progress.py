"""orchestrator/record/progress_bar.py: what the driver's bar shows."""

import io

from orchestrator.record.progress_bar import Progress
from trainers.link import metrics as M


def _postfix(records):
    p = Progress(total=1000, enabled=True)
    p.bar.fp = io.StringIO()  # keep the test's output clean
    p.update(records)
    text = p.bar.postfix
    p.close()
    return text


def test_a_classifier_shows_validation_accuracy():
    text = _postfix([(10, {M.TRAIN_LOSS: 0.5, M.SAMPLES_SEEN: 320, M.VAL_ACCURACY: 0.91, M.VAL_LOSS: 0.3})])
    assert "step=10" in text and "val_acc=0.910" in text and "val_ppl" not in text


def test_a_language_model_shows_validation_perplexity_not_token_accuracy():
    text = _postfix([(10, {M.TRAIN_LOSS: 1.5, M.SAMPLES_SEEN: 320, M.VAL_ACCURACY: 0.55, M.VAL_PERPLEXITY: 4.4817})])
    assert "val_ppl=4.48" in text and "val_acc" not in text


# -- the time left ---------------------------------------------------------------------------

from orchestrator.record.progress_bar import Eta  # noqa: E402


def _steps(eta, t0, seen0, dt, per_step, n, batch, workers):
    t, seen = t0, seen0
    for _ in range(n):
        t, seen = t + dt, seen + per_step
        eta.observe(t, seen, batch, workers)
    return t, seen


def test_the_time_left_is_the_rate_of_the_stretch_under_way():
    eta = Eta(total=10_000, min_span=2.0)
    assert eta.remaining_s is None and eta.text() == "eta ?"  # no rate before any stretch was measured
    t, seen = _steps(eta, 0.0, 0, 0.5, 50, 10, batch=50, workers=1)  # 100 samples/s
    assert eta.rate == 100.0 and eta.remaining_s == (10_000 - 500) / 100.0
    # a resize: the new group's start-up (30 s without steps) never counts as training time
    t, seen = _steps(eta, t + 30.0, seen, 0.5, 200, 1, batch=200, workers=4)
    assert eta.rate == 100.0  # one step of the new stretch: the last measured rate stands
    t, seen = _steps(eta, t, seen, 0.5, 200, 4, batch=200, workers=4)
    assert eta.rate == 400.0 and eta.remaining_s == (10_000 - seen) / 400.0
    assert eta.text() == f"eta 0:{round((10_000 - seen) / 400):02d} at 400 samples/s"


def test_while_a_group_restarts_no_stale_rate_is_shown():
    eta = Eta(total=10_000, min_span=2.0)
    _steps(eta, 0.0, 0, 0.5, 50, 10, batch=50, workers=1)
    eta.pause()
    assert eta.rate is None and eta.text() == "eta ?"
    eta.observe(100.0, 600, 50, 2)  # its first step: the last measured rate until the new one is measured
    assert eta.rate == 100.0


def test_the_bar_says_restarting_until_the_new_group_steps():
    p = Progress(total=1000, enabled=True)
    p.bar.fp = io.StringIO()
    p.update([(1, {M.SAMPLES_SEEN: 16.0, M.BATCH_GLOBAL: 16.0, M.WORKERS: 1.0}, 0.0)])
    p.restarting("W 1 -> 2")
    assert p.bar.desc.startswith("restarting (W 1 -> 2)") and p.bar.postfix.startswith("eta ?")
    p.update([(2, {M.SAMPLES_SEEN: 48.0, M.BATCH_GLOBAL: 32.0, M.WORKERS: 2.0}, 40.0)])
    assert p.bar.desc.startswith("training")
    p.close()


# -- the lines a batch change and a resize write ------------------------------------------------


class _Lines:
    def __init__(self):
        self.lines, self.last, self.states = [], {}, []

    def update(self, records):
        for _, m, *_ in records:
            self.last.update(m)

    def write(self, line):
        self.lines.append(line)

    def restarting(self, what=""):
        self.states.append(f"restarting {what}")

    def close(self):
        pass


def _rec(step, b, w, lr, mf):
    return (step, {M.BATCH_GLOBAL: float(b), M.WORKERS: float(w), M.LR: lr, M.MF: mf, M.SAMPLES_SEEN: 0.0}, 0.0)


def test_a_batch_change_and_its_resize_are_one_line_with_the_new_lr_and_mf():
    from orchestrator.record.events import ResizeHandedOver, ResizeRecord
    from orchestrator.record.listeners import ProgressListener
    from trainers.link.messages import BatchChange

    p = _Lines()
    listener = ProgressListener(p)
    listener.on_records([_rec(44, 32, 1, 0.1, 0.9), _rec(45, 32, 1, 0.1, 0.9)])
    listener.on_event(BatchChange(step=45, old=32, new=64))
    listener.on_event(
        ResizeHandedOver(
            resize=ResizeRecord(
                from_workers=1, to=2, mode="restart", step=45, time=0.0, decided=0.0, fit_returned=0.0, phase=1
            )
        )
    )
    assert p.lines == [] and p.states == ["restarting W 1 -> 2"]  # the new LR and MF are not known yet
    listener.on_records([_rec(46, 64, 2, 0.2, 0.81), _rec(47, 64, 2, 0.2, 0.81)])
    assert p.lines == [
        "batch: B 32 -> 64 and W 1 -> 2 at step 45 (restarting the group): lr 0.1 -> 0.2, mf 0.9 -> 0.81"
    ]


def test_a_batch_change_without_a_resize_and_a_resize_alone_show_lr_and_mf():
    from orchestrator.record.events import ResizeHandedOver, ResizeRecord
    from orchestrator.record.listeners import ProgressListener
    from trainers.link.messages import BatchChange

    p = _Lines()
    listener = ProgressListener(p)
    listener.on_records([_rec(10, 32, 2, 0.1, 0.9)])
    listener.on_event(BatchChange(step=10, old=32, new=64))
    listener.on_records([_rec(11, 64, 2, 0.2, 0.9)])
    listener.on_event(
        ResizeHandedOver(
            resize=ResizeRecord(
                from_workers=2, to=4, mode="overlap", step=20, time=0.0, decided=0.0, fit_returned=0.0, phase=1
            )
        )
    )
    listener.on_records([_rec(20, 64, 2, 0.2, 0.9), _rec(21, 64, 4, 0.2, 0.9)])
    assert p.lines == [
        "batch: B 32 -> 64 at step 10: W 2, lr 0.1 -> 0.2, mf 0.9",
        "resize: W 2 -> 4 at step 20 (the new group took over): B 64, lr 0.2, mf 0.9",
    ]
    assert p.states == []  # an overlapping resize never stops training
    listener.on_event(BatchChange(step=30, old=64, new=128))
    listener.close()  # the run ended first: the line is still written, without what no step ran with
    assert p.lines[-1] == "batch: B 64 -> 128 at step 30"


def test_a_failed_worker_shows_the_group_restarting_at_once():
    from orchestrator.record.events import GroupFailed
    from orchestrator.record.listeners import ProgressListener
    from orchestrator.run.monitor import MonitorState

    m = MonitorState(available=lambda: {})
    m.group_failed(0, "ActorDiedError: the worker died")  # what FailureNotice tells the monitor
    _, events = m.drain()
    assert events == [GroupFailed(phase=0, message="ActorDiedError: the worker died", time=events[0].time)]
    p = _Lines()
    ProgressListener(p).on_event(events[0])
    assert p.states == ["restarting a worker failed"] and "a worker failed (ActorDiedError" in p.lines[0]


def test_a_resize_line_says_when_the_new_group_has_fewer_workers_than_asked():
    from orchestrator.record.events import ResizeHandedOver, ResizeRecord
    from orchestrator.record.listeners import ProgressListener

    p = _Lines()
    listener = ProgressListener(p)
    listener.on_records([_rec(10, 64, 2, 0.2, 0.9)])
    listener.on_event(
        ResizeHandedOver(
            resize=ResizeRecord(
                from_workers=2, to=4, mode="restart", step=10, time=0.0, decided=0.0, fit_returned=0.0, phase=1
            )
        )
    )
    listener.on_records([_rec(11, 64, 3, 0.2, 0.9)])  # an elastic group that found room for 3
    assert p.lines == ["resize: W 2 -> 4 at step 10 (restarting the group): B 64, W 3 of 4 asked, lr 0.2, mf 0.9"]


def test_a_callers_functions_get_the_records_and_the_events():
    """``run_training(on_records=, on_event=)``: a search trial hears its run's events (restarts) too."""
    from orchestrator.record.events import GroupRestarted
    from orchestrator.record.listeners import RecordsCallback

    heard: list = []
    restarted, again = GroupRestarted(step=5, workers=1, restarts=1), GroupRestarted(step=10, workers=1, restarts=2)
    both = RecordsCallback(heard.append, heard.append)
    both.on_records([(1, {M.TRAIN_LOSS: 1.0}, 0.0)])
    both.on_event(restarted)
    events_only = RecordsCallback(None, heard.append)
    events_only.on_records([(2, {}, 0.0)])  # no function for records: nothing
    events_only.on_event(again)
    assert heard == [[(1, {M.TRAIN_LOSS: 1.0}, 0.0)], restarted, again]
