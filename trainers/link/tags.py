"""The names of the tags the driver sets on a run's MLflow run: one constant per name, beside the
metric names (``trainers/link/metrics.py``).

The strings are the run's public contract (MLflow keys that ``resume``, a resumed driver and a
reviewer read back): never rename one.  Who sets them: ``orchestrator/run/runner.py`` (where the run
lives, how it ended), ``orchestrator/record/listeners.py`` (what happened on the way),
``orchestrator/record/run_tracker.py`` (the code and the model), ``orchestrator/record/note.py`` (the description).
"""

from __future__ import annotations

# -- where the run lives (read back by resume: orchestrator/run/run_info.py find_run) ----------------------
TRAIN_RUN_NAME = "elastic.train_run_name"  # the run's folder under checkpoint.storage_path (elastic-<run id>)
STORAGE_PATH = "elastic.storage_path"  # checkpoint.storage_path as the run used it (an absolute folder or a URI)
RESUMES = "elastic.resumes"  # how many times the run was resumed (each resume adds one)
RAY_TRAIN_RUNS = "elastic.ray_train_runs"  # its newest groups' Ray Train run ids, space-separated (reservations.py)
RUN_KEY = "elastic.run_key"  # the run's idempotency key (train --run-key, tracking.run_key, a Ray job's submission id)
GIT_DIRTY = "elastic.git.dirty"  # "true" when the project's checkout had uncommitted changes

# -- how the run ended ---------------------------------------------------------------------------------
FAILURE = "elastic.failure"  # why the run ended FAILED, one line (removed when a resume finishes the run)
FINAL_WORKERS = "elastic.final_workers"  # the workers of the run's last group
RESIZES = "elastic.resizes"  # resizes over the whole run, every driver of it counted
MODEL_ERROR = "elastic.model_error"  # why the MLflow model was not logged (model/model.pt holds the weights)
REGISTERED_MODEL = "elastic.registered_model"  # name/version of the registered model (--register)

# -- on each checkpoint's MLflow LoggedModel (orchestrator/record/checkpoint_models.py) -----------------------
CHECKPOINT_URI = "elastic.checkpoint.uri"  # where the checkpoint lives (a folder or an object-store URI)
CHECKPOINT_STEP = "elastic.checkpoint.step"  # the optimizer step it holds
CHECKPOINT_PRUNED = "elastic.checkpoint.pruned"  # "true": checkpoint.keep removed it since

# -- what happened on the way (orchestrator/record/listeners.py TrackingListener) -----------------------------
WARNINGS = "elastic.warnings"  # the run's warnings, one a line (the last 5000 characters)
WORKER_THREADS = "elastic.worker_threads"  # torch's threads per worker (rank 0's, in the newest group)
RESTARTS = "elastic.restarts"  # restarts of a group by Ray Train after a failure
CHECKPOINTS_QUARANTINED = "elastic.checkpoints_quarantined"  # damaged checkpoints moved to quarantine/, one a line
ROLLBACKS = "elastic.rollbacks"  # rollbacks after a non-finite loss (train.on_nonfinite: rollback)
RESIZES_CALLED_OFF = "elastic.resizes_called_off"  # resizes whose new group training ended before it was ready
RESIZE_CALLED_OFF_REASON = "elastic.resize_called_off_reason"  # the last one's reason
RESIZES_SKIPPED = "elastic.resizes_skipped"  # resizes that could not pay for themselves (scaling.resize_when: pays)
RESIZE_SKIPPED_REASON = "elastic.resize_skipped_reason"  # the last one's reason
DRAINS = "elastic.drains"  # planned resizes off a node drained with a notice (a preemption)
DRAIN_REASON = "elastic.drain_reason"  # the last one's line
CAPACITY_RETURNED = "elastic.capacity_returned"  # resizes up once capacity a lost node took came back
CAPACITY_RETURNED_REASON = "elastic.capacity_returned_reason"  # the last one's reason
GOODPUT_DECISIONS = "elastic.goodput.decisions"  # decisions of scaling.policy goodput so far
GOODPUT_REASON = "elastic.goodput.reason"  # the latest decision's reason, with every alternative's goodput

# -- MLflow's own tags the driver writes -----------------------------------------------------------------
NOTE = "mlflow.note.content"  # the run's description in MLflow's UI, markdown (orchestrator/record/note.py)


def rollback(n: int) -> str:
    """``elastic.rollback.<n>``: the message of the run's ``n``-th rollback (from 1)."""
    return f"elastic.rollback.{n}"


def goodput_change(n: int) -> str:
    """``elastic.goodput.change.<n>``: the reason of the ``n``-th goodput decision that changed B or W (from 1)."""
    return f"elastic.goodput.change.{n}"
