import pytest
import torch

from trainers.data.config import DatasetInfo
from trainers.workload.config import ModelConfig
from trainers.workload.models import MODELS, build_model


@pytest.mark.parametrize("name", ["mlp", "cnn", "resnet18"])
@pytest.mark.parametrize("norm", ["batch", "group", "none"])
def test_models_map_inputs_to_logits(name, norm):
    info = DatasetInfo((3, 32, 32) if name.startswith("resnet") else (1, 8, 8), 10)
    m = build_model(info, ModelConfig(name=name, norm=norm, hidden=32))
    out = m(torch.randn(4, *info.shape))
    assert out.shape == (4, 10)
    has_bn = any(isinstance(x, torch.nn.modules.batchnorm._BatchNorm) for x in m.modules())
    assert has_bn == (norm == "batch")


def test_resnet50_keeps_32x32_resolution_in_stem():
    m = build_model(DatasetInfo((3, 32, 32), 10), ModelConfig(name="resnet50"))
    assert m.conv1.stride == (1, 1) and isinstance(m.maxpool, torch.nn.Identity)
    assert m(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_registry_lists_required_models():
    assert {"mlp", "cnn", "resnet18", "resnet50"} <= set(MODELS)
