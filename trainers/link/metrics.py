"""The names of the metrics a run logs: one constant per name, used by every producer
(the worker loop, the driver) and every consumer (MLflow tracking, the progress bar, the search layer).

The strings are the run's public contract (MLflow keys): never rename one.  How a run flows from
the loop to MLflow: ``docs/architecture.md``."""

from __future__ import annotations

# -- one row per optimizer step (rank 0, trainers/loop/trainer.py) -------------------------------------
TRAIN_LOSS = "train/loss"
VAL_LOSS = "val/loss"
VAL_ACCURACY = "val/accuracy"
LR = "lr"
WEIGHT_DECAY = "train/weight_decay"  # the optimizer's weight decay in effect (optimizer.wd_rule may change it)
MF = "mf"
BATCH_GLOBAL = "batch/global"  # the global batch the policy has in force
BATCH_SAMPLES = "batch/samples"  # the samples a step took (an epoch's short last batch: fewer than B)
BATCH_LOCAL = "batch/local"
BATCH_ACCUM_STEPS = "batch/accum_steps"
WORKERS = "workers"
SAMPLES_SEEN = "samples_seen"
EPOCH = "epoch"
THROUGHPUT = "throughput/samples_per_s"
GNS_B_SIMPLE = "gns/b_simple"
GNS_G_SQ = "gns/g_sq"
GNS_TRACE_SIGMA = "gns/trace_sigma"
AMP_SKIPPED_STEPS = (
    "amp/skipped_steps"  # fp16: optimizer steps skipped for inf/NaN gradients (trainers/accel/precision.py)
)
AMP_LOSS_SCALE = "amp/loss_scale"  # fp16: the loss scale S
MEMORY_PEAK = "memory/peak_bytes"  # on a GPU, at each push: torch.cuda.max_memory_allocated of rank 0
# language models (the batch counts sequences of T tokens; these count tokens)
VAL_PERPLEXITY = "val/perplexity"  # exp(val/loss), val/loss a per-sequence mean of token losses
BATCH_GLOBAL_TOKENS = "batch/global_tokens"
TOKENS_SEEN = "tokens_seen"
THROUGHPUT_TOKENS = "throughput/tokens_per_s"

# gradient combination (trainers/combine/methods.py; combine.method local_sgd)
COMBINE_SYNCS = "combine/syncs"  # parameter averages so far
COMBINE_BYTES_SENT = "combine/bytes_sent"  # payload this rank contributed to them
COMBINE_BYTES_SAVED = "combine/bytes_saved"  # per-step gradient averaging's payload minus bytes_sent
COMBINE_BYTES_PER_STEP = "combine/bytes_per_step"  # dmsgd/decentlam: sent by this worker to its neighbours, last step
COMBINE_ALLREDUCE_BYTES_PER_STEP = "combine/allreduce_bytes_per_step"  # a ring all-reduce of the same parameters
COMBINE_CONSENSUS_DISTANCE = "combine/consensus_distance"  # (1/W) sum_i |x_i - mean x|^2 over the workers

# -- logged by the driver ------------------------------------------------------------------------
RESTARTS = "restarts"
ROLLBACKS = "rollbacks"  # train.on_nonfinite: rollback, logged at the diverged step
LR_FACTOR = "lr_factor"  # the learning-rate factor after a rollback (0.5 ** rollbacks)
DRAINED_WORKERS = "drain/workers"  # workers on a node drained with a notice, at the step the run left it
DRAINED_LEFT_S = "drain/left_s"  # the seconds left before the drained node's deadline when the run saw it
RESIZE_FROM = "resize/from"
RESIZE_TO = "resize/to"
RESIZE_LATENCY_S = "resize/latency_s"
# a resize that could not pay for itself (trainers/policies/resize.py resize_pays): its best-case gain and its cost
RESIZE_SKIPPED_GAIN_S = "resize/skipped_gain_s"
RESIZE_SKIPPED_COST_S = "resize/skipped_cost_s"
# scaling.policy goodput (trainers/policies/goodput.py), at each decision: the predicted goodput
# (B0-equivalent samples/s) of the (B, W) in force and of the one chosen, and the B_noise it used
GOODPUT_CURRENT = "goodput/current"
GOODPUT_CHOSEN = "goodput/chosen"
GOODPUT_B_NOISE = "goodput/b_noise"
# what the run cost, at the driver's end (orchestrator/record/cost.py): its worker groups' worker-seconds
# (and GPU-seconds where workers hold GPUs), from each group's fit() call to its return, every driver's
COST_WORKER_SECONDS = "cost/worker_seconds"
COST_GPU_SECONDS = "cost/gpu_seconds"


# Metrics every step row may carry (in the order the search layer lists them).
STEP_METRICS = (
    VAL_ACCURACY,
    VAL_LOSS,
    TRAIN_LOSS,
    LR,
    MF,
    BATCH_GLOBAL,
    BATCH_SAMPLES,
    BATCH_LOCAL,
    BATCH_ACCUM_STEPS,
    WORKERS,
    SAMPLES_SEEN,
    EPOCH,
    THROUGHPUT,
    GNS_B_SIMPLE,
    VAL_PERPLEXITY,
    BATCH_GLOBAL_TOKENS,
    TOKENS_SEEN,
    THROUGHPUT_TOKENS,
)
