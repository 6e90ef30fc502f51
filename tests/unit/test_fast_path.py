"""The GPU fast path through the real worker loop (``Trainer``) on CPU: bf16 against fp32, the compiled
model against the eager one with clean checkpoint keys, fp16's skipped steps, augmentation the
same across a resume, and the input pipeline (raw uint8 pixels normalised per batch)."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import torch

from trainers.accel.precision import LossScaler, Precision
from trainers.data.augment import Augment
from trainers.data.datasets import CIFAR_MEAN, CIFAR_STD
from trainers.data.pipeline import DeviceData, InputPipeline
from trainers.link.runtime import Runtime
from trainers.loop.config import LoopConfig
from trainers.loop.meter import ThroughputMeter
from trainers.loop.trainer import Trainer

CNN = {
    "data": {"name": "synthetic", "size": 256, "shape": [3, 8, 8]},
    "model": {"name": "cnn", "norm": "group", "hidden": 16},
    "optimizer": {"name": "sgd", "lr": 0.1, "mf": 0.9, "base_batch_size": 32},
    "batch": {"size": 32, "max_local_batch": 16},
    "train": {"epochs": 1, "seed": 3},
}

MLP = {
    "data": {"name": "digits"},
    "model": {"name": "mlp", "norm": "none", "hidden": 16},
    "optimizer": {"name": "sgd", "lr": 0.1, "mf": 0.9, "base_batch_size": 24},
    "batch": {"size": 24, "max_local_batch": 8, "policy": "noise_scale", "check_every": 1000},
    "train": {"epochs": 1},
}


def _with(raw: dict, **sections) -> dict:
    out = {k: dict(v) for k, v in raw.items()}
    for name, values in sections.items():
        out.setdefault(name, {}).update(values)
    return out


def _trainer(raw: dict, runtime: Runtime | None = None) -> Trainer:
    return Trainer(LoopConfig.model_validate(raw), runtime or Runtime(), rank=0, world=1, device=torch.device("cpu"))


def _steps(t: Trainer, sizes) -> list[float]:
    rng = np.random.default_rng(0)
    return [t.train_step(rng.permutation(t.plan.n)[:n]) for n in sizes]


# --------------------------------------------------------------------------- precision


def test_bf16_loss_within_2e2_of_fp32_through_the_loop():
    fp32 = _trainer(CNN)
    bf16 = _trainer(_with(CNN, train={"precision": "bf16"}))
    dtypes = []
    bf16.learner.model.register_forward_hook(lambda m, i, out: dtypes.append(out.dtype))
    a, b = _steps(fp32, [32] * 3), _steps(bf16, [32] * 3)
    assert dtypes and set(dtypes) == {torch.bfloat16}, "the forward ran under bf16 autocast"
    assert all(p.dtype == torch.float32 for p in bf16.learner.params), "parameters stay fp32"
    np.testing.assert_allclose(b, a, atol=2e-2)
    assert a != b  # not the same computation by accident
    ev = bf16.evaluate()
    assert np.isfinite(ev["val/loss"]) and abs(ev["val/loss"] - fp32.evaluate()["val/loss"]) < 2e-2


def _fp16_on_cpu(t: Trainer, init_scale: float = 2.0**10) -> Precision:
    """fp16's scaler path without the CPU refusal (GradScaler itself runs on CPU), fp32 compute."""
    p = Precision("fp32", "cpu")
    p.scaler = LossScaler("cpu", init_scale=init_scale)
    t.learner.prec = p
    t.checkpoints.states["precision"] = p
    return p


def test_fp16_skipped_step_trains_nothing_counts_no_samples_and_is_logged():
    t = _trainer(MLP)
    prec = _fp16_on_cpu(t)
    backward, poison = prec.backward, {"at": 2}

    def backward_then_poison(loss):  # the 2nd step's gradients hold a NaN (an fp16 overflow)
        backward(loss)
        if t.state.step + 1 == poison["at"]:
            t.learner.params[0].grad.view(-1)[0] = float("nan")

    prec.backward = backward_then_poison
    meter = t.report.meter = ThroughputMeter(10, 0)
    t.advance()
    assert (t.state.samples_seen, t.learner.gns.count, prec.skipped_steps) == (24, 1, 0)
    before = [p.detach().clone() for p in t.learner.params]
    _, metrics = t.advance()
    assert (t.state.step, t.state.cursor) == (2, 48), "the data order moves on"
    assert t.state.samples_seen == 24 and meter._samples == 24, "a skipped step adds no samples"
    assert t.learner.gns.count == 1, "and no noise estimate"
    assert all(torch.equal(a, b) for a, b in zip(before, t.learner.params)), "and leaves the weights alone"
    assert metrics["amp/skipped_steps"] == 1.0 and metrics["amp/loss_scale"] == 2.0**9
    t.advance()
    assert (t.state.samples_seen, t.learner.gns.count, prec.skipped_steps) == (48, 2, 1)
    assert t.checkpoints.state_dict()["precision"]["skipped_steps"] == 1


def test_fp16_noise_statistics_match_the_unscaled_run():
    """The noise probe reads S * g before unscaling; its statistics come out as without scaling."""
    plain, scaled = _trainer(MLP), _trainer(MLP)
    _fp16_on_cpu(scaled, init_scale=2.0**8)
    a, b = _steps(plain, [24, 24, 24]), _steps(scaled, [24, 24, 24])
    np.testing.assert_allclose(b, a, rtol=1e-5)
    for k, v in plain.learner.gns.state_dict().items():
        assert scaled.learner.gns.state_dict()[k] == pytest.approx(v, rel=1e-4), k


# --------------------------------------------------------------------------- compile


def test_compiled_loop_matches_eager_within_1e4_and_checkpoints_clean_keys(tmp_path):
    """Dynamo + AOTAutograd with the eager backend (no C compiler, no processes); uneven batches
    (dynamic shapes) and the W=1 noise probe's micro-batch cut."""
    eager = _trainer(MLP)
    runtime = Runtime(storage=str(tmp_path), run_prefix="elastic-c", run_name="elastic-c")
    compiled = _trainer(_with(MLP, train={"compile": True, "compile_backend": "aot_eager"}), runtime)
    assert type(compiled.learner.model).__name__ == "OptimizedModule"
    a, b = _steps(eager, [24, 20, 17]), _steps(compiled, [24, 20, 17])
    np.testing.assert_allclose(b, a, atol=1e-4)
    for pa, pb in zip(eager.learner.params, compiled.learner.params):
        torch.testing.assert_close(pb, pa, atol=1e-4, rtol=0)
    keys = list(compiled.checkpoints.state_dict()["model"])
    assert keys == list(eager.work.model.state_dict())
    assert not any(k.startswith(("_orig_mod.", "module.")) or "_orig_mod" in k for k in keys)
    compiled.state.step = 3
    path = compiled.save_checkpoint()
    assert list(torch.load(os.path.join(path, "state.pt"), weights_only=True)["model"]) == keys
    fresh = _trainer(_with(MLP, train={"compile": True, "compile_backend": "aot_eager"}), runtime)
    assert fresh.restore() is True
    for pa, pb in zip(compiled.learner.params, fresh.learner.params):
        assert torch.equal(pa, pb)
    eager_again = _trainer(MLP, runtime)  # a compiled run's checkpoint loads into an eager one
    assert eager_again.restore() is True and torch.equal(eager_again.learner.params[0], compiled.learner.params[0])


# --------------------------------------------------------------------------- augmentation and inputs


class Recorder:
    """Wraps the loop's input pipeline and keeps each training sample's model input by (epoch, id)."""

    def __init__(self, inner):
        self.inner, self.seen = inner, {}

    def __call__(self, x, ids=None, epoch=0):
        out = self.inner(x, ids, epoch)
        if ids is not None:
            for i, row in zip(np.asarray(ids).tolist(), out):
                self.seen[(epoch, i)] = row.detach().clone()
        return out


AUG = _with(
    MLP,
    data={"augment": ["random_crop", "hflip"], "crop_padding": 2},
    batch={"size": 100, "max_local_batch": 30, "policy": "fixed"},
    optimizer={"base_batch_size": 100},
    train={"epochs": 2, "push_every_s": 0},
    checkpoint={"every_steps": 8, "keep": 100},
)


def test_augmentation_is_the_same_across_a_resume(tmp_path):
    runtime = Runtime(storage=str(tmp_path), run_prefix="elastic-a", run_name="elastic-a")
    first = _trainer(AUG, runtime)
    first.learner.inputs = Recorder(first.learner.inputs)
    first.run()
    whole = first.learner.inputs.seen
    assert len(whole) == 2 * first.plan.n and first.state.epoch == 2
    raw = first.work.tensors.train_x
    changed = sum(not torch.equal(whole[(0, i)], raw[i]) for i in range(first.plan.n))
    assert changed > first.plan.n // 2, "the inputs were augmented"
    assert sum(not torch.equal(whole[(0, i)], whole[(1, i)]) for i in range(first.plan.n)) > first.plan.n // 2
    # resume at step 8 (mid-epoch: 15 steps an epoch): drop the newer checkpoints
    folder = os.path.join(str(tmp_path), "elastic-a")
    for name in os.listdir(folder):
        if name.startswith("checkpoint_step") and int(name[len("checkpoint_step") :][:8]) > 8:
            shutil.rmtree(os.path.join(folder, name))
    again = _trainer(AUG, runtime)
    again.learner.inputs = Recorder(again.learner.inputs)
    again.run()
    assert again.state.epoch == 2
    resumed = again.learner.inputs.seen
    assert len(resumed) == 2 * first.plan.n - 8 * 100
    for key, x in resumed.items():
        assert torch.equal(x, whole[key]), key


def test_input_pipeline_matches_device_data_and_is_none_when_idle():
    g = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 256, (40, 3, 8, 8), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (40,), generator=g)
    aug = Augment(["random_crop", "hflip"], seed=5)
    dd = DeviceData(raw, y, "cpu", CIFAR_MEAN, CIFAR_STD, channels_last=True)
    pipe = InputPipeline("cpu", mean=CIFAR_MEAN, std=CIFAR_STD, channels=3, channels_last=True, augment=aug)
    ids = np.array([4, 9, 9, 31])
    want, _ = dd.batch(ids, aug, epoch=2)
    got = pipe(raw[ids], ids, 2)
    assert torch.equal(got, want) and got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(pipe(raw[ids]), dd.batch(ids)[0]), "no ids: validation, no augmentation"
    assert InputPipeline.build(device="cpu", mean=None, std=None, channels=3, channels_last=False, augment=None) is None


def test_channels_last_loop_matches_nchw():
    a = _trainer(CNN)
    b = _trainer(_with(CNN, model={"channels_last": True}))
    conv = next(m for m in b.learner.model.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    np.testing.assert_allclose(_steps(b, [32, 32]), _steps(a, [32, 32]), rtol=1e-4)


# --------------------------------------------------------------------------- the recipe


def test_the_cifar10_resnet50_recipe_loads_and_asks_for_the_fast_path(tmp_path):
    from orchestrator.config.prepare import load_config
    from orchestrator.record.params import flatten, public_config
    from tests.unit.test_data import _write_tiny_cifar

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    _write_tiny_cifar(str(tmp_path))
    cfg = load_config(os.path.join(root, "configs", "cifar10_resnet50.yaml"), [f"data.root={tmp_path}"])
    assert (cfg.model.name, cfg.model.norm, cfg.model.sync_bn, cfg.model.channels_last) == (
        "resnet50",
        "batch",
        False,
        True,
    )
    assert (cfg.optimizer.name, cfg.optimizer.mf) == ("sgd", 0.9)
    assert (cfg.schedule.scaling_rule, cfg.schedule.warmup, cfg.schedule.decay) == ("linear", "gradual", "cosine")
    assert (cfg.train.precision, cfg.data.device, cfg.data.augment, cfg.data.val_split) == (
        "bf16",
        "accelerator",
        ["random_crop", "hflip"],
        "test",
    )
    assert (cfg.scaling.min_workers, cfg.scaling.max_workers, cfg.scaling.use_gpu) == (1, 8, True)
    assert cfg.batch.size == 8 * cfg.batch.max_local_batch  # one micro-batch a GPU at 8, accumulation below
    params = flatten(public_config(cfg))  # what MLflow logs as the run's params
    for key in (
        "train.precision",
        "train.compile",
        "model.channels_last",
        "data.device",
        "data.augment",
        "data.val_split",
    ):
        assert key in params
