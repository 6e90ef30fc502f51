"""Adversarial learning for large batches: ConAdv (Liu et al., "Concurrent Adversarial Learning
for Large-Batch Training", ICLR 2022, arXiv 2106.00221) and its two-pass baseline.

``train.adversarial.method``:

* ``none``: plain training.
* ``sync`` (the paper's DisAdv, two sequential passes): the perturbation of batch t is computed
  with the current weights w_t, then the weight gradient on the perturbed batch.
* ``conadv``: the perturbation of batch t+1 is computed with the weights of step t (stale by one,
  tau = 1), so that it and the weight gradient of batch t do not depend on each other and run
  side by side (a second CUDA stream on a GPU; on the CPU one after the other, see below).

The formulas (x a sample's model input after the input pipeline: augmentation, normalisation;
l the per-sample training loss; eps = ``epsilon``, K = ``steps``, alpha = eps / K):

    delta_0     = 0
    delta_{k+1} = clip_[-eps, eps]( delta_k + alpha * sign( grad_x l(w_s; x + delta_k, y) ) )
    x_hat       = x + delta_K                 (K = 1: FGSM, x + eps * sign(grad_x l(w_s; x, y)))

with w_s = w_t for ``sync`` and w_s = w_{t-1} for ``conadv`` (the perturbation is an L-infinity
ball projection of signed input-gradient steps, in the units of the model's input).  The weights
are updated on a mix of the clean and the adversarial loss, c = ``clean_weight``:

    g_t = (1/B) sum_i [ c * grad_w l(w_t; x_i, y_i) + (1 - c) * grad_w l(w_t; x_hat_i, y_i) ]

Source caveat: the paper's own text could not be read where this was written (only its abstract
and summaries); the signed-gradient L-inf step, tau = 1 and the clean + adversarial update follow
the paper as recalled, not a quotation, and ``clean_weight`` lets either reading be run.
The paper trains on both the clean and the adversarial examples (as AdvProp does); the default
c = 1/2 is their mean, which keeps the gradient at the scale the LR was tuned for (their plain sum
is 2x this gradient: the same as c = 1/2 at twice the LR); c = 0 trains on the adversarial
examples only (then the clean forward is skipped and ``train/loss`` is the adversarial loss).  Both
terms are normalised by the global batch B as every gradient here is; with c > 0 the clean and
the perturbed samples go through the model as one batch of 2b per micro-batch, and ``train/loss``
stays the clean loss, comparable with ``method: none``.

The perturbation pass runs on a snapshot of the weights and buffers through
``torch.func.functional_call``: the model's BatchNorm statistics and the optimizer never see it, and
the input gradient accumulates nothing into ``.grad``.  ``conadv`` keeps the snapshot of w_t (the
stale weights) and the perturbation it computed for the next batch; both go in the checkpoint
(``adversarial``), so a resume is exact.  The next batch is known ahead for the built-in in-memory
sets (the data order is a function of epoch and position); where it is not (a map-style
DataLoader, a batch size that changed, a rollback), the perturbation of batch t is computed at step
t from the stale snapshot w_{t-1}: the same formula, only not overlapped.

On the CPU the two parts run one after the other.  A second thread did not pay where it was
measured (2 shared cores, load average ~7; the bench CNN at B = 512, median of 12): in sequence with
one torch thread 276 ms per step's pair of parts, in two Python threads 443 ms (one torch thread
each) or 521 ms (two); and a thread would need its own copy of the module, since
``functional_call`` swaps the module's parameters in place while it runs.  The CUDA side stream
has no such problem: one host thread launches both parts, in a fixed order, so the RNG use is the
same as in sequence.

A model whose input is not floating point (token ids: the text LM) has no input gradient; the
config check refuses it (``orchestrator/config/rules.py``) and this module raises the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.func import functional_call

from trainers.loop.config import AdversarialConfig
from trainers.workload.build import LossFn, StepBatch, summed_loss, to_device

Perturbations = list[torch.Tensor]  # one per micro-batch of this rank


def perturbation(
    model: torch.nn.Module,
    state: dict[str, torch.Tensor],
    loss_fn: LossFn,
    x: torch.Tensor,
    y: Any,
    epsilon: float,
    steps: int,
    autocast: Callable[[], Any],
) -> torch.Tensor:
    """delta_K of the module docstring for one micro-batch, with the weights and buffers ``state``."""
    if not x.is_floating_point():
        raise TypeError(
            f"train.adversarial: the model input is {x.dtype}, which has no gradient (token ids?); "
            "set train.adversarial.method: none"
        )
    alpha = epsilon / steps
    delta = torch.zeros_like(x)
    for _ in range(steps):
        delta.requires_grad_(True)
        with autocast():
            loss = summed_loss(loss_fn, functional_call(model, state, (x + delta,)), y)
        (g,) = torch.autograd.grad(loss, delta)
        delta = (delta.detach() + alpha * g.sign()).clamp_(-epsilon, epsilon)
    return delta.detach()


class Adversary:
    """A step's perturbations (``for_step``), the pending one for the next batch, the stale weights."""

    def __init__(
        self,
        cfg: AdversarialConfig,
        model: torch.nn.Module,
        loss_fn: LossFn,
        autocast: Callable[[], Any],
        inputs: Callable[..., Any] | None,
        device: torch.device,
    ) -> None:
        self.cfg, self.model, self.loss_fn, self.autocast = cfg, model, loss_fn, autocast
        self.inputs, self.device = inputs, device
        self.concurrent = cfg.method == "conadv"
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" and self.concurrent else None
        self.stale: dict[str, torch.Tensor] | None = None  # conadv: the weights and buffers of the last step
        # conadv: the next batch's global ids, this rank's micro-batch ids, their perturbations
        self.pending: tuple[np.ndarray, list[np.ndarray], Perturbations] | None = None
        self.on_perturb: Callable[[dict[str, torch.Tensor], np.ndarray], None] | None = None  # tests

    def snapshot(self) -> dict[str, torch.Tensor]:
        """The model's weights and buffers now, copied (the model moves on; the snapshot does not)."""
        named = [*self.model.named_parameters(), *self.model.named_buffers()]
        return {n: t.detach().clone() for n, t in named}

    def _inputs(self, batch: StepBatch, epoch: int) -> Iterator[tuple[torch.Tensor, Any]]:
        for i, (x, y) in enumerate(batch.micro):
            x, y = to_device(x, self.device), to_device(y, self.device)
            if self.inputs is not None:
                x = self.inputs(x, batch.micro_ids[i], epoch)
            yield x, y

    def compute(self, state: dict[str, torch.Tensor], batch: StepBatch, epoch: int) -> Perturbations:
        """This rank's perturbations of ``batch`` with the weights ``state``."""
        if self.on_perturb is not None:
            self.on_perturb(state, batch.ids)
        c = self.cfg
        return [
            perturbation(self.model, state, self.loss_fn, x, y, c.epsilon, c.steps, self.autocast)
            for x, y in self._inputs(batch, epoch)
        ]

    def for_step(self, batch: StepBatch, epoch: int) -> Perturbations:
        """The perturbations that step t trains ``batch`` (batch t) with: sync computes them now with
        w_t; conadv takes the ones computed at step t-1 with w_{t-1} (or computes them now from the
        stale snapshot w_{t-1}; at the first step there is none older than w_t)."""
        if not self.concurrent:  # the live weights (nothing moves them before the backward), copied buffers
            live = {n: p.detach() for n, p in self.model.named_parameters()}
            live.update((n, t.detach().clone()) for n, t in self.model.named_buffers())
            return self.compute(live, batch, epoch)
        pending, self.pending = self.pending, None
        if pending is not None and _same_slices(pending[0], pending[1], batch):
            return pending[2]
        return self.compute(self.stale if self.stale is not None else self.snapshot(), batch, epoch)

    def start_next(self, peek: Callable[[], tuple[StepBatch, int] | None]) -> None:
        """conadv, before step t's weight gradient: snapshot w_t (the next step's stale weights) and
        perturb batch t+1 with it, on the side stream on a GPU (joined by :meth:`join`)."""
        if not self.concurrent:
            return
        self.stale = self.snapshot()
        ahead = peek()
        if ahead is None:
            return
        nxt, epoch = ahead
        if self.stream is None:
            self.pending = (nxt.ids, nxt.micro_ids, self.compute(self.stale, nxt, epoch))
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # the snapshot is taken
        with torch.cuda.stream(self.stream):
            self.pending = (nxt.ids, nxt.micro_ids, self.compute(self.stale, nxt, epoch))

    def join(self) -> None:
        """The side stream's work done before the weights move (the snapshot was copied, but the
        next step reads the perturbations)."""
        if self.stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)

    # -- checkpoint ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Rank 0 writes it: another rank (or a group of another size, whose slices differ) finds
        the pending perturbations are not of its slices and computes its own from ``stale``, the
        same on every rank."""
        if self.pending is None:
            return {"stale": self.stale, "pending": None}
        ids, micro_ids, deltas = self.pending
        pending = {"ids": ids.tolist(), "micro_ids": [m.tolist() for m in micro_ids], "deltas": deltas}
        return {"stale": self.stale, "pending": pending}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        stale = state.get("stale")
        self.stale = None if stale is None else {k: v.to(self.device) for k, v in stale.items()}
        p = state.get("pending")
        self.pending = (
            None
            if p is None
            else (
                np.asarray(p["ids"], dtype=np.int64),
                [np.asarray(m, dtype=np.int64) for m in p["micro_ids"]],
                [d.to(self.device) for d in p["deltas"]],
            )
        )


def _same_slices(ids: np.ndarray, micro_ids: list[np.ndarray], batch: StepBatch) -> bool:
    """The pending perturbations are of ``batch`` and of this rank's micro-batches of it."""
    return (
        np.array_equal(ids, batch.ids)
        and len(micro_ids) == len(batch.micro_ids)
        and all(np.array_equal(a, b) for a, b in zip(micro_ids, batch.micro_ids, strict=True))
    )
