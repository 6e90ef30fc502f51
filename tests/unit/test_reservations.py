"""The record of a run's Ray Train groups that ``resume`` uses to drop a killed driver's
reservations (orchestrator/run/reservations.py); the drop itself runs against a real Ray in
tests/integration/test_resilience.py."""

from types import SimpleNamespace

from orchestrator.run.reservations import KEEP, ray_train_run_id, recorded, release


def test_the_newest_ids_are_kept_newest_last_without_repeats():
    value = ""
    for i in range(KEEP + 2):
        value = recorded(value, f"id{i}")
    assert value.split() == [f"id{i}" for i in range(2, KEEP + 2)]
    assert recorded("a b c", "b").split() == ["a", "c", "b"]  # a group started again moves to the end
    assert recorded(None, "x") == "x"


def test_the_id_is_read_from_the_trainers_run_context():
    assert ray_train_run_id(SimpleNamespace(train_run_context=SimpleNamespace(run_id="abc"))) == "abc"
    assert ray_train_run_id(object()) is None  # a Ray Train without it: nothing recorded, nothing dropped


def test_nothing_to_release_asks_nothing_of_ray():
    assert release(None) == 0 and release("  ") == 0
