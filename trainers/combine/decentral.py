"""Decentralized momentum SGD, ``combine.method: dmsgd`` and ``decentlam``: each worker its own
parameters, mixed with its graph neighbours' every step.

Yuan, Chen, Huang, Zhang, Pan, Xu, Yin, "DecentLaM: Decentralized Momentum SGD for Large-batch Deep
Training", ICCV 2021, arXiv 2104.11981.

Every worker i keeps its own parameters ``x_i`` and momentum ``m_i`` and talks only to its
neighbours.  ``g_i^k`` is worker i's gradient at its own ``x_i^k`` (on its slice of the global
batch; see "the batch" below), ``gamma`` the LR, ``beta`` the momentum factor, ``w_ij`` the mixing
weights (below).  Vectors are stacked by worker: ``x = [x_1; ...; x_n]``, ``W`` the mixing matrix.

DmSGD, the paper's decentralized baseline (its eq. (3))::

    m_i^{k+1} = beta m_i^k + g_i^k
    x_i^{k+1} = sum_{j in N_i} w_ij (x_j^k - gamma m_j^{k+1})          i.e.  x^{k+1} = W (x^k - gamma m^{k+1})

    Its fixed point is biased: with constant gradients the workers settle where
    ``(I - W) x = -gamma/(1 - beta) W g``; the inconsistency bias scales with ``gamma / (1 - beta)``,
    the momentum *amplifies* it, and a large batch (a large LR, little gradient noise) exposes it.

DecentLaM (the paper's Algorithm 1)::

    m_i^{k+1} = beta m_i^k + g_i^k + (1/gamma) (x_i^k - sum_{j in N_i} w_ij x_j^k)
    x_i^{k+1} = x_i^k - gamma m_i^{k+1}

    equivalently ``x^{k+1} = W x^k - gamma (beta m^k + g^k)``.  At a fixed point ``m = 0``, so
    ``g + (I - W) x / gamma = 0``: summed over the workers (``1^T (I - W) = 0``) the mean gradient
    vanishes whatever beta is; the momentum no longer enters the bias.

How the loop runs them (:class:`Decentralized`, called by ``DmSGDCombination`` and
``DecentLaMCombination`` in ``trainers/combine/combinations.py``): the optimizer is PyTorch's heavy-ball SGD
(``optimizer.name: sgd``: ``m <- beta m + d``, ``x <- x - gamma m``, ``d`` the gradient plus
weight decay), so

* DecentLaM adds ``(x_i - sum_j w_ij x_j) / gamma`` to ``.grad`` right before ``opt.step()``
  (:meth:`Decentralized.correct_gradients`): the optimizer's step is then exactly the recursion above
  (weight decay is part of ``g``).  A step with ``gamma = 0`` (a warmup from 0) mixes the
  parameters directly, ``x <- W x``, the recursion's limit, and leaves the correction out of m.
* DmSGD lets the optimizer take its local step ``x - gamma m^{k+1}`` and then mixes the result
  with the neighbours' (:meth:`Decentralized.mix_parameters`).

Graph and weights (:func:`neighbour_offsets`, :func:`mixing_matrix`): circulant and symmetric
(the paper's analysis assumes a symmetric, doubly stochastic W), worker i exchanges with
``i +/- d`` (mod n) for each offset d in D (a set closed under ``d -> n - d``), and
``w_ij = 1 / (|D| + 1)`` for ``j = i`` and each neighbour:

* ``ring``: ``D = {1, n - 1}`` (1/3 each; n = 2: 1/2 each).
* ``exponential``: ``D = {+/- 2^k mod n : 2^k < n}``, i.e. i talks to i +/- 1, 2, 4, ...;
  ``tau = |D|`` neighbours (O(log n)), weight ``1/(tau + 1)``; n = 4 is the complete graph.
  (A one-directional exponential graph, i -> i + 2^k only, gives a non-symmetric W, for which
  DecentLaM's momentum on the correction term can diverge: at n = 8, beta = 0.9 it does.)

The batch: one data order, each worker its slice of the global batch B as under ``mean``, the loss
scaled by ``W / B`` (so ``g_i = (W b_i / B)`` times worker i's mean gradient and the workers'
average of the ``g_i`` is exactly the global batch's mean gradient, uneven slices included).  What
no longer holds: the workers' parameters differ, so the result depends on W and on the graph
(W = 1 is refused: nothing to be decentralized about; a run at W = 3 is not a run at W = 4).

Per step each worker sends ``|D| P`` values (P parameters); a ring all-reduce of the same
parameters sends ``2 (n - 1) / n P`` per worker.  The consensus distance
``(1/n) sum_i |x_i - xbar|^2`` is measured with one float64 all-reduce of ``[x_i, |x_i|^2]``
(a measurement, not counted in the bytes).  Validation scores the average model.

Checkpoints (component ``combine``): before a save every rank's parameters, momentum and floating
buffers are gathered, and rank 0 writes them all.  A resume at the same W gives each rank its
own back (exact); at another W the graph is re-formed and every worker starts from the average of
the saved workers' parameters, momentum and buffers.  At the run's end the workers are set to
their average first, so the final model is the average.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "DECENTRAL_METHODS",
    "Decentralized",
    "allreduce_bytes",
    "consensus_distance",
    "decentlam_step",
    "dmsgd_step",
    "mixing_matrix",
    "neighbour_mix",
    "neighbour_offsets",
]

DECENTRAL_METHODS: tuple[str, ...] = ("dmsgd", "decentlam")
TOPOLOGIES: tuple[str, ...] = ("ring", "exponential")


# --------------------------------------------------------------------------- graph


def neighbour_offsets(topology: str, world: int) -> list[int]:
    """The offsets d: worker i receives from ``i - d`` and sends to ``i + d`` (mod ``world``)."""
    if world < 2:
        raise ValueError(f"a decentralized graph needs at least 2 workers, got {world}")
    if topology == "ring":
        return sorted({1, world - 1})
    if topology == "exponential":
        offsets, d = set(), 1
        while d < world:
            offsets |= {d, world - d}
            d *= 2
        return sorted(offsets)
    raise ValueError(f"combine.topology: unknown {topology!r}; expected one of {', '.join(TOPOLOGIES)}")


def mixing_matrix(topology: str, world: int) -> torch.Tensor:
    """``W[i, j] = w_ij`` (float64): ``1/(|D|+1)`` on the diagonal and at ``j = i - d``."""
    offsets = neighbour_offsets(topology, world)
    w = 1.0 / (len(offsets) + 1)
    mat = torch.zeros(world, world, dtype=torch.float64)
    for i in range(world):
        mat[i, i] = w
        for d in offsets:
            mat[i, (i - d) % world] += w
    return mat


# --------------------------------------------------------------------------- the recursions (rows = workers)


def dmsgd_step(
    x: torch.Tensor, m: torch.Tensor, g: torch.Tensor, lr: float, beta: float, mix: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """DmSGD on stacked workers (row i = worker i): ``m' = beta m + g``, ``x' = W (x - lr m')``."""
    m_new = beta * m + g
    return mix.to(x.dtype) @ (x - lr * m_new), m_new


def decentlam_step(
    x: torch.Tensor, m: torch.Tensor, g: torch.Tensor, lr: float, beta: float, mix: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """DecentLaM on stacked workers: ``m' = beta m + g + (x - W x) / lr``, ``x' = x - lr m'``."""
    m_new = beta * m + g + (x - mix.to(x.dtype) @ x) / lr
    return x - lr * m_new, m_new


def consensus_distance(x: torch.Tensor) -> float:
    """``(1/n) sum_i |x_i - xbar|^2`` for stacked workers (row i = worker i's flat parameters)."""
    x = x.double().reshape(x.shape[0], -1)
    return float((x - x.mean(0, keepdim=True)).pow(2).sum(1).mean())


def allreduce_bytes(numel: int, element_size: int, world: int) -> int:
    """What one worker sends in a ring all-reduce of ``numel`` values: ``2 (n - 1) / n`` of them."""
    return 2 * (world - 1) * numel * element_size // world


# --------------------------------------------------------------------------- distributed


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def neighbour_mix(flat: torch.Tensor, offsets: Sequence[int], group: Any = None) -> torch.Tensor:
    """``sum_j w_ij x_j`` for this rank: send ``flat`` to ``rank + d``, receive from ``rank - d`` for
    each offset (point-to-point, ``batch_isend_irecv``: gloo and NCCL), average with its own."""
    rank, world = _world()
    recvs = [torch.empty_like(flat) for _ in offsets]
    ops = []
    for d, buf in zip(offsets, recvs):
        ops.append(dist.P2POp(dist.isend, flat, (rank + d) % world, group=group))
        ops.append(dist.P2POp(dist.irecv, buf, (rank - d) % world, group=group))
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    total = flat.clone()
    for buf in recvs:
        total += buf
    return total / (len(offsets) + 1)


@contextlib.contextmanager
def restored(tensors: Sequence[torch.Tensor]) -> Iterator[None]:
    """Within the block ``tensors`` may be overwritten (the workers' average put in place for a
    validation); their values are copied back when it ends, however it ends."""
    saved = [t.detach().clone() for t in tensors]
    try:
        yield
    finally:
        with torch.no_grad():
            for t, s in zip(tensors, saved):
                t.copy_(s)


def _flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _unflat(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


class Decentralized:
    """DmSGD / DecentLaM as the loop runs them (see the module docstring): the neighbour exchange
    around ``opt.step()``, the byte counts and the consensus distance, the checkpoint of every rank."""

    def __init__(self, method: str, topology: str, world: int):
        if method not in DECENTRAL_METHODS:
            raise ValueError(f"combine.method: Decentralized needs one of {DECENTRAL_METHODS}, got {method!r}")
        if world < 2:
            raise ValueError(
                f"combine.method: {method} needs at least 2 workers, this group has {world}; "
                "set scaling.min_workers >= 2 or combine.method: mean"
            )
        self.method, self.topology, self.world = method, topology, world
        self.offsets = neighbour_offsets(topology, world)
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.steps = 0
        self.bytes_sent = 0  # so far, this worker
        self.bytes_per_step = 0
        self.allreduce_bytes_per_step = 0
        self.last_distance: float | None = None
        self._gathered: torch.Tensor | None = None  # every rank's state, gathered before a save (rank 0)

    # -- the pieces

    def _params(self) -> list[torch.nn.Parameter]:
        assert self.model is not None, "Decentralized needs the model (Combination.attach)"
        return [p for p in self.model.parameters() if p.requires_grad]

    def _buffers(self) -> list[torch.Tensor]:
        assert self.model is not None
        return [b for b in self.model.buffers() if b.is_floating_point()]

    def _lr_of(self) -> dict[int, float]:
        assert self.optimizer is not None, "Decentralized needs the optimizer (Combination.attach)"
        return {id(p): float(g["lr"]) for g in self.optimizer.param_groups for p in g["params"]}

    @torch.no_grad()
    def _mix_params(self) -> tuple[list[torch.nn.Parameter], torch.Tensor]:
        """``sum_j w_ij x_j`` of the parameters, one flat tensor per call (same dtype required)."""
        params = self._params()
        flat = _flat(params)
        mixed = neighbour_mix(flat, self.offsets)
        sent = len(self.offsets) * flat.numel() * flat.element_size()
        self.bytes_per_step = sent
        self.allreduce_bytes_per_step = allreduce_bytes(flat.numel(), flat.element_size(), self.world)
        self.bytes_sent += sent
        self.steps += 1
        return params, mixed

    @torch.no_grad()
    def correct_gradients(self) -> None:
        """DecentLaM, before the optimizer's step: ``.grad += (x_i - sum_j w_ij x_j) / gamma``
        (``gamma = 0``: ``x <- W x`` now)."""
        lrs = self._lr_of()
        params, mixed = self._mix_params()
        offset = 0
        for p in params:
            w = mixed[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
            lr = lrs.get(id(p), 0.0)
            if lr <= 0.0:
                p.copy_(w)
                continue
            corr = (p.detach() - w) / lr
            if p.grad is None:
                p.grad = corr.clone()
            else:
                p.grad.add_(corr)

    @torch.no_grad()
    def mix_parameters(self) -> None:
        """DmSGD, after the optimizer's local step: ``x_i <- sum_j w_ij (x_j - gamma m_j)``."""
        params, mixed = self._mix_params()
        _unflat(mixed, params)

    @torch.no_grad()
    def consensus(self) -> float:
        """``(1/n) sum_i |x_i - xbar|^2`` over the group: one float64 all-reduce of ``[x_i, |x_i|^2]``."""
        flat = _flat(self._params()).double()
        buf = torch.cat([flat, flat.dot(flat).reshape(1)])
        rank, world = _world()
        if world > 1:
            dist.all_reduce(buf)
        mean = buf[:-1] / world
        self.last_distance = max(0.0, float(buf[-1] / world - mean.dot(mean)))
        return self.last_distance

    @contextlib.contextmanager
    def averaged(self) -> Iterator[None]:
        """Validation scores the workers' average (parameters and floating buffers), each rank's own restored after."""
        tensors = [p.data for p in self._params()] + self._buffers()
        _, world = _world()
        with restored(tensors):
            with torch.no_grad():
                flat = _flat(tensors).double()
                if world > 1:
                    dist.all_reduce(flat)
                _unflat((flat / world).to(tensors[0].dtype), tensors)
            yield

    # -- checkpoint

    def _momenta(self) -> list[torch.Tensor]:
        assert self.optimizer is not None
        out = []
        for p in self._params():
            buf = self.optimizer.state.get(p, {}).get("momentum_buffer")
            out.append(buf if buf is not None else torch.zeros_like(p))
        return out

    def _state_tensors(self) -> list[torch.Tensor]:
        return [p.data for p in self._params()] + self._momenta() + self._buffers()

    @torch.no_grad()
    def gather(self, final: bool = False) -> None:
        """Before a save, on every rank: every rank's parameters, momentum and floating buffers to
        rank 0 (an ``all_gather`` in float64, exact for fp32/bf16).  ``final`` (the run's end): the
        workers are first set to their average, so the saved model is the average."""
        rank, world = _world()
        flat = _flat(self._state_tensors()).double()
        rows = [torch.empty_like(flat) for _ in range(world)]
        if world > 1:
            dist.all_gather(rows, flat)
        else:
            rows = [flat]
        stacked = torch.stack(rows)
        dtype = self._params()[0].dtype
        if final:
            stacked[:] = stacked.mean(0)
            _unflat(stacked[rank].to(dtype), self._state_tensors())
        # kept in the parameters' dtype (the float64 round trip is exact): W x 2P (+ buffers) values
        self._gathered = stacked.to(dtype) if rank == 0 else None

    def state_dict(self) -> dict[str, Any]:
        """Rank 0's, after :meth:`gather`: the counters and ``ranks`` (one row per rank, the parameters'
        dtype: parameters, then momentum, then floating buffers)."""
        return {
            "method": self.method,
            "topology": self.topology,
            "world": self.world,
            "steps": self.steps,
            "bytes_sent": self.bytes_sent,
            "ranks": self._gathered if self._gathered is not None else torch.zeros(0),
        }

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Each rank its own row at the same W (exact); at another W every rank the rows' average."""
        rows = state["ranks"]
        self.steps, self.bytes_sent = int(state["steps"]), int(state["bytes_sent"])
        if rows.numel() == 0:
            return
        rank, world = _world()
        tensors = self._state_tensors()
        n = sum(t.numel() for t in tensors)
        if rows.shape[1] != n:
            raise ValueError(f"combine: the checkpoint holds {rows.shape[1]} values per rank, this model {n}")
        row = rows[rank] if int(state["world"]) == world and rows.shape[0] == world else rows.mean(0)
        _unflat(row.to(tensors[0].dtype), tensors)
        assert self.optimizer is not None
        params = self._params()
        for p, m in zip(params, tensors[len(params) : 2 * len(params)]):
            self.optimizer.state.setdefault(p, {})["momentum_buffer"] = m
