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
import posixpath
import re
import shutil
import time
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from trainers.batching import BatchConfig, BatchStats, build_batch_policy
from trainers.data import (DataConfig, InMemoryData, epoch_permutation, global_batch, load_data, micro_batches,
                           slice_bounds)
from trainers.link import agreement
from trainers.link import metrics as M
from trainers.link.agreement import Action, PushDecision, WorkersNeeded
from trainers.link.channel import Channel
from trainers.link.messages import (AutoWarmupEnd, BatchChange, CheckpointSaved, Finished, FirstStep, PhaseStart,
                                    ResizeCheckpoint, Stopped, WorkerWarning)
from trainers.link.runtime import Runtime
from trainers.meter import ThroughputMeter
from trainers.models import ModelConfig, build_model
from trainers.noise import GradientNoiseScale, MicroBatchGradNorms, sq_norm_tensor
from trainers.optim import (OptimizerConfig, apply_momentum_correction, build_optimizer, mf_for, set_lr,
                            set_mf)
from trainers.schedules import Schedule, ScheduleConfig
from trainers.state import CorruptCheckpoint, TrainState, read_checkpoint, write_checkpoint

R = TypeVar("R")


class TrainConfig(BaseModel):
    """The ``train`` section."""

    model_config = ConfigDict(extra="forbid")

    epochs: float = Field(default=5, gt=0, description="may be fractional")
    eval_every: int = Field(default=0, ge=0, description="validate every N steps; 0 = at each epoch end")
    seed: int = 0
    log_every: int = Field(default=10, gt=0, description="fewest steps between pushes of metrics to the driver")
    push_every_s: float = Field(default=0.25, ge=0, description="seconds between pushes (at least log_every "
                                "steps apart); 0 = every log_every steps")
    sample_log_dir: str | None = Field(default=None, description="debug: each rank appends the ids it trained on")


class CheckpointConfig(BaseModel):
    """The ``checkpoint`` section."""

    model_config = ConfigDict(extra="forbid")

    every_steps: int = Field(default=0, ge=0, description="0 = only at epoch ends")
    keep: int = Field(default=2, gt=0)
    storage_path: str = Field(default="ray_runs", description="checkpoint folder (on a cluster: a shared filesystem mount)")

    @field_validator("storage_path")
    @classmethod
    def _a_directory(cls, v: str) -> str:
        if "://" in v:
            raise ValueError(f"URIs are not supported (got {v!r}); give a directory path (on a cluster: "
                             "a shared filesystem such as NFS mounted at the same path on every node)")
        return v


class LoopConfig(BaseModel):
    """The sections a worker needs; the orchestrator's root config extends this."""

    model_config = ConfigDict(extra="forbid")

    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    batch: BatchConfig = Field(default_factory=BatchConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)

    @model_validator(mode="after")
    def _cross_checks(self) -> "LoopConfig":
        b = self.batch
        # A growing batch may start below max_local_batch; it must be able to reach it.
        largest = b.size if b.policy == "fixed" else max(b.size, b.max_size or 0, *(s for _, s in b.schedule or []))
        if b.max_local_batch > largest and (b.policy == "fixed" or b.max_size is not None or b.policy == "schedule"):
            what = "batch.size" if b.policy == "fixed" else "the largest batch this policy reaches"
            raise ValueError(f"batch.max_local_batch: {b.max_local_batch} is above {what} "
                             f"{largest}; set it to at most {largest}")
        self.schedule.check_total_epochs(self.train.epochs)
        return self


# --------------------------------------------------------------------------- small steps


def _device() -> torch.device:
    import ray.train.torch

    return ray.train.torch.get_device()


def _wrap_ddp(model: torch.nn.Module, device: torch.device, world: int,
              local_sq: torch.Tensor | None = None) -> torch.nn.Module:
    """DDP on gloo/NCCL.  With ``local_sq``, a communication hook adds each bucket's squared
    norm *before* the all-reduce to it: this worker's own gradient, for the noise scale."""
    if world == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model, device_ids=[device.index]) if device.type == "cuda" else DDP(model)
    if local_sq is not None:
        def hook(state, bucket):  # no annotations: DDP checks them against the real GradBucket type
            buf = bucket.buffer()
            state += buf.double().pow(2).sum()
            buf.div_(dist.get_world_size())
            fut = dist.all_reduce(buf, async_op=True).get_future()
            return fut.then(lambda f: f.value()[0])

        ddp.register_comm_hook(local_sq, hook)
    return ddp


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


def _rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    out = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        out["cuda"] = torch.cuda.get_rng_state(device)
    return out


def _restore_rng(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def checkpoint_step(path: str) -> int | None:
    """The step in a checkpoint directory's name (``checkpoint_step00000045[_resize]``)."""
    m = re.match(r"checkpoint_step(\d+)", posixpath.basename(path.rstrip("/")))
    return int(m.group(1)) if m else None


def run_checkpoints(storage: str, run_prefix: str) -> list[str]:
    """Every checkpoint of one training run, newest first: all phases' Ray Train run folders
    (``<prefix>``, ``<prefix>-…``) under ``storage``."""
    from pyarrow.fs import FileSelector, FileSystem, FileType

    fs, root = FileSystem.from_uri(storage) if "://" in storage else (None, storage)
    if fs is None:
        from pyarrow.fs import LocalFileSystem

        fs = LocalFileSystem()
    found = []
    for run in fs.get_file_info(FileSelector(root, allow_not_found=True)):
        name = posixpath.basename(run.path)
        if run.type != FileType.Directory or not (name == run_prefix or name.startswith(run_prefix + "-")):
            continue
        for c in fs.get_file_info(FileSelector(run.path)):
            step = checkpoint_step(c.path)
            if c.type == FileType.Directory and step is not None:
                found.append((step, c.path))
    found.sort(reverse=True)
    return [p if fs.type_name == "local" else f"{storage.split('://')[0]}://{p}" for _, p in found]


def prune_checkpoints(storage: str, run_prefix: str, keep: int) -> None:
    """Delete all but the ``keep`` newest checkpoints of a training run (every phase's folder:
    an overlapping resize leaves the old phase's last ones behind)."""
    for path in run_checkpoints(storage, run_prefix)[keep:]:
        shutil.rmtree(path, ignore_errors=True)


def load_newest_checkpoint(storage: str, run_prefix: str, device: torch.device, warn=print,
                           expect: str | None = None) -> dict[str, Any] | None:
    """The newest intact checkpoint of this training run; a corrupt one is skipped with a warning.

    ``expect``: a checkpoint known to exist (the handover), listed even if storage is slow to show it."""
    from ray.train import Checkpoint

    paths = run_checkpoints(storage, run_prefix)
    if expect and expect.rstrip("/") not in paths:
        paths.insert(0, expect.rstrip("/"))
        paths.sort(key=lambda p: checkpoint_step(p) or 0, reverse=True)
    for i, path in enumerate(paths):
        try:
            with Checkpoint(path=path).as_directory() as d:
                payload = read_checkpoint(d, map_location=device)
            if i > 0:
                warn(f"resumed from older checkpoint {path}")
            return payload
        except CorruptCheckpoint as e:
            warn(f"skipping corrupt checkpoint: {e}")
    if paths:
        raise CorruptCheckpoint(f"no intact checkpoint to resume from among {paths}")
    return None


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
        # Policies: pure functions of (epoch, batch, world) plus small explicit state.
        self.schedule = Schedule(cfg.schedule, cfg.optimizer.lr, cfg.optimizer.base_batch_size, cfg.train.epochs)
        self.auto = self.schedule.new_auto()
        self.batch_policy = build_batch_policy(cfg.batch, dataset_size=self.n)
        self.B = cfg.batch.size
        self._next_flush = cfg.train.log_every  # the step of the next push to the driver (see run)
        self._stepped = False  # this group made its first step (see advance)
        needs_gns = bool(self.batch_policy.needs) or cfg.schedule.scaling_rule == "adascale"
        self.gns = GradientNoiseScale(cfg.batch.ema) if needs_gns else None
        # With W > 1 the small-batch gradients are the workers' own, measured by a DDP hook;
        # with W = 1 they are the micro-batches' (see train_step).
        self._local_sq = (torch.zeros((), dtype=torch.float64, device=self.device)
                          if needs_gns and self.world > 1 else None)
        base = build_model(self.data.info, cfg.model).to(self.device)
        self.model = _wrap_ddp(base, self.device, self.world, self._local_sq)
        self.params = [p for p in base.parameters() if p.requires_grad]
        self.opt = build_optimizer(base, cfg.optimizer)
        self.state = TrainState()
        self.channel = Channel(runtime.monitor_name, runtime.namespace, enabled=self.rank == 0)
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

    def noise_signal(self):
        return self.gns.adascale_signal(self.cfg.optimizer.base_batch_size) if self.gns else None

    def lr_for_step(self) -> float:
        return self.schedule.lr(self.epoch_float, self.B, self.auto, self.noise_signal())

    def mf_for_step(self) -> float:
        return mf_for(self.cfg.optimizer, self.B / self.world)

    def maybe_change_batch(self) -> tuple[int, str] | None:
        """Ask the batch policy for this step's B; every rank follows rank 0's answer."""
        if self.batch_policy.name == "fixed":
            return None
        stats = BatchStats(b_simple=self.gns.b_simple if self.gns else None, norm_test=None)
        if self.gns is not None and "norm_test" in self.batch_policy.needs:
            r = self.gns.norm_test(self.B, self.cfg.batch.norm_test_eta)
            stats = BatchStats(b_simple=stats.b_simple, norm_test=r.suggested if r else None)
        d = self.batch_policy.decide(self.state.step, self.epoch_float, self.B, stats)
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

    def _load(self) -> dict[str, Any] | None | bool:
        """The newest checkpoint of this training run (any phase); False when this group must
        not train (it was started for a resize that was called off)."""
        handover = None
        if self.runtime.handover:
            handover = self._await_handover()
            if handover is None:
                return False
        if not self.runtime.storage:
            return None
        return load_newest_checkpoint(self.runtime.storage, self.runtime.run_prefix, self.device,
                                      warn=self._warn, expect=handover)

    def restore(self) -> bool | None:
        """Load the newest checkpoint; True if there was one, None if this group must not train."""
        payload = self._load()
        if payload is False:
            return None
        if payload is None:
            return False
        _unwrap(self.model).load_state_dict(payload["model"])
        self.opt.load_state_dict(payload["optimizer"])
        self.state = TrainState.from_dict(payload["train"])
        _restore_rng(payload["rng"], self.device)
        extra = self.state.extra
        if "batch" in extra:
            self.B = int(extra["batch"]["size"])
            self.batch_policy.load_state_dict(extra["batch"]["policy"])
        if self.gns is not None and "gns" in extra:
            self.gns.load_state_dict(extra["gns"])
        if self.auto is not None and "auto_warmup" in extra:
            self.auto.load_state_dict(extra["auto_warmup"])
        self.channel.replay(payload.get("pending_metrics", []))
        return True

    def save_checkpoint(self, finished: bool = False, resize_to: int = 0) -> str:
        """Rank 0 writes the checkpoint straight into this phase's run folder and prunes the
        training run's checkpoints to ``checkpoint.keep``; the other ranks have nothing to do.

        Not through ``ray.train.report``: its controller takes one report per poll (every
        ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``, 2 s), so a report that follows the previous one
        sooner waits for it, which made a checkpoint per short epoch cost seconds.  The workers
        find checkpoints by listing the run's folders (:func:`load_newest_checkpoint`).
        Returns the checkpoint's path (its name where nothing was written)."""
        self.state.finished = finished
        self.state.extra = {"batch": {"size": self.B, "policy": self.batch_policy.state_dict()}}
        if self.gns is not None:
            self.state.extra["gns"] = self.gns.state_dict()
        if self.auto is not None:
            self.state.extra["auto_warmup"] = self.auto.state_dict()
        name = f"checkpoint_step{self.state.step:08d}" + ("_resize" if resize_to else "")
        if self.rank != 0 or not self.runtime.storage:
            return name
        path = os.path.join(self.runtime.storage, self.runtime.run_name, name)
        if os.path.exists(path):  # a corrupt one this group skipped on restore and has now passed again
            shutil.rmtree(path)
        write_checkpoint(path, {
            "model": _unwrap(self.model).state_dict(),
            "optimizer": self.opt.state_dict(),
            "train": self.state.to_dict(),
            "rng": _rng_state(self.device),
            "pending_metrics": self.channel.pending(),
        })
        prune_checkpoints(self.runtime.storage, self.runtime.run_prefix, self.cfg.checkpoint.keep)
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

    def _my_micro_batches(self, mine: np.ndarray) -> list[np.ndarray]:
        micros = micro_batches(mine, self.cfg.batch.max_local_batch)
        if self.gns is not None and self.world == 1 and len(micros) == 1 and len(mine) >= 2:
            micros = micro_batches(mine, (len(mine) + 1) // 2)  # one worker: split in two to estimate
        return micros

    def train_step(self, ids: np.ndarray) -> float:
        """Forward/backward this rank's slice of global batch ``ids`` in micro-batches, then step."""
        bsz = len(ids)
        lo, hi = slice_bounds(bsz, self.rank, self.world)
        mine = ids[lo:hi]
        micros = self._my_micro_batches(mine)
        if not self.model.training:
            self.model.train()
        scale = self.world / bsz
        loss_sum = None  # float64, accumulated over the micro-batches
        # small-batch statistics for the noise scale: sum |g_s|^2, sum 1/b_s, sum b_s |g_s|^2, count
        small = torch.zeros(4, dtype=torch.float64, device=self.device) if self.gns is not None else None
        tracker = MicroBatchGradNorms(self.params) if (self.gns is not None and self.world == 1) else None
        if self._local_sq is not None:
            self._local_sq.zero_()
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
            loss_sum = loss.detach().double() if loss_sum is None else loss_sum + loss.detach().double()
            if tracker is not None:  # this micro-batch's mean gradient = delta * B / (W * b)
                sq = tracker.after_backward(scale=bsz / (self.world * len(mb)))
                small += torch.stack([sq, sq.new_tensor(1.0 / len(mb)), sq * len(mb), sq.new_tensor(1.0)])
        if self._local_sq is not None and len(mine) > 0:  # this worker's mean gradient (DDP hook)
            sq = self._local_sq * (bsz / (self.world * len(mine))) ** 2
            small += torch.stack([sq, sq.new_tensor(1.0 / len(mine)), sq * len(mine), sq.new_tensor(1.0)])
        big_sq = sq_norm_tensor(p.grad for p in self.params) if self.gns is not None else None
        new_lr = self.lr_for_step()
        if self.state.step > 0:
            apply_momentum_correction(self.opt, self.opt.param_groups[0]["lr"], new_lr)
        self.lr, self.mf = new_lr, self.mf_for_step()
        set_lr(self.opt, self.lr)
        set_mf(self.opt, self.mf)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if loss_sum is None:  # an empty slice
            loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        reduced = loss_sum.reshape(1) if small is None else torch.cat([loss_sum.reshape(1), small])
        if self.world > 1:
            dist.all_reduce(reduced)
        v = reduced.tolist()
        if small is not None and v[4] >= 1 and big_sq is not None:
            self.gns.update(small_sq=v[1] / v[4], b_small=v[4] / v[2], big_sq=float(big_sq), b_big=bsz)
        loss_mean = v[0] / bsz
        if self.auto is not None:
            self.auto.record(self.lr, loss_mean)
        if self._sample_log is not None:
            self._sample_log.write(json.dumps({"epoch": self.state.epoch, "step": self.state.step + 1,
                                               "rank": self.rank, "attempt": self._attempt,
                                               "ids": mine.tolist()}) + "\n")
            self._sample_log.flush()
        return loss_mean

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
        return {M.VAL_LOSS: float(totals[0] / totals[2]), M.VAL_ACCURACY: float(totals[1] / totals[2])}

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

    def agree(self, record: R) -> R:
        """Rank 0's ``record`` (a named decision, trainers/link/agreement.py), broadcast so that
        every rank acts on the same one at the same step."""
        return agreement.agree(record, self.world, self.device)

    # -- the loop -------------------------------------------------------------------------------

    def metrics_for_step(self, loss: float, bsz: int) -> dict[str, float]:
        lo, hi = slice_bounds(bsz, 0, self.world)
        m = {
            M.TRAIN_LOSS: loss,
            M.LR: self.lr,
            M.MF: self.mf,
            M.BATCH_GLOBAL: float(bsz),
            M.BATCH_LOCAL: float(hi - lo),
            M.BATCH_ACCUM_STEPS: float(max(1, -(-(hi - lo) // self.cfg.batch.max_local_batch))),
            M.WORKERS: float(self.world),
            M.SAMPLES_SEEN: float(self.state.samples_seen),
            M.EPOCH: self.epoch_float,
        }
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
            answer = self.channel.ask_resize(self.state.step, self.B, self.runtime.workers)
            mine = WorkersNeeded(answer.workers, answer.overlap)
        return self.agree(mine)

    def epoch_end_checks(self) -> None:
        if self.auto is not None and not self.auto.done:
            d = self.auto.check(self.epoch_float, self.B)
            if d.stopped_now:
                self.channel.emit(AutoWarmupEnd(step=self.state.step, peak_lr=d.peak_lr, reason=d.reason))

    def advance(self, perm: np.ndarray, meter: ThroughputMeter) -> tuple[bool, dict[str, float]]:
        """One optimizer step on the next global batch of ``perm``, validated when due (time the
        meter sets aside).  Returns whether the epoch ended and the step's metrics."""
        ids = global_batch(perm, self.state.cursor, self.B)
        loss = self.train_step(ids)
        self.state.step += 1
        self.state.cursor += len(ids)
        self.state.samples_seen += len(ids)
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
            with meter.aside():
                metrics.update(self.evaluate())
        meter.count(len(ids))
        return epoch_ended, metrics

    def push(self, metrics: dict[str, float], meter: ThroughputMeter, flush: bool, overlap: bool) -> PushDecision:
        """Log the step's metrics.  At a push (``flush``) add the window's throughput, send, and
        agree with every rank on rank 0's decision (stop, hand over to the new group started
        beside this one when ``overlap``, or go on) and on the steps to the next push."""
        if not flush:
            self.channel.log(self.state.step, metrics)
            return PushDecision(Action.GO, 0)
        reading = meter.read()
        metrics[M.THROUGHPUT] = reading.samples_per_s
        self.channel.log(self.state.step, metrics)
        stop = self.channel.flush()
        action = Action.STOP if stop else Action.HAND_OVER if overlap and self.channel.handover else Action.GO
        decision = self.agree(PushDecision(action, reading.push_interval))
        self._next_flush = self.state.step + decision.next_push_in
        return decision

    def end(self, stopped: bool) -> None:
        """The run is over (finished, or ``stopped`` by the driver): a last checkpoint, then tell the driver."""
        self.save_checkpoint(finished=True)
        self.channel.emit(Stopped(step=self.state.step) if stopped else Finished(step=self.state.step))
        self.channel.flush(wait=True)

    def run(self) -> None:
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
        if resumed and self.batch_policy.name != "fixed":
            need = self.ask_workers()  # the batch this group restored may already need more workers
            if need.workers and not need.overlap:
                return self.hand_over(need.workers)
            overlap_to = need.workers
        while not self.finished():
            perm = epoch_permutation(self.cfg.train.seed, self.state.epoch, self.n)
            while self.state.cursor < self.n and not self.finished():
                change = self.maybe_change_batch()
                if change is not None:
                    need = self.on_batch_change(change[0])
                    if need.workers and not need.overlap:  # the batch outgrew the group: end the phase now
                        return self.hand_over(need.workers)
                    # overlap: go on at the new batch (more micro-batches) until the new group is ready
                    overlap_to = need.workers or overlap_to
                epoch_ended, metrics = self.advance(perm, meter)
                flush = self.should_flush() or epoch_ended or self.finished() or overlap_to > 0
                decision = self.push(metrics, meter, flush, overlap=overlap_to > 0)
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
