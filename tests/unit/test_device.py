import pytest
import torch
from torch import nn

from orchestrator.config.rules import check_fast_path
from orchestrator.config.schema import ConfigError, validate
from trainers.accel.device import (
    clean_state_dict,
    compile_model,
    load_clean_state_dict,
    strip_prefixes,
    to_channels_last,
    unwrap_model,
)
from trainers.data.augment import Augment
from trainers.data.config import DatasetInfo
from trainers.data.datasets import CIFAR_MEAN, CIFAR_STD
from trainers.data.pipeline import DeviceData, Prefetcher
from trainers.workload.config import ModelConfig
from trainers.workload.models import build_model


def _cnn():
    torch.manual_seed(0)
    return build_model(DatasetInfo((3, 8, 8), 10), ModelConfig(name="cnn", hidden=32, norm="group"))


def test_channels_last_converts_weights_and_keeps_outputs():
    ref = _cnn()
    m = to_channels_last(_cnn())
    conv = next(x for x in m.modules() if isinstance(x, nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    x = torch.randn(4, 3, 8, 8)
    assert torch.allclose(m(x.contiguous(memory_format=torch.channels_last)), ref(x), atol=1e-5)


def _fast_path(shape=(3, 8, 8), *, model="cnn", channels_last=False, device="host", use_gpu=False, precision="bf16"):
    """``orchestrator/config/rules.py check_fast_path`` on a config of synthetic data shaped ``shape``."""
    check_fast_path(
        validate(
            {
                "data": {"name": "synthetic", "shape": list(shape), "device": device},
                "model": {"name": model, "channels_last": channels_last},
                "scaling": {"use_gpu": use_gpu},
                "train": {"precision": precision},
            }
        )
    )


def test_channels_last_refuses_a_non_image_model_naming_the_field():
    mlp = build_model(DatasetInfo((1, 8, 8), 10), ModelConfig(name="mlp"))
    with pytest.raises(ValueError, match=r"^model\.channels_last: Sequential has no Conv2d"):
        to_channels_last(mlp)
    with pytest.raises(ConfigError, match=r"^model\.channels_last: needs 4-D image batches"):
        _fast_path([64], channels_last=True)
    with pytest.raises(ConfigError, match=r"^model\.channels_last: mlp has no Conv2d layer"):
        _fast_path(model="mlp", channels_last=True)
    _fast_path([3, 32, 32], channels_last=True)
    _fast_path([64], model="mlp")


def test_data_device_accelerator_needs_gpus():
    with pytest.raises(ConfigError, match=r"^data\.device: accelerator .* needs scaling\.use_gpu: true"):
        _fast_path(device="accelerator")
    _fast_path(device="accelerator", use_gpu=True)
    _fast_path(device="host")


def test_device_data_gives_the_cpu_paths_normalised_batch():
    g = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 256, (50, 3, 8, 8), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (50,), generator=g)
    # the host path (trainers/data/datasets.py's CIFAR loader): whole set to float, normalised, then indexed
    mean, std = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1), torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
    host = (raw.float() / 255.0 - mean) / std
    dd = DeviceData(raw, y, "cpu", CIFAR_MEAN, CIFAR_STD, channels_last=True)
    assert dd.x.dtype == torch.uint8 and len(dd) == 50
    ids = [7, 3, 3, 49, 0]
    xb, yb = dd.batch(ids)
    assert xb.dtype == torch.float32 and xb.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(xb, host[ids], atol=1e-6) and torch.equal(yb, y[ids])
    # float data is kept as float32 and only normalised
    f = DeviceData(host, y, "cpu")
    assert f.x.dtype == torch.float32 and torch.equal(f.batch(ids)[0], host[ids])


def test_device_data_augments_raw_pixels_before_normalising():
    raw = torch.full((4, 3, 8, 8), 200, dtype=torch.uint8)
    dd = DeviceData(raw, torch.zeros(4, dtype=torch.long), "cpu", CIFAR_MEAN, CIFAR_STD)
    aug = Augment(["random_crop"], seed=0)
    xb, _ = dd.batch([0, 1, 2, 3], augment=aug, epoch=1)
    expected = dd.normalize(aug(raw, torch.arange(4), 1))
    assert torch.equal(xb, expected)
    black = ((0.0 - torch.tensor(CIFAR_MEAN)) / torch.tensor(CIFAR_STD)).view(3, 1, 1)
    assert bool(torch.isclose(xb, black).any())  # some padding came in, black in raw pixels


def test_device_data_checks_its_inputs():
    with pytest.raises(ValueError, match="differ in length"):
        DeviceData(torch.zeros(3, 1, 2, 2), torch.zeros(2), "cpu")
    with pytest.raises(ValueError, match="one per channel"):
        DeviceData(torch.zeros(3, 3, 2, 2), torch.zeros(3), "cpu", mean=[0.1, 0.2])


def test_strip_prefixes_only_when_every_key_has_them():
    sd = {"_orig_mod.module.a.weight": 1, "_orig_mod.module.b": 2}
    assert strip_prefixes(sd) == {"a.weight": 1, "b": 2}
    assert strip_prefixes({"module.a": 1, "head.b": 2}) == {"module.a": 1, "head.b": 2}
    assert strip_prefixes({}) == {}


def test_compiled_model_matches_eager_and_checkpoints_clean_keys():
    """Dynamo + AOTAutograd with the eager backend (no C compiler, no processes); the inductor
    version is tests/integration/test_compile.py."""
    eager = _cnn()
    compiled = compile_model(_cnn(), dynamic=True, backend="aot_eager")
    assert unwrap_model(compiled) is compiled._orig_mod
    for n in (5, 3):  # uneven slices: dynamic shapes
        x = torch.randn(n, 3, 8, 8)
        a, b = eager(x), compiled(x)
        assert torch.allclose(a, b, atol=1e-4)
        a.square().sum().backward()
        b.square().sum().backward()
    for pa, pb in zip(eager.parameters(), unwrap_model(compiled).parameters()):
        assert torch.allclose(pa.grad, pb.grad, atol=1e-4)
    assert all(k.startswith("_orig_mod.") for k in compiled.state_dict())
    clean = clean_state_dict(compiled)
    assert list(clean) == list(eager.state_dict())
    assert list(clean_state_dict(compiled.state_dict())) == list(eager.state_dict())
    fresh = compile_model(
        build_model(DatasetInfo((3, 8, 8), 10), ModelConfig(name="cnn", hidden=32, norm="group")), backend="aot_eager"
    )
    load_clean_state_dict(fresh, compiled.state_dict())  # prefixed keys
    load_clean_state_dict(eager, clean)  # clean keys into a plain model
    for pa, pb in zip(unwrap_model(fresh).parameters(), eager.parameters()):
        assert torch.equal(pa, pb)


def test_prefetcher_yields_every_batch_in_order_on_the_device():
    batches = [(torch.full((2,), i), torch.tensor([i])) for i in range(4)]
    out = list(Prefetcher(batches, "cpu"))
    assert [int(y) for _, y in out] == [0, 1, 2, 3]
    assert all(torch.equal(a, b[0]) for (a, _), b in zip(out, batches))
    assert list(Prefetcher([], "cpu")) == []


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"precision": "fp16"}, "train.precision"),
        ({"device": "accelerator"}, "data.device"),
        ({"channels_last": True, "shape": [10]}, "model.channels_last"),
    ],
)
def test_check_fast_path_names_the_field_on_cpu(kw, field):
    with pytest.raises(ConfigError) as e:
        _fast_path(**kw)
    msg = str(e.value)
    assert msg.startswith(field + ":") and "\n" not in msg
    _fast_path(**{**kw, "use_gpu": True, "channels_last": False})
