import io

import pytest
import torch
import torch.nn.functional as F

from trainers.accel.config import PRECISION_NAMES, PrecisionConfig, check_precision
from trainers.accel.precision import PRECISIONS, LossScaler, Precision
from trainers.data.config import DatasetInfo
from trainers.workload.config import ModelConfig
from trainers.workload.models import build_model


def _cnn_step(precision: str):
    """Loss of a small CNN on a fixed batch, one SGD step, and the loss after it."""
    torch.manual_seed(0)
    model = build_model(DatasetInfo((3, 16, 16), 10), ModelConfig(name="cnn", hidden=32))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 3, 16, 16, generator=g), torch.randint(0, 10, (32,), generator=g)
    prec = Precision(precision, "cpu")
    losses = []
    for _ in range(2):
        prec.begin_step()
        with prec.autocast():
            per_sample = F.cross_entropy(model(x), y, reduction="none")
        loss = per_sample.float().sum() / len(y)
        assert loss.dtype == torch.float32
        prec.backward(loss)
        prec.unscale(opt)
        assert all(p.grad.dtype == torch.float32 and p.dtype == torch.float32 for p in model.parameters())
        assert prec.step(opt) is False
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


def test_bf16_loss_within_2e2_of_fp32_on_cpu():
    fp32, bf16 = _cnn_step("fp32"), _cnn_step("bf16")
    assert fp32 != bf16  # bf16 really ran in lower precision
    for a, b in zip(fp32, bf16):
        assert abs(a - b) < 2e-2


def test_autocast_dtype_per_precision():
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with Precision("fp32", "cpu").autocast():
        assert lin(x).dtype == torch.float32
    with Precision("bf16", "cpu").autocast():
        assert lin(x).dtype == torch.bfloat16


def test_fp16_on_cpu_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"^train\.precision: fp16 needs a CUDA GPU"):
        Precision("fp16", "cpu")
    with pytest.raises(ValueError, match=r"^train\.precision: unknown 'fp8'"):
        check_precision("fp8", "cuda")
    check_precision("fp16", "cuda")  # fine on a GPU
    check_precision("bf16", "cpu")


def test_config_defaults_and_literal():
    assert PrecisionConfig().precision == "fp32"
    with pytest.raises(ValueError):
        PrecisionConfig(precision="fp8")
    assert tuple(PRECISIONS) == PRECISION_NAMES  # the config's names (torch-free) are the dtypes' keys


def _model_opt():
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 2)
    return m, torch.optim.SGD(m.parameters(), lr=0.5)


def test_loss_scaler_skips_a_step_with_inf_gradients_and_halves_the_scale():
    m, opt = _model_opt()
    s = LossScaler("cpu", init_scale=8.0)
    s.begin_step()
    s.scale(m(torch.randn(4, 3)).sum()).backward()
    m.weight.grad[0, 0] = float("inf")
    before = [p.detach().clone() for p in m.parameters()]
    assert s.step(opt) is True
    assert all(torch.equal(a, b) for a, b in zip(before, m.parameters()))
    assert s.get_scale() == 4.0
    opt.zero_grad()
    s.begin_step()
    s.scale(m(torch.randn(4, 3)).sum()).backward()
    assert s.step(opt) is False
    assert not all(torch.equal(a, b) for a, b in zip(before, m.parameters()))
    assert s.get_scale() == 4.0


def _fp16_precision_on_cpu(init_scale: float) -> Precision:
    """fp16's scaler path without the CPU refusal (GradScaler itself runs on CPU)."""
    p = Precision("bf16", "cpu")
    p.scaler = LossScaler("cpu", init_scale=init_scale)
    return p


def test_grad_factor_and_unscale_give_the_true_gradient_once():
    m, opt = _model_opt()
    x = torch.randn(4, 3)
    m(x).sum().backward()
    true = m.weight.grad.clone()
    opt.zero_grad()
    p = _fp16_precision_on_cpu(16.0)
    p.begin_step()
    p.backward(m(x).sum())
    assert torch.allclose(m.weight.grad, 16.0 * true)
    assert torch.allclose(m.weight.grad * p.grad_factor(), true)
    p.unscale(opt)
    p.unscale(opt)  # idempotent within a step
    assert torch.allclose(m.weight.grad, true)
    assert p.step(opt) is False and p.skipped_steps == 0
    assert Precision("bf16", "cpu").grad_factor() == 1.0


def test_skipped_steps_are_counted_and_checkpointed():
    m, opt = _model_opt()
    p = _fp16_precision_on_cpu(2.0**10)
    for bad in (True, False, True):
        p.begin_step()
        p.backward(m(torch.randn(2, 3)).sum())
        if bad:
            m.bias.grad[0] = float("nan")
        assert p.step(opt) is bad
        opt.zero_grad()
    assert p.skipped_steps == 2
    assert p.metrics() == {"amp/skipped_steps": 2.0, "amp/loss_scale": 2.0**8}
    buf = io.BytesIO()
    torch.save(p.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    q = _fp16_precision_on_cpu(2.0**16)
    q.load_state_dict(state)
    assert q.skipped_steps == 2 and q.scaler.get_scale() == 2.0**8
    r = Precision("bf16", "cpu")  # another precision on resume: keeps the count, ignores the scaler
    r.load_state_dict(state)
    assert r.skipped_steps == 2 and r.metrics() == {}
    assert Precision("fp32", "cpu").state_dict() == {"skipped_steps": 0, "scaler": {}}
