"""Checkpoints: the format (atomic, durable, checksummed, weights-only), discovery across phase
folders, pruning, fallback past corrupt ones, the manager's registered components, format 1."""

import hashlib
import json
import os
import socket

import numpy as np
import pytest
import torch

import trainers.loop.checkpoint as ckpt
import trainers.loop.storage as storage
from trainers.loop.checkpoint import (
    CheckpointManager,
    CorruptCheckpoint,
    PendingRecords,
    RNGState,
    StateAdapter,
    prune_checkpoints,
    read_checkpoint,
    run_checkpoints,
    verify_checkpoint,
    write_checkpoint,
)
from trainers.loop.config import CheckpointConfig
from trainers.policies.batching import BatchConfig, build_batch_policy
from trainers.policies.noise import GradientNoiseScale
from trainers.policies.plan import TrainState
from trainers.policies.schedules import AutoWarmup, ScheduleConfig

RUN = "elastic-abc"


def _payload():
    m = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    m(torch.randn(4, 3)).sum().backward()
    opt.step()
    return {
        "model": m.state_dict(),
        "optimizer": opt.state_dict(),
        "train": TrainState(step=7, epoch=1, cursor=96).state_dict(),
        "noise": {"ema": 0.5},
        "rng": {"torch": torch.get_rng_state()},
    }


# --------------------------------------------------------------------------- the format


def test_round_trip_weights_only(tmp_path):
    p = _payload()
    d = write_checkpoint(str(tmp_path / "ckpt"), p)
    assert sorted(os.listdir(d)) == ["manifest.json", "state.pt"]
    assert not [x for x in os.listdir(tmp_path) if x.startswith(".")]  # no temp dir left behind
    back = read_checkpoint(d)
    assert back["train"] == p["train"] and back["noise"] == {"ema": 0.5}
    torch.testing.assert_close(back["model"]["weight"], p["model"]["weight"])
    assert back["optimizer"]["state"][0]["momentum_buffer"].shape == (2, 3)
    assert json.load(open(os.path.join(d, "manifest.json")))["format"] == ckpt.FORMAT_VERSION == 2


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


def test_write_fsyncs_state_manifest_and_folder_before_the_rename_and_the_parent_after(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(src)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    d = write_checkpoint(str(tmp_path / "run" / "checkpoint_step00000001"), {"x": torch.zeros(3)})
    (at,) = [i for i, e in enumerate(events) if e[0] == "replace"]
    tmp = events[at][1]
    before = {p for _, p in events[:at]}
    after = {p for _, p in events[at + 1 :]}
    assert {os.path.join(tmp, "state.pt"), os.path.join(tmp, "manifest.json"), tmp} <= before
    assert os.path.dirname(d) in after


def test_unknown_future_format_is_corrupt(tmp_path):
    d = write_checkpoint(str(tmp_path / "ckpt"), _payload())
    m = os.path.join(d, "manifest.json")
    manifest = json.load(open(m))
    json.dump(dict(manifest, format=99), open(m, "w"))
    with pytest.raises(CorruptCheckpoint, match="unknown checkpoint format 99"):
        verify_checkpoint(d)
    json.dump({k: v for k, v in manifest.items() if k != "format"}, open(m, "w"))
    with pytest.raises(CorruptCheckpoint, match="unknown checkpoint format None"):
        verify_checkpoint(d)


def test_a_manifest_that_is_not_an_object_is_corrupt(tmp_path):
    d = write_checkpoint(str(tmp_path / "ckpt"), _payload())
    open(os.path.join(d, "manifest.json"), "w").write("[1, 2]")
    with pytest.raises(CorruptCheckpoint, match="unreadable manifest"):
        read_checkpoint(d)


def test_an_unreadable_state_file_is_corrupt_not_a_crash(tmp_path, monkeypatch):
    d = write_checkpoint(str(tmp_path / "ckpt"), _payload())
    real_open = open

    def no_permission(path, *a, **k):
        if str(path).endswith("state.pt"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr(storage, "open", no_permission, raising=False)  # we run as root: chmod would not stop a read
    with pytest.raises(CorruptCheckpoint, match="cannot read state.pt"):
        read_checkpoint(d)


def test_a_state_that_is_not_a_mapping_is_corrupt(tmp_path):
    d = write_checkpoint(str(tmp_path / "ckpt"), [1, 2])
    with pytest.raises(CorruptCheckpoint, match="not a mapping"):
        read_checkpoint(d)


# --------------------------------------------------------------------------- discovery and pruning


def test_prune_keeps_the_newest_checkpoints_across_phase_folders(tmp_path):
    layout = {RUN: [10, 20], f"{RUN}-r0p1": [30], f"{RUN}-r0p2": [40, 50], "elastic-other": [60]}
    for folder, steps in layout.items():
        for step in steps:
            write_checkpoint(str(tmp_path / folder / f"checkpoint_step{step:08d}"), {"step": step})
    write_checkpoint(str(tmp_path / f"{RUN}-r0p1" / "checkpoint_step00000030_resize"), {"step": 30})
    prune_checkpoints(str(tmp_path), RUN, keep=3)
    left = [os.path.relpath(p, tmp_path) for p in run_checkpoints(str(tmp_path), RUN)]
    assert left == [
        f"{RUN}-r0p2/checkpoint_step00000050",
        f"{RUN}-r0p2/checkpoint_step00000040",
        f"{RUN}-r0p1/checkpoint_step00000030_resize",
    ]
    assert (tmp_path / "elastic-other" / "checkpoint_step00000060").is_dir()  # another run: untouched


def test_keep_below_two_is_refused_naming_the_field():
    from orchestrator.config.schema import ConfigError, validate

    with pytest.raises(ValueError, match="checkpoint.keep: 1 leaves no older checkpoint to fall back to"):
        CheckpointConfig(keep=1)
    with pytest.raises(ConfigError) as e:
        validate({"checkpoint": {"keep": 1}})
    assert str(e.value).startswith("checkpoint.keep: 1 leaves no older checkpoint")
    assert CheckpointConfig().keep == 2


# --------------------------------------------------------------------------- the manager


class _Channel:
    """The reporter's side of PendingRecords."""

    def __init__(self, records=()):
        self.records, self.replayed = [list(r) for r in records], None

    def pending(self):
        return self.records

    def replay(self, records):
        self.replayed = records


class _Box:
    """A component with a plain state."""

    def __init__(self, **state):
        self.state = dict(state)

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state):
        self.state = dict(state)


def _states(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    gns = GradientNoiseScale(0.95)
    holder = {"B": 32}
    return {
        "model": model,
        "optimizer": opt,
        "train": TrainState(step=seed),
        "rng": RNGState(torch.device("cpu")),
        "batch": StateAdapter(lambda: {"size": holder["B"]}, lambda s: holder.update(B=s["size"])),
        "noise": gns,
        "reporter": PendingRecords(_Channel([[seed, {"train/loss": 0.5}, 1.0]])),
    }, holder


def _manager(tmp_path, states, run_name=RUN, **kw):
    return CheckpointManager(states, storage=str(tmp_path), run_prefix=RUN, run_name=run_name, **kw)


def test_manager_round_trip_of_registered_components(tmp_path):
    states, holder = _states(0)
    states["noise"].update(small_sq=2.0, b_small=8.0, big_sq=1.0, b_big=32.0)
    states["train"].step, states["train"].cursor, holder["B"] = 12, 96, 48
    rng = torch.get_rng_state()
    m = _manager(tmp_path, states)
    path = m.save(12)
    assert path == str(tmp_path / RUN / "checkpoint_step00000012")
    assert set(read_checkpoint(path)) == {"model", "optimizer", "train", "rng", "batch", "noise", "reporter"}

    torch.manual_seed(123)  # move the generator on
    fresh, fresh_holder = _states(1)
    assert _manager(tmp_path, fresh).load() is True
    torch.testing.assert_close(fresh["model"].weight, states["model"].weight)
    torch.testing.assert_close(
        fresh["optimizer"].state_dict()["state"][0]["momentum_buffer"],
        states["optimizer"].state_dict()["state"][0]["momentum_buffer"],
    )
    assert fresh["train"] == TrainState(step=12, cursor=96)
    assert fresh_holder["B"] == 48
    assert fresh["noise"].state_dict() == states["noise"].state_dict()
    assert fresh["reporter"].channel.replayed == [[0, {"train/loss": 0.5}, 1.0]]
    assert torch.equal(torch.get_rng_state(), rng)


def test_a_component_the_checkpoint_lacks_keeps_its_fresh_state(tmp_path):
    states, _ = _states(0)
    del states["noise"]  # a run without a noise estimator registers none
    _manager(tmp_path, states).save(5)
    fresh, _ = _states(1)
    fresh["noise"].update(small_sq=2.0, b_small=8.0, big_sq=1.0, b_big=32.0)
    before = fresh["noise"].state_dict()
    assert _manager(tmp_path, fresh).load()
    assert fresh["noise"].state_dict() == before and fresh["train"].step == 0


def test_manager_refuses_a_component_without_state_dict(tmp_path):
    with pytest.raises(TypeError, match="'B'"):
        _manager(tmp_path, {"B": 32})


def test_manager_finds_the_newest_checkpoint_across_phase_folders(tmp_path):
    for run_name, step in ((RUN, 10), (f"{RUN}-r0p1", 30), (f"{RUN}-r0p2", 20), ("elastic-other", 99)):
        _manager(tmp_path, {"t": _Box(step=step)}, run_name=run_name, keep=5).save(step)
    box = _Box()
    m = _manager(tmp_path, {"t": box}, run_name=f"{RUN}-r0p3")
    assert m.load() and box.state == {"step": 30}
    assert [os.path.basename(p) for p in m.checkpoints()] == [
        "checkpoint_step00000030",
        "checkpoint_step00000020",
        "checkpoint_step00000010",
    ]


def test_nothing_to_restore(tmp_path):
    assert _manager(tmp_path, {"t": _Box()}).load() is False
    m = CheckpointManager({"t": _Box()}, storage="", run_prefix="", run_name="")
    assert m.load() is False and m.save(3) == "checkpoint_step00000003" and not m.writing


def test_only_the_writer_writes(tmp_path):
    m = _manager(tmp_path, {"t": _Box(x=1)}, writer=False)
    assert m.save(4, resize=True) == "checkpoint_step00000004_resize"
    assert not os.path.exists(tmp_path / RUN)


def test_save_prunes_the_run_to_keep(tmp_path):
    m = _manager(tmp_path, {"t": _Box()}, keep=2)
    for step in (1, 2, 3):
        m.save(step)
    assert [os.path.basename(p) for p in m.checkpoints()] == ["checkpoint_step00000003", "checkpoint_step00000002"]


def _truncate(path):
    state = os.path.join(path, "state.pt")
    with open(state, "r+b") as f:
        f.truncate(os.path.getsize(state) // 2)


def test_corrupt_newest_falls_back_with_a_warning(tmp_path):
    m = _manager(tmp_path, {"t": _Box()}, keep=3)
    for step in (10, 20):
        m.states["t"].state = {"step": step}
        m.save(step)
    _truncate(str(tmp_path / RUN / "checkpoint_step00000020"))
    warnings, box = [], _Box()
    assert _manager(tmp_path, {"t": box}, warn=warnings.append).load()
    assert box.state == {"step": 10}
    assert "skipping corrupt checkpoint" in warnings[0] and "checkpoint_step00000020" in warnings[0]
    assert "resumed from older checkpoint" in warnings[1] and "checkpoint_step00000010" in warnings[1]


def test_every_checkpoint_corrupt_is_an_error(tmp_path):
    _manager(tmp_path, {"t": _Box()}).save(10)
    _truncate(str(tmp_path / RUN / "checkpoint_step00000010"))
    with pytest.raises(CorruptCheckpoint, match="no intact checkpoint"):
        _manager(tmp_path, {"t": _Box()}, warn=lambda _: None).load()


def test_unknown_format_and_unreadable_state_fall_back(tmp_path, monkeypatch):
    m = _manager(tmp_path, {"t": _Box(step=0)}, keep=5)
    for step in (10, 20, 30):
        m.states["t"].state = {"step": step}
        m.save(step)
    manifest = tmp_path / RUN / "checkpoint_step00000030" / "manifest.json"
    manifest.write_text(json.dumps(dict(json.loads(manifest.read_text()), format=3)))
    real_open = open
    bad = str(tmp_path / RUN / "checkpoint_step00000020" / "state.pt")

    def no_permission(path, *a, **k):
        if str(path) == bad:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr(storage, "open", no_permission, raising=False)
    warnings, box = [], _Box()
    assert _manager(tmp_path, {"t": box}, warn=warnings.append).load()
    assert box.state == {"step": 10}
    assert "unknown checkpoint format 3" in warnings[0] and "Permission denied" in warnings[1]


def test_the_writer_moves_a_damaged_checkpoint_aside_and_says_where(tmp_path):
    """Skipped once, never again: the damaged newest checkpoint goes to quarantine/ (kept for a
    person to look at), pruning does not count it, the next restore does not try it; the warning
    and the callback name it, why, and where it is now.  A reader that does not write leaves it."""
    m = _manager(tmp_path, {"t": _Box(step=0)}, keep=2)
    for step in (10, 20):
        m.states["t"].state = {"step": step}
        m.save(step)
    damaged = str(tmp_path / RUN / "checkpoint_step00000020")
    _truncate(damaged)
    warnings = []
    assert _manager(tmp_path, {"t": _Box()}, writer=False, warn=warnings.append).load()
    assert os.path.isdir(damaged) and "moved to" not in warnings[0]
    warnings, told, box = [], [], _Box()
    m2 = _manager(tmp_path, {"t": box}, keep=2, warn=warnings.append, quarantined=lambda *a: told.append(a))
    assert m2.load() and box.state == {"step": 10}
    moved = str(tmp_path / RUN / "quarantine" / "checkpoint_step00000020")
    assert not os.path.exists(damaged) and os.path.isfile(os.path.join(moved, "state.pt"))
    assert warnings[0].startswith("skipping corrupt checkpoint: ") and warnings[0].endswith(f"; moved to {moved}")
    assert told == [(damaged, told[0][1], moved)] and "bytes, manifest says" in told[0][1]
    m2.save(15)  # keep = 2: the damaged one is not counted, 10 stays
    assert [os.path.basename(p) for p in m2.checkpoints()] == ["checkpoint_step00000015", "checkpoint_step00000010"]
    _truncate(str(tmp_path / RUN / "checkpoint_step00000015"))
    m3 = _manager(tmp_path, {"t": _Box()}, warn=warnings.append)
    assert m3.load() and os.path.isdir(str(tmp_path / RUN / "quarantine" / "checkpoint_step00000015"))
    m3.save(20)
    _truncate(str(tmp_path / RUN / "checkpoint_step00000020"))
    assert _manager(tmp_path, {"t": _Box()}, warn=warnings.append).load()
    assert os.path.isdir(moved + "-2"), "a second damaged checkpoint of the same name is kept beside the first"


def test_known_corrupt_checkpoints_do_not_count_towards_keep(tmp_path, monkeypatch):
    """Resumed at 10 past a corrupt 20 that could not be moved aside: saving 15 must not delete 10,
    the only other intact one."""

    def cannot_move(path):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(ckpt, "quarantine_checkpoint", cannot_move)
    m = _manager(tmp_path, {"t": _Box(step=0)}, keep=2)
    for step in (10, 20):
        m.save(step)
    _truncate(str(tmp_path / RUN / "checkpoint_step00000020"))
    m2 = _manager(tmp_path, {"t": _Box()}, keep=2, warn=lambda _: None)
    assert m2.load()
    m2.save(15)
    names = [os.path.basename(p) for p in m2.checkpoints()]
    assert names == ["checkpoint_step00000020", "checkpoint_step00000015", "checkpoint_step00000010"]
    m2.save(20)  # passing the corrupt one's step writes over it; now it counts again
    names = [os.path.basename(p) for p in m2.checkpoints()]
    assert names == ["checkpoint_step00000020", "checkpoint_step00000015"]
    verify_checkpoint(m2.checkpoints()[0])


def _dead_pid() -> int:
    pid = int(open("/proc/sys/kernel/pid_max").read()) - 1
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1


def test_a_starting_writer_removes_stale_temporary_folders_of_dead_writers_on_this_host(tmp_path):
    host, dead = socket.gethostname(), _dead_pid()
    folder = tmp_path / f"{RUN}-r0p1"
    stale = [f".checkpoint_step00000010.tmp-{host}-{dead}", f".checkpoint_step00000020.tmp-{dead}"]
    kept = [
        f".checkpoint_step00000030.tmp-{host}-{os.getpid()}",  # a live writer
        f".checkpoint_step00000040.tmp-some-other-host-{dead}",
    ]  # its pid means nothing here
    for name in stale + kept:
        (folder / name).mkdir(parents=True)
        (folder / name / "state.pt").write_bytes(b"partial")
    (tmp_path / "elastic-other").mkdir()
    (tmp_path / "elastic-other" / f".checkpoint_step00000050.tmp-{host}-{dead}").mkdir()  # another run
    _manager(tmp_path, {"t": _Box()}, writer=False)
    assert sorted(os.listdir(folder)) == sorted(stale + kept)  # only a writer cleans up
    _manager(tmp_path, {"t": _Box()})
    assert sorted(os.listdir(folder)) == sorted(kept)
    assert os.listdir(tmp_path / "elastic-other")


def test_temporary_folder_names_carry_host_and_pid():
    assert (
        storage.tmp_name("checkpoint_step00000001")
        == f".checkpoint_step00000001.tmp-{socket.gethostname()}-{os.getpid()}"
    )


# --------------------------------------------------------------------------- format 1


def _write_format1(directory: str, payload: dict) -> None:
    """How checkpoints were written before components were registered (format 1)."""
    os.makedirs(directory)
    state = os.path.join(directory, "state.pt")
    torch.save(payload, state)
    digest = hashlib.sha256(open(state, "rb").read()).hexdigest()
    json.dump(
        {"format": 1, "sha256": digest, "bytes": os.path.getsize(state)},
        open(os.path.join(directory, "manifest.json"), "w"),
    )


def _policies():
    policy = build_batch_policy(BatchConfig(size=32, max_local_batch=32, policy="noise_scale"), dataset_size=1000)
    auto = AutoWarmup(ScheduleConfig(warmup="auto", decay="cosine"))
    return policy, GradientNoiseScale(0.95), auto


def test_a_format1_checkpoint_restores_into_the_components(tmp_path):
    states, holder = _states(0)
    policy, gns, auto = _policies()
    policy.changes, policy.last_change_step = 2, 40
    gns.update(small_sq=2.0, b_small=8.0, big_sq=1.0, b_big=32.0)
    for lr, loss in ((1e-5, 2.3), (2e-5, 2.2)):
        auto.record(lr, loss)
    rng = torch.get_rng_state()
    _write_format1(
        str(tmp_path / RUN / "checkpoint_step00000045"),
        {
            "model": states["model"].state_dict(),
            "optimizer": states["optimizer"].state_dict(),
            "train": {
                "step": 45,
                "epoch": 1,
                "cursor": 96,
                "samples_seen": 1440,
                "restarts": 2,
                "finished": False,
                "extra": {
                    "batch": {"size": 64, "policy": policy.state_dict()},
                    "gns": gns.state_dict(),
                    "auto_warmup": auto.state_dict(),
                },
            },
            "rng": {"torch": rng},
            "pending_metrics": [[44, {"train/loss": 0.5}, 1.0]],
        },
    )
    torch.manual_seed(7)
    fresh, fresh_holder = _states(1)
    f_policy, f_gns, f_auto = _policies()
    batch = {"size": 0}

    def load_batch(s):
        batch["size"] = s["size"]
        f_policy.load_state_dict(s["policy"])

    fresh.update(batch=StateAdapter(lambda: {}, load_batch), noise=f_gns, auto_warmup=f_auto)
    assert _manager(tmp_path, fresh).load()
    torch.testing.assert_close(fresh["model"].weight, states["model"].weight)
    assert fresh["train"] == TrainState(step=45, epoch=1, cursor=96, samples_seen=1440)
    assert batch["size"] == 64 and (f_policy.changes, f_policy.last_change_step) == (2, 40)
    assert f_gns.state_dict() == gns.state_dict() and f_auto.state_dict() == auto.state_dict()
    assert fresh["reporter"].channel.replayed == [[44, {"train/loss": 0.5}, 1.0]]
    assert torch.equal(torch.get_rng_state(), rng)


def test_a_format1_checkpoint_without_policies_or_pending_metrics(tmp_path):
    """The oldest format-1 checkpoints carry no pending_metrics; a fixed-batch run no gns."""
    _write_format1(
        str(tmp_path / RUN / "checkpoint_step00000003"),
        {
            "train": {
                "step": 3,
                "epoch": 0,
                "cursor": 3,
                "samples_seen": 3,
                "restarts": 0,
                "finished": True,
                "extra": {},
            }
        },
    )
    payload = read_checkpoint(str(tmp_path / RUN / "checkpoint_step00000003"))
    assert payload == {
        "train": {"step": 3, "epoch": 0, "cursor": 3, "samples_seen": 3, "finished": True},
        "reporter": {"records": []},
    }


# --------------------------------------------------------------------------- the worker's registration

TRAINER_CFG = {
    "data": {"name": "digits"},
    "model": {"name": "mlp", "norm": "none", "hidden": 16},
    "optimizer": {"name": "sgd", "lr": 0.1, "mf": 0.9, "base_batch_size": 24},
    "batch": {"size": 24, "max_local_batch": 24, "policy": "noise_scale", "check_every": 1000},
    "schedule": {"warmup": "auto", "decay": "cosine"},
    "train": {"epochs": 1},
}


def _trainer(tmp_path):
    from trainers.loop.config import LoopConfig
    from trainers.loop.trainer import Runtime, Trainer

    runtime = Runtime(storage=str(tmp_path), run_prefix=RUN, run_name=RUN)
    return Trainer(LoopConfig.model_validate(TRAINER_CFG), runtime, rank=0, world=1, device=torch.device("cpu"))


def _same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    elif isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b


def _trained(tmp_path):
    t = _trainer(tmp_path)
    for _ in range(2):
        t.train_step(np.arange(24))
    t.state.step, t.state.cursor, t.state.samples_seen = 2, 48, 48
    return t


@pytest.mark.parametrize("fmt", [1, 2])
def test_a_trainer_restores_what_a_trainer_saved(tmp_path, fmt):
    t = _trained(tmp_path)
    saved = t.checkpoints.state_dict()
    assert set(saved) == {"model", "optimizer", "train", "rng", "batch", "noise", "auto_warmup", "reporter", "rollback"}
    if fmt == 2:
        t.save_checkpoint()
    else:  # the same state as the loop wrote it before components were registered
        _write_format1(
            str(tmp_path / RUN / "checkpoint_step00000002"),
            {
                "model": saved["model"],
                "optimizer": saved["optimizer"],
                "rng": saved["rng"],
                "pending_metrics": saved["reporter"]["records"],
                "train": dict(
                    saved["train"],
                    restarts=0,
                    extra={"batch": saved["batch"], "gns": saved["noise"], "auto_warmup": saved["auto_warmup"]},
                ),
            },
        )
    torch.manual_seed(99)
    fresh = _trainer(tmp_path)
    assert fresh.restore() is True
    _same(fresh.checkpoints.state_dict(), saved)


# --------------------------------------------------------------------------- written beside the loop


def _write_held_back(monkeypatch):
    """``write_checkpoint`` waits until the returned event is set (a slow store), then writes."""
    import threading

    go, real = threading.Event(), ckpt.write_checkpoint

    def held(directory, payload):
        assert go.wait(10), "the test never released the write"
        return real(directory, payload)

    monkeypatch.setattr(ckpt, "write_checkpoint", held)
    return go


def test_a_checkpoint_written_beside_the_loop_holds_the_state_of_its_step(tmp_path, monkeypatch):
    states, _ = _states(0)
    states["train"].step = 7
    m = _manager(tmp_path, states)
    go = _write_held_back(monkeypatch)
    saved = states["model"].weight.detach().clone()
    m.save_beside(7)
    assert m.take_written() == []  # still being written: nothing to announce
    with torch.no_grad():  # the loop's next steps change the parameters in place
        states["model"].weight.add_(1.0)
    states["train"].step = 8
    go.set()
    m.settle()
    assert m.take_written() == [(7, str(tmp_path / RUN / "checkpoint_step00000007"))]
    assert m.take_written() == []  # announced once
    fresh, _ = _states(1)
    assert _manager(tmp_path, fresh).load() is True
    torch.testing.assert_close(fresh["model"].weight, saved)
    assert fresh["train"].step == 7


def test_every_other_use_of_the_manager_waits_for_the_write_beside_the_loop(tmp_path, monkeypatch):
    states, _ = _states(0)
    m = _manager(tmp_path, states)
    import threading

    go = _write_held_back(monkeypatch)
    m.save_beside(3)
    threading.Timer(0.05, go.set).start()  # the write finishes only after the listing below has begun
    assert m.checkpoints() == [str(tmp_path / RUN / "checkpoint_step00000003")]  # listed: it was waited for
    m.save(4)
    assert m.take_written() == [(3, str(tmp_path / RUN / "checkpoint_step00000003"))]


def test_a_failed_write_beside_the_loop_is_raised_at_the_next_checkpoint_not_announced(tmp_path, monkeypatch):
    states, _ = _states(0)
    m = _manager(tmp_path, states)

    def full(directory, payload):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt, "write_checkpoint", full)
    m.save_beside(5)
    m._pending[1].exception(timeout=10)  # the thread has failed
    assert m.take_written() == []  # a failure is never announced as a checkpoint
    with pytest.raises(storage.StorageFull) as info:
        m.save_beside(6)  # the next checkpoint raises it, in the loop's thread
    assert "checkpoint_step00000005" in info.value.path
    m.close()


def test_host_copy_is_independent_of_the_live_state():
    t = torch.ones(3)
    state = {"a": [t, {"b": (t, 2)}], "c": np.arange(3), "d": "x"}
    snap = ckpt.host_copy(state)
    t.add_(1)
    state["c"][0] = 9
    assert snap["a"][0].tolist() == [1.0, 1.0, 1.0] and snap["a"][1]["b"][0].tolist() == [1.0, 1.0, 1.0]
    assert snap["a"][1]["b"][1] == 2 and snap["c"].tolist() == [0, 1, 2] and snap["d"] == "x"
