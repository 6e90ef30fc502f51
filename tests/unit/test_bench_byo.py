"""bench/byo.py compares two data paths on the same model and samples: its factories must give
exactly the built-in synthetic set and the built-in CNN."""

import torch

from bench.byo import Pairs, cnn, synthetic_pairs
from trainers.data.config import DataConfig, DatasetInfo
from trainers.data.datasets import load_data
from trainers.data.sampler import fetch
from trainers.workload.config import ModelConfig
from trainers.workload.models import build_model


def test_synthetic_pairs_are_the_built_in_split():
    train, val = synthetic_pairs(size=300, shape=[1, 8, 8], classes=10, seed=3)
    d = load_data(DataConfig(name="synthetic", size=300, shape=[1, 8, 8], num_classes=10), 3)
    assert isinstance(train, Pairs) and len(train) == d.num_train and len(val) == int(d.val_y.shape[0])
    x, y = fetch(train, [5, 0, 7])  # the DataLoader path's batched __getitems__
    assert torch.equal(x, d.train_x[[5, 0, 7]]) and torch.equal(y, d.train_y[[5, 0, 7]])
    assert torch.equal(train[4][0], d.train_x[4]) and int(val[2][1]) == int(d.val_y[2])


def test_cnn_factory_is_the_built_in_cnn():
    torch.manual_seed(0)
    a = cnn(shape=[1, 8, 8], classes=10, hidden=16)
    torch.manual_seed(0)
    b = build_model(DatasetInfo((1, 8, 8), 10), ModelConfig(name="cnn", hidden=16, norm="group"))
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert a(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
