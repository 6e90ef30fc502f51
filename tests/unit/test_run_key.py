"""A training run's idempotency key (orchestrator/run/run_key.py): where it comes from, and what a
``train`` with a key does with the runs already tagged with it."""

from __future__ import annotations

import json

import pytest

from orchestrator.config.schema import ConfigError
from orchestrator.run.run_key import JOB_CONFIG_ENV, KeyedStart, decide, run_key, submission_id


def _job_env(submission: str) -> dict[str, str]:
    """The environment Ray's job supervisor gives a submitted entrypoint (its JobConfig as JSON)."""
    return {JOB_CONFIG_ENV: json.dumps({"runtime_env": {}, "metadata": {"job_submission_id": submission}})}


def test_the_key_is_the_flag_else_the_config_else_the_ray_jobs_submission_id():
    env = _job_env("raysubmit_4LamXRuQpYdSMg7J")
    assert run_key("flag-key", "cfg-key", env) == "flag-key"
    assert run_key(None, "cfg-key", env) == "cfg-key"
    assert run_key(None, None, env) == "raysubmit_4LamXRuQpYdSMg7J"
    assert run_key(None, None, {}) is None  # not a submitted job: every train is a new run
    assert submission_id({JOB_CONFIG_ENV: "not json"}) is None
    assert submission_id({JOB_CONFIG_ENV: json.dumps({"metadata": {}})}) is None


@pytest.mark.parametrize(("flag", "cfg", "where"), [("it's", None, "--run-key"), (None, "", "tracking.run_key")])
def test_a_key_mlflows_search_cannot_match_exactly_is_refused_with_the_field(flag, cfg, where):
    with pytest.raises(ConfigError, match=f"^{where}: .* is not a usable key; use 1 to 200 letters"):
        run_key(flag, cfg, {})


def test_a_keyed_train_starts_a_new_run_resumes_an_unfinished_one_and_leaves_a_finished_one():
    assert decide([]) == KeyedStart("new")
    assert decide([("a", "KILLED", 10)]) == KeyedStart("resume", "a")
    assert decide([("a", "RUNNING", 10)]) == KeyedStart("resume", "a")  # its lock says whether its driver lives
    assert decide([("a", "FAILED", 10), ("b", "FINISHED", 20)]) == KeyedStart("finished", "b")
    assert decide([("b", "FINISHED", 20), ("c", "FAILED", 30)]) == KeyedStart("resume", "c")  # the newest
