"""torch.compile with inductor on CPU (it runs a C compiler in subprocesses, hence not the unit tier)."""

import shutil

import pytest
import torch
import torch.nn.functional as F

from trainers.accel.device import clean_state_dict, compile_model, load_clean_state_dict, unwrap_model
from trainers.data.config import DatasetInfo
from trainers.workload.config import ModelConfig
from trainers.workload.models import build_model

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not (shutil.which("cc") or shutil.which("gcc")),
        reason="torch.compile's inductor backend needs a C compiler (cc/gcc) on CPU",
    ),
]


def _cnn():
    torch.manual_seed(0)
    return build_model(DatasetInfo((3, 8, 8), 10), ModelConfig(name="cnn", hidden=32, norm="group"))


def test_inductor_training_steps_match_eager_within_1e4_with_clean_keys():
    eager, base = _cnn(), _cnn()
    compiled = compile_model(base, dynamic=True)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (eager, base)]
    g = torch.Generator().manual_seed(1)
    for n in (6, 5, 7):  # uneven slices: dynamic shapes, no recompilation per size
        x, y = torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)
        losses = []
        for net, opt in zip((eager, compiled), opts):
            loss = F.cross_entropy(net(x), y, reduction="none").float().sum() / n
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        assert abs(losses[0] - losses[1]) < 1e-4
    for pa, pb in zip(eager.parameters(), base.parameters()):
        assert torch.allclose(pa, pb, atol=1e-4)
    keys = list(clean_state_dict(compiled))
    assert keys == list(eager.state_dict()) and not any("_orig_mod" in k for k in keys)
    fresh = _cnn()
    load_clean_state_dict(fresh, compiled.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), unwrap_model(compiled).parameters()))
