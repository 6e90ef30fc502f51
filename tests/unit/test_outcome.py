"""How a run ends (orchestrator/run/outcome.py): each terminal state's MLflow status, exit status and
one line; the resume command's wording; and the CLI's exit status taken from the run's end."""

from __future__ import annotations

import errno
from types import SimpleNamespace

import pytest

from orchestrator.config.command import cli
from orchestrator.run.outcome import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    TRACEBACK_ARTIFACT,
    CapacityLost,
    Diverged,
    DriverFailed,
    Ending,
    Finished,
    Interrupted,
    OutOfStorage,
    RayTrainFailed,
    Resume,
    Stopped,
    TrackingGone,
    UserCodeFailed,
    ending,
    is_fatal,
)
from trainers.link import messages as msg
from trainers.loop.storage import StorageFull

RUN = Resume("abc123", "sqlite:////store/mlflow.db")
FROM_PYTHON = Resume("abc123", "sqlite:////store/mlflow.db", from_python=True)


def _user_error(deterministic: bool = True, where: str = "my_data.py:42 in __getitem__") -> msg.WorkloadFailed:
    return msg.WorkloadFailed(
        rank=1,
        phase=0,
        where=where,
        error="ValueError: corrupt record 17",
        traceback="Traceback (most recent call last):\n  ...\nValueError: corrupt record 17",
        deterministic=deterministic,
    )


def _raised(e: BaseException) -> BaseException:
    try:
        raise e
    except BaseException as caught:  # noqa: BLE001 - the traceback is what the test reads
        return caught


@pytest.mark.parametrize("end", [Finished("result"), Stopped("result"), Finished()])
def test_a_run_that_finished_or_was_stopped_ends_finished_with_exit_0_and_no_message(end):
    assert ending(end, RUN) == Ending("FINISHED", EXIT_OK, None, None)


def test_a_diverged_run_fails_with_the_events_message():
    ev = msg.Diverged(step=17, value=float("nan"), checkpoint="/runs/elastic-abc123/checkpoint_step00000010")
    said = ending(Diverged(ev), RUN)
    assert (said.status, said.exit_code, said.traceback) == ("FAILED", 1, None)
    assert said.message == (
        "training diverged at step 17: train/loss = nan; the last finite checkpoint is "
        "/runs/elastic-abc123/checkpoint_step00000010; lower optimizer.lr or lengthen the warmup"
    )


@pytest.mark.parametrize(
    "deterministic, why", [(True, "not retried: a restart would meet it again"), (False, "met again after a restart")]
)
def test_the_users_error_fails_the_run_with_where_and_why_and_its_traceback(deterministic, why):
    ev = _user_error(deterministic)
    said = ending(UserCodeFailed(ev), RUN)
    assert (said.status, said.exit_code) == ("FAILED", 1)
    assert said.message == (
        f"my_data.py:42 in __getitem__: ValueError: corrupt record 17 (rank 1; {why}; full "
        f"traceback: artifact {TRACEBACK_ARTIFACT} of the run)"
    )
    assert said.traceback == ev.traceback


def test_a_store_that_did_not_answer_fails_the_run_with_the_resume_command():
    """An error of what the run reads from (trainers/errors.EndsRun: a shard store that did not
    answer through its retries) ends the run at once, its checkpoints kept: its line ends with the
    command that resumes it."""
    from trainers.data.shards.cache import ShardUnavailable
    from trainers.link.failure import run_ending_error

    err = ShardUnavailable(
        "data.root: could not fetch shard 'shard_00003.bin' from s3://b/corpus after 4 tries in 30.2 s "
        "(connection refused); the run stopped at its newest checkpoint: resume it once the store answers again"
    )
    ev = run_ending_error(err, rank=2)
    assert ev is not None and ev.resumable and ev.deterministic
    said = ending(UserCodeFailed(ev), RUN)
    assert (said.status, said.exit_code) == ("FAILED", 1)
    assert said.message.startswith("data.root: could not fetch shard 'shard_00003.bin'")
    assert said.message.endswith(f"(rank 2; not retried: a restart would meet it again): {RUN.command()}")
    assert "\n" not in said.message and said.traceback == ev.traceback


def test_a_full_checkpoint_storage_fails_the_run_with_what_is_kept_and_the_resume_command():
    ev = msg.StorageFailed(
        step=40,
        path="/d/elastic-abc123/checkpoint_step00000040",
        code=errno.ENOSPC,
        free=0,
        message="the checkpoint storage is full (No space left on device) writing "
        "/d/elastic-abc123/checkpoint_step00000040, 0 B free there",
        fix="free space there",
        checkpoint=None,
    )
    said = ending(OutOfStorage(ev), RUN)
    assert (said.status, said.exit_code, said.traceback) == ("FAILED", 1, None)
    assert said.message == (
        "the checkpoint storage is full (No space left on device) writing /d/elastic-abc123/checkpoint_step00000040, "
        "0 B free there; training stopped at step 40 without restarting (a restart would write into the same "
        "storage); no checkpoint was written yet; free space there, then: "
        f"{cli()} resume abc123 --tracking-uri sqlite:////store/mlflow.db"
    )


def test_a_full_disk_on_the_drivers_side_fails_the_run_with_the_resume_command():
    err = StorageFull("/home/me/mlruns/1/artifacts/model.pt", errno.EDQUOT, free=None, what="driver's")
    said = ending(OutOfStorage(err), FROM_PYTHON)
    assert (said.status, said.exit_code) == ("FAILED", 1)
    assert said.message == (
        "the driver's storage is over its disk quota (Disk quota exceeded) writing "
        "/home/me/mlruns/1/artifacts/model.pt; free space there or raise the quota, then: "
        "fit(resume='abc123', ...) with the same functions"
    )


def test_a_lost_tracking_server_fails_the_run_with_the_trackers_account():
    said = ending(TrackingGone(RuntimeError("the tracking server did not answer for 8 s"), "the account"), RUN)
    assert said == Ending("FAILED", EXIT_FAILED, "the account")


def test_lost_capacity_fails_the_run_with_its_message():
    said = ending(CapacityLost("lost capacity: only 0 of scaling.min_workers 1 workers fit ...; with: X"), RUN)
    assert said == Ending(
        "FAILED", EXIT_FAILED, "lost capacity: only 0 of scaling.min_workers 1 workers fit ...; with: X"
    )


@pytest.mark.parametrize("kind", [RayTrainFailed, DriverFailed])
def test_an_error_not_the_users_fails_the_run_with_its_first_line_and_traceback(kind):
    e = _raised(RuntimeError("Training failed after 1 attempts\nthe rest of Ray's message"))
    said = ending(kind(e), RUN)
    assert (said.status, said.exit_code) == ("FAILED", 1)
    assert said.message == "RuntimeError: Training failed after 1 attempts"
    assert said.traceback.startswith("Traceback (most recent call last):") and "in _raised" in said.traceback
    long = ending(kind(ValueError("x" * 400)), RUN).message
    assert long == ("ValueError: " + "x" * 400)[:300], "one line of at most 300 characters (trainers/errors.py)"


def test_an_interrupted_run_is_killed_with_exit_130_and_how_to_continue_it():
    said = ending(Interrupted(steps=57, checkpoint=50), RUN)
    assert (said.status, said.exit_code, said.traceback) == ("KILLED", EXIT_INTERRUPTED, None)
    assert said.message == (
        f"stopped by Ctrl-C or SIGTERM after step 57; it continues from its checkpoint at step 50 "
        f"with: {cli()} resume abc123"
    )
    assert ending(Interrupted(steps=57, checkpoint=50), FROM_PYTHON).message.endswith(
        "with: from Python: fit(resume='abc123', ...) with the same functions"
    )
    before = ending(Interrupted(steps=3, checkpoint=None), RUN)
    assert before == Ending(
        "KILLED",
        130,
        "stopped by Ctrl-C or SIGTERM after step 3, before its first checkpoint: nothing to resume; train it anew",
    )


def test_something_that_is_no_terminal_state_is_refused():
    with pytest.raises(TypeError, match="not a terminal state"):
        ending(object(), RUN)  # type: ignore[arg-type]


def test_the_resume_command_names_the_store_without_its_credentials(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert (
        Resume("r1", "sqlite:///mlflow.db").command()
        == f"{cli()} resume r1 --tracking-uri sqlite:///{tmp_path}/mlflow.db"
    )
    assert (
        Resume("r1", "postgresql://alice:s3cret@db/mlflow")
        .command()
        .endswith("--tracking-uri postgresql://alice:***@db/mlflow")
    )
    assert Resume("r1", "sqlite:///mlflow.db").command(store=False) == f"{cli()} resume r1"
    assert Resume("r1", "").command() == f"{cli()} resume r1"
    assert Resume("r1", "sqlite:///m.db", from_python=True).command() == "fit(resume='r1', ...) with the same functions"


def test_a_deterministic_error_or_one_met_before_is_fatal():
    first, other_place = _user_error(False), _user_error(False, where="my_data.py:7 in load")
    assert is_fatal(_user_error(True), [])
    assert not is_fatal(first, []) and not is_fatal(first, [other_place])
    assert is_fatal(first, [other_place, _user_error(False)])


def test_the_cli_exits_with_the_status_of_the_runs_end(monkeypatch, capsys):
    import orchestrator.run.runner as runner
    from orchestrator.cli import _train_and_report

    def summary(end, status, code):
        return runner.RunSummary(
            run_id="abc123",
            tracking_uri="sqlite:///m.db",
            experiment_id="1",
            status=status,
            steps=5,
            wall_s=1.0,
            exit_code=code,
            outcome=end,
            error=ending(end, RUN).message,
        )

    import orchestrator.cli as cli

    # Ray is started (here: said to be) while the driver loads; the run is told it owns that Ray
    monkeypatch.setattr(cli, "ensure_ray", lambda verbose, runtime_env=None: True)
    monkeypatch.setattr(cli, "runtime_env", lambda cfg: None)
    monkeypatch.setattr(cli, "_load_driver", lambda uri: None)
    cfg = SimpleNamespace(tracking=SimpleNamespace(experiment="e", resolved_uri=lambda: "sqlite:///m.db"))
    handed = []
    for end, status, code in ((Finished(), "FINISHED", 0), (CapacityLost("lost capacity"), "FAILED", 1)):

        def run(cfg, **kw):
            handed.append(kw["own_ray"])
            return summary(end, status, code)

        monkeypatch.setattr(runner, "run_training", run)
        assert _train_and_report(cfg) == code
    assert handed == [True, True]
    assert "error          lost capacity" in capsys.readouterr().out

    def interrupted(cfg, **kw):
        raise runner.RunInterrupted(summary(Interrupted(steps=5, checkpoint=None), "KILLED", 130))

    monkeypatch.setattr(runner, "run_training", interrupted)
    assert _train_and_report(cfg) == 130
    assert "run killed: 5 steps" in capsys.readouterr().err
