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


# -- the bar's total: the config's where it says the size, else the workers' -------------------


def _factory_config(tmp_path, calls: list):
    """A run of 2.5 epochs whose data and model are functions sent by value; the data function
    records each call (the driver must make none)."""
    from orchestrator.config.schema import validate
    from trainers.workload.build import BY_VALUE

    def data():
        calls.append("data")
        raise AssertionError("the driver loaded the factory's data")

    raw = {
        "data": {"factory": f"{BY_VALUE}tests.data"},
        "model": {"factory": f"{BY_VALUE}tests.model"},
        "batch": {"size": 32, "max_local_batch": 32},
        "scaling": {"min_workers": 1, "max_workers": 1, "cpus_per_worker": 0.5},
        "train": {"epochs": 2.5, "seed": 0},
        "checkpoint": {"storage_path": str(tmp_path / "runs")},
        "tracking": {"uri": "mem://", "experiment": "tests"},
    }
    return validate(raw), {"data": data, "model": lambda: None}


def test_a_built_in_sets_total_comes_from_the_config_as_it_did_from_its_loaded_data(monkeypatch):
    import math

    from orchestrator.config.schema import validate
    from orchestrator.record.progress_bar import total_samples
    from trainers.data import datasets
    from trainers.data.datasets import load_data

    configs = [
        validate({"data": {"name": "digits"}, "train": {"epochs": 0.5}}),
        validate({"data": {"name": "digits", "val_fraction": 0.3}, "train": {"epochs": 3}}),
        validate({"data": {"name": "synthetic", "size": 1001, "val_fraction": 0.15}, "train": {"epochs": 1.7}}),
    ]
    loaded = [math.ceil(c.train.epochs * load_data(c.data, c.train.seed).num_train) for c in configs]

    def no_loading(*args, **kwargs):
        raise AssertionError("the bar's total loaded the data")

    for loader in ("_load_digits", "_load_synthetic", "_load_cifar10"):
        monkeypatch.setattr(datasets, loader, no_loading)
    assert [total_samples(c) for c in configs] == loaded == [719, 3774, 1447]
    cifar = validate(
        {
            "data": {"name": "cifar10", "root": "/nowhere", "val_split": "test"},
            "model": {"name": "cnn"},
            "train": {"epochs": 1},
        }
    )
    assert total_samples(cifar) == 50_000  # the catalog's count, no files read
    assert total_samples(validate({"data": {"name": "text"}, "model": {"name": "lstm"}})) is None


def test_the_driver_starts_a_factorys_bar_without_a_total_and_without_calling_the_factory(tmp_path, monkeypatch):
    from orchestrator.run import runner

    class NoTracker:
        run_id, uri = "abc", "mem://"

        def __init__(self, *args, **kwargs):
            pass

    calls: list = []
    cfg, functions = _factory_config(tmp_path, calls)
    monkeypatch.setattr(runner, "RunTracker", NoTracker)
    record, plan = runner.ConfigRecord.from_config(cfg), runner.GroupPlan.from_config(cfg, functions)
    driver = runner._Driver(record, plan, runner.RunOptions(functions=functions), t0=0.0)
    bar = driver.progress.bar
    driver.progress.update([(3, {M.SAMPLES_SEEN: 96.0, M.BATCH_GLOBAL: 32.0, M.WORKERS: 1.0}, 1.0)])
    assert calls == [] and bar.total is None and driver.progress.eta.total is None
    assert str(bar).startswith("training: 96.0 samples [00:")  # a count and the time, no bar
    driver.progress.close()


def test_a_factorys_total_arrives_with_the_workers_phase_start_and_a_resume_gets_the_same(tmp_path, monkeypatch):
    """The runner hears its group's PhaseStart: the bar's total is train.epochs times the training
    set rank 0 counted, for a new run's driver and a resumed run's alike; the driver calls the data
    function neither before the group starts nor after."""
    from orchestrator.record.progress_bar import total_samples
    from orchestrator.run.monitor import MonitorState
    from orchestrator.run.outcome import Finished
    from orchestrator.run.phases import PhaseRunner
    from orchestrator.run.run_books import GroupPlan, RunStart
    from tests.helpers import StateLink
    from tests.unit.test_phases import FakeFit, FakeTracker
    from trainers.link.messages import PhaseStart

    calls: list = []
    cfg, functions = _factory_config(tmp_path, calls)
    for start, step in ((RunStart(), 0), (RunStart(resumes=1, workers=1), 30)):
        progress = Progress(total_samples(cfg), enabled=True)
        state = MonitorState(available=lambda: {"CPU": 8.0})
        plan = GroupPlan.from_config(cfg, functions)
        runner = PhaseRunner(plan, FakeTracker(), start, progress, poll_s=0.01, link=StateLink(state))
        before: list = []

        def group(m: MonitorState, phase: int, step=step, progress=progress, before=before) -> str:
            before.append((list(calls), progress.bar.total))
            m.push(
                [(step + 1, {M.SAMPLES_SEEN: 32.0 * (step + 1)}, 1.0)],
                [
                    PhaseStart(
                        phase=0,
                        workers=1,
                        step=step,
                        resumed=step > 0,
                        threads=1,
                        entered=1.0,
                        built=1.0,
                        train_samples=400,
                    )
                ],
            )
            return "done"

        monkeypatch.setattr(
            runner, "_trainer", lambda workers, phase, handover, group=group, state=state: FakeFit(group, state, phase)
        )
        assert runner.run() == Finished("done")
        assert before == [([], None)]  # no total until the group said its size
        assert (progress.bar.total, progress.eta.total, progress.bar.n) == (1000, 1000.0, 32 * (step + 1))  # 2.5 x 400
    assert calls == []


def test_a_bar_without_a_total_shows_the_rate_and_takes_the_total_when_it_comes():
    p = Progress(total=None, enabled=True)
    for step in range(1, 6):  # 100 samples/s over 2.5 s
        p.update([(step, {M.SAMPLES_SEEN: 50.0 * step, M.BATCH_GLOBAL: 50.0, M.WORKERS: 1.0}, 0.5 * step)])
    assert p.bar.postfix.startswith("at 100 samples/s,") and p.bar.total is None
    p.sized(1000)
    assert p.bar.total == 1000 and p.bar.postfix.startswith("eta 0:08 at 100 samples/s,")
    assert str(p.bar).startswith("training:  25%|") and "| 250/1.00k [" in str(p.bar)
    p.close()
