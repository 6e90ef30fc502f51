"""A checkpoint storage that is full (ENOSPC), over its quota (EDQUOT) or read-only (EROFS) is a
failure no retry cures: the write leaves nothing behind, the worker group ends at once on every
rank without a restart, and the driver ends the run FAILED with one line naming the path, the
space free there and the resume command.  ENOSPC is injected at the write here (no processes);
tests/integration/test_disk_full.py fills a real filesystem."""

import contextlib
import errno
import glob
import io
import os

import numpy as np
import pytest
import torch

from orchestrator.config.command import cli
from trainers.link.messages import FirstStep, PhaseStart, StorageFailed
from trainers.loop.checkpoint import CheckpointManager, read_checkpoint, run_checkpoints
from trainers.loop.storage import LOCAL, StorageFull, no_room


class _Fills:
    """A writable file that takes ``room`` bytes, then fails like a full disk does."""

    def __init__(self, f, room: int, code: int) -> None:
        self.f, self.room, self.code = f, room, code

    def write(self, data) -> int:
        n = memoryview(data).nbytes
        if n > self.room:
            raise OSError(self.code, os.strerror(self.code))
        self.room -= n
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)


def _disk_fills_after(monkeypatch, room: int, code: int = errno.ENOSPC) -> None:
    real = LOCAL.open_write

    @contextlib.contextmanager
    def open_write(location):
        with real(location) as f:
            yield _Fills(f, room, code)

    monkeypatch.setattr(LOCAL, "open_write", open_write)


class _Counter:
    def __init__(self) -> None:
        self.n = torch.zeros(5000)

    def state_dict(self):
        return {"n": self.n}

    def load_state_dict(self, s):
        self.n = s["n"]


def _manager(tmp_path):
    return CheckpointManager({"c": _Counter()}, storage=str(tmp_path), run_prefix="elastic-r", run_name="elastic-r")


def test_torch_s_own_error_for_a_full_disk_is_recognised():
    """torch.save turns the file's ENOSPC into a RuntimeError of its own: the OSError is behind it."""

    with pytest.raises(Exception) as info:
        torch.save({"w": torch.zeros(1000)}, _Fills(io.BytesIO(), 100, errno.ENOSPC))  # a block fits
    assert not isinstance(info.value, OSError)
    assert no_room(info.value).errno == errno.ENOSPC
    assert no_room(RuntimeError("something else")) is None
    assert no_room(OSError(errno.EIO, "I/O error")) is None  # may pass: a restart tries again


def test_a_full_disk_mid_checkpoint_leaves_nothing_and_says_where(tmp_path, monkeypatch):
    m = _manager(tmp_path)
    first = m.save(10)
    _disk_fills_after(monkeypatch, room=4096)
    with pytest.raises(StorageFull) as info:
        m.save(20)
    e = info.value
    assert e.path == os.path.join(str(tmp_path), "elastic-r", "checkpoint_step00000020")
    assert e.code == errno.ENOSPC and isinstance(e.free, int)
    assert e.message.startswith(f"the checkpoint storage is full (No space left on device) writing {e.path}, ")
    assert e.message.endswith("free there") and e.fix == "free space there"
    leftovers = [p for p in glob.glob(f"{tmp_path}/**/.*", recursive=True)]
    assert leftovers == [], "the temporary folder of the failed write is gone"
    assert run_checkpoints(str(tmp_path), "elastic-r") == [first]  # the older one is intact
    read_checkpoint(first)
    assert StorageFull.from_dict(e.as_dict()).message == e.message  # what the other ranks are told


@pytest.mark.parametrize(
    "code, state, fix",
    [(errno.EDQUOT, "is over its disk quota", "raise the quota"), (errno.EROFS, "is read-only", "make it writable")],
)
def test_a_quota_or_a_read_only_disk_is_the_same_kind_of_failure(tmp_path, monkeypatch, code, state, fix):
    _disk_fills_after(monkeypatch, room=0, code=code)
    with pytest.raises(StorageFull) as info:
        _manager(tmp_path).save(5)
    assert state in info.value.message and fix in info.value.fix


def test_another_write_error_is_left_to_ray_train_s_restarts(tmp_path, monkeypatch):
    _disk_fills_after(monkeypatch, room=0, code=errno.EIO)
    with pytest.raises(Exception) as info:
        _manager(tmp_path).save(5)
    assert not isinstance(info.value, StorageFull)


def test_a_whole_file_written_on_a_full_disk_leaves_no_temporary_file(tmp_path, monkeypatch):
    _disk_fills_after(monkeypatch, room=0)
    with pytest.raises(OSError):
        LOCAL.write_bytes(str(tmp_path / "elastic_run.json"), b"{}")
    assert os.listdir(tmp_path) == []


def test_the_group_ends_without_raising_and_says_why(tmp_path, monkeypatch):
    """A worker that raised would be restarted by Ray Train (FailureConfig.max_failures) into the
    same full disk: the loop ends normally instead and rank 0 tells the driver."""
    from tests.unit.test_checkpoint import _trainer

    t = _trainer(tmp_path)
    t.cfg.checkpoint.every_steps = 2
    t.cfg.checkpoint.background = False  # each save in the loop's thread (the one beside it: below)
    events = []
    monkeypatch.setattr(t.report, "emit", events.append)
    saves = []
    real = t.checkpoints.save

    def save(step, resize=False):
        saves.append(step)
        if len(saves) == 2:
            _disk_fills_after(monkeypatch, room=0)
        return real(step, resize)

    monkeypatch.setattr(t.checkpoints, "save", save)
    t.run()  # returns: no exception reaches Ray Train
    assert saves == [2, 4]
    (failed,) = [e for e in events if isinstance(e, StorageFailed)]
    assert failed.step == 4 and failed.code == errno.ENOSPC
    assert failed.checkpoint.endswith("checkpoint_step00000002") and "checkpoint_step00000004" in failed.path
    assert t.state.step == 4  # it stopped there


def test_a_full_disk_beside_the_loop_ends_the_group_at_the_next_checkpoint(tmp_path, monkeypatch):
    """Written beside the loop (``checkpoint.background``), checkpoint 4's failure is known at the
    next checkpoint (6): the group ends there the same way, and checkpoint 2 is the one announced."""
    import trainers.loop.checkpoint as ckpt
    from tests.unit.test_checkpoint import _trainer

    t = _trainer(tmp_path)
    t.cfg.checkpoint.every_steps = 2
    events = []
    monkeypatch.setattr(t.report, "emit", events.append)
    writes, real = [], ckpt.write_checkpoint

    def write(directory, payload):
        writes.append(directory)
        if len(writes) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(directory, payload)

    monkeypatch.setattr(ckpt, "write_checkpoint", write)
    t.run()  # returns: no exception reaches Ray Train
    assert [os.path.basename(w) for w in writes] == ["checkpoint_step00000002", "checkpoint_step00000004"]
    (failed,) = [e for e in events if isinstance(e, StorageFailed)]
    assert failed.step == 6 and failed.code == errno.ENOSPC and "checkpoint_step00000004" in failed.path
    assert failed.checkpoint.endswith("checkpoint_step00000002")
    saved = [e.step for e in events if type(e).__name__ == "CheckpointSaved"]
    assert saved == [2]  # the failed one is never announced
    assert t.state.step == 6


def test_the_driver_ends_the_run_with_one_line_and_the_resume_command(tmp_path, monkeypatch):
    from tests.unit.test_phases import _runner

    def full(m, phase):
        m.push(
            [(1, {"workers": 1.0}, 1.0)],
            [
                PhaseStart(phase=phase, workers=1, step=0, resumed=False, threads=1, entered=1.0, built=1.0),
                FirstStep(step=1, phase=phase),
                StorageFailed(
                    step=40,
                    path="/d/elastic-abc/checkpoint_step00000040",
                    code=errno.ENOSPC,
                    free=0,
                    message="the checkpoint storage is full (No space left on device) writing "
                    "/d/elastic-abc/checkpoint_step00000040, 0 B free there",
                    fix="free space there",
                    checkpoint="/d/elastic-abc/checkpoint_step00000030",
                ),
            ],
        )
        return "ended"

    from orchestrator.run.outcome import OutOfStorage, ending

    runner, tracker, started = _runner(tmp_path, monkeypatch, {0: full}, "restart")
    end = runner.run()
    assert isinstance(end, OutOfStorage) and end.full.step == 40
    assert started == [(0, 1, False)]  # no other group
    said = ending(end, runner.resume())
    assert (said.status, said.exit_code) == ("FAILED", 1)
    assert said.message == (
        "the checkpoint storage is full (No space left on device) writing /d/elastic-abc/checkpoint_step00000040, "
        "0 B free there; training stopped at step 40 without restarting (a restart would write into the same "
        "storage); the newest checkpoint is /d/elastic-abc/checkpoint_step00000030; free space there, then: "
        f"{cli()} resume abc --tracking-uri mem://"
    )
    assert np.isfinite(runner.book.t_start)
