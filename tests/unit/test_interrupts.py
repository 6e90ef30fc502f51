"""orchestrator/interrupts.py: SIGTERM as Ctrl-C for the CLI drivers, and a stop that waits for the
end of a tracking store's write (signals sent to this process; no Ray, no clock)."""

import os
import signal

import pytest

from orchestrator import interrupts


@pytest.fixture(autouse=True)
def _python_ctrl_c():
    """Python's own Ctrl-C handler, as in a terminal (a shell's background job, as the suite may be
    run, starts with SIGINT ignored, which the drivers keep ignored)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def _spin():
    for _ in range(100):  # the handler runs between bytecodes of the main thread
        pass


def test_sigterm_inside_the_block_raises_keyboard_interrupt_and_the_old_handlers_come_back():
    seen = []
    old = {sig: signal.signal(sig, lambda s, _: seen.append(s)) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with pytest.raises(KeyboardInterrupt):
            with interrupts.terminate_as_interrupt():
                assert interrupts.active()
                os.kill(os.getpid(), signal.SIGTERM)
                _spin()
        assert not interrupts.active()
        for sig in (signal.SIGTERM, signal.SIGINT):
            os.kill(os.getpid(), sig)
            _spin()
        assert seen == [signal.SIGTERM, signal.SIGINT]
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_inside_a_write_is_raised_when_the_write_ends_and_the_write_is_whole(sig):
    done = []
    with interrupts.terminate_as_interrupt():
        with pytest.raises(KeyboardInterrupt):
            with interrupts.deferred_interrupts():
                with interrupts.deferred_interrupts():  # nested: raised at the outermost end
                    signal.raise_signal(sig)
                    _spin()
                    done.append("inner")
                _spin()
                done.append("outer")
        assert done == ["inner", "outer"]
        with interrupts.deferred_interrupts():  # the next write is not stopped again
            _spin()
        with pytest.raises(KeyboardInterrupt):  # and the driver's loop still sees the stop, as after any
            interrupts.raise_pending_interrupt()


def test_a_second_stop_while_one_waits_is_raised_at_once():
    """A store that hangs (an outage) cannot hold the driver: the second Ctrl-C stops it."""
    done = []
    with interrupts.terminate_as_interrupt():
        with pytest.raises(KeyboardInterrupt):
            with interrupts.deferred_interrupts():
                signal.raise_signal(signal.SIGINT)
                done.append("first waits")
                signal.raise_signal(signal.SIGTERM)
                done.append("never")
    assert done == ["first waits"]


def test_outside_the_block_a_write_is_only_run():
    with interrupts.deferred_interrupts():
        pass
    assert not interrupts.active()
    with pytest.raises(KeyboardInterrupt):  # Python's own Ctrl-C, untouched
        with interrupts.deferred_interrupts():
            signal.raise_signal(signal.SIGINT)
            _spin()


def test_a_stop_inside_an_mlflow_call_leaves_the_store_unlocked_and_the_call_whole(tracking_uri, monkeypatch):
    """The real failure: a SIGTERM landed in MLflow's SQLAlchemy query (the row loader, its cursor
    still open) inside ``log_batch``.  The interrupted call held SQLite's lock while its traceback
    lived, so the driver's next write (the checkpoint's LoggedModel, the run's KILLED status) waited
    MLflow's 20 s busy timeout and failed with "database is locked".  Through the driver's client
    the call ends first, its rows are in, and the run's status is written at once."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient
    from sqlalchemy.orm import loading

    raw = MlflowClient(tracking_uri)
    run_id = raw.create_run(raw.create_experiment("stops")).info.run_id
    fired, instances = [], loading.instances

    def stop_mid_query(result, context):
        if not fired:
            fired.append(True)
            signal.raise_signal(signal.SIGTERM)
        return instances(result, context)

    monkeypatch.setattr(loading, "instances", stop_mid_query)
    client = interrupts.deferring(MlflowClient(tracking_uri))
    assert isinstance(client, MlflowClient) and interrupts.deferring(client) is client
    with interrupts.terminate_as_interrupt():
        try:
            client.log_batch(run_id, metrics=[Metric("train/loss", 1.5, 0, 1)])
            raise AssertionError("the stop was lost")
        except KeyboardInterrupt:  # the driver's handler writes while the stop is being handled
            raw.set_terminated(run_id, "KILLED")
    assert fired
    assert raw.get_run(run_id).info.status == "KILLED"
    assert [m.value for m in raw.get_metric_history(run_id, "train/loss")] == [1.5]
    assert client.get_run(run_id).info.run_id == run_id  # what is not a write passes through
    assert client.tracking_uri == raw.tracking_uri


def test_a_sigterm_whose_interrupt_was_swallowed_still_reaches_the_drivers_loop():
    """Python runs a signal's handler wherever the main thread is: a KeyboardInterrupt raised inside
    a weakref callback (a garbage collection) is printed and dropped.  The driver's loop asks again
    at its next poll (orchestrator/run/phases.py), once; outside the block nothing is pending."""
    with interrupts.terminate_as_interrupt():
        try:
            signal.raise_signal(signal.SIGTERM)
        except KeyboardInterrupt:
            pass  # as "Exception ignored in: <function WeakValueDictionary...remove>" drops it
        with pytest.raises(KeyboardInterrupt):
            interrupts.raise_pending_interrupt()
        interrupts.raise_pending_interrupt()  # once: the stop is on its way
        try:
            signal.raise_signal(signal.SIGTERM)
        except KeyboardInterrupt:
            pass
    interrupts.raise_pending_interrupt()  # the block's end leaves nothing pending


def test_a_sigterm_lost_in_a_weakref_callback_is_not_reported_and_still_stops(monkeypatch):
    """The real loss: the handler's KeyboardInterrupt raised inside a weakref callback.  Python
    hands it to sys.unraisablehook ("Exception ignored in ... KeyboardInterrupt", a traceback on
    the run's stderr that reads as a crash); inside the block that report is dropped and the stop
    stays pending, any other unraisable exception still reaches the hook, and the block's end
    puts the hook back."""
    import gc
    import sys
    import weakref

    reported = []
    recorder = lambda u: reported.append(u.exc_type)  # noqa: E731
    monkeypatch.setattr(sys, "unraisablehook", recorder)

    class Thing:
        pass

    def lost(_):
        interrupts._on_stop(signal.SIGTERM, None)

    def broken(_):
        raise ValueError("a real bug in a finalizer")

    with interrupts.terminate_as_interrupt():
        thing = Thing()
        ref = weakref.ref(thing, lost)
        del thing
        gc.collect()
        assert ref() is None and reported == []
        with pytest.raises(KeyboardInterrupt):
            interrupts.raise_pending_interrupt()
        other = Thing()
        ref = weakref.ref(other, broken)
        del other
        gc.collect()
        assert reported == [ValueError]
    assert sys.unraisablehook is recorder


def test_a_stop_inside_a_journal_write_leaves_no_lock_behind_and_the_trial_is_written(tmp_path, monkeypatch):
    """The search's default storage (search/study_storage.py): a SIGTERM between Optuna's taking of
    the journal's lock file and its ``try`` left the lock behind, and every later write (the
    interrupted driver's FAIL of its running trials, a re-run's) waited Optuna's 30 s grace period
    for it.  Through the storage the driver opens, the write ends first and the lock is let go."""
    import optuna
    from optuna.storages.journal import JournalFileSymlinkLock

    from search.study_storage import open_storage

    path = tmp_path / "optuna.journal"
    storage = open_storage(str(path))
    assert isinstance(storage, optuna.storages.JournalStorage)
    study = optuna.create_study(study_name="s", storage=storage)
    fired, acquire = [], JournalFileSymlinkLock.acquire

    def stop_once_locked(self):
        taken = acquire(self)
        if not fired:
            fired.append(True)
            signal.raise_signal(signal.SIGTERM)
        return taken

    monkeypatch.setattr(JournalFileSymlinkLock, "acquire", stop_once_locked)
    with interrupts.terminate_as_interrupt():
        with pytest.raises(KeyboardInterrupt):
            study.ask()
    assert fired
    assert not [p.name for p in tmp_path.iterdir() if p.name != path.name]  # no lock file left
    again = optuna.load_study(study_name="s", storage=open_storage(str(path)))
    assert [t.state for t in again.trials] == [optuna.trial.TrialState.RUNNING]


def _like_ray_init(code: int | None = None):
    """What ``ray.init`` does first: its own SIGTERM handler, ``sys.exit(signum)``; then it starts Ray
    (here: a SIGTERM arrives while it does), or exits with ``code``."""
    import sys

    signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(signum))
    if code is not None:
        sys.exit(code)
    signal.raise_signal(signal.SIGTERM)
    _spin()


def test_a_sigterm_while_ray_init_starts_ray_is_the_stop_not_a_silent_exit_15():
    with interrupts.terminate_as_interrupt():
        with pytest.raises(KeyboardInterrupt):
            with interrupts.through_ray_init():
                _like_ray_init()
        assert signal.getsignal(signal.SIGTERM) is interrupts._on_stop  # put back for the run
        with pytest.raises(SystemExit) as other:  # any other exit of ray.init is its own
            with interrupts.through_ray_init():
                _like_ray_init(code=3)
        assert other.value.code == 3 and signal.getsignal(signal.SIGTERM) is interrupts._on_stop
    old = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with pytest.raises(SystemExit):  # outside the drivers' block: Ray's behaviour, untouched
            with interrupts.through_ray_init():
                _like_ray_init()
    finally:
        signal.signal(signal.SIGTERM, old)


def test_fit_in_a_users_program_takes_ctrl_c_only_and_a_nested_block_changes_nothing():
    """``fit()`` (orchestrator/api.py): the program's SIGTERM stays the program's (also after
    ``ray.init`` replaced it), Ctrl-C waits for a store write; a block inside a block is the outer one."""
    seen = []
    mine = lambda s, _: seen.append(s)  # noqa: E731
    old = signal.signal(signal.SIGTERM, mine)
    try:
        with interrupts.terminate_as_interrupt(sigterm=False):
            assert signal.getsignal(signal.SIGTERM) is mine
            interrupts.reinstall()
            assert signal.getsignal(signal.SIGTERM) is mine
            with pytest.raises(KeyboardInterrupt):
                with interrupts.deferred_interrupts():
                    signal.raise_signal(signal.SIGINT)
                    _spin()
                    seen.append("written")
            with interrupts.terminate_as_interrupt():  # nested: still Ctrl-C only
                assert signal.getsignal(signal.SIGTERM) is mine
            assert interrupts.active()  # the inner block's end did not end the outer one
        assert seen == ["written"] and not interrupts.active()
    finally:
        signal.signal(signal.SIGTERM, old)


def test_a_ctrl_c_the_process_was_started_ignoring_stays_ignored():
    """A shell's background job starts with SIGINT ignored: the drivers keep it so (SIGTERM still stops)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with interrupts.terminate_as_interrupt():
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.raise_signal(signal.SIGINT)
        _spin()
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGTERM)
            _spin()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
