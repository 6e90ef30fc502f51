"""Checkpoint files: atomic write, checksum, weights-only load, corruption detected."""

import os

import pytest
import torch

from trainers.state import CorruptCheckpoint, TrainState, read_checkpoint, verify_checkpoint, write_checkpoint


def _payload():
    m = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    m(torch.randn(4, 3)).sum().backward()
    opt.step()
    return {"model": m.state_dict(), "optimizer": opt.state_dict(),
            "train": TrainState(step=7, epoch=1, cursor=96, extra={"gns": {"ema": 0.5}}).to_dict(),
            "rng": {"torch": torch.get_rng_state()}}


def test_round_trip_weights_only(tmp_path):
    p = _payload()
    d = write_checkpoint(str(tmp_path / "ckpt"), p)
    assert sorted(os.listdir(d)) == ["manifest.json", "state.pt"]
    assert not [x for x in os.listdir(tmp_path) if x.startswith(".")]  # no temp dir left behind
    back = read_checkpoint(d)
    assert TrainState.from_dict(back["train"]) == TrainState.from_dict(p["train"])
    torch.testing.assert_close(back["model"]["weight"], p["model"]["weight"])
    assert back["optimizer"]["state"][0]["momentum_buffer"].shape == (2, 3)


def test_truncated_state_is_detected(tmp_path):
    d = write_checkpoint(str(tmp_path / "ckpt"), _payload())
    f = os.path.join(d, "state.pt")
    with open(f, "r+b") as fh:
        fh.truncate(os.path.getsize(f) - 10)
    with pytest.raises(CorruptCheckpoint, match="bytes"):
        verify_checkpoint(d)


def test_flipped_byte_is_detected(tmp_path):
    d = write_checkpoint(str(tmp_path / "ckpt"), _payload())
    f = os.path.join(d, "state.pt")
    data = bytearray(open(f, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(f, "wb").write(bytes(data))
    with pytest.raises(CorruptCheckpoint, match="sha256"):
        read_checkpoint(d)


def test_missing_manifest_is_detected(tmp_path):
    d = write_checkpoint(str(tmp_path / "ckpt"), _payload())
    os.remove(os.path.join(d, "manifest.json"))
    with pytest.raises(CorruptCheckpoint, match="missing"):
        read_checkpoint(d)


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_arbitrary_objects_are_never_unpickled(tmp_path):
    d = write_checkpoint(str(tmp_path / "ckpt"), {"x": _Evil()})
    with pytest.raises(CorruptCheckpoint, match="cannot load"):
        read_checkpoint(d)


def test_prune_keeps_the_newest_checkpoints_across_phase_folders(tmp_path):
    from trainers.loop import prune_checkpoints, run_checkpoints

    run = "elastic-abc"
    layout = {run: [10, 20], f"{run}-r0p1": [30], f"{run}-r0p2": [40, 50], "elastic-other": [60]}
    for folder, steps in layout.items():
        for step in steps:
            write_checkpoint(str(tmp_path / folder / f"checkpoint_step{step:08d}"), {"step": step})
    write_checkpoint(str(tmp_path / f"{run}-r0p1" / "checkpoint_step00000030_resize"), {"step": 30})
    prune_checkpoints(str(tmp_path), run, keep=3)
    left = [os.path.relpath(p, tmp_path) for p in run_checkpoints(str(tmp_path), run)]
    assert left == [f"{run}-r0p2/checkpoint_step00000050", f"{run}-r0p2/checkpoint_step00000040",
                    f"{run}-r0p1/checkpoint_step00000030_resize"]
    assert (tmp_path / "elastic-other" / "checkpoint_step00000060").is_dir()  # another run: untouched


def test_push_interval_follows_the_step_pace_but_never_below_log_every():
    from trainers.meter import push_interval

    assert push_interval(10, 0.25, steps=10, seconds=0.02) == 125  # 500 steps/s -> a push per 0.25 s
    assert push_interval(10, 0.25, steps=10, seconds=5.0) == 10    # slow steps: every log_every steps
    assert push_interval(10, 0.0, steps=10, seconds=0.02) == 10    # time-based pushes turned off
    assert push_interval(1, 0.25, steps=3, seconds=1e-6) == 10_000  # capped
