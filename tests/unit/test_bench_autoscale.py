"""bench/autoscale.py's quick-form stop: a record from a group smaller than its batch wants."""

import importlib

import pytest


@pytest.fixture
def autoscale(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # the module sets it at import; restored after the test
    return importlib.import_module("bench.autoscale")


def test_a_group_short_of_the_workers_its_batch_wants(autoscale):
    from trainers.link import metrics as M

    short = autoscale.short_of_workers
    assert short({M.WORKERS: 1.0, M.BATCH_GLOBAL: 80.0}, max_local_batch=64)  # W 1 of 2 asked: accumulates
    assert not short({M.WORKERS: 1.0, M.BATCH_GLOBAL: 64.0}, max_local_batch=64)  # fits one worker
    assert not short({M.WORKERS: 2.0, M.BATCH_GLOBAL: 128.0}, max_local_batch=64)  # the group it wants
    assert not short({M.TRAIN_LOSS: 1.0}, max_local_batch=64)  # a record without the batch's figures
