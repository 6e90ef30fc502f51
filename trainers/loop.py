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
import os
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from pydantic import BaseModel

from trainers.checkpoint import CheckpointManager, PendingRecords, RNGState, StateAdapter, Stateful
from trainers.config import LoopConfig
from trainers.data import InMemoryData, accum_steps, epoch_permutation, global_batch, load_data, micro_batches, slice_bounds
from trainers.models import build_model
from trainers.noise import NoiseProbe
from trainers.optim import build_optimizer
from trainers.policy import PolicySet
from trainers.report import Reporter
from trainers.state import TrainState


class Runtime(BaseModel):
    """What the driver tells the workers besides the config."""

    monitor_name: str | None = None
    namespace: str | None = None
    phase: int = 0
    workers: int = 1  # what the phase asked for (Ray may run fewer after a failure)
    handover: bool = False  # started early (an overlapping resize): restore the old group's last checkpoint
    storage: str = ""  # checkpoint storage and the training run's folder prefix there (all phases)
    run_prefix: str = ""
    run_name: str = ""  # this phase's Ray Train run (a folder under ``storage``)


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


def push_interval(log_every: int, push_every_s: float, steps: int, seconds: float) -> int:
    """Steps until the next push of metrics to the driver: ``push_every_s`` at the pace of the
    last window (``steps`` in ``seconds``), never fewer than ``log_every``.  Fast steps would
    otherwise push (an actor call that wakes the monitor and, in turn, the driver) dozens of
    times a second for a progress bar that needs a few."""
    if push_every_s <= 0 or steps <= 0 or seconds <= 0:
        return log_every
    return max(log_every, min(10_000, int(push_every_s * steps / seconds)))


class Trainer:
    """One worker's training state and the named steps of the loop."""

    def __init__(self, cfg: LoopConfig, runtime: Runtime, rank: int | None = None, world: int | None = None,
                 device: torch.device | None = None):
        """Rank, world and device come from Ray Train's context unless given (gloo tests)."""
        self.cfg, self.runtime = cfg, runtime
        if rank is None or world is None:
            import ray.train

            ctx = ray.train.get_context()
            rank, world = ctx.get_world_rank(), ctx.get_world_size()
        self.rank, self.world = rank, world
        self.device = device if device is not None else _device()
        torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank
        self.data: InMemoryData = load_data(cfg.data, cfg.train.seed)
        self.n = self.data.num_train
        # Policies: pure functions of (epoch, batch, world) plus small explicit state, in one set.
        self.policies = PolicySet.from_config(cfg, dataset_size=self.n)
        self.batch_policy, self.auto = self.policies.batch_policy, self.policies.auto  # checkpointed parts
        self.B = cfg.batch.size
        self._next_flush = cfg.train.log_every  # the step of the next push to the driver (see run)
        base = build_model(self.data.info, cfg.model).to(self.device)
        self.model = _wrap_ddp(base, self.device, self.world)
        self.params = [p for p in base.parameters() if p.requires_grad]
        # The gradient-noise measurement, when a policy reads it (AdaScale, adaptive batch).
        self.noise = NoiseProbe(cfg.batch.ema, self.params, self.world, self.device) \
            if self.policies.needs_noise else None
        if self.noise is not None:
            self.noise.attach(self.model)
        self.gns = self.noise.gns if self.noise is not None else None  # the estimator (checkpointed)
        self.opt = build_optimizer(base, cfg.optimizer)
        self.state = TrainState()
        self.reporter = Reporter(runtime.monitor_name, runtime.namespace, enabled=self.rank == 0)
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
        d = self.policies.decide_batch(self.state.step, self.epoch_float, self.B, self.gns)
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
        self.reporter.event("warning", message=message)

    def _await_handover(self) -> str | None:
        """A group started early: rank 0 waits for the old group's last checkpoint, every rank
        gets its path (None: the resize was called off)."""
        box = [self.reporter.await_handover(self.runtime.phase) if self.rank == 0 else None]
        if self.world > 1:
            dist.broadcast_object_list(box, src=0, device=self.device)
        return box[0]

    def checkpoint_states(self) -> dict[str, Stateful]:
        """What a checkpoint holds, by name (trainers/checkpoint.py); what this run lacks is left out."""
        states: dict[str, Stateful] = {
            "model": _unwrap(self.model), "optimizer": self.opt, "train": self.state, "rng": RNGState(self.device),
            "batch": StateAdapter(lambda: {"size": self.B, "policy": self.batch_policy.state_dict()},
                                  self._load_batch_state)}
        if self.gns is not None:
            states["noise"] = self.gns
        if self.auto is not None:
            states["auto_warmup"] = self.auto
        states["reporter"] = PendingRecords(self.reporter)
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
        find checkpoints by listing the run's folders (:class:`~trainers.checkpoint.CheckpointManager`).
        Returns the checkpoint's path (its name where nothing was written)."""
        self.state.finished = finished
        path = self.checkpoints.save(self.state.step, resize=bool(resize_to))
        if self.checkpoints.writing:
            self.reporter.event("checkpoint", step=self.state.step, resize_to=resize_to)
        return path

    def hand_over(self, resize_to: int) -> None:
        """End this group at a checkpoint that the group of ``resize_to`` workers restores."""
        path = self.save_checkpoint(resize_to=resize_to)
        if self.rank == 0:
            self.reporter.handed_over(self.runtime.phase, self.state.step, path)
        self.reporter.event("resize_checkpoint", step=self.state.step, resize_to=resize_to)
        self.reporter.flush(wait=True)

    # -- one optimizer step ---------------------------------------------------------------

    def train_step(self, ids: np.ndarray) -> float:
        """Forward/backward this rank's slice of global batch ``ids`` in micro-batches, then step."""
        bsz = len(ids)
        lo, hi = slice_bounds(bsz, self.rank, self.world)
        mine = ids[lo:hi]
        mlb = self.cfg.batch.max_local_batch
        micros = micro_batches(mine, self.noise.micro_batch_size(len(mine), mlb) if self.noise else mlb)
        if not self.model.training:
            self.model.train()
        scale = self.world / bsz
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)  # over the micro-batches
        if self.noise is not None:
            self.noise.begin_step()
        if not micros:
            # An empty slice (B < W at an epoch's tail) still joins DDP's all-reduce with a zero gradient.
            x = self.data.train_x[ids[:1]].to(self.device)
            (self.model(x).sum() * 0.0).backward()
        for i, mb in enumerate(micros):
            sync = i == len(micros) - 1
            ctx = self.model.no_sync() if (self.world > 1 and not sync) else contextlib.nullcontext()
            with ctx:
                x = self.data.train_x[mb].to(self.device, non_blocking=True)
                y = self.data.train_y[mb].to(self.device, non_blocking=True)
                loss = F.cross_entropy(self.model(x), y, reduction="sum")
                (loss * scale).backward()
            loss_sum = loss_sum + loss.detach().double()
            if self.noise is not None:
                self.noise.after_micro_batch(bsz, len(mb))
        small = self.noise.finish(bsz, len(mine)) if self.noise is not None else None
        s = self.policies.settings(self.epoch_float, self.B, self.world, self.gns, samples=bsz)
        self.policies.apply(self.opt, s, first=self.state.step == 0)
        self.lr, self.mf = s.lr, s.mf
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        # one all-reduce per step: the loss sum and the noise statistics ride together
        reduced = loss_sum.reshape(1) if small is None else torch.cat([loss_sum.reshape(1), small])
        if self.world > 1:
            dist.all_reduce(reduced)
        v = reduced.tolist()
        if self.noise is not None:
            self.noise.update(v[1:], bsz)
        loss_mean = v[0] / bsz
        self.policies.after_step(self.lr, loss_mean)
        if self._sample_log is not None:
            self._log_samples(mine)
        return loss_mean

    def _log_samples(self, mine: np.ndarray) -> None:
        """Debug (``train.sample_log_dir``): append the ids this rank trained on in this step."""
        self._sample_log.write(json.dumps({"epoch": self.state.epoch, "step": self.state.step + 1, "rank": self.rank,
                                           "attempt": self._attempt, "ids": mine.tolist()}) + "\n")
        self._sample_log.flush()

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Each rank scores a strided share of the validation set; sums are all-reduced."""
        self.model.eval()
        x_all, y_all = self.data.val_x[self.rank::self.world], self.data.val_y[self.rank::self.world]
        totals = torch.zeros(3, dtype=torch.float64, device=self.device)
        chunk = max(256, self.cfg.batch.max_local_batch)
        for s in range(0, len(y_all), chunk):
            x = x_all[s:s + chunk].to(self.device)
            y = y_all[s:s + chunk].to(self.device)
            out = _unwrap(self.model)(x)
            totals[0] += F.cross_entropy(out, y, reduction="sum").double()
            totals[1] += (out.argmax(1) == y).sum().double()
            totals[2] += len(y)
        if self.world > 1:
            dist.all_reduce(totals)
        return {"val/loss": float(totals[0] / totals[2]), "val/accuracy": float(totals[1] / totals[2])}

    # -- predicates ---------------------------------------------------------------------------

    def finished(self) -> bool:
        return self.epoch_float >= self.cfg.train.epochs - 1e-12

    def should_eval(self, epoch_ended: bool) -> bool:
        every = self.cfg.train.eval_every
        return (every > 0 and self.state.step % every == 0) or (every == 0 and epoch_ended)

    def should_checkpoint(self, epoch_ended: bool) -> bool:
        every = self.cfg.checkpoint.every_steps
        return epoch_ended or (every > 0 and self.state.step % every == 0)

    def should_flush(self) -> bool:
        return self.state.step >= self._next_flush

    def agree(self, value: int) -> int:
        """Rank 0's value, broadcast so that every rank acts on the same one at the same step."""
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.broadcast(t, src=0)
        return int(t.item())

    # -- the loop -------------------------------------------------------------------------------

    def metrics_for_step(self, loss: float, bsz: int) -> dict[str, float]:
        lo, hi = slice_bounds(bsz, 0, self.world)
        m = {
            "train/loss": loss,
            "lr": self.lr,
            "mf": self.mf,
            "batch/global": float(bsz),
            "batch/local": float(hi - lo),
            "batch/accum_steps": float(accum_steps(bsz, self.world, self.cfg.batch.max_local_batch)),
            "workers": float(self.world),
            "samples_seen": float(self.state.samples_seen),
            "epoch": self.epoch_float,
        }
        if self.gns is not None and self.gns.b_simple is not None:
            m["gns/b_simple"] = self.gns.b_simple
            m["gns/g_sq"] = self.gns.g_sq
            m["gns/trace_sigma"] = self.gns.trace_sigma
        return m

    def on_batch_change(self, old: int) -> tuple[int, bool]:
        """Log the change; ask the driver whether the group must grow."""
        self.reporter.event("batch_change", step=self.state.step, old=old, new=self.B)
        return self.ask_workers()

    def ask_workers(self) -> tuple[int, bool]:
        """(workers the batch needs, 0 = keep this group; overlap?): rank 0 asks, all agree."""
        to, overlap = self.reporter.ask_resize(self.state.step, self.B, self.runtime.workers) if self.rank == 0 \
            else (0, False)
        code = self.agree(2 * to + int(overlap))
        return code // 2, bool(code % 2)

    def epoch_end_checks(self) -> None:
        d = self.policies.at_epoch_end(self.epoch_float, self.B)
        if d is not None and d.stopped_now:
            self.reporter.event("auto_warmup_end", step=self.state.step, peak_lr=d.peak_lr, reason=d.reason)

    def run(self) -> None:
        built = time.time()
        resumed = self.restore()
        if resumed is None or self.state.finished:
            return  # a resize called off before this group took over, or nothing left to do
        self.reporter.event("phase_start", phase=self.runtime.phase, workers=self.world, step=self.state.step,
                            resumed=resumed, threads=torch.get_num_threads(),
                            entered=getattr(self, "entered", built), built=built)
        # Throughput windows run flush to flush on the wall clock (so the cost of pushing
        # metrics counts), minus validation and checkpoint time.
        window_samples, window_start, window_side = 0, time.perf_counter(), 0.0
        window_steps, self._next_flush = 0, self.state.step + self.cfg.train.log_every
        first_step_done = False
        overlap_to = 0  # workers of a new group starting beside this one (an overlapping resize)
        if resumed and self.batch_policy.name != "fixed":
            # the batch this group restored may already need more workers than it has
            resize_to, overlap = self.ask_workers()
            if resize_to and not overlap:
                return self.hand_over(resize_to)
            overlap_to = resize_to
        while not self.finished():
            perm = epoch_permutation(self.cfg.train.seed, self.state.epoch, self.n)
            while self.state.cursor < self.n and not self.finished():
                change = self.maybe_change_batch()
                if change is not None:
                    resize_to, overlap = self.on_batch_change(change[0])
                    if resize_to and not overlap:  # the batch outgrew the group: end the phase now
                        return self.hand_over(resize_to)
                    # overlap: go on at the new batch (more micro-batches) until the new group is ready
                    overlap_to = resize_to or overlap_to
                ids = global_batch(perm, self.state.cursor, self.B)
                loss = self.train_step(ids)
                self.state.step += 1
                self.state.cursor += len(ids)
                self.state.samples_seen += len(ids)
                epoch_ended = self.state.cursor >= self.n
                metrics = self.metrics_for_step(loss, len(ids))
                if not first_step_done:
                    self.reporter.event("first_step", step=self.state.step, phase=self.runtime.phase)
                    first_step_done = True
                if epoch_ended:
                    self.state.epoch += 1
                    self.state.cursor = 0
                    self.epoch_end_checks()
                if self.should_eval(epoch_ended) or self.finished():
                    t_eval = time.perf_counter()
                    metrics.update(self.evaluate())
                    window_side += time.perf_counter() - t_eval
                flush = self.should_flush() or epoch_ended or self.finished() or overlap_to > 0
                window_samples += len(ids)
                window_steps += 1
                interval = 0
                if flush:
                    now = time.perf_counter()
                    busy = max(now - window_start - window_side, 1e-9)
                    metrics["throughput/samples_per_s"] = window_samples / busy
                    t = self.cfg.train
                    interval = push_interval(t.log_every, t.push_every_s, window_steps, busy)
                    window_samples, window_steps, window_start, window_side = 0, 0, now, 0.0
                self.reporter.log(self.state.step, metrics)
                # rank 0's decision, shared: 1 stop, 2 hand over to the new group, 0 go on;
                # with the steps to the next push (rank 0's clock decides it for every rank)
                code = 0
                if flush:
                    stop_now = self.reporter.flush()
                    decision = 1 if stop_now else 2 if overlap_to and self.reporter.handover else 0
                    code = self.agree(decision + 4 * interval)
                    code, self._next_flush = code % 4, self.state.step + code // 4
                stop = code == 1
                if self.finished() or stop:
                    self.save_checkpoint(finished=True)
                    self.reporter.event("stopped" if stop and not self.finished() else "finished",
                                        step=self.state.step)
                    self.reporter.flush(wait=True)
                    return
                if code == 2:
                    return self.hand_over(overlap_to)
                if self.should_checkpoint(epoch_ended):
                    t_ckpt = time.perf_counter()
                    self.save_checkpoint()
                    window_side += time.perf_counter() - t_ckpt
                if epoch_ended:
                    break
        self.reporter.flush(wait=True)

    def close(self) -> None:
        if self._sample_log is not None:
            self._sample_log.close()


def train_loop_per_worker(payload: dict[str, Any]) -> None:
    entered = time.time()
    cfg = LoopConfig.model_validate(payload["config"])
    runtime = Runtime.model_validate(payload.get("runtime", {}))
    trainer = Trainer(cfg, runtime)
    trainer.entered = entered
    try:
        trainer.run()
    finally:
        trainer.close()
