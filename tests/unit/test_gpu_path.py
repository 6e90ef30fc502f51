"""The GPU fast path on a CUDA GPU, through the real worker loop (``Trainer``): bf16 with
channels_last and the data held on the device against the fp32 loop on the CPU, fp16's real
gradient scaler skipping an overflowed step, device-side augmentation and normalisation
matching the CPU's, the host->device prefetcher, the noise-scale statistics on the device, and a
``torch.compile``d model (inductor) against the eager one.

Skipped without CUDA (this project's CI has no GPU; ``bench/gpu_checks.py`` runs them on a lent
GPU machine).  ``ELB_TEST_DEVICE=cpu`` runs them on the CPU instead, to check the tests
themselves where no GPU is at hand (fp16 then uses the same scaler on CPU)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from trainers.accel.device import compile_model, load_clean_state_dict, unwrap_model
from trainers.accel.precision import LossScaler, Precision
from trainers.data.augment import Augment
from trainers.data.config import DatasetInfo
from trainers.data.datasets import CIFAR_MEAN, CIFAR_STD
from trainers.data.pipeline import DeviceData, Prefetcher
from trainers.link.runtime import Runtime
from trainers.loop.config import LoopConfig
from trainers.loop.trainer import Trainer
from trainers.workload.config import ModelConfig
from trainers.workload.models import build_model

DEVICE = os.environ.get("ELB_TEST_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(
    DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU (bench/gpu_checks.py runs these)"
)

CNN = {
    "data": {"name": "synthetic", "size": 512, "shape": [3, 16, 16]},
    "model": {"name": "cnn", "norm": "batch", "hidden": 32},
    "optimizer": {"name": "sgd", "lr": 0.05, "mf": 0.9, "base_batch_size": 64},
    "batch": {"size": 64, "max_local_batch": 32},
    "train": {"epochs": 1, "seed": 1},
}


def _with(raw: dict, **sections) -> dict:
    out = {k: dict(v) for k, v in raw.items()}
    for name, values in sections.items():
        out.setdefault(name, {}).update(values)
    return out


def _trainer(raw: dict, device: str) -> Trainer:
    return Trainer(LoopConfig.model_validate(raw), Runtime(), rank=0, world=1, device=torch.device(device))


def _steps(t: Trainer, n: int, size: int = 64) -> list[float]:
    rng = np.random.default_rng(0)
    return [t.train_step(rng.permutation(t.plan.n)[:size]) for _ in range(n)]


def test_bf16_channels_last_on_device_data_follows_the_fp32_cpu_loop():
    ref = _trainer(CNN, "cpu")
    fast = _trainer(
        _with(
            CNN,
            model={"channels_last": True},
            data={"device": "accelerator"},
            train={"precision": "bf16"},
        ),
        DEVICE,
    )
    conv = next(m for m in fast.learner.model.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.device.type == DEVICE and conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert all(p.dtype == torch.float32 for p in fast.learner.params), "parameters stay fp32"
    a, b = _steps(ref, 4), _steps(fast, 4)
    assert all(np.isfinite(b))
    np.testing.assert_allclose(b, a, atol=3e-2)
    ev_ref, ev = ref.evaluate(), fast.evaluate()
    assert abs(ev["val/loss"] - ev_ref["val/loss"]) < 3e-2
    for p, q in zip(ref.learner.params, fast.learner.params):  # the weights moved the same way
        assert torch.allclose(p, q.detach().cpu(), atol=5e-2)


def test_fp16_scaler_skips_an_overflowed_step_and_halves_the_scale():
    raw = _with(CNN, train={"precision": "fp16"}) if DEVICE == "cuda" else CNN
    t = _trainer(raw, DEVICE)
    if DEVICE != "cuda":  # the CPU refuses fp16: the same scaler, fp32 compute
        t.learner.prec = Precision("fp32", "cpu")
        t.learner.prec.scaler = LossScaler("cpu", init_scale=2.0**16)
    prec = t.learner.prec
    assert prec.scaler is not None
    backward = prec.backward

    def backward_then_overflow(loss):
        backward(loss)
        if t.state.step + 1 == 2:
            t.learner.params[0].grad.view(-1)[0] = float("inf")

    prec.backward = backward_then_overflow
    t.advance()
    scale = prec.metrics()["amp/loss_scale"]
    before = [p.detach().clone() for p in t.learner.params]
    _, metrics = t.advance()
    assert metrics["amp/skipped_steps"] == 1.0 and metrics["amp/loss_scale"] == scale / 2
    assert all(torch.equal(a, b) for a, b in zip(before, t.learner.params)), "the skipped step moved nothing"
    t.advance()
    assert not any(torch.equal(a, b) for a, b in zip(before, t.learner.params)), "the next one trains"


def test_device_data_and_augmentation_match_the_cpu():
    g = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (64,), generator=g)
    aug = Augment(["random_crop", "hflip"], seed=4)
    on_dev = DeviceData(raw, y, DEVICE, CIFAR_MEAN, CIFAR_STD, channels_last=True)
    on_cpu = DeviceData(raw, y, "cpu", CIFAR_MEAN, CIFAR_STD, channels_last=True)
    assert on_dev.x.device.type == DEVICE and on_dev.x.dtype == torch.uint8, "kept as uint8 on the device"
    ids = np.array([5, 0, 63, 5, 17])
    for epoch in (0, 3):
        xd, yd = on_dev.batch(ids, aug, epoch)
        xc, yc = on_cpu.batch(ids, aug, epoch)
        assert xd.device.type == DEVICE and xd.is_contiguous(memory_format=torch.channels_last)
        assert torch.allclose(xd.cpu(), xc, atol=1e-5) and torch.equal(yd.cpu(), yc)
    assert not torch.allclose(on_dev.batch(ids, aug, 0)[0], on_dev.batch(ids, aug, 3)[0]), "epochs differ"


def test_prefetcher_copies_every_batch_to_the_device_in_order():
    batches = [(torch.randn(8, 3), torch.tensor([i])) for i in range(5)]
    out = list(Prefetcher(batches, DEVICE))
    assert [int(y) for _, y in out] == list(range(5))
    assert all(x.device.type == DEVICE and torch.equal(x.cpu(), b[0]) for (x, _), b in zip(out, batches))


def test_noise_statistics_on_the_device_match_the_cpu():
    raw = _with(CNN, batch={"policy": "noise_scale", "check_every": 1000, "max_size": 512})
    cpu, dev = _trainer(raw, "cpu"), _trainer(raw, DEVICE)
    np.testing.assert_allclose(_steps(dev, 3), _steps(cpu, 3), rtol=1e-3, atol=1e-4)
    a, b = cpu.learner.gns.state_dict(), dev.learner.gns.state_dict()
    assert a.keys() == b.keys()
    for k, v in a.items():
        assert b[k] == pytest.approx(v, rel=2e-2, abs=1e-6), k


def test_inductor_compiled_model_matches_eager_and_saves_clean_keys():
    info = DatasetInfo((3, 16, 16), 10)
    torch.manual_seed(0)
    eager = build_model(info, ModelConfig(name="cnn", hidden=16, norm="group")).to(DEVICE)
    compiled = compile_model(build_model(info, ModelConfig(name="cnn", hidden=16, norm="group")).to(DEVICE))
    load_clean_state_dict(compiled, eager.state_dict())
    x = torch.randn(16, 3, 16, 16, device=DEVICE)
    torch.testing.assert_close(compiled(x), eager(x), rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(compiled(x[:5]), eager(x[:5]), rtol=1e-3, atol=1e-3)  # another size: dynamic
    assert set(unwrap_model(compiled).state_dict()) == set(eager.state_dict())


def test_conadv_on_a_side_stream_matches_conadv_in_sequence():
    """ConAdv's next-batch perturbation on a second CUDA stream gives the weights the same steps in
    sequence give (the join orders the streams)."""
    raw = _with(CNN, train={"epochs": 1, "seed": 1, "adversarial": {"method": "conadv", "epsilon": 0.05}})
    side, seq = _trainer(raw, DEVICE), _trainer(raw, DEVICE)
    assert (side.learner.adversary.stream is not None) == (DEVICE == "cuda")
    seq.learner.adversary.stream = None
    for t in (side, seq):
        for _ in range(4):
            t.advance()
    for p, q in zip(side.learner.params, seq.learner.params, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
