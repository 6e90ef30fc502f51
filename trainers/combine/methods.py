"""Gradient combination (``combine.method``): the math and state of the methods that keep one model
on every rank (the ``combine`` section and each method's config rules: ``trainers/combine/config.py``).

The classes the loop calls, one per method, are in ``trainers/combine/combinations.py``; DmSGD and
DecentLaM's math is in ``trainers/combine/decentral.py``; formulas in the design's section 5 and
``docs/architecture.md``.

``mean`` (default, today's behaviour)
    DDP's all-reduce average; with the loop's loss scaling ``W / B`` the combined gradient is
    exactly the mean gradient of the global batch, whatever W is (``trainers/loop/trainer.py``).

``adasum`` (Maleki, Musuvathi, Mytkowicz et al. 2020, "Scaling distributed training with
adaptive summation", MLSys 2021)
    For two gradients ``a``, ``b`` of one layer (one parameter tensor)::

        Adasum(a, b) = (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b

    It is ``a + b`` when they are orthogonal and ``(a + b) / 2 = a`` when they are equal, so it
    behaves like a sum when the workers' gradients carry independent information and like a mean
    when they are redundant.  A zero input is the identity (``Adasum(0, b) = b``): we take the
    coefficient of a zero-norm input as 1, its term being zero anyway.

    *W inputs, any W* (:func:`adasum_tree`).  The inputs are combined level by level: at each
    level, adjacent pairs ``(x0, x1), (x2, x3), ...`` are combined, and when the count is odd
    the last one moves up to the next level unchanged; repeat until one is left.  For a power of
    two this is the balanced binary tree of Horovod's recursive halving; for other W it equals
    splitting the list at the largest power of two below its length (left: a complete tree,
    right: the rest, recursively), e.g. W=3: ``A(A(x0, x1), x2)``; W=5: ``A(A(A(x0,x1), A(x2,x3)), x4)``;
    W=6: ``A(A(A(x0,x1), A(x2,x3)), A(x4,x5))``.  Input i is rank i's, so the result depends on
    the rank order only through this fixed tree: every rank computes the same thing.

    *Distributed form* (:func:`adasum_allreduce`): every rank flattens its layers into one
    vector, ``all_gather`` brings all W vectors to every rank, and every rank runs the same tree
    per layer in float64 coefficients.  Exact and identical on all ranks (same inputs, same
    order, same arithmetic), works on gloo and NCCL alike.  Cost per rank: receives (W-1) P
    values (P parameters) and holds W P, computes O(W P); recursive doubling would move
    ~P log2 W.  For the W this product runs (a handful of workers) the simple form wins on
    clarity; a recursive-doubling version can replace it behind the same signature.

    *Gradients, not optimizer deltas.*  Horovod applies Adasum to each worker's optimizer delta
    and keeps the optimizer state local, so workers' momentum buffers differ.  Here the inputs
    are gradients and every rank then runs the *same* optimizer step on the *same* combined
    gradient, so the optimizer state stays identical on all ranks: rank 0's checkpoint is the
    whole state, a resume or resize restores it exactly, and LARS/LAMB/momentum correction work
    unchanged.  For plain SGD the two choices agree (Adasum is scale-equivariant,
    ``Adasum(c a, c b) = c Adasum(a, b)``, and the delta is ``-eta g``); with momentum the delta form
    also combines the velocity, which we give up for checkpoint exactness.

    *Each worker's input*, with micro-batch accumulation and uneven slices: the mean gradient
    over the worker's own slice of the global batch, ``g_i = (1/b_i) sum_{x in slice_i} grad l(x)``.
    The loop does not wrap the model in DDP under ``adasum`` (no all-reduce, no hook) and keeps the
    loss scaled by ``W / B`` as under ``mean``, so ``.grad = (W b_i / B) g_i``; :class:`AdasumCombiner` divides that
    factor back out.  A worker with an empty slice (B < W at an epoch's tail) contributes 0,
    which Adasum ignores.  Uneven slices are therefore weighted by Adasum's geometry, not by b_i.

    *LR rule*: no linear scaling by W.  Adasum of W parallel gradients is their mean, of W
    orthogonal ones their sum, so it already adapts its step between 1x and Wx.  The LR is the
    one tuned for one worker's batch ``b = B / W``: set ``optimizer.base_batch_size`` to the
    per-worker batch and ``schedule.scaling_rule: none`` (Horovod's Adasum guidance likewise keeps
    the single-worker LR rather than scaling it by the number of workers).  The driver's config
    check enforces the scaling rule (``AdasumRules.refuse`` in ``trainers/combine/config.py``).

    *Resize*: the result depends on the number of inputs W, by design.  A changing W (a growing
    batch policy that resizes the group, or an elastic min/max worker range) would change the
    math mid-run, so the driver's config check (``AdasumRules.refuse``) refuses those combinations:
    Adasum runs at a fixed W, and a resume at the same W continues exactly (the state is the
    optimizer's, identical on all ranks).

``local_sgd`` (Stich 2019, "Local SGD converges fast and communicates little"; with adaptive
batches: Lau, Li, Xu, Liu, Kolar 2024, "Communication-efficient adaptive batch size strategies
for distributed local gradient methods")
    Each worker steps alone on its own local batches for H = ``combine.local_steps`` steps, then
    the parameters (and, with ``combine.average_momentum``, the optimizer's per-parameter state,
    e.g. SGD's momentum buffer or Adam's moments; and always the floating buffers such as
    BatchNorm running statistics) are averaged: :class:`LocalSGD`.  What the words mean here:

    * **global batch** ``B``: the samples all workers consume in one step together, ``W x`` the
      local batch.  Each worker takes its slice ``slice_bounds(B, rank, W)`` of the same global
      batch of the same epoch permutation as under ``mean``, so **an epoch** is unchanged: the
      same data order per epoch, every sample once, whatever W and H are.  Each worker's loss is
      normalized by its own slice (its update is a local mean gradient step), not by B.
    * **samples_seen** counts global-batch samples as today (``B`` per step).
    * **LR**: the schedule's LR at the global batch B as today: averaging W local steps of LR
      eta on batches of b is, to first order in eta, one step of eta on the mean gradient of
      W b = B samples.
    * **checkpoints** only at sync points (``step % H == 0``): right after :meth:`LocalSGD.sync`
      the parameters, the averaged optimizer state and the buffers are identical on all ranks,
      so rank 0's checkpoint is the whole state and a resume (at any W) continues exactly.  A
      checkpoint that falls due between syncs (an epoch end, ``checkpoint.every_steps``) is taken
      at the next sync step (:meth:`LocalSGD.checkpoint_now`).  Without ``average_momentum`` the
      momentum buffers are per worker; they are averaged once more when a checkpoint is saved
      (:meth:`LocalSGD.average_optimizer_state`), the only difference from a run without
      checkpoints, so for an exact resume ``average_momentum: true`` is the default.
    * **the run's end and a resize** are made sync points: a save at a step that was not a sync
      (the last step, a hand-over to a group of another size) first runs :meth:`LocalSGD.sync`
      with ``checkpoint=True`` (one extra, counted sync), so the final model is the workers'
      average and the next group starts from one state.
    * **validation** between syncs scores the average model (:meth:`LocalSGD.averaged`), leaving
      each worker's own parameters as they were.
    * **the loss** is still all-reduced every step (one float64: ``train/loss`` is the global
      batch's mean loss and a non-finite loss stops every rank at the same step); the byte
      counts leave it out.  An empty slice (B < W at an epoch's tail) is a zero gradient: the
      worker's step then moves by its momentum (and weight decay) only.
    * **the norm test in its local form** (Lau et al.): at a sync, each worker's gradient of its
      last local step ``g_i`` (mean over ``b_i`` samples) gives the per-example variance
      estimate ``Var = (sum_i b_i |g_i|^2 - B |g_B|^2) / (W - 1)`` with ``g_B = sum_i b_i g_i / B``
      (``trainers/policies/noise.py`` eq. (3)), and :func:`trainers.policies.noise.norm_test` suggests the global
      batch ``ceil(Var / (eta^2 |g_B|^2))`` when ``Var / B > eta^2 |g_B|^2``.  The ``norm_test``
      batch policy (``trainers/policies/batching.py``) turns that into the next B (monotone, rounded,
      clamped); the next local batch is that B's slice.  Needs W >= 2.
    * **communication**: per-step averaging would send the gradient (P values) every step; local
      SGD sends the parameters (+ the optimizer state + buffers + the norm test's gradient) once
      per H steps.  :attr:`LocalSGD.bytes_saved` is the difference, counted as the payload each
      rank contributes to its all-reduces (the ring algorithm's wire factor ~2(W-1)/W is the same
      for both and left out).

Everything here is plain PyTorch and ``torch.distributed`` (no Ray, no MLflow).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from trainers.combine.config import CombineConfig
from trainers.combine.decentral import restored
from trainers.link import metrics as M
from trainers.policies.batching import BatchPolicy, BatchStats
from trainers.policies.decisions import BatchDecision, NoopDecision
from trainers.policies.noise import NormTestResult, norm_test

__all__ = [
    "AdasumCombiner",
    "LocalSGD",
    "SyncResult",
    "adasum_allreduce",
    "adasum_layers",
    "adasum_pair",
    "adasum_tree",
    "local_variance",
]

# --------------------------------------------------------------------------- Adasum math


def _coef(dot: torch.Tensor, sq: torch.Tensor) -> torch.Tensor:
    """``1 - dot / (2 sq)``, or 1 where ``sq == 0`` (a zero input's term is zero anyway)."""
    safe = torch.where(sq > 0, sq, torch.ones_like(sq))
    return torch.where(sq > 0, 1.0 - dot / (2.0 * safe), torch.ones_like(sq))


def adasum_pair(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(1 - a.b/(2|a|^2)) a + (1 - a.b/(2|b|^2)) b`` for one layer (Maleki et al. 2020).

    Dot product and norms in float64, the result in the inputs' dtype; a zero-norm input is the
    identity (``adasum_pair(0, b) == b``)."""
    if a.shape != b.shape:
        raise ValueError(f"adasum_pair: shapes differ, {tuple(a.shape)} vs {tuple(b.shape)}")
    a64, b64 = a.detach().reshape(-1).double(), b.detach().reshape(-1).double()
    dot = torch.dot(a64, b64)
    ca, cb = _coef(dot, torch.dot(a64, a64)), _coef(dot, torch.dot(b64, b64))
    return (ca * a64 + cb * b64).to(a.dtype).reshape(a.shape)


def adasum_tree(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Adasum of W >= 1 tensors of one layer: adjacent pairs level by level, an odd last one moving
    up unchanged (the module docstring shows W = 3, 5, 6)."""
    level = list(tensors)
    if not level:
        raise ValueError("adasum_tree: no inputs")
    while len(level) > 1:
        nxt = [adasum_pair(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0].clone()


def adasum_layers(inputs: Sequence[Sequence[torch.Tensor]]) -> list[torch.Tensor]:
    """Adasum per layer: ``inputs[i][l]`` is worker i's tensor for layer l; returns one tensor per layer."""
    if not inputs:
        raise ValueError("adasum_layers: no inputs")
    n = len(inputs[0])
    if any(len(x) != n for x in inputs):
        raise ValueError("adasum_layers: the workers give different numbers of layers")
    return [adasum_tree([x[layer] for x in inputs]) for layer in range(n)]


def _flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors]) if tensors else torch.zeros(0)


def adasum_allreduce(per_layer_tensors: Sequence[torch.Tensor], group: Any = None) -> list[torch.Tensor]:
    """The Adasum of all ranks' ``per_layer_tensors`` (same shapes and dtype on every rank),
    returned on every rank: one ``all_gather`` of the flattened layers, then :func:`adasum_layers`
    over the inputs in rank order.  Identical on all ranks; a single process returns a copy."""
    tensors = list(per_layer_tensors)
    world = dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1
    if world == 1:
        return [t.detach().clone() for t in tensors]
    flat = _flatten(tensors).contiguous()
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat, group=group)
    sizes = [t.numel() for t in tensors]
    inputs = [[piece.reshape(t.shape) for piece, t in zip(g.split(sizes), tensors)] for g in gathered]
    return adasum_layers(inputs)


class AdasumCombiner:
    """The explicit collective the loop calls after backward (all micro-batches under ``no_sync()``),
    before the optimizer steps: replaces each parameter's ``.grad`` with the Adasum of the workers'
    mean gradients.

    ``loss_scale`` is the factor the loop multiplied each per-sample loss sum by (``W / B``), so
    ``.grad / (loss_scale * b_i)`` is this worker's mean gradient over its ``b_i`` samples; an empty
    slice (``b_i = 0``) or a missing ``.grad`` contributes zeros.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], group: Any = None, buffers: Iterable[torch.Tensor] = ()):
        self.params = [p for p in params if p.requires_grad]
        self.group = group
        self.buffers = [b for b in buffers if b.is_floating_point()]

    @torch.no_grad()
    def combine(self, local_count: int, loss_scale: float) -> None:
        factor = 0.0 if local_count <= 0 else 1.0 / (loss_scale * local_count)
        inputs = [torch.zeros_like(p) if (p.grad is None or local_count <= 0) else p.grad * factor for p in self.params]
        for p, g in zip(self.params, adasum_allreduce(inputs, self.group)):
            p.grad = g
        self.sync_buffers()

    @torch.no_grad()
    def sync_buffers(self) -> None:
        """Rank 0's floating buffers (BatchNorm running statistics) on every rank, as DDP's
        ``broadcast_buffers`` does under ``mean``: the model rank 0 saves is every rank's."""
        world = dist.get_world_size(self.group) if dist.is_available() and dist.is_initialized() else 1
        if world > 1:
            for b in self.buffers:
                dist.broadcast(b, src=0, group=self.group)


# --------------------------------------------------------------------------- local SGD


def local_variance(b: Sequence[float], sq: Sequence[float], big_sq: float) -> float | None:
    """Per-example variance from ``n >= 2`` gradients ``g_i`` over ``b_i`` samples and their weighted
    mean ``g_B``: ``(sum_i b_i |g_i|^2 - B |g_B|^2) / (n - 1)`` (``trainers/policies/noise.py`` eq. (3));
    ``None`` for fewer than two non-empty inputs."""
    pairs = [(float(bi), float(si)) for bi, si in zip(b, sq) if bi > 0]
    if len(pairs) < 2:
        return None
    total = sum(bi for bi, _ in pairs)
    return (sum(bi * si for bi, si in pairs) - total * float(big_sq)) / (len(pairs) - 1)


@dataclass(frozen=True)
class SyncResult:
    """What one :meth:`LocalSGD.sync` did: the step, the bytes this rank sent, and the local norm
    test's answer for the current global batch (``None`` when not asked or not estimable)."""

    step: int
    bytes_sent: int
    norm_test: NormTestResult | None = None
    variance: float | None = None


def _per_param_state(optimizer: torch.optim.Optimizer, p: torch.Tensor) -> list[torch.Tensor]:
    """The optimizer's floating tensors for ``p`` that have its shape (momentum buffer, Adam's moments)."""
    st = optimizer.state.get(p, {})
    return [
        v
        for _, v in sorted(st.items(), key=lambda kv: str(kv[0]))
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.shape == p.shape
    ]


class LocalSGD:
    """Local SGD's bookkeeping and its sync (see the module docstring).

    ``should_sync(step)``: ``step`` is the number of optimizer steps done (1 after the first), and a
    sync follows every H-th.  ``sync`` averages parameters, floating buffers and (optionally) the
    optimizer's per-parameter state, runs the local norm test when ``norm_test_eta`` is set, and
    counts ``syncs``, ``bytes_sent`` and the baseline ``bytes_per_step_baseline`` (one gradient per
    step, what per-step averaging would send); ``bytes_saved`` is their difference.
    """

    def __init__(self, cfg: CombineConfig, norm_test_eta: float | None = None):
        if cfg.method != "local_sgd":
            raise ValueError(f"combine.method: LocalSGD needs 'local_sgd', got {cfg.method!r}")
        self.H = cfg.H
        self.average_momentum = cfg.averages_momentum
        self.norm_test_eta = norm_test_eta
        self.syncs = 0
        self.bytes_sent = 0
        self.bytes_baseline = 0
        self.last_sync_step = 0
        self.suggested: int | None = None  # the last sync's norm-test batch (checkpointed: read after it)
        self._checkpoint_due = False  # a checkpoint fell due between syncs; taken at the next one

    def should_sync(self, step: int) -> bool:
        return step > 0 and step % self.H == 0

    @property
    def bytes_saved(self) -> int:
        return self.bytes_baseline - self.bytes_sent

    def metrics(self) -> dict[str, float]:
        return {
            M.COMBINE_SYNCS: float(self.syncs),
            M.COMBINE_BYTES_SAVED: float(self.bytes_saved),
            M.COMBINE_BYTES_SENT: float(self.bytes_sent),
        }

    @torch.no_grad()
    def sync(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        step: int,
        group: Any = None,
        local_count: int = 0,
        grad_scale: float = 1.0,
        checkpoint: bool = False,
        norm_test: bool | None = None,
    ) -> SyncResult:
        """Average the model (and optimizer state) over the group's ranks, in place.

        Call after ``optimizer.step()`` and before ``zero_grad`` when the local norm test is on:
        ``.grad * grad_scale`` must then be this worker's mean gradient of its last step over
        ``local_count`` samples.  ``step`` is the optimizer steps done (for the byte count).
        ``checkpoint=True`` averages the optimizer state even without ``average_momentum``, so the
        state rank 0 saves is every rank's.  ``norm_test``: run the local norm test at this sync
        (default: whenever ``norm_test_eta`` is set); its suggestion is kept in :attr:`suggested`."""
        world = dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1
        params = [p for p in model.parameters()]
        grad_bytes = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
        self.bytes_baseline += max(0, step - self.last_sync_step) * grad_bytes
        self.last_sync_step = step

        tensors = list(params) + [b for b in model.buffers() if b.is_floating_point()]
        if self.average_momentum or checkpoint:
            for p in params:
                tensors.extend(_per_param_state(optimizer, p))
        sent = self._average(tensors, world, group)

        result_nt, variance = None, None
        if self.norm_test_eta is not None and (norm_test is None or norm_test):
            variance, result_nt, nt_bytes = self._norm_test(params, world, group, local_count, grad_scale)
            sent += nt_bytes
            self.suggested = result_nt.suggested if result_nt is not None else None
        self.syncs += 1
        self.bytes_sent += sent
        return SyncResult(step=step, bytes_sent=sent, norm_test=result_nt, variance=variance)

    def average_optimizer_state(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, group: Any = None
    ) -> None:
        """Average only the optimizer's per-parameter state (a checkpoint at a sync step without
        ``average_momentum``: the state rank 0 saves must be every rank's); counted as sent."""
        world = dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1
        tensors = [t for p in model.parameters() for t in _per_param_state(optimizer, p)]
        self.bytes_sent += self._average(tensors, world, group) if tensors else 0

    def decide_batch(self, policy: BatchPolicy, step: int, epoch: float, current: int) -> BatchDecision | NoopDecision:
        """The batch policy's answer from the last sync's local norm test (``step`` steps done:
        with ``batch.check_every`` a multiple of H, every check step is a sync step)."""
        return policy.decide(step, epoch, current, BatchStats(b_simple=None, norm_test=self.suggested))

    def checkpoint_now(self, due: bool, step: int) -> bool:
        """Checkpoints only at sync points: a checkpoint that falls due between syncs (an epoch
        end, ``checkpoint.every_steps``) is taken at the next sync step."""
        self._checkpoint_due = self._checkpoint_due or due
        if self._checkpoint_due and self.should_sync(step):
            self._checkpoint_due = False
            return True
        return False

    @contextlib.contextmanager
    def averaged(self, model: torch.nn.Module, step: int, group: Any = None) -> Iterator[None]:
        """Validation between syncs scores the workers' average: the parameters and floating
        buffers are averaged into place for the block and each rank's own values restored after.
        A no-op at a sync step (all ranks already hold the average).  Not counted in the bytes
        (it is evaluation, not training; per-step averaging would pay it too)."""
        world = dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1
        if world == 1 or self.last_sync_step == step:
            yield
            return
        tensors = [p.data for p in model.parameters()] + [b for b in model.buffers() if b.is_floating_point()]
        with restored(tensors):
            with torch.no_grad():
                self._average(tensors, world, group)
            yield

    @staticmethod
    def _average(tensors: list[torch.Tensor], world: int, group: Any) -> int:
        """All-reduce-average ``tensors`` in place, one flat buffer per dtype; returns the bytes sent."""
        sent = 0
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        for ts in by_dtype.values():
            flat = torch.cat([t.reshape(-1) for t in ts])
            sent += flat.numel() * flat.element_size()
            if world > 1:
                dist.all_reduce(flat, group=group)
                flat.div_(world)
            offset = 0
            for t in ts:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()
        return sent

    def _norm_test(
        self, params: list[torch.nn.Parameter], world: int, group: Any, local_count: int, grad_scale: float
    ) -> tuple[float | None, NormTestResult | None, int]:
        """The local norm test: one all-reduce of ``[b_i g_i, b_i, b_i |g_i|^2]`` (float64)."""
        grads = [p for p in params if p.requires_grad]
        device = grads[0].device if grads else torch.device("cpu")
        if local_count > 0:
            g = torch.cat(
                [
                    (p.grad.double().reshape(-1) * grad_scale)
                    if p.grad is not None
                    else torch.zeros(p.numel(), dtype=torch.float64, device=device)
                    for p in grads
                ]
            )
        else:
            g = torch.zeros(sum(p.numel() for p in grads), dtype=torch.float64, device=device)
        b = float(max(local_count, 0))
        sq = g.dot(g)
        n_nonempty = 1.0 if b > 0 else 0.0
        buf = torch.cat([g * b, torch.stack([sq.new_tensor(b), sq * b, sq.new_tensor(n_nonempty)])])
        if world > 1:
            dist.all_reduce(buf, group=group)
        sent = buf.numel() * buf.element_size()
        total_b, sum_b_sq, n = float(buf[-3]), float(buf[-2]), int(round(float(buf[-1])))
        if n < 2 or total_b <= 0:
            return None, None, sent
        g_big = buf[:-3] / total_b
        big_sq = float(g_big.dot(g_big))
        variance = (sum_b_sq - total_b * big_sq) / (n - 1)
        assert self.norm_test_eta is not None
        return variance, norm_test(variance, big_sq, int(total_b), self.norm_test_eta), sent

    # -- checkpoint ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, int]:
        """Plain ints (safe for ``torch.load(weights_only=True)``); ``suggested`` is 0 for none."""
        return {
            "H": self.H,
            "syncs": self.syncs,
            "bytes_sent": self.bytes_sent,
            "bytes_baseline": self.bytes_baseline,
            "last_sync_step": self.last_sync_step,
            "suggested": self.suggested or 0,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = {"H", "syncs", "bytes_sent", "bytes_baseline", "last_sync_step"} - set(state)
        if missing:
            raise KeyError(f"LocalSGD state lacks {sorted(missing)}")
        if int(state["H"]) != self.H:
            # the byte counts and the sync points only mean something with the same H
            raise ValueError(f"combine.local_steps: checkpoint has {state['H']}, this run {self.H}")
        self.syncs = int(state["syncs"])
        self.bytes_sent = int(state["bytes_sent"])
        self.bytes_baseline = int(state["bytes_baseline"])
        self.last_sync_step = int(state["last_sync_step"])
        self.suggested = int(state.get("suggested", 0)) or None
        self._checkpoint_due = False  # a checkpoint is always taken at a sync step
