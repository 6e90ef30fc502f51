"""Token shards on the multi-node tier: a tiny GPT reading its corpus from a bucket of the
S3-compatible server (every node reaches it), at W = 3 on three 1-CPU nodes, loses a node mid-run;
the run goes on at W = 2 from its newest checkpoint and trains the windows of a W = 1 run of the
same config, in the same order: each step's global batch (the ranks' ids of the step's last attempt,
in rank order) is the epochs' order (trainers/data/shards/order.py), which is what a run at a fixed
W trains (tests/integration/test_token_shards.py: a run at W = 1 then 2 against the same order; the
order is a function of the seed and the epoch alone, tests/unit): no W = 1 run is repeated here."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
import uuid

import numpy as np
import pytest
from torch import nn

from tests.helpers import migrated_store, read_sample_log
from tests.multinode.runs import (
    ask,
    checkpointed,
    driver,
    finish,
    free_cpus,
    lift_brake,
    logged_workers,
    refresh_train_view,
    run_id,
    wait_for,
    worker_nodes,
    workers_logged,
)

pytestmark = [pytest.mark.multinode, pytest.mark.timeout(900)]

SEED, BLOCK, EPOCHS, CONTEXT = 5, 2, 2, 16
SLEEP_S = 0.2  # each training micro-batch while the brake file exists: the node is lost mid-run on any machine


class _Braked(nn.Module):
    """A model whose training forward waits ``SLEEP_S`` while the file ``brake`` exists (same math)."""

    def __init__(self, inner: nn.Module, brake: str | None) -> None:
        super().__init__()
        self.inner, self.brake = inner, brake

    def forward(self, x):
        if self.training and self.brake and os.path.exists(self.brake):
            time.sleep(SLEEP_S)
        return self.inner(x)


def braked_gpt(brake: str | None = None, **params) -> nn.Module:
    """``model.factory`` of these runs: the catalog's GPT factory's model, braked."""
    from trainers.catalog import GPT
    from trainers.workload.lm_models import LM_MODELS

    return _Braked(LM_MODELS[GPT.name](**params), brake)


def _corpus(s3_server, tmp) -> str:
    """8 byte-level shards of 2000 tokens prepared in ``tmp`` and copied to a fresh bucket."""
    from trainers.data.shards.prepare import prepare

    src = tmp / "src.txt"
    src.write_bytes(bytes(np.random.default_rng(1).integers(32, 127, 16000, dtype=np.uint8)))
    m, _ = prepare([str(src)], str(tmp / "shards"), shard_tokens=2000, progress=False)
    bucket = s3_server.create_bucket(f"tok-{uuid.uuid4().hex[:10]}")
    fs = s3_server.filesystem()
    for name in [*(s.name for s in m.shards), "manifest.json"]:
        with fs.open_output_stream(f"{bucket}/corpus/{name}") as f:
            f.write((tmp / "shards" / name).read_bytes())
    return f"s3://{bucket}/corpus"


def _config(tmp, root: str, workers: int, brake: str | None = None) -> dict:
    return {
        "data": {
            "name": "token_shards",
            "root": root,
            "context": CONTEXT,
            "shard_block": BLOCK,
            "cache_bytes": 6 * 4000,
        },
        "model": {
            "factory": "tests.multinode.test_token_shards_nodes:braked_gpt",
            "loss": "token_cross_entropy",
            "params": {"n_layer": 1, "n_head": 2, "d_model": 16, "context": CONTEXT, "brake": brake},
        },
        "optimizer": {"name": "adamw", "lr": 0.001},
        "batch": {"size": 12, "max_local_batch": 4},  # W = 3 the batch's own size (W = 2, 1: micro-batches)
        "scaling": {
            "min_workers": min(2, workers),
            "max_workers": workers,
            "cpus_per_worker": 1,
            "max_failures": 3,
            "capacity_check_s": 2,  # a group started before Ray Train counted the third node grows within 2 s
        },
        "train": {"epochs": EPOCHS, "seed": SEED, "log_every": 5, "sample_log_dir": f"{tmp}/samples"},
        "checkpoint": {"every_steps": 5, "storage_path": f"{tmp}/ray_runs"},
        "tracking": {"uri": migrated_store(f"sqlite:///{tmp}/mlflow.db")},
    }


def _trained(tmp) -> list[int]:
    """The windows the run of ``tmp`` trained, step after step: each step as its last attempt trained
    it (a step trained again after a lost node: the new group's), its ranks in order."""
    rows = read_sample_log(f"{tmp}/samples")
    last: dict[int, float] = {}
    for r in rows:
        last[r["step"]] = max(last.get(r["step"], r["attempt"]), r["attempt"])
    by_step: dict[int, list[int]] = {}
    for r in sorted(rows, key=lambda r: (r["step"], r["rank"])):
        if r["attempt"] == last[r["step"]]:
            by_step.setdefault(r["step"], []).extend(r["ids"])
    assert sorted(by_step) == list(range(1, len(by_step) + 1)), "a step missing from the sample log"
    return [i for s in sorted(by_step) for i in by_step[s]]


def test_w3_on_three_nodes_losing_one_trains_the_windows_of_w1_in_order(cluster, s3_server, tmp_path):
    from trainers.data.shards.cache import default_cache_root
    from trainers.data.shards.dataset import load_tokens
    from trainers.data.shards.order import epoch_order

    worker_nodes(cluster, 3, cpus=1)
    root = _corpus(s3_server, tmp_path)
    try:
        deadline = time.time() + 120  # an earlier test's workers released, every node free
        while free_cpus(cluster) < 3:
            assert time.time() < deadline, "the three worker nodes' CPUs not free after 120 s"
            time.sleep(1)
        refresh_train_view(cluster)  # W = 3 from the first step
        lost = tmp_path / "w3"
        os.makedirs(lost)
        brake = os.path.join(lost, "brake")
        open(brake, "w").close()
        run = driver(cluster, str(lost), _config(lost, root, workers=3, brake=brake))
        # W = 3 logged and a checkpoint (a group that started smaller, before Ray Train counted the
        # third node, grows to 3 at its capacity check)
        wait_for(run, lost, "W = 3 and a checkpoint", lambda: 3 in workers_logged(lost) and checkpointed(lost))
        victim = sorted(cluster.worker_nodes, key=lambda n: n.node_id)[-1]
        cluster.remove_node(victim, allow_graceful=False)
        # Ray Train sizes the restarted group from a view of the nodes up to 20 s old, which the driver
        # has re-read at its next look (every 2 s): a look after Ray Train's decision leaves the group
        # waiting 10 s for the lost node's CPU (RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S) before it is
        # sized anew, a path test_node_changes' lost node takes as it comes.  The windows' order is
        # this test's point: the view is re-read as soon as Ray declares the node dead.
        ask(cluster, f"refresh_once_dead {victim.node_id}")
        wait_for(run, lost, "the run going on at W = 2", lambda: 2 in workers_logged(lost))
        lift_brake(lost)
        rc, text = finish(run, lost)
        assert rc == 0 and "Traceback" not in text, text
    finally:
        shutil.rmtree(os.path.join(default_cache_root(), hashlib.sha256(root.encode()).hexdigest()[:16]), True)
    assert logged_workers(f"sqlite:///{lost}/mlflow.db", run_id(lost))[-2:] == [3, 2], "W goes 3 -> 2 and stays"
    train, _ = load_tokens(root, context=CONTEXT, val_fraction=0.2, block=BLOCK, cache_dir=str(tmp_path / "c"))
    expected = np.concatenate([epoch_order(SEED, e, train.offsets, BLOCK) for e in range(EPOCHS)]).tolist()
    assert _trained(lost) == expected, "W = 3 losing a node trains the same windows in the same order"
