"""search.capacity: what a trial holds and whether it fits beside the running ones."""

from __future__ import annotations

from orchestrator.config.schema import validate
from search.capacity import Capacity, trial_needs

BASE = {
    "data": {"name": "digits"},
    "model": {"name": "mlp", "norm": "none", "hidden": 32},
    "optimizer": {"name": "sgd", "lr": 0.05, "mf": 0.9, "base_batch_size": 32},
    "batch": {"size": 32, "max_local_batch": 16},
    "train": {"epochs": 2},
}


def test_capacity():
    c = Capacity({"CPU": 2.0, "memory": 1e9})
    assert c.fits({"CPU": 1.0}) and c.never_fits({"CPU": 3.0}) and c.never_fits({"CPU": 1, "GPU": 1})
    c.take({"CPU": 1.5})
    assert not c.fits({"CPU": 1.0}) and c.fits({"CPU": 0.5})
    c.give({"CPU": 1.5})
    assert c.fits({"CPU": 2.0})


def test_never_fits_says_what_the_cluster_lacks():
    c = Capacity({"CPU": 4.0})
    assert c.never_fits({"CPU": 4.0}) is None
    assert c.never_fits({"CPU": 6.0}) == "needs 6 CPU but the cluster has 4"
    c.give({"CPU": 1.0})  # never below zero
    assert c.used == {"CPU": 0.0}


def test_a_trial_needs_its_largest_worker_group():
    cfg = validate({**BASE, "scaling": {"min_workers": 1, "max_workers": 3, "cpus_per_worker": 2}})
    assert trial_needs(cfg) == {"CPU": 6}
