"""What every worker runs: ``train_loop_per_worker`` for Ray Train's ``TorchTrainer``.

Read :meth:`Trainer.train` top to bottom: restore the newest checkpoint if there is one; then,
step after step until the planned end, ask the batch plan for this step's global batch (rank 0's
policies decide, every rank follows; a batch that outgrows the group ends it at a checkpoint for a
bigger one), run the step (each worker takes its slice of the global batch in micro-batches with
the loss normalized by the global batch, the gradients are combined, the optimizer steps with the
plan's LR and MF), advance the plan, log and push to the driver, checkpoint when due.

The parts, one idea each: the batch plan (``trainers/policies/plan.py``: step, epoch, cursor, B,
W, LR, MF), the learner (``trainers/loop/learner.py``: the model, its optimizer, a step's backward
and update, validation), the reporter (``trainers/loop/report.py``: what the driver hears and is
asked), the checkpoint manager (``trainers/loop/checkpoint.py``) and the rollback policy
(``trainers/loop/rollback.py``).  See ``docs/architecture.md``.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

import numpy as np
import torch

from trainers.accel.device import clean_state_dict, load_clean_state_dict
from trainers.accel.profile import profiler_from_env
from trainers.combine.config import RULES
from trainers.link import metrics as M
from trainers.link.agreement import Action, WorkersNeeded
from trainers.link.failure import ended_by_user_error, report_user_error
from trainers.link.messages import (
    AutoWarmupEnd,
    BatchChange,
    CheckpointQuarantined,
    CheckpointSaved,
    Diverged,
    Finished,
    PhaseStart,
    ResizeCheckpoint,
    Stopped,
    StorageFailed,
    process_started,
)
from trainers.link.runtime import Runtime
from trainers.loop.checkpoint import CheckpointManager, PendingRecords, RNGState, StateAdapter, Stateful
from trainers.loop.config import LoopConfig, eval_due
from trainers.loop.group import Group, node_id
from trainers.loop.learner import Learner
from trainers.loop.report import Reporter
from trainers.loop.rollback import RollbackPolicy
from trainers.loop.storage import StorageFull
from trainers.policies.batching import noise_probe_runs
from trainers.policies.goodput import StepTimeFeed
from trainers.policies.plan import BatchPlan, TrainState
from trainers.policies.policy_set import PolicySet
from trainers.workload.build import Functions, StepBatch, TensorBatches, build_workload, perplexity

__all__ = ["LoopConfig", "NonFiniteLoss", "Runtime", "Trainer", "train_loop_per_worker"]


class NonFiniteLoss(RuntimeError):
    """The global batch's loss at ``step`` is ``value`` (inf or nan): the run stops (see ``Trainer.run``)."""

    def __init__(self, step: int, value: float):
        super().__init__(f"non-finite loss {value} at step {step}")
        self.step, self.value = step, value


class SampleLog:
    """Debug (``train.sample_log_dir``): the ids each rank trained on, a JSON line per step, with
    the group's attempt (rank 0's start time) that tells a restarted group's lines apart."""

    def __init__(self, directory: str, phase: int, group: Group) -> None:
        os.makedirs(directory, exist_ok=True)
        self.rank = group.rank
        self.file = open(os.path.join(directory, f"phase{phase}-rank{group.rank}-{os.getpid()}.jsonl"), "a")
        self.attempt = group.start_time()

    def write(self, epoch: int, step: int, ids: np.ndarray) -> None:
        self.file.write(
            json.dumps({"epoch": epoch, "step": step, "rank": self.rank, "attempt": self.attempt, "ids": ids.tolist()})
            + "\n"
        )
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class Trainer:
    """One worker's part of a training run: its parts (see the module docstring) and the loop."""

    def __init__(
        self,
        cfg: LoopConfig,
        runtime: Runtime,
        rank: int | None = None,
        world: int | None = None,
        device: torch.device | None = None,
        functions: Functions | None = None,
        entered: float | None = None,
    ):
        """Rank, world and device come from Ray Train's context unless given (gloo tests);
        ``functions``: factories sent by value (trainers/workload/build.py); ``entered``: when the
        worker entered its loop function (the driver measures a group's start with it)."""
        self.cfg, self.runtime, self.entered = cfg, runtime, entered
        self.group = Group.current(rank, world, device)
        torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank
        # The workload: datasets, then the model (same initial weights on every rank), the per-sample loss.
        self.work = build_workload(cfg, functions, raw_pixels=True, single_sample_guard=True)  # uint8 CIFAR
        policies = PolicySet.from_config(cfg, dataset_size=self.work.num_train)
        # scaling.policy goodput: step times per (local batch, W) and the noise scale, for the driver's question
        self.goodput = StepTimeFeed(cfg.batch.check_every) if runtime.goodput else None
        self.learner = Learner(
            cfg,
            self.work,
            self.group,
            measure_noise=noise_probe_runs(
                cfg.batch.policy, cfg.schedule.scaling_rule, runtime.goodput, RULES[cfg.combine.method].uses_ddp
            ),
        )
        # Where the run stands and what each step runs with; fed by what this group measures.
        self.plan = BatchPlan(
            policies, workers=self.group.world, noise=self.learner.gns, batch_stats=self.learner.combine.batch_stats
        )
        self.rollback = RollbackPolicy(cfg.train.on_nonfinite, cfg.train.max_rollbacks)  # lr factor (checkpointed)
        self.report = Reporter(
            runtime, self.group, cfg.train.log_every, cfg.train.push_every_s, self.work.tokens_per_sample
        )
        self.checkpoints = CheckpointManager(
            self.checkpoint_states(),
            storage=runtime.storage,
            run_prefix=runtime.run_prefix,
            run_name=runtime.run_name,
            keep=cfg.checkpoint.keep,
            writer=self.group.rank == 0,
            warn=self.report.warn,
            map_location=self.group.device,
            quarantined=self._quarantined,
        )
        self.samples = (
            SampleLog(cfg.train.sample_log_dir, runtime.phase, self.group) if cfg.train.sample_log_dir else None
        )

    @property
    def state(self) -> TrainState:
        """The counters that survive phases and restarts (the plan's)."""
        return self.plan.state

    # -- checkpoints ----------------------------------------------------------------------------

    def checkpoint_states(self) -> dict[str, Stateful]:
        """What a checkpoint holds, by name (trainers/loop/checkpoint.py); what this run lacks is left out."""
        learner = self.learner
        states: dict[str, Stateful] = {
            "model": StateAdapter(
                lambda: clean_state_dict(learner.model), lambda s: load_clean_state_dict(learner.model, s)
            ),
            "optimizer": learner.opt,
            **self.plan.components(),
            "rng": RNGState(self.group.device),
        }
        if learner.gns is not None:
            states["noise"] = learner.gns
        if learner.prec.scaler is not None:  # fp16: the loss scale and the skipped steps
            states["precision"] = learner.prec
        states.update(learner.combine.states())
        if self.goodput is not None:  # the measured step times: a resumed run decides with them
            states["goodput"] = self.goodput
        if learner.adversary is not None and learner.adversary.concurrent:  # conadv: stale weights, next deltas
            states["adversarial"] = learner.adversary
        states["reporter"] = PendingRecords(self.report.channel)
        states["rollback"] = self.rollback
        return states

    def _quarantined(self, path: str, reason: str, moved_to: str) -> None:
        self.report.emit(CheckpointQuarantined(path=path, reason=reason, moved_to=moved_to))

    def restore(self) -> bool | None:
        """Load the newest checkpoint of this training run (any phase) into the registered
        components; True if there was one, None if this group must not train (it was started for
        a resize that was called off)."""
        handover = None
        if self.runtime.handover:
            handover = self.report.await_handover()
            if handover is None:
                return None
        return self.checkpoints.load(expect=handover)

    def save_checkpoint(self, finished: bool = False, resize_to: int = 0, beside: bool = False) -> str:
        """Rank 0 writes the checkpoint straight into this phase's run folder and prunes the
        training run's checkpoints to ``checkpoint.keep``; the other ranks have nothing to do.

        Not through ``ray.train.report``: its controller takes one report per poll (every
        ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``, 2 s), so a report that follows the previous one
        sooner waits for it, which made a checkpoint per short epoch cost seconds.  The workers
        find checkpoints by listing the run's folders (:class:`~trainers.loop.checkpoint.CheckpointManager`).
        Returns the checkpoint's path (its name where nothing was written).  A storage that is full
        (or read-only) raises :class:`StorageFull` on every rank (:meth:`run` ends the group).

        ``beside``: written by a thread while the next steps train (``checkpoint.background``, the
        periodic ones); it is announced (``CheckpointSaved``) once written, and its error, if any,
        is raised here at the next checkpoint, on every rank as any other."""
        self.state.finished = finished
        self.learner.combine.before_save(self.state.step, final=finished)  # the state rank 0 saves: every rank's
        full: StorageFull | None = None
        path = ""
        try:
            self.checkpoints.settle()  # the previous one, if it is still being written beside the loop
            self.announce_written()
            if beside:
                self.checkpoints.save_beside(self.state.step)
            else:
                path = self.checkpoints.save(self.state.step, resize=bool(resize_to))
        except StorageFull as e:
            full = e
        if self.group.world > 1:  # rank 0's outcome on every rank: a full disk ends the whole group here
            told = self.group.agree_object(full.as_dict() if full is not None else None)
            full = StorageFull.from_dict(told) if told is not None else None
        if full is not None:
            raise full
        if self.checkpoints.writing and not beside:
            self.report.emit(CheckpointSaved(step=self.state.step, resize_to=resize_to, path=path))
        return path

    def announce_written(self) -> None:
        """Tell the driver of each checkpoint written beside the loop since the last call."""
        for step, path in self.checkpoints.take_written():
            self.report.emit(CheckpointSaved(step=step, resize_to=0, path=path))

    def hand_over(self, resize_to: int) -> None:
        """End this group at a checkpoint that the group of ``resize_to`` workers restores."""
        path = self.save_checkpoint(resize_to=resize_to)
        self.report.handed_over(self.state.step, path)
        self.report.emit(ResizeCheckpoint(step=self.state.step, resize_to=resize_to))
        self.report.flush(wait=True)

    def end(self, stopped: bool) -> None:
        """The group ends (the planned end, or ``stopped`` by the driver): a last checkpoint, then
        tell the driver.  Only the planned end marks the state finished: a stopped run's checkpoint
        must resume to the planned last step."""
        self.save_checkpoint(finished=not stopped)
        self.report.emit(Stopped(step=self.state.step) if stopped else Finished(step=self.state.step))
        self.report.flush(wait=True)

    # -- one optimizer step -----------------------------------------------------------------------

    def train_step(self, batch: StepBatch | np.ndarray) -> float:
        """One optimizer step on a global batch (a :class:`StepBatch`, or its ids) with the plan's
        settings; :meth:`advance` moves the plan on.  Returns the global batch's mean loss (the same
        on every rank)."""
        if not isinstance(batch, StepBatch):
            batch = self.learner.batches.batch(np.asarray(batch))
        step = self.state.step + 1
        s = self.plan.step_settings(len(batch.ids), self.rollback.lr_factor)  # lr x 0.5 per rollback
        adv, deltas = self.learner.adversary, None
        if adv is not None:  # train.adversarial: this batch's perturbations; conadv starts the next batch's
            deltas = adv.for_step(batch, self.state.epoch)
            adv.start_next(lambda: self.peek_next(batch))
        loss = self.learner.backward(batch, self.state.epoch, deltas)
        if adv is not None:
            adv.join()
        if not math.isfinite(loss):  # the same on every rank, and before the weights move
            raise NonFiniteLoss(step, loss)
        self.plan.policies.apply(self.learner.opt, s, first=step == 1)  # LR, MF, momentum correction
        self.learner.update(step, batch)
        if self.samples is not None:
            self.samples.write(self.state.epoch, step, batch.mine)
        return loss

    def peek_next(self, batch: StepBatch) -> tuple[StepBatch, int] | None:
        """The global batch the data order gives after ``batch`` at the batch in force, and its
        epoch (conadv perturbs it ahead); None where the order is not known ahead (a DataLoader's)."""
        batches = self.learner.batches
        if not isinstance(batches, TensorBatches):
            return None
        epoch, cursor = self.state.epoch, self.state.cursor + len(batch.ids)
        if cursor >= self.plan.n:
            epoch, cursor = epoch + 1, 0
        return batches.next(epoch, cursor, self.plan.batch), epoch

    def advance(self) -> tuple[bool, dict[str, float]]:
        """One optimizer step on the next global batch of the data order, the plan advanced, the
        model validated when due (time set aside from the throughput window).  Returns whether the
        epoch ended and the step's metrics."""
        t0 = time.perf_counter()
        batch = self.learner.batches.next(self.state.epoch, self.state.cursor, self.plan.batch)
        loss = self.train_step(batch)
        trained = 0 if self.learner.skipped else len(batch.ids)  # a skipped step (fp16) trained nothing
        if self.goodput is not None:  # the step's time (data, forward, backward, all-reduce, update)
            s = self.plan.current
            self.goodput.observe(
                s.local, self.group.world, time.perf_counter() - t0, whole=s.samples == s.batch and trained > 0
            )
        moved = self.plan.advance(loss, trained)
        metrics = self.metrics_for_step(loss)
        self.report.stepped_at(self.state.step)
        if moved.warmup_end is not None:
            end = moved.warmup_end
            self.report.emit(AutoWarmupEnd(step=self.state.step, peak_lr=end.peak_lr, reason=end.reason))
        if self.should_eval(moved.epoch_ended, trained) or self.plan.done:
            with self.report.aside(), self.learner.combine.evaluating(self.state.step):
                metrics.update(self.evaluate())
        self.report.count(trained)
        return moved.epoch_ended, metrics

    def metrics_for_step(self, loss: float) -> dict[str, float]:
        """The metrics of the step the plan ran last.  ``batch/*`` describe the batch the policy has
        in force (B, rank 0's share, its micro-batches); ``batch/samples`` is what this step took
        (an epoch's short last batch is smaller than B)."""
        s, samples_seen = self.plan.current, self.state.samples_seen
        m = {
            M.TRAIN_LOSS: loss,
            M.LR: s.lr,
            M.WEIGHT_DECAY: s.weight_decay
            if s.weight_decay is not None
            else float(self.learner.opt.param_groups[0].get("weight_decay", 0.0)),
            M.MF: s.mf,
            M.BATCH_GLOBAL: float(s.batch),
            M.BATCH_SAMPLES: float(s.samples),
            M.BATCH_LOCAL: float(s.local),
            M.BATCH_ACCUM_STEPS: float(s.accum),
            M.WORKERS: float(s.workers),
            M.SAMPLES_SEEN: float(samples_seen),
            M.EPOCH: self.plan.epoch_float,
        }
        tokens = self.work.tokens_per_sample
        if tokens is not None:
            m[M.BATCH_GLOBAL_TOKENS] = float(s.batch * tokens)
            m[M.TOKENS_SEEN] = float(samples_seen * tokens)
        m.update(self.learner.prec.metrics())  # fp16: amp/skipped_steps, amp/loss_scale
        m.update(self.learner.combine.metrics())
        gns = self.learner.gns
        if gns is not None and gns.b_simple is not None:
            m[M.GNS_B_SIMPLE] = gns.b_simple
            m[M.GNS_G_SQ] = gns.g_sq
            m[M.GNS_TRACE_SIGMA] = gns.trace_sigma
        return m

    def evaluate(self) -> dict[str, float]:
        """Validation (:meth:`Learner.evaluate`); a language model adds ``val/perplexity = exp(val/loss)``."""
        mlb, tokens = self.cfg.batch.max_local_batch, self.work.tokens_per_sample
        m = self.learner.evaluate(max(256, mlb) if tokens is None else mlb)
        if tokens is not None:
            m[M.VAL_PERPLEXITY] = perplexity(m[M.VAL_LOSS])
        return m

    # -- predicates and questions -------------------------------------------------------------------

    def should_eval(self, epoch_ended: bool, trained: int = 0) -> bool:
        """Validate now: every ``eval_every`` steps, at the step (of ``trained`` samples) whose samples
        seen pass a multiple of ``eval_every_samples``, or at an epoch's end when neither is set."""
        return eval_due(self.cfg.train, self.state.step, self.state.samples_seen, trained, epoch_ended)

    def should_checkpoint(self, epoch_ended: bool) -> bool:
        every = self.cfg.checkpoint.every_steps
        return self.learner.combine.should_checkpoint(
            epoch_ended or (every > 0 and self.state.step % every == 0), self.state.step
        )

    def ask_workers(self, measured: bool = False, periodic: bool = False) -> WorkersNeeded:
        """The workers the batch in force needs (the driver decides, every rank agrees).  ``measured``
        (goodput): send what this group measured, and let goodput choose the batch too; ``periodic``:
        goodput's own question, which rank 0 asks only once the (local batch, W) of the last step
        has been measured."""
        inputs, ask = None, True
        if measured and self.goodput is not None and self.group.rank == 0:
            s = self.plan.current
            if periodic:
                ask = s is not None and self.goodput.ready(s.local, self.group.world)
            inputs = self.goodput.inputs(
                self.learner.gns.b_simple if self.learner.gns is not None else None,
                self.cfg.optimizer.base_batch_size,
                self.goodput_max_batch(),
                self.cfg.batch.round_to,
            )
        return self.report.ask_workers(self.state.step, self.plan.batch, self.plan.remaining_samples, inputs, ask=ask)

    def goodput_max_batch(self) -> int:
        """The largest batch goodput may choose: up to ``batch.max_size`` (and the training set) when
        the batch is goodput's to choose (``batch.policy: fixed``), else the batch in force (the batch
        policy owns B)."""
        b = self.cfg.batch
        if b.policy == "fixed" and b.max_size is not None:
            return max(self.plan.batch, min(b.max_size, self.work.num_train))
        return self.plan.batch

    def goodput_due(self, first_step: int, overlap_to: int) -> bool:
        """Goodput's periodic question is due before the next step: every ``batch.check_every`` steps,
        not at a group's first step (nothing measured yet) nor while a new group starts beside this
        one.  The same on every rank (steps and agreed values only)."""
        return (
            self.goodput is not None
            and overlap_to == 0
            and self.state.step > first_step
            and self.goodput.due(self.state.step)
        )

    # -- the loop -------------------------------------------------------------------------------------

    def run(self) -> None:
        """Train (:meth:`train`); a non-finite loss ends the run at once, with no checkpoint of
        the diverged state, and tells the driver which checkpoint holds the last finite one.  A
        checkpoint storage that is full ends it too, without a restart (:class:`StorageFailed`)."""
        try:
            self.train()
        except NonFiniteLoss as e:
            kept = self.checkpoints.checkpoints()
            self.report.emit(
                Diverged(
                    step=e.step, value=e.value, checkpoint=kept[0] if kept else None, rollbacks=self.rollback.rollbacks
                )
            )
            self.report.flush(wait=True)
        except StorageFull as e:
            # Not raised on: Ray Train would restart the group (FailureConfig.max_failures) only for
            # it to fill the same disk again.  Every rank got here at the same step (save_checkpoint).
            kept = self.checkpoints.checkpoints()
            self.report.emit(
                StorageFailed(
                    step=self.state.step,
                    path=e.path,
                    code=e.code,
                    free=e.free,
                    message=e.message,
                    fix=e.fix,
                    checkpoint=kept[0] if kept else None,
                )
            )
            self.report.flush(wait=True)

    def train(self) -> None:
        """Restore, then train until the run's planned end, the driver stops it, or this group hands
        over to one of another size (a resize); see ``docs/architecture.md``."""
        built = time.time()
        resumed = self.restore()
        if resumed is None:
            return  # a resize called off before this group took over
        if self.state.finished:
            # nothing left to train; the records the checkpoint carries still go out (a tracking
            # server that was away at the planned end: the resume records them)
            self.report.flush(wait=True)
            return
        nodes = tuple(self.group.gather_object(node_id()))  # where this group's ranks run (a drained node's)
        self.report.emit(
            PhaseStart(
                phase=self.runtime.phase,
                workers=self.group.world,
                step=self.state.step,
                resumed=resumed,
                threads=torch.get_num_threads(),
                entered=self.entered if self.entered is not None else built,
                built=built,
                spawned=process_started(),
                nodes=nodes,
                train_samples=self.work.num_train,
            )
        )
        self.report.start(self.state.step)
        first_step = self.state.step
        overlap_to = 0  # workers of a new group starting beside this one (an overlapping resize)
        if resumed and self.plan.policies.adapts_batch:
            need = self.ask_workers()  # the batch this group restored may already need more workers
            if need.workers and not need.overlap:
                return self.hand_over(need.workers)
            overlap_to = need.workers
        if self.goodput is not None:
            self.goodput.restart()  # this group's first steps are left out of the step times
        profiler = profiler_from_env(self.group.rank, self.runtime.phase, self.group.device.type == "cuda")
        while not self.plan.done:
            # This step's global batch: rank 0's policies decide, every rank follows.
            change = self.plan.next_batch(agree=self.group.agree_int)
            need = None
            if change is not None:
                self.report.emit(BatchChange(step=change.step, old=change.old, new=change.new))
                need = self.ask_workers(measured=True)
            elif self.goodput_due(first_step, overlap_to):  # goodput's periodic question
                need = self.ask_workers(measured=True, periodic=True)
            if need is not None:
                adopted = self.plan.adopt(need.batch, "goodput") if need.batch else None
                if adopted is not None:  # goodput chose B: the LR follows by the scaling rule
                    self.report.emit(BatchChange(step=adopted.step, old=adopted.old, new=adopted.new))
                if (change or adopted) and self.goodput is not None:
                    self.goodput.restart()  # a new batch's first steps are left out too
                if need.workers and not need.overlap:  # the batch outgrew the group (or goodput): end the phase
                    return self.hand_over(need.workers)
                # overlap: go on at the new batch (more micro-batches) until the new group is ready
                overlap_to = need.workers or overlap_to
            try:
                epoch_ended, metrics = self.advance()
            except NonFiniteLoss as e:  # train.on_nonfinite: rollback reloads the last checkpoint
                if not self.rollback.recover(self, e.step, e.value):
                    raise
                continue
            if profiler is not None:  # ELB_PROFILE_DIR (bench/gpu.py --profile)
                profiler.step()
            done = self.plan.done
            flush = (
                self.report.due(self.state.step)
                or epoch_ended
                or done
                or overlap_to > 0
                or self.runtime.judges(metrics)
            )  # a judged value goes to the driver at once
            decision = self.report.push(self.state.step, metrics, flush)
            if self.cfg.train.compile and self.state.step == first_step + 1:
                self.report.meter.read()  # the throughput window starts after compilation (the first step)
            if done or decision.action == Action.STOP:
                return self.end(stopped=not done)
            if decision.action == Action.HAND_OVER:  # (a resize the driver decided itself: capacity came back)
                return self.hand_over(overlap_to or decision.to)
            if self.should_checkpoint(epoch_ended):
                with self.report.aside():
                    self.save_checkpoint(beside=self.cfg.checkpoint.background)
            else:
                self.announce_written()
        self.report.flush(wait=True)

    def close(self) -> None:
        self.checkpoints.close()
        self.learner.batches.close()
        if self.samples is not None:
            self.samples.close()


def train_loop_per_worker(payload: dict[str, Any]) -> None:
    entered = time.time()
    cfg = LoopConfig.model_validate(payload["config"])
    runtime = Runtime.model_validate(payload.get("runtime", {}))
    if ended_by_user_error(runtime):  # a restart would meet the user's error again: end this group at once
        return
    try:
        trainer = Trainer(cfg, runtime, functions=payload.get("functions"), entered=entered)
        try:
            trainer.run()
        finally:
            trainer.close()
    except Exception as e:
        report_user_error(e, runtime, _world_rank())  # the user's code raised: the driver says where
        raise


def _world_rank() -> int:
    try:
        import ray.train

        return ray.train.get_context().get_world_rank()
    except Exception:  # outside Ray Train (tests)
        return 0
