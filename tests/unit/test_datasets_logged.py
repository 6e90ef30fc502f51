"""A run's datasets as MLflow inputs (orchestrator/record/datasets.py), read back from a real SQLite store:
a built-in set by its catalog name, a factory by its import path and its parameters' digest, a text
corpus by its files' digest, each in the training and validation contexts; no credential in a source."""

from __future__ import annotations

import json

from mlflow.tracking import MlflowClient

from orchestrator.config.schema import validate
from orchestrator.record.datasets import clean_source, dataset_input, describe_data
from orchestrator.record.params import ConfigRecord
from orchestrator.record.run_tracker import RunTracker


def _inputs(tmp_path, data: dict) -> list[tuple[str, str, str, str, str]]:
    """(context, name, digest, source_type, source uri) of a new run's dataset inputs."""
    cfg = validate({"data": data, "tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment": "d"}})
    tracker = RunTracker(ConfigRecord.from_config(cfg))
    run = MlflowClient(tracker.client.tracking_uri).get_run(tracker.run_id)
    out = []
    for di in run.inputs.dataset_inputs:
        context = {t.key: t.value for t in di.tags}["mlflow.data.context"]
        d = di.dataset
        out.append((context, d.name, d.digest, d.source_type, json.loads(d.source)["uri"]))
    tracker.end()
    return sorted(out)


def test_a_builtin_set_in_both_contexts(tmp_path):
    rows = _inputs(tmp_path, {"name": "digits", "val_fraction": 0.2})
    assert [(c, n, t, u) for c, n, _, t, u in rows] == [
        ("training", "digits", "code", "catalog:digits"),
        ("validation", "digits", "code", "catalog:digits"),
    ]
    assert rows[0][2] != rows[1][2]  # each split its own digest
    other = _inputs(tmp_path / "b", {"name": "digits", "val_fraction": 0.3})
    assert {r[2] for r in rows}.isdisjoint({r[2] for r in other})  # another split: other data, other digests


def test_a_factory_by_its_import_path_and_parameters(tmp_path):
    data = {"factory": "tests.byo_workloads:digits", "params": {"seed": 0}}
    rows = _inputs(tmp_path, data)
    assert {(n, t, u) for _, n, _, t, u in rows} == {("tests.byo_workloads:digits", "code", data["factory"])}
    again = describe_data(validate({"data": data}).data)
    assert sorted(d.dataset.digest for d in again) == sorted(r[2] for r in rows)  # the same data, the same digest
    changed = describe_data(validate({"data": {**data, "params": {"seed": 1}}}).data)
    assert {d.dataset.digest for d in changed}.isdisjoint({r[2] for r in rows})


def test_a_text_corpus_by_its_files(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("hello world\n" * 50)
    data = {"name": "text", "path": str(corpus)}
    first = describe_data(validate({"data": data}).data)
    assert json.loads(first[0].dataset.source)["uri"] == str(corpus) and first[0].dataset.source_type == "local"
    corpus.write_text("hello there\n" * 50)  # the same file, other text
    second = describe_data(validate({"data": data}).data)
    assert first[0].dataset.digest != second[0].dataset.digest


def test_no_credential_in_a_logged_source():
    uri = "s3://AKIAKEY:s3cr3t@bucket/shards/manifest.json?X-Amz-Signature=abc&token=t#frag"
    assert clean_source(uri) == "s3://bucket/shards/manifest.json"
    assert clean_source("https://user:pw@host:8443/data?sig=1") == "https://host:8443/data"
    assert clean_source("/data/corpus.txt") == "/data/corpus.txt"
    di = dataset_input("shards", uri, "0123abcd", "training")
    assert "s3cr3t" not in di.dataset.source and "Signature" not in di.dataset.source
    assert di.dataset.source_type == "s3" and di.dataset.name == "shards" and di.dataset.digest == "0123abcd"


def test_a_dataset_another_run_created_meanwhile_is_linked_on_the_next_try(tmp_path):
    from orchestrator.record.datasets import log_datasets

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = validate({"tracking": {"uri": uri, "experiment": "d"}})
    first, second = (
        RunTracker(ConfigRecord.from_config(cfg)),
        RunTracker(ConfigRecord.from_config(cfg)),
    )  # two trials of one study, both logged digits
    client = second.client
    calls = []

    class Racing:  # the first call meets the unique key the other run's insert just took
        def log_inputs(self, run_id, datasets):
            calls.append(run_id)
            if len(calls) == 1:
                raise RuntimeError("UNIQUE constraint failed: datasets.experiment_id, datasets.name, datasets.digest")
            client.log_inputs(run_id, datasets=datasets)

    assert log_datasets(Racing(), second.run_id, describe_data(cfg.data)) and len(calls) == 2
    got = MlflowClient(uri).get_run(second.run_id).inputs.dataset_inputs
    assert sorted(d.dataset.digest for d in got) == sorted(
        d.dataset.digest for d in MlflowClient(uri).get_run(first.run_id).inputs.dataset_inputs
    )

    class Away:
        def log_inputs(self, run_id, datasets):
            raise ConnectionError("the tracking server does not answer")

    assert log_datasets(Away(), second.run_id, describe_data(cfg.data)) is False  # the run goes on
    first.end()
    second.end()
