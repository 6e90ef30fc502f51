"""The built-in language models: shapes, causality, weight tying, and a tiny GPT that learns bytes."""

from __future__ import annotations

import math

import pytest
import torch

from trainers.data.text import load_text
from trainers.workload.factory import probe, token_cross_entropy
from trainers.workload.lm_models import GPT, LM_MODELS, gpt, lstm


@pytest.mark.parametrize("name", sorted(LM_MODELS))
def test_shapes(name):
    model = LM_MODELS[name](
        **({"n_layer": 2, "n_head": 2, "d_model": 32, "context": 16} if name == "gpt" else {"d_embed": 8, "hidden": 16})
    )
    ids = torch.randint(0, 256, (3, 16))
    assert model(ids).shape == (3, 16, 256)
    assert model(ids[:, :5]).shape == (3, 5, 256)


@pytest.mark.parametrize("name", sorted(LM_MODELS))
def test_a_later_token_never_changes_earlier_logits(name):
    torch.manual_seed(0)
    model = LM_MODELS[name](
        **({"n_layer": 2, "n_head": 4, "d_model": 32, "context": 12} if name == "gpt" else {"d_embed": 8, "hidden": 16})
    )
    model.eval()
    ids = torch.randint(0, 256, (2, 12))
    base = model(ids)
    for t in (0, 5, 11):
        changed = ids.clone()
        changed[:, t] = (changed[:, t] + 1) % 256
        out = model(changed)
        assert torch.allclose(out[:, :t], base[:, :t], atol=1e-6)
        assert not torch.allclose(out[:, t], base[:, t])


def test_gpt_defaults_tie_the_head_and_count_about_1_9m_parameters():
    m = gpt()
    assert m.head.weight is m.tok.weight
    n = sum(p.numel() for p in m.parameters())  # tied head: counted once
    d, layers, vocab, context = 192, 4, 256, 128
    per_block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (4 * d * d + 4 * d) + (4 * d * d + d)
    assert n == vocab * d + context * d + layers * per_block + 2 * d == 1_853_568  # lm_quickstart's ~1.9M GPT
    with pytest.raises(ValueError, match="longer than the model's context"):
        GPT(n_layer=1, n_head=1, d_model=8, context=4)(torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="^model.params: d_model"):
        gpt(n_head=5, d_model=32)


def test_builtins_pass_probe(tmp_path):
    data = lambda: load_text(context=16, cache_dir=tmp_path)  # noqa: E731
    assert probe(lambda: gpt(n_layer=1, n_head=2, d_model=16, context=16), data, "token_cross_entropy") is None
    assert probe(lambda: lstm(d_embed=8, hidden=16, n_layer=1), data, "token_cross_entropy") is None


@pytest.fixture()
def one_thread():
    """One intra-op thread: on a small shared CPU, more threads make tiny matmuls much slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_a_tiny_gpt_learns_bytes(tmp_path, one_thread):
    """A few hundred steps of a plain loop lower the byte-level loss from ln(256) clearly."""
    torch.manual_seed(0)
    train, val = load_text(context=32, cache_dir=tmp_path)
    model = gpt(n_layer=2, n_head=2, d_model=48, context=32)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    g = torch.Generator().manual_seed(0)

    def val_loss() -> float:
        model.eval()
        with torch.no_grad():
            x, y = val.__getitems__(list(range(0, len(val), max(1, len(val) // 64)))[:64])
            v = token_cross_entropy(model(x), y).mean().item()
        model.train()
        return v

    before = val_loss()
    assert abs(before - math.log(256)) < 0.3
    for _ in range(200):
        idx = torch.randint(0, len(train), (16,), generator=g).tolist()
        x, y = train.__getitems__(idx)
        loss = token_cross_entropy(model(x), y).sum() / len(idx)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    after = val_loss()
    assert after < 2.9 and before - after > 2.0, (before, after)  # perplexity from 256 to below e^2.9 ~ 18
