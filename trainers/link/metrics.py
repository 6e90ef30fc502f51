"""The names of the metrics a run logs: one constant per name, used by every producer
(the worker loop, the driver) and every consumer (MLflow tracking, the progress bar,
the search layer).  The strings are the run's public contract (MLflow keys): never
rename one.  How a run flows from the loop to MLflow: ``docs/architecture.md``."""

from __future__ import annotations

# -- one row per optimizer step (rank 0, trainers/loop.py) -------------------------------------
TRAIN_LOSS = "train/loss"
VAL_LOSS = "val/loss"
VAL_ACCURACY = "val/accuracy"
LR = "lr"
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
# language models (the batch counts sequences of T tokens; these count tokens)
VAL_PERPLEXITY = "val/perplexity"  # exp(val/loss), val/loss a per-sequence mean of token losses
BATCH_GLOBAL_TOKENS = "batch/global_tokens"
TOKENS_SEEN = "tokens_seen"
THROUGHPUT_TOKENS = "throughput/tokens_per_s"

# gradient combination (trainers/combine.py; combine.method local_sgd)
COMBINE_SYNCS = "combine/syncs"  # parameter averages so far
COMBINE_BYTES_SENT = "combine/bytes_sent"  # payload this rank contributed to them
COMBINE_BYTES_SAVED = "combine/bytes_saved"  # per-step gradient averaging's payload minus bytes_sent

# -- logged by the driver ------------------------------------------------------------------------
RESTARTS = "restarts"
RESIZE_FROM = "resize/from"
RESIZE_TO = "resize/to"
RESIZE_LATENCY_S = "resize/latency_s"


def resize_part(part: str) -> str:
    """``resize/<part>`` for a part of a resize's latency (``overlap_s``, ``teardown_s``,
    ``start_s``, ``setup_s``; see orchestrator/phases.py)."""
    return f"resize/{part}"


# Metrics every step row may carry (in the order the search layer lists them).
STEP_METRICS = (VAL_ACCURACY, VAL_LOSS, TRAIN_LOSS, LR, MF, BATCH_GLOBAL, BATCH_SAMPLES, BATCH_LOCAL, BATCH_ACCUM_STEPS,
                WORKERS, SAMPLES_SEEN, EPOCH, THROUGHPUT, GNS_B_SIMPLE, VAL_PERPLEXITY, BATCH_GLOBAL_TOKENS, TOKENS_SEEN,
                THROUGHPUT_TOKENS)
