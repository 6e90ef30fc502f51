"""The storage layer on a local folder, what a storage location may be, and the commands that
must work on a URI without reaching it (``plan``).  Against a real S3-compatible server:
tests/integration/test_object_store.py."""

import os

import pytest

from orchestrator.cli import main
from orchestrator.config.schema import validate
from trainers.loop import storage
from trainers.loop.storage import LOCAL, join, location_problem, resolve, store_for


def test_locations_join_and_resolve(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve("runs") == str(tmp_path / "runs")
    assert resolve("~/x") == os.path.expanduser("~/x")
    assert resolve("file:///data/runs") == "/data/runs"
    assert resolve("s3://bucket/runs/") == "s3://bucket/runs"
    assert (
        join("s3://bucket/runs", "elastic-1", "checkpoint_step00000001")
        == "s3://bucket/runs/elastic-1/checkpoint_step00000001"
    )
    assert join("s3://bucket", "elastic-1") == "s3://bucket/elastic-1"
    assert join("/a/b", "c") == "/a/b/c"
    assert storage.basename("s3://bucket/runs/elastic-1/") == "elastic-1"
    assert isinstance(store_for("s3://bucket/x"), storage.ObjectStore)
    assert store_for("runs") is LOCAL and store_for("file:///tmp") is LOCAL


@pytest.mark.parametrize(
    "location, fragment",
    [
        ("", "empty"),
        ("ftp://host/runs", "unknown URI scheme 'ftp://'"),
        ("s3://AKIA:hunter2@bucket/runs", "a URI with credentials (s3://***@...) is not accepted"),
        ("s3://bucket/runs?endpoint_override=x", "URI options ('?...') are not accepted"),
        ("s3:///runs", "no bucket"),
    ],
)
def test_a_location_that_cannot_hold_checkpoints_is_named(location, fragment):
    why = location_problem(location)
    assert why is not None and fragment in why
    assert "hunter2" not in why  # a secret in the URI is never repeated
    with pytest.raises(ValueError, match="checkpoint.storage_path: ") as e:
        validate({"checkpoint": {"storage_path": location}})
    assert "hunter2" not in str(e.value)


@pytest.mark.parametrize(
    "location", ["ray_runs", "/abs/runs", "file:///abs/runs", "s3://bucket", "s3://bucket/a/b", "gs://bucket/runs"]
)
def test_folders_and_bucket_uris_are_accepted(location):
    assert location_problem(location) is None
    assert validate({"checkpoint": {"storage_path": location}}).checkpoint.storage_path == location


def test_the_local_store(tmp_path):
    root = str(tmp_path / "root")
    LOCAL.write_bytes(join(root, "a", "info.json"), b"{}")  # parents made, atomically replaced
    LOCAL.write_bytes(join(root, "a", "info.json"), b'{"x": 1}')
    assert LOCAL.read_bytes(join(root, "a", "info.json")) == b'{"x": 1}'
    assert sorted(os.listdir(tmp_path / "root" / "a")) == ["info.json"]  # no temporary file left
    assert LOCAL.kind(join(root, "a")) == "dir" and LOCAL.kind(join(root, "a", "info.json")) == "file"
    assert LOCAL.kind(join(root, "none")) is None and LOCAL.children(join(root, "none")) == []
    with LOCAL.stage(join(root, "a", "ckpt")) as d:
        assert os.path.basename(d).startswith(".ckpt.tmp-")  # the folder appears only at the end
        assert LOCAL.kind(join(root, "a", "ckpt")) is None
        with LOCAL.open_write(join(d, "f")) as f:
            f.write(b"123")
    assert LOCAL.size(join(root, "a", "ckpt", "f")) == 3
    assert sorted(LOCAL.children(join(root, "a"))) == [("ckpt", "dir"), ("info.json", "file")]
    assert sorted(LOCAL.files_under(root)) == ["a/ckpt/f", "a/info.json"]
    LOCAL.remove(join(root, "a", "ckpt"))
    LOCAL.remove(join(root, "a", "ckpt"))  # nothing there: not an error
    assert LOCAL.files_under(root) == ["a/info.json"]


def test_a_failed_local_stage_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with LOCAL.stage(str(tmp_path / "ckpt")) as d:
            with LOCAL.open_write(join(d, "f")) as f:
                f.write(b"partial")
            raise RuntimeError("the writer failed")
    assert os.listdir(tmp_path) == []


def test_plan_works_on_a_bucket_uri_without_reaching_it(tmp_path, capsys, monkeypatch):
    """``plan`` only validates the config: a bucket that does not exist (no server at all) is not
    its business, and nothing is written anywhere."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        "data: {name: digits}\nmodel: {name: mlp, norm: none}\nbatch: {size: 32, max_local_batch: 16}\n"
        "train: {epochs: 1}\ncheckpoint: {storage_path: 's3://no-such-bucket/runs'}\n"
    )
    assert main(["plan", str(cfg), "--format", "csv"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("step") and len(out.splitlines()) > 2
    assert sorted(os.listdir(tmp_path)) == ["cfg.yaml"]
