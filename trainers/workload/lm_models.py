"""Language models for the built-in ``text`` workload: a small GPT and an LSTM.

Both map token ids ``[b, T]`` (int64, vocabulary 256 by default: bytes) to next-token logits
``[b, T, V]``, to be trained with :func:`trainers.workload.factory.token_cross_entropy`.

* :class:`GPT`: a decoder-only causal transformer in the GPT-2 layout (Radford et al. 2019):
  learned token and position embeddings, pre-LayerNorm blocks ``x + attn(ln(x))``,
  ``x + mlp(ln(x))`` with a 4x GELU MLP, a final LayerNorm and an output head tied to the token
  embedding (Press & Wolf 2017).  Attention is PyTorch's
  ``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)`` (fused kernels where
  available).  Weights ~ N(0, 0.02); the two residual output projections of each block are
  scaled by ``1/sqrt(2 * n_layer)`` (GPT-2's scheme, keeps the residual stream's variance flat).
* :class:`LSTMLM`: embedding, ``n_layer`` LSTM layers, a linear head: the model family on which
  LEGW (You et al. 2018, "Large-Batch Training for LSTM and Beyond") studied warmup scaling.

Neither depends on the rank or world size; no BatchNorm, so results do not depend on how a
batch is cut into micro-batches.  See docs/architecture.md ("workloads").
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from trainers import catalog


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: ``softmax(q k^T / sqrt(d_head) + causal mask) v``."""

    def __init__(self, d_model: int, n_head: int, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % n_head:
            fit = max(n_head, d_model - d_model % n_head)
            raise ValueError(
                f"model.params: d_model ({d_model}) must be a multiple of n_head ({n_head}); set "
                f"model.params d_model to {fit} or n_head to a divisor of {d_model}"
            )
        self.n_head, self.dropout = n_head, dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        shape = (b, t, self.n_head, d // self.n_head)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))  # [b, h, t, d_head]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """A pre-LN transformer block: ``x + attn(ln1(x))`` then ``x + mlp(ln2(x))``."""

    def __init__(self, d_model: int, n_head: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A small causal transformer; ``forward(ids [b, T]) -> logits [b, T, vocab_size]`` with ``T <= context``."""

    def __init__(
        self,
        n_layer: int = 4,
        n_head: int = 6,
        d_model: int = 192,
        context: int = 128,
        vocab_size: int = 256,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.context = context
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(context, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d_model, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.head.weight = self.tok.weight  # weight tying
        self.apply(self._init)
        for block in self.blocks:
            for proj in (block.attn.proj, block.mlp[2]):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        if t > self.context:
            raise ValueError(f"sequence of {t} tokens is longer than the model's context {self.context}")
        pos = torch.arange(t, device=ids.device)
        x = self.drop(self.tok(ids) + self.pos(pos))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class LSTMLM(nn.Module):
    """Embedding, ``n_layer`` LSTM layers, linear head: ``forward(ids [b, T]) -> logits [b, T, V]``."""

    def __init__(
        self, d_embed: int = 64, hidden: int = 256, n_layer: int = 2, vocab_size: int = 256, dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_embed)
        self.lstm = nn.LSTM(
            d_embed, hidden, num_layers=n_layer, batch_first=True, dropout=dropout if n_layer > 1 else 0.0
        )
        self.head = nn.Linear(hidden, vocab_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(ids))
        return self.head(out)


def gpt(
    n_layer: int = 4,
    n_head: int = 6,
    d_model: int = 192,
    context: int = 128,
    vocab_size: int = 256,
    dropout: float = 0.0,
) -> GPT:
    """Factory for ``model.name: gpt`` (defaults: about 1.9M parameters at context 128)."""
    return GPT(n_layer=n_layer, n_head=n_head, d_model=d_model, context=context, vocab_size=vocab_size, dropout=dropout)


def lstm(d_embed: int = 64, hidden: int = 256, n_layer: int = 2, vocab_size: int = 256, dropout: float = 0.0) -> LSTMLM:
    """Factory for ``model.name: lstm``."""
    return LSTMLM(d_embed=d_embed, hidden=hidden, n_layer=n_layer, vocab_size=vocab_size, dropout=dropout)


LM_MODELS = {catalog.GPT.name: gpt, catalog.LSTM.name: lstm}
