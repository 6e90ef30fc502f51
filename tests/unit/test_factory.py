"""Factories: every bad input is one ValueError that starts with the field; probe() runs the contract."""

from __future__ import annotations

import textwrap

import pytest
import torch

from trainers.workload.factory import (
    BATCHNORM_WARNING,
    FactoryError,
    build_datasets,
    build_model,
    check_dataset_size,
    check_loss_output,
    cross_entropy,
    probe,
    qualified_name,
    resolve,
    resolve_loss,
    token_cross_entropy,
)

GOOD = """
import torch
from torch import nn


class Pairs(torch.utils.data.Dataset):
    def __init__(self, n, d=4, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, d, generator=g)
        self.y = (self.x.sum(1) > 0).long()

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def data(n=32, d=4):
    return Pairs(n, d, 0), Pairs(8, d, 1)


def model(d=4, hidden=8, bn=False):
    layers = [nn.Linear(d, hidden)]
    if bn:
        layers.append(nn.BatchNorm1d(hidden))
    return nn.Sequential(*layers, nn.ReLU(), nn.Linear(hidden, 2))


def mean_loss(out, y):
    return torch.nn.functional.cross_entropy(out, y)


def per_sample_loss(out, y):
    return torch.nn.functional.cross_entropy(out, y, reduction="none") * 2.0


def not_a_pair():
    return Pairs(4)


def lists():
    return [1, 2, 3], [4]


def not_a_module():
    return "model"


def raises(**kw):
    raise RuntimeError("no GPU here")


def bad_forward():
    return nn.Linear(3, 2)


class Wrapper:
    @staticmethod
    def build():
        return nn.Linear(4, 2)


NUMBER = 3
"""


@pytest.fixture()
def pkg(tmp_path, monkeypatch):
    """A package ``userpkg`` with a good module, a broken one, and one needing a missing dependency."""
    root = tmp_path / "src"
    (root / "userpkg").mkdir(parents=True)
    (root / "userpkg" / "__init__.py").write_text("")
    (root / "userpkg" / "good.py").write_text(textwrap.dedent(GOOD))
    (root / "userpkg" / "broken.py").write_text("x = 1 / 0\n")
    (root / "userpkg" / "needs_dep.py").write_text("import surely_not_installed_pkg\n")
    (root / "userpkg" / "syntax.py").write_text("def f(:\n")
    monkeypatch.syspath_prepend(str(root))
    return "userpkg"


def one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    assert isinstance(exc.value, ValueError)
    return msg


def test_path_without_colon(pkg):
    with pytest.raises(FactoryError) as e:
        resolve("userpkg.good.model", "model.factory")
    assert one_line(e).startswith("model.factory: 'userpkg.good.model' is not of the form 'package.module:function'")
    with pytest.raises(FactoryError, match="^data.factory: "):
        resolve("userpkg.good:", "data.factory")


def test_module_that_cannot_be_imported_says_how_to_fix(pkg):
    with pytest.raises(FactoryError) as e:
        resolve("not_my_pkg.models:build", "model.factory")
    msg = one_line(e)
    assert msg.startswith("model.factory: cannot import 'not_my_pkg.models'")
    assert "PYTHONPATH" in msg and "pip install -e" in msg and "code.py_modules" in msg
    with pytest.raises(FactoryError, match="^model.factory: cannot import 'userpkg.nope'"):
        resolve("userpkg.nope:build", "model.factory")


def test_module_that_raises_on_import_names_the_exception(pkg):
    with pytest.raises(FactoryError) as e:
        resolve("userpkg.broken:model", "model.factory")
    assert one_line(e) == (
        "model.factory: importing 'userpkg.broken' raised ZeroDivisionError: division by zero; "
        "fix the module so that it imports cleanly (python -c 'import userpkg.broken')"
    )
    with pytest.raises(FactoryError) as e:  # a missing dependency is the module raising, not a path problem
        resolve("userpkg.needs_dep:model", "data.factory")
    msg = one_line(e)
    assert msg.startswith("data.factory: importing 'userpkg.needs_dep' raised ModuleNotFoundError")
    assert "surely_not_installed_pkg" in msg
    with pytest.raises(FactoryError, match="^model.factory: importing 'userpkg.syntax' raised SyntaxError"):
        resolve("userpkg.syntax:f", "model.factory")


def test_missing_attribute_suggests_the_nearest_name(pkg):
    with pytest.raises(FactoryError) as e:
        resolve("userpkg.good:modle", "model.factory")
    assert one_line(e) == "model.factory: 'userpkg.good' has no attribute 'modle'; did you mean 'model'?"
    with pytest.raises(FactoryError) as e:
        resolve("userpkg.good:zzzzzz", "model.factory")
    assert (
        one_line(e)
        == "model.factory: 'userpkg.good' has no attribute 'zzzzzz'; name a function defined in userpkg.good"
    )


def test_not_callable(pkg):
    with pytest.raises(FactoryError) as e:
        resolve("userpkg.good:NUMBER", "model.factory")
    assert one_line(e) == (
        "model.factory: 'userpkg.good:NUMBER' is a int, not a callable; name the function (or class) that builds it"
    )


def test_dotted_attribute_and_callables_resolve(pkg):
    assert isinstance(build_model("userpkg.good:Wrapper.build"), torch.nn.Linear)
    fn = lambda: torch.nn.Linear(1, 1)  # noqa: E731
    assert resolve(fn, "model.factory") is fn
    assert qualified_name(fn) is None
    assert qualified_name(resolve("userpkg.good:model", "model.factory")) == "userpkg.good:model"
    assert qualified_name(cross_entropy) == "trainers.workload.factory:cross_entropy"


def test_wrong_return_types_name_field_and_expectation(pkg):
    with pytest.raises(FactoryError) as e:
        build_datasets("userpkg.good:not_a_pair")
    msg = one_line(e)
    assert msg.startswith("data.factory: returned Pairs, expected a (train, val) pair of map-style datasets")
    assert "__len__" in msg and "__getitem__" in msg
    with pytest.raises(FactoryError, match=r"^data.factory: train\[0\] is a int, expected an \(input, target\)"):
        build_datasets("userpkg.good:lists")
    with pytest.raises(FactoryError) as e:
        build_model("userpkg.good:not_a_module")
    assert one_line(e) == "model.factory: returned str, expected a torch.nn.Module; return the model itself"
    with pytest.raises(FactoryError, match="^data.factory: train is a int without __len__/__getitem__"):
        build_datasets(lambda: (1, 2))
    with pytest.raises(FactoryError, match="^data.factory: the val dataset is empty"):
        build_datasets(lambda: ([(1, 2)], []))


def test_factory_that_raises_or_gets_wrong_params(pkg):
    with pytest.raises(FactoryError) as e:
        build_model("userpkg.good:raises")
    assert one_line(e) == (
        "model.factory: the factory raised RuntimeError: no GPU here; fix the factory or the values in model.params"
    )
    with pytest.raises(FactoryError) as e:
        build_model("userpkg.good:model", {"hiden": 3})
    msg = one_line(e)
    # the field to fix is model.params, with the nearest name the function takes
    assert msg == "model.params: model() takes no argument 'hiden'; did you mean hidden? (it takes d, hidden, bn)", msg
    with pytest.raises(FactoryError) as e:
        build_model("userpkg.good:model", {"widht": 3})
    assert one_line(e) == (
        "model.params: model() takes no argument 'widht'; remove it from model.params (it takes d, hidden, bn)"
    )


def test_dataset_smaller_than_global_batch(pkg):
    train, _ = build_datasets("userpkg.good:data", {"n": 10})
    check_dataset_size(train, 10)
    with pytest.raises(FactoryError) as e:
        check_dataset_size(train, 11)
    assert one_line(e).startswith("data.factory: the training set has 10 samples, fewer than the global batch of 11")
    with pytest.raises(FactoryError, match="^data.factory: the training set has 32 samples"):
        probe("userpkg.good:model", "userpkg.good:data", global_batch=64)


def test_loss_must_return_one_value_per_sample(pkg):
    with pytest.raises(FactoryError) as e:
        probe("userpkg.good:model", "userpkg.good:data", "userpkg.good:mean_loss")
    assert one_line(e).startswith("model.loss: returned shape [] for 2 samples, expected [2]")
    with pytest.raises(FactoryError, match=r"^model.loss: returned float, expected a tensor of shape \[3\]"):
        check_loss_output(1.0, 3)
    assert probe("userpkg.good:model", "userpkg.good:data", "userpkg.good:per_sample_loss") is None


def test_loss_names(pkg):
    assert resolve_loss(None) is cross_entropy
    assert resolve_loss("token_cross_entropy") is token_cross_entropy
    with pytest.raises(FactoryError, match="^model.loss: 'mse' is neither one of"):
        resolve_loss("mse")
    with pytest.raises(FactoryError, match="^model.loss: 'userpkg.good' has no attribute 'mean_los'"):
        resolve_loss("userpkg.good:mean_los")


def test_builtin_losses_are_per_sample():
    logits, y = torch.randn(5, 3), torch.tensor([0, 1, 2, 0, 1])
    assert torch.allclose(cross_entropy(logits, y).mean(), torch.nn.functional.cross_entropy(logits, y))
    tok, ty = torch.randn(4, 6, 7), torch.randint(0, 7, (4, 6))
    per_seq = token_cross_entropy(tok, ty)
    assert per_seq.shape == (4,)
    want = torch.stack([torch.nn.functional.cross_entropy(tok[i], ty[i]) for i in range(4)])
    assert torch.allclose(per_seq, want)


def test_probe_passes_a_good_workload_and_warns_on_batchnorm(pkg):
    assert probe("userpkg.good:model", "userpkg.good:data", model_params={"hidden": 4}, data_params={"n": 16}) is None
    warning = probe("userpkg.good:model", "userpkg.good:data", model_params={"bn": True})
    assert warning == BATCHNORM_WARNING and "per micro-batch" in warning


def test_probe_reports_a_forward_that_fails(pkg):
    with pytest.raises(FactoryError) as e:
        probe("userpkg.good:bad_forward", "userpkg.good:data")
    assert one_line(e).startswith("model.factory: forward on two training samples failed: RuntimeError")


class Unloadable(torch.nn.Module):
    """A state dict holding a plain object: torch.load(weights_only=True) refuses it."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.lin(x)

    def state_dict(self, *a, **kw):
        sd = super().state_dict(*a, **kw)
        sd["meta"] = Unloadable.Meta()
        return sd

    class Meta:
        pass


def test_probe_reports_a_state_dict_that_weights_only_cannot_load(pkg):
    with pytest.raises(FactoryError) as e:
        probe(Unloadable, "userpkg.good:data")
    assert one_line(e).startswith("model.factory: the state dict does not survive torch.save/torch.load(weights_only")


def test_name_and_factory_are_mutually_exclusive():
    from orchestrator.config.rules import check_combinations
    from orchestrator.config.schema import ConfigError, validate

    check_combinations(validate({"model": {"name": "cnn"}}))
    check_combinations(validate({"model": {"factory": "a.b:c"}}))
    with pytest.raises(ConfigError) as e:
        check_combinations(validate({"data": {"name": "digits", "factory": "pkg.data:build"}}))
    assert one_line(e) == (
        "data.factory: give either data.name ('digits') or data.factory ('pkg.data:build'), "
        "not both; remove one of them"
    )
