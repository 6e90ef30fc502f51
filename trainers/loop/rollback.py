"""What the loop does on a non-finite loss: stop (the default), or roll back and go on more gently.

``train.on_nonfinite: rollback``: the step whose all-reduced loss is inf/nan never reaches the
weights (``trainers/loop/trainer.py`` checks before the optimizer step).  The loss of step ``k`` is
computed from the weights step ``k - 1`` made, so a checkpoint of step ``k - 1`` holds finite
weights that already give a non-finite loss: the group reloads the newest checkpoint *before* step
``k - 1``, halves the learning rate for the rest of the run and goes on, replaying the same batches
(the data cursor comes back with the checkpoint; the replay writes over the later checkpoints).  At most
``train.max_rollbacks`` times; past that, or with no checkpoint to go back
to, the run stops as with ``stop`` (``Diverged``: MLflow FAILED, the last finite checkpoint named).

Halving is the usual remedy for a loss spike at a learning rate near the edge of stability: the
stable step size of gradient descent on a quadratic of curvature ``lambda`` is ``lr < 2/lambda``
(e.g. Cohen et al., 2021, "Gradient Descent on Neural Networks Typically Occurs at the Edge of
Stability"), so a factor of 2 moves a run that just crossed the edge back inside it.

The factor is policy state: ``lr = factor * policies' lr``, ``factor = 0.5 ** rollbacks`` (the batch
plan applies it: ``BatchPlan.step_settings(lr_factor=...)``).  It is a
checkpoint component (``rollback``), so it survives checkpoints, restarts and resizes; loading
merges monotonically (the larger count wins) so the reload of the rollback itself, from a
checkpoint written before it, does not undo it.
"""

from __future__ import annotations

from typing import Any

from trainers.link.messages import RolledBack
from trainers.loop.checkpoint import CorruptCheckpoint, checkpoint_step

FACTOR = 0.5  # the learning rate is multiplied by this at each rollback


class RollbackPolicy:
    """``rollbacks`` done so far and the learning-rate factor they give; ``recover`` does one."""

    def __init__(self, on_nonfinite: str = "stop", max_rollbacks: int = 3) -> None:
        self.on_nonfinite, self.max_rollbacks = on_nonfinite, max_rollbacks
        self.rollbacks = 0

    @property
    def lr_factor(self) -> float:
        """``FACTOR ** rollbacks``."""
        return FACTOR**self.rollbacks

    def allowed(self) -> bool:
        return self.on_nonfinite == "rollback" and self.rollbacks < self.max_rollbacks

    def recover(self, trainer: Any, step: int, value: float) -> bool:
        """After a non-finite loss at ``step``: if a rollback is allowed and an intact checkpoint of a
        step before ``step - 1`` exists, reload it into every component, halve the learning rate,
        tell the driver (``RolledBack``) and return ``True`` (the loop goes on from the checkpoint's
        step); else ``False`` (stop).  Every rank takes the same branch: the loss and the checkpoint
        folder are the same on all."""
        if not self.allowed():
            return False
        good = [p for p in trainer.checkpoints.checkpoints() if (checkpoint_step(p) or 0) < step - 1]
        for path in good:
            before = self.rollbacks
            self.rollbacks += 1
            try:
                trainer.checkpoints.load_path(path)  # every component; this one keeps the larger count
            except CorruptCheckpoint:
                self.rollbacks = before
                continue
            trainer.learner.opt.zero_grad(set_to_none=True)  # the diverged step's gradients are not finite
            break
        else:
            return False
        trainer.report.emit(
            RolledBack(
                step=step,
                value=value,
                checkpoint=path,
                to_step=trainer.state.step,
                rollbacks=self.rollbacks,
                lr_factor=self.lr_factor,
            )
        )
        trainer.report.flush(wait=True)
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"rollbacks": self.rollbacks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rollbacks = max(self.rollbacks, int(state.get("rollbacks", 0)))
