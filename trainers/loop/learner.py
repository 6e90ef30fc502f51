"""The model side of a worker: the model and its optimizer, how this rank's micro-batches become
one update of the global batch, and validation.

Why the loss is scaled by ``world / B``: DDP *averages* gradients over the W workers.  Summing
per-sample losses and dividing by the global B (Goyal et al.: normalize by kn, not n), then
multiplying by W to undo DDP's average, makes the combined gradient exactly the mean gradient of
the global batch, whatever W is and however unevenly the batch is cut.  See
``docs/architecture.md`` (the global batch is the math).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from trainers.accel.device import compile_model, to_channels_last
from trainers.accel.precision import Precision
from trainers.combine.combinations import build_combination
from trainers.data.pipeline import input_pipeline
from trainers.link import metrics as M
from trainers.loop.adversarial import Adversary, Perturbations
from trainers.loop.config import LoopConfig
from trainers.loop.group import Group
from trainers.policies.noise import GradientNoiseScale, NoiseProbe
from trainers.policies.optim import build_optimizer
from trainers.workload.build import StepBatch, Workload, batch_len, correct, make_batches, summed_loss, to_device


def _wrap_ddp(model: torch.nn.Module, device: torch.device, world: int) -> torch.nn.Module:
    """DDP on gloo/NCCL (the model itself at W = 1)."""
    if world == 1:
        return model
    return DDP(model, device_ids=[device.index]) if device.type == "cuda" else DDP(model)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside DDP (itself at W = 1)."""
    return getattr(model, "module", model)


class Learner:
    """The model (on the device, DDP-wrapped when the combination uses DDP, compiled on demand),
    its optimizer, precision and gradient combination, the gradient-noise probe (``measure_noise``:
    a policy reads it) and this rank's micro-batches of the data order (``batches``).

    A step is :meth:`backward` (the global batch's gradient, its loss all-reduced) and, once the
    caller has set the step's LR and MF, :meth:`update` (the optimizer step)."""

    def __init__(self, cfg: LoopConfig, work: Workload, group: Group, measure_noise: bool) -> None:
        self.group, self.loss_fn = group, work.loss_fn
        base = (to_channels_last(work.model) if cfg.model.channels_last else work.model).to(group.device)
        # How the workers' gradients become one update (trainers/combine/base.py): one class per method.
        self.combine = build_combination(cfg.combine, group.world, cfg.batch)
        self.model = _wrap_ddp(base, group.device, group.world if self.combine.uses_ddp else 1)
        self.params = [p for p in base.parameters() if p.requires_grad]
        # The gradient-noise measurement, when a policy reads it (AdaScale, adaptive batch).
        self.noise = NoiseProbe(cfg.batch.ema, self.params, group.world, group.device) if measure_noise else None
        if self.noise is not None:
            self.noise.attach(self.model)
        if cfg.train.compile:  # after DDP and its hook; checkpoints keep the plain model's keys
            self.model = compile_model(self.model, backend=cfg.train.compile_backend)
        self.prec = Precision.from_config(cfg.train, group.device)  # autocast, fp16's loss scaling
        # inputs on the device: augment raw pixels, normalise, channels_last (data.device: accelerator
        # moves an in-memory set to the device once, here); None when there is nothing to do
        self.inputs = input_pipeline(cfg, work, group.device)
        # This rank's micro-batches of the global order: tensor indexing for built-in in-memory sets, a
        # DataLoader for map-style datasets; the same ids either way (the noise probe's W = 1 split too).
        self.batches = make_batches(
            work,
            seed=cfg.train.seed,
            rank=group.rank,
            world=group.world,
            max_local_batch=cfg.batch.max_local_batch,
            split_single=self.noise is not None,
            loader=cfg.data.loader
            if cfg.data.device == "host"
            else cfg.data.loader.model_copy(update={"pin_memory": True}),
        )
        self.opt = build_optimizer(base, cfg.optimizer)
        # train.adversarial (trainers/loop/adversarial.py): sync and conadv perturb the inputs
        adv = cfg.train.adversarial
        self.adversary = (
            Adversary(adv, base, self.loss_fn, self.prec.autocast, self.inputs, group.device)
            if adv.method != "none"
            else None
        )
        self.combine.attach(base, self.opt)
        self.skipped = False  # the last step was skipped (fp16: inf/NaN gradients)
        self._reduced: list[float] = []  # the last backward's all-reduced loss sum and noise sums

    @property
    def gns(self) -> GradientNoiseScale | None:
        """The gradient-noise estimator the probe feeds (checkpointed), None without a probe."""
        return self.noise.gns if self.noise is not None else None

    # -- one optimizer step ---------------------------------------------------------------------

    def backward(self, batch: StepBatch, epoch: int, deltas: Perturbations | None = None) -> float:
        """This rank's micro-batches of the global batch forward and backward, then one all-reduce
        of the loss sum (with the noise statistics riding along).  Returns the global batch's mean
        loss, the same on every rank; nothing has touched the weights yet.  ``deltas``: the
        adversarial perturbations of this rank's micro-batches (the clean loss is returned)."""
        bsz = len(batch.ids)
        loss_sum = self.accumulate(batch, epoch, deltas)
        self.prec.unscale(self.opt)  # fp16: from here on .grad holds the true gradient
        small = self.noise.finish(bsz, batch.mine_len, self.prec.grad_factor()) if self.noise is not None else None
        reduced = loss_sum.reshape(1) if small is None else torch.cat([loss_sum.reshape(1), small])
        if self.group.world > 1:
            dist.all_reduce(reduced)
        self._reduced = reduced.tolist()
        return self._reduced[0] / bsz

    def update(self, step: int, batch: StepBatch) -> None:
        """The optimizer step ``step`` with the LR and MF set on ``opt`` (fp16 skips it on inf/NaN
        gradients: ``skipped``), the combination's hooks around it, then the noise estimates."""
        bsz = len(batch.ids)
        self.combine.before_step(batch.mine_len, bsz)
        self.skipped = self.prec.step(self.opt)
        self.combine.after_step(step, batch.mine_len)
        self.opt.zero_grad(set_to_none=True)
        if self.noise is not None and not self.skipped:
            self.noise.update(self._reduced[1:], bsz)

    def accumulate(self, batch: StepBatch, epoch: int, deltas: Perturbations | None = None) -> torch.Tensor:
        """Gradients of this rank's micro-batches of the global batch, one by one (DDP all-reduces
        only after the last), each per-sample loss summed and scaled by ``W / B`` (DDP averages
        over W: the result is the global batch's mean gradient).  With ``deltas`` (adversarial
        training) each micro-batch goes through the model with its perturbed copy as one batch and
        the mix of both losses counts (trainers/loop/adversarial.py).  Returns this rank's clean loss sum (float64;
        the perturbed one's where ``clean_weight`` is 0)."""
        bsz, micros = len(batch.ids), batch.micro
        if not self.model.training:
            self.model.train()
        scale = self.combine.loss_scale(bsz, batch.mine_len)  # W / B, or 1 / b_i where each worker steps alone
        device = self.group.device
        loss_sum: torch.Tensor | None = None  # float64; the first micro-batch's loss starts it
        if self.noise is not None:
            self.noise.begin_step()
        self.prec.begin_step()
        if not micros:
            # An empty slice (B < W at an epoch's tail) still joins DDP's all-reduce with a zero gradient.
            x = to_device(self.batches.one_input(batch.ids), device)
            x = self.inputs(x) if self.inputs is not None else x
            (self.model(x).sum() * 0.0).backward()
        for i, (x, y) in enumerate(micros):
            last = i == len(micros) - 1
            with self.model.no_sync() if (hasattr(self.model, "no_sync") and not last) else contextlib.nullcontext():
                x, y = to_device(x, device), to_device(y, device)
                if self.inputs is not None:  # augmentation: a function of (seed, epoch, sample id)
                    x = self.inputs(x, batch.micro_ids[i], epoch)
                if deltas is None:
                    with self.prec.autocast():
                        loss = summed_loss(self.loss_fn, self.model(x), y)  # an fp32 sum
                    self.prec.backward(loss * scale)
                else:  # g = c grad(clean) + (1 - c) grad(perturbed): one batch of 2b (c = 0: the perturbed only)
                    c = self.adversary.cfg.clean_weight
                    with self.prec.autocast():
                        if c == 0:
                            loss = summed_loss(self.loss_fn, self.model(x + deltas[i]), y)
                            total = loss
                        else:
                            b = batch_len(x)
                            out = self.model(torch.cat([x, x + deltas[i]]))
                            loss = summed_loss(self.loss_fn, out[:b], y)
                            total = c * loss + (1 - c) * summed_loss(self.loss_fn, out[b:], y)
                    self.prec.backward(total * scale)
            clean = loss.detach().double()
            loss_sum = clean if loss_sum is None else loss_sum + clean
            if self.noise is not None:
                self.noise.after_micro_batch(bsz, len(batch.micro_ids[i]), self.prec.grad_factor())
        return torch.zeros((), dtype=torch.float64, device=device) if loss_sum is None else loss_sum

    # -- validation -----------------------------------------------------------------------------

    @torch.no_grad()
    def evaluate(self, chunk: int) -> dict[str, float]:
        """Each rank scores a strided share of the validation set, ``chunk`` samples at a time, with
        the training loss (and accuracy where the output is classes or tokens); sums are all-reduced."""
        self.model.eval()
        device = self.group.device
        totals = torch.zeros(4, dtype=torch.float64, device=device)  # loss, hits, samples, scored
        for x, y in self.batches.val_batches(chunk):
            x, y = to_device(x, device), to_device(y, device)
            x = self.inputs(x) if self.inputs is not None else x
            with self.prec.autocast():
                out = unwrap(self.model)(x)
                loss = summed_loss(self.loss_fn, out, y)
            totals[0] += loss.double()
            hits = correct(out, y)
            if hits is not None:
                totals[1] += hits
                totals[3] += batch_len(x)
            totals[2] += batch_len(x)
        if self.group.world > 1:
            dist.all_reduce(totals)
        m = {M.VAL_LOSS: float(totals[0] / totals[2])}
        if totals[3] > 0:
            m[M.VAL_ACCURACY] = float(totals[1] / totals[3])
        return m
