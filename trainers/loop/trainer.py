"""What every worker runs: ``train_loop_per_worker`` for Ray Train's ``TorchTrainer``.

Read top to bottom: build the data, model and optimizer; restore the latest
checkpoint if there is one; then for each global batch, each worker runs its slice
in micro-batches (gradient accumulation) with the loss normalized by the global
batch, DDP sums the gradients, and the optimizer steps.  Rank 0 streams metrics to
the driver's monitor and writes checkpoints.

Why the loss is scaled by ``world / B``: DDP *averages* gradients over the W
workers.  Summing per-sample losses and dividing by the global B (Goyal et al.:
normalize by kn, not n), then multiplying by W to undo DDP's average, makes the
combined gradient exactly the mean gradient of the global batch, whatever W is
and however unevenly the batch is cut.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from trainers.loop.checkpoint import CheckpointManager, PendingRecords, RNGState, StateAdapter, Stateful
from trainers.combine.methods import Combination
from trainers.loop.config import LoopConfig
from trainers.data.order import accum_steps, slice_bounds
from trainers.accel.device import clean_state_dict, compile_model, load_clean_state_dict, to_channels_last
from trainers.data.pipeline import input_pipeline
from trainers.link import agreement
from trainers.link import metrics as M
from trainers.link.agreement import Action, PushDecision, WorkersNeeded
from trainers.link.channel import Channel
from trainers.link.messages import (AutoWarmupEnd, BatchChange, CheckpointSaved, Diverged, Finished, FirstStep, PhaseStart,
                                    ResizeCheckpoint, Stopped, WorkerWarning)
from trainers.link.runtime import Runtime
from trainers.loop.meter import ThroughputMeter
from trainers.policies.noise import NoiseProbe
from trainers.policies.optim import build_optimizer
from trainers.loop.rollback import RollbackPolicy
from trainers.policies.policy_set import PolicySet
from trainers.accel.precision import Precision
from trainers.loop.state import TrainState
from trainers.workload.build import (Functions, StepBatch, batch_len, build_workload, correct, make_batches, perplexity, summed_loss, to_device)

R = TypeVar("R")


# --------------------------------------------------------------------------- small steps


def _device() -> torch.device:
    import ray.train.torch

    return ray.train.torch.get_device()


def _wrap_ddp(model: torch.nn.Module, device: torch.device, world: int) -> torch.nn.Module:
    """DDP on gloo/NCCL (the model itself at W = 1)."""
    if world == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[device.index]) if device.type == "cuda" else DDP(model)


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


class NonFiniteLoss(RuntimeError):
    """The global batch's loss at ``step`` is ``value`` (inf or nan): the run stops (see ``Trainer.run``)."""

    def __init__(self, step: int, value: float):
        super().__init__(f"non-finite loss {value} at step {step}")
        self.step, self.value = step, value


class Trainer:
    """One worker's training state and the named steps of the loop."""

    _samples_per_s: float | None = None  # the last push window's throughput (resize economics)

    def __init__(self, cfg: LoopConfig, runtime: Runtime, rank: int | None = None, world: int | None = None,
                 device: torch.device | None = None, functions: Functions | None = None):
        """Rank, world and device come from Ray Train's context unless given (gloo tests);
        ``functions``: factories sent by value (trainers/workload/build.py)."""
        self.cfg, self.runtime = cfg, runtime
        if rank is None or world is None:
            import ray.train

            ctx = ray.train.get_context()
            rank, world = ctx.get_world_rank(), ctx.get_world_size()
        self.rank, self.world = rank, world
        self.device = device if device is not None else _device()
        torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank
        # The workload: datasets, then the model (same initial weights on every rank), the per-sample loss.
        self.work = build_workload(cfg, functions, raw_pixels=True)  # CIFAR as uint8: see self.inputs
        self.n = self.work.num_train
        self.tokens = self.work.tokens_per_sample  # T of a language model, else None
        # Policies: pure functions of (epoch, batch, world) plus small explicit state, in one set.
        self.policies = PolicySet.from_config(cfg, dataset_size=self.n)
        self.batch_policy, self.auto = self.policies.batch_policy, self.policies.auto  # checkpointed parts
        self.B = cfg.batch.size
        self.rollback = RollbackPolicy(cfg.train.on_nonfinite, cfg.train.max_rollbacks)  # lr factor (checkpointed)
        self._next_flush = cfg.train.log_every  # the step of the next push to the driver (see run)
        self._stepped = False  # this group made its first step (see advance)
        base = (to_channels_last(self.work.model) if cfg.model.channels_last else self.work.model).to(self.device)
        # How the workers' gradients become one update (trainers/combine/methods.py): only mean uses DDP.
        self.combine = Combination(cfg.combine, self.world, cfg.batch.policy, cfg.batch.norm_test_eta,
                                   cfg.batch.check_every)
        self.combine.attach(base)
        self.model = _wrap_ddp(base, self.device, self.world if self.combine.uses_ddp else 1)
        self.params = [p for p in base.parameters() if p.requires_grad]
        # The gradient-noise measurement, when a policy reads it (AdaScale, adaptive batch).
        self.noise = NoiseProbe(cfg.batch.ema, self.params, self.world, self.device) \
            if self.policies.needs_noise and self.combine.uses_ddp else None
        if self.noise is not None:
            self.noise.attach(self.model)
        if cfg.train.compile:  # after DDP and its hook; checkpoints keep the plain model's keys
            self.model = compile_model(self.model, backend=cfg.train.compile_backend)
        self.prec = Precision.from_config(cfg.train, self.device)  # autocast, fp16's loss scaling
        self._skipped = False  # the last step was skipped (fp16: inf/NaN gradients)
        # inputs on the device: augment raw pixels, normalise, channels_last (data.device: accelerator
        # moves an in-memory set to the device once, here); None when there is nothing to do
        self.inputs = input_pipeline(cfg, self.work, self.device)
        # This rank's micro-batches of the global order: tensor indexing for built-in in-memory sets, a
        # DataLoader for map-style datasets; the same ids either way (the noise probe's W = 1 split too).
        self.batches = make_batches(self.work, seed=cfg.train.seed, rank=self.rank, world=self.world,
                                    max_local_batch=cfg.batch.max_local_batch, split_single=self.noise is not None,
                                    loader=cfg.data.loader if cfg.data.device == "host" else
                                    cfg.data.loader.model_copy(update={"pin_memory": True}))
        self.gns = self.noise.gns if self.noise is not None else None  # the estimator (checkpointed)
        self.opt = build_optimizer(base, cfg.optimizer)
        self.state = TrainState()
        self.channel = Channel(runtime.monitor_name, runtime.namespace, enabled=self.rank == 0,
                               judged=runtime.judged_metrics)
        self.checkpoints = CheckpointManager(self.checkpoint_states(), storage=runtime.storage,
                                             run_prefix=runtime.run_prefix, run_name=runtime.run_name,
                                             keep=cfg.checkpoint.keep, writer=self.rank == 0, warn=self._warn,
                                             map_location=self.device)
        self.lr, self.mf = 0.0, 0.0  # what the last step used
        self._sample_log = None
        if cfg.train.sample_log_dir:
            os.makedirs(cfg.train.sample_log_dir, exist_ok=True)
            self._sample_log = open(os.path.join(cfg.train.sample_log_dir,
                                                 f"phase{runtime.phase}-rank{self.rank}-{os.getpid()}.jsonl"), "a")
        self._attempt = self._group_attempt_id() if self._sample_log else 0.0

    def _group_attempt_id(self) -> float:
        """Rank 0's start time, shared: tells a restarted group's records from an earlier attempt's."""
        t = torch.tensor([time.time()], dtype=torch.float64)
        if self.world > 1:
            dist.broadcast(t, src=0)
        return float(t.item())

    # -- policies -------------------------------------------------------------------------------

    @property
    def epoch_float(self) -> float:
        """Fractional epochs completed before the next step."""
        return self.state.epoch + self.state.cursor / self.n

    def maybe_change_batch(self) -> tuple[int, str] | None:
        """Ask the batch policy for this step's B; every rank follows rank 0's answer."""
        if not self.policies.adapts_batch:
            return None
        d = self.policies.decide_batch(self.state.step, self.epoch_float, self.B, self.gns) if self.combine.local is None \
            else self.combine.decide_batch(self.batch_policy, self.state.step, self.epoch_float, self.B)
        new = d.size if d else self.B
        if self.world > 1:
            t = torch.tensor([new], dtype=torch.int64, device=self.device)
            dist.broadcast(t, src=0)
            new = int(t.item())
        if new == self.B:
            return None
        old, self.B = self.B, new
        return old, getattr(d, "reason", "rank 0's decision")

    # -- checkpoints -----------------------------------------------------------------------

    def _warn(self, message: str) -> None:
        print(f"[elastic] warning: {message}", flush=True)
        self.channel.emit(WorkerWarning(message=message))

    def _await_handover(self) -> str | None:
        """A group started early: rank 0 waits for the old group's last checkpoint, every rank
        gets its path (None: the resize was called off)."""
        box = [self.channel.await_handover(self.runtime.phase) if self.rank == 0 else None]
        if self.world > 1:
            dist.broadcast_object_list(box, src=0, device=self.device)
        return box[0]

    def checkpoint_states(self) -> dict[str, Stateful]:
        """What a checkpoint holds, by name (trainers/loop/checkpoint.py); what this run lacks is left out."""
        states: dict[str, Stateful] = {
            "model": StateAdapter(lambda: clean_state_dict(self.model), lambda s: load_clean_state_dict(self.model, s)),
            "optimizer": self.opt, "train": self.state, "rng": RNGState(self.device),
            "batch": StateAdapter(lambda: {"size": self.B, "policy": self.batch_policy.state_dict()},
                                  self._load_batch_state)}
        if self.gns is not None:
            states["noise"] = self.gns
        if self.auto is not None:
            states["auto_warmup"] = self.auto
        if self.prec.scaler is not None:  # fp16: the loss scale and the skipped steps
            states["precision"] = self.prec
        states.update(self.combine.states())
        states["reporter"] = PendingRecords(self.channel)
        states["rollback"] = self.rollback
        return states

    def _load_batch_state(self, state: dict[str, Any]) -> None:
        self.B = int(state["size"])
        self.batch_policy.load_state_dict(state["policy"])

    def restore(self) -> bool | None:
        """Load the newest checkpoint of this training run (any phase) into the registered
        components; True if there was one, None if this group must not train (it was started for
        a resize that was called off)."""
        handover = None
        if self.runtime.handover:
            handover = self._await_handover()
            if handover is None:
                return None
        return self.checkpoints.load(expect=handover)

    def save_checkpoint(self, finished: bool = False, resize_to: int = 0) -> str:
        """Rank 0 writes the checkpoint straight into this phase's run folder and prunes the
        training run's checkpoints to ``checkpoint.keep``; the other ranks have nothing to do.

        Not through ``ray.train.report``: its controller takes one report per poll (every
        ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``, 2 s), so a report that follows the previous one
        sooner waits for it, which made a checkpoint per short epoch cost seconds.  The workers
        find checkpoints by listing the run's folders (:class:`~trainers.loop.checkpoint.CheckpointManager`).
        Returns the checkpoint's path (its name where nothing was written)."""
        self.state.finished = finished
        self.combine.before_save(_unwrap(self.model), self.opt, self.state.step)
        path = self.checkpoints.save(self.state.step, resize=bool(resize_to))
        if self.checkpoints.writing:
            self.channel.emit(CheckpointSaved(step=self.state.step, resize_to=resize_to))
        return path

    def hand_over(self, resize_to: int) -> None:
        """End this group at a checkpoint that the group of ``resize_to`` workers restores."""
        path = self.save_checkpoint(resize_to=resize_to)
        if self.rank == 0:
            self.channel.handed_over(self.runtime.phase, self.state.step, path)
        self.channel.emit(ResizeCheckpoint(step=self.state.step, resize_to=resize_to))
        self.channel.flush(wait=True)

    # -- one optimizer step ---------------------------------------------------------------

    def train_step(self, batch: StepBatch | np.ndarray) -> float:
        """Forward/backward this rank's micro-batches of a global batch (a :class:`StepBatch`, or
        its ids), then step.  Returns the global batch's mean loss (the same on every rank)."""
        if not isinstance(batch, StepBatch):
            batch = self.batches.batch(np.asarray(batch))
        bsz = len(batch.ids)
        loss_sum = self.accumulate(batch)
        self.prec.unscale(self.opt)  # fp16: from here on .grad holds the true gradient
        small = self.noise.finish(bsz, batch.mine_len, self.prec.grad_factor()) if self.noise is not None else None
        # one all-reduce per step: the loss sum and the noise statistics ride together; before the
        # optimizer step, so a non-finite loss (the same on every rank) never reaches the weights
        reduced = loss_sum.reshape(1) if small is None else torch.cat([loss_sum.reshape(1), small])
        if self.world > 1:
            dist.all_reduce(reduced)
        v = reduced.tolist()
        if not math.isfinite(v[0]):
            raise NonFiniteLoss(self.state.step + 1, v[0] / bsz)
        s = self.policies.settings(self.epoch_float, self.B, self.world, self.gns, samples=bsz)
        s = self.rollback.scale(s)  # lr x 0.5 per rollback (train.on_nonfinite: rollback)
        self.policies.apply(self.opt, s, first=self.state.step == 0)
        self.lr, self.mf = s.lr, s.mf
        self.combine.before_step(batch.mine_len, bsz)
        self._skipped = self.prec.step(self.opt)  # fp16: skipped on inf/NaN gradients
        self.combine.after_step(_unwrap(self.model), self.opt, self.state.step + 1, batch.mine_len)
        self.opt.zero_grad(set_to_none=True)
        if self.noise is not None and not self._skipped:
            self.noise.update(v[1:], bsz)
        loss_mean = v[0] / bsz
        self.policies.after_step(self.lr, loss_mean)
        if self._sample_log is not None:
            self._log_samples(batch.mine)
        return loss_mean

    def accumulate(self, batch: StepBatch) -> torch.Tensor:
        """Gradients of this rank's micro-batches of the global batch, one by one (DDP all-reduces
        only after the last), each per-sample loss summed and scaled by ``W / B`` (DDP averages
        over W: the result is the global batch's mean gradient).  Returns this rank's loss sum (float64)."""
        bsz, micros = len(batch.ids), batch.micro
        if not self.model.training:
            self.model.train()
        scale = self.combine.loss_scale(bsz, batch.mine_len)  # W / B (mean, adasum); 1 / b_i (local_sgd)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        if self.noise is not None:
            self.noise.begin_step()
        self.prec.begin_step()
        if not micros:
            # An empty slice (B < W at an epoch's tail) still joins DDP's all-reduce with a zero gradient.
            x = to_device(self.batches.one_input(batch.ids), self.device)
            x = self.inputs(x) if self.inputs is not None else x
            (self.model(x).sum() * 0.0).backward()
        for i, (x, y) in enumerate(micros):
            last = i == len(micros) - 1
            with self.model.no_sync() if (hasattr(self.model, "no_sync") and not last) else contextlib.nullcontext():
                x, y = to_device(x, self.device), to_device(y, self.device)
                if self.inputs is not None:  # augmentation: a function of (seed, epoch, sample id)
                    x = self.inputs(x, batch.micro_ids[i], self.state.epoch)
                with self.prec.autocast():
                    loss = summed_loss(self.work.loss_fn, self.model(x), y)  # an fp32 sum
                self.prec.backward(loss * scale)
            loss_sum = loss_sum + loss.detach().double()
            if self.noise is not None:
                self.noise.after_micro_batch(bsz, len(batch.micro_ids[i]), self.prec.grad_factor())
        return loss_sum

    def _log_samples(self, mine: np.ndarray) -> None:
        """Debug (``train.sample_log_dir``): append the ids this rank trained on in this step."""
        self._sample_log.write(json.dumps({"epoch": self.state.epoch, "step": self.state.step + 1, "rank": self.rank,
                                           "attempt": self._attempt, "ids": mine.tolist()}) + "\n")
        self._sample_log.flush()

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Each rank scores a strided share of the validation set with the training loss (and
        accuracy where the output is classes or tokens); sums are all-reduced.  A language model
        adds ``val/perplexity = exp(val/loss)``."""
        self.model.eval()
        totals = torch.zeros(4, dtype=torch.float64, device=self.device)  # loss, hits, samples, scored
        chunk = max(256, self.cfg.batch.max_local_batch) if self.tokens is None else self.cfg.batch.max_local_batch
        for x, y in self.batches.val_batches(chunk):
            x, y = to_device(x, self.device), to_device(y, self.device)
            x = self.inputs(x) if self.inputs is not None else x
            with self.prec.autocast():
                out = _unwrap(self.model)(x)
                loss = summed_loss(self.work.loss_fn, out, y)
            totals[0] += loss.double()
            hits = correct(out, y)
            if hits is not None:
                totals[1] += hits
                totals[3] += batch_len(x)
            totals[2] += batch_len(x)
        if self.world > 1:
            dist.all_reduce(totals)
        m = {M.VAL_LOSS: float(totals[0] / totals[2])}
        if totals[3] > 0:
            m[M.VAL_ACCURACY] = float(totals[1] / totals[3])
        if self.tokens is not None:
            m[M.VAL_PERPLEXITY] = perplexity(m[M.VAL_LOSS])
        return m

    # -- predicates ---------------------------------------------------------------------------

    def finished(self) -> bool:
        return self.epoch_float >= self.cfg.train.epochs - 1e-12

    def should_eval(self, epoch_ended: bool) -> bool:
        every = self.cfg.train.eval_every
        return (every > 0 and self.state.step % every == 0) or (every == 0 and epoch_ended)

    def should_checkpoint(self, epoch_ended: bool) -> bool:
        every = self.cfg.checkpoint.every_steps
        return self.combine.should_checkpoint(epoch_ended or (every > 0 and self.state.step % every == 0),
                                              self.state.step)  # local_sgd: at sync steps only

    def should_flush(self) -> bool:
        return self.state.step >= self._next_flush

    def agree(self, record: R) -> R:
        """Rank 0's ``record`` (a named decision, trainers/link/agreement.py), broadcast so that
        every rank acts on the same one at the same step."""
        return agreement.agree(record, self.world, self.device)

    # -- the loop -------------------------------------------------------------------------------

    def metrics_for_step(self, loss: float, bsz: int) -> dict[str, float]:
        """The step's metrics.  ``batch/*`` describe the batch the policy has in force (B, rank
        0's share, its micro-batches); ``batch/samples`` is what this step took (an epoch's
        short last batch is smaller than B)."""
        lo, hi = slice_bounds(self.B, 0, self.world)
        m = {
            M.TRAIN_LOSS: loss,
            M.LR: self.lr,
            M.MF: self.mf,
            M.BATCH_GLOBAL: float(self.B),
            M.BATCH_SAMPLES: float(bsz),
            M.BATCH_LOCAL: float(hi - lo),
            M.BATCH_ACCUM_STEPS: float(accum_steps(self.B, self.world, self.cfg.batch.max_local_batch)),
            M.WORKERS: float(self.world),
            M.SAMPLES_SEEN: float(self.state.samples_seen),
            M.EPOCH: self.epoch_float,
        }
        if self.tokens is not None:
            m[M.BATCH_GLOBAL_TOKENS] = float(self.B * self.tokens)
            m[M.TOKENS_SEEN] = float(self.state.samples_seen * self.tokens)
        m.update(self.prec.metrics())  # fp16: amp/skipped_steps, amp/loss_scale
        m.update(self.combine.metrics())
        if self.gns is not None and self.gns.b_simple is not None:
            m[M.GNS_B_SIMPLE] = self.gns.b_simple
            m[M.GNS_G_SQ] = self.gns.g_sq
            m[M.GNS_TRACE_SIGMA] = self.gns.trace_sigma
        return m

    def on_batch_change(self, old: int) -> WorkersNeeded:
        """Log the change; ask the driver whether the group must grow."""
        self.channel.emit(BatchChange(step=self.state.step, old=old, new=self.B))
        return self.ask_workers()

    def ask_workers(self) -> WorkersNeeded:
        """The workers the batch needs (0 = keep this group) and whether a new group starts beside
        this one: rank 0 asks the driver, every rank agrees."""
        mine = WorkersNeeded()
        if self.rank == 0:
            remaining = (self.cfg.train.epochs - self.epoch_float) * self.n
            answer = self.channel.ask_resize(self.state.step, self.B, self.runtime.workers, remaining,
                                             self._samples_per_s)
            mine = WorkersNeeded(answer.workers, answer.overlap)
        return self.agree(mine)

    def epoch_end_checks(self) -> None:
        d = self.policies.at_epoch_end(self.epoch_float, self.B)
        if d is not None and d.stopped_now:
            self.channel.emit(AutoWarmupEnd(step=self.state.step, peak_lr=d.peak_lr, reason=d.reason))

    def advance(self, meter: ThroughputMeter) -> tuple[bool, dict[str, float]]:
        """One optimizer step on the next global batch of the data order, validated when due (time
        the meter sets aside).  Returns whether the epoch ended and the step's metrics."""
        batch = self.batches.next(self.state.epoch, self.state.cursor, self.B)
        ids = batch.ids
        loss = self.train_step(batch)
        self.state.step += 1
        self.state.cursor += len(ids)
        trained = 0 if self._skipped else len(ids)  # a skipped step (fp16) trained nothing
        self.state.samples_seen += trained
        epoch_ended = self.state.cursor >= self.n
        metrics = self.metrics_for_step(loss, len(ids))
        if not self._stepped:
            self.channel.emit(FirstStep(step=self.state.step, phase=self.runtime.phase))
            self._stepped = True
        if epoch_ended:
            self.state.epoch += 1
            self.state.cursor = 0
            self.epoch_end_checks()
        if self.should_eval(epoch_ended) or self.finished():
            with meter.aside(), self.combine.evaluating(_unwrap(self.model), self.state.step):
                metrics.update(self.evaluate())
        meter.count(trained)
        return epoch_ended, metrics

    def push(self, metrics: dict[str, float], meter: ThroughputMeter, flush: bool, overlap: bool) -> PushDecision:
        """Log the step's metrics.  At a push (``flush``) add the window's throughput, send, and
        agree with every rank on rank 0's decision (stop, hand over to the new group started
        beside this one when ``overlap``, or go on) and on the steps to the next push."""
        if not flush:
            self.channel.log(self.state.step, metrics)
            return PushDecision(Action.GO, 0)
        reading = meter.read()
        self._samples_per_s = reading.samples_per_s
        metrics[M.THROUGHPUT] = reading.samples_per_s
        if self.device.type == "cuda":  # the GPU memory this process's tensors peaked at so far
            metrics[M.MEMORY_PEAK] = float(torch.cuda.max_memory_allocated(self.device))
        if self.tokens is not None:
            metrics[M.THROUGHPUT_TOKENS] = reading.samples_per_s * self.tokens
        self.channel.log(self.state.step, metrics)
        stop = self.channel.flush()
        action = Action.STOP if stop else Action.HAND_OVER if overlap and self.channel.handover else Action.GO
        decision = self.agree(PushDecision(action, reading.push_interval))
        self._next_flush = self.state.step + decision.next_push_in
        return decision

    def end(self, stopped: bool) -> None:
        """The group ends (the planned end, or ``stopped`` by the driver): a last checkpoint, then
        tell the driver.  Only the planned end marks the state finished: a stopped run's checkpoint
        must resume to the planned last step."""
        self.save_checkpoint(finished=not stopped)
        self.channel.emit(Stopped(step=self.state.step) if stopped else Finished(step=self.state.step))
        self.channel.flush(wait=True)

    def run(self) -> None:
        """Train (:meth:`train`); a non-finite loss ends the run at once, with no checkpoint of
        the diverged state, and tells the driver which checkpoint holds the last finite one."""
        try:
            self.train()
        except NonFiniteLoss as e:
            kept = self.checkpoints.checkpoints()
            self.channel.emit(Diverged(step=e.step, value=e.value, checkpoint=kept[0] if kept else None,
                                       rollbacks=self.rollback.rollbacks))
            self.channel.flush(wait=True)

    def train(self) -> None:
        """Restore, then train until the run ends, the driver stops it, or this group hands over
        to one of another size (a resize); see ``docs/architecture.md``."""
        built = time.time()
        resumed = self.restore()
        if resumed is None or self.state.finished:
            return  # a resize called off before this group took over, or nothing left to do
        self.channel.emit(PhaseStart(phase=self.runtime.phase, workers=self.world, step=self.state.step,
                                     resumed=resumed, threads=torch.get_num_threads(),
                                     entered=getattr(self, "entered", built), built=built))
        meter = ThroughputMeter(self.cfg.train.log_every, self.cfg.train.push_every_s)
        self._next_flush, self._stepped = self.state.step + self.cfg.train.log_every, False
        overlap_to = 0  # workers of a new group starting beside this one (an overlapping resize)
        first_step = self.state.step
        if resumed and self.batch_policy.name != "fixed":
            need = self.ask_workers()  # the batch this group restored may already need more workers
            if need.workers and not need.overlap:
                return self.hand_over(need.workers)
            overlap_to = need.workers
        while not self.finished():
            while self.state.cursor < self.n and not self.finished():
                change = self.maybe_change_batch()
                if change is not None:
                    need = self.on_batch_change(change[0])
                    if need.workers and not need.overlap:  # the batch outgrew the group: end the phase now
                        return self.hand_over(need.workers)
                    # overlap: go on at the new batch (more micro-batches) until the new group is ready
                    overlap_to = need.workers or overlap_to
                try:
                    epoch_ended, metrics = self.advance(meter)
                except NonFiniteLoss as e:  # train.on_nonfinite: rollback reloads the last checkpoint
                    if not self.rollback.recover(self, e.step, e.value):
                        raise
                    continue
                flush = (self.should_flush() or epoch_ended or self.finished() or overlap_to > 0
                         or self.runtime.judges(metrics))  # a judged value goes to the driver at once
                decision = self.push(metrics, meter, flush, overlap=overlap_to > 0)
                if self.cfg.train.compile and self.state.step == first_step + 1:
                    meter.read()  # the throughput window starts after compilation (the first step)
                if self.finished() or decision.action == Action.STOP:
                    return self.end(stopped=not self.finished())
                if decision.action == Action.HAND_OVER:
                    return self.hand_over(overlap_to)
                if self.should_checkpoint(epoch_ended):
                    with meter.aside():
                        self.save_checkpoint()
                if epoch_ended:
                    break
        self.channel.flush(wait=True)

    def close(self) -> None:
        self.batches.close()
        if self._sample_log is not None:
            self._sample_log.close()


def train_loop_per_worker(payload: dict[str, Any]) -> None:
    entered = time.time()
    cfg = LoopConfig.model_validate(payload["config"])
    runtime = Runtime.model_validate(payload.get("runtime", {}))
    trainer = Trainer(cfg, runtime, functions=payload.get("functions"))
    trainer.entered = entered
    try:
        trainer.run()
    finally:
        trainer.close()
