"""``scaling.policy: goodput`` on a real local Ray with a real MLflow store: the batch needs one worker
(B = max_local_batch), but goodput, fed the step times rank 0 measured and the noise scale, predicts
more goodput on 3 workers (half a CPU each) and the driver resizes the group to follow it; the run
logs why (the reason with every W's predicted goodput), as a tag, metrics and a line on the driver's
terminal."""

import pytest
from mlflow.tracking import MlflowClient

from orchestrator.run.runner import run_training
from tests.helpers import make_config, metric_series

pytestmark = pytest.mark.integration


def test_goodput_resizes_the_group_and_says_why(ray_cluster, tmp_path, capfd):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    # 18 steps of B=96 (1.2 epochs of digits' 1438 samples); goodput is asked every 10 steps: at step
    # 10, from W=1's step times alone (one W measured: no sync cost known yet), W=3 predicts the most.
    # resize_when: always: the run is far too short for a group's start to pay for itself.
    cfg = make_config(
        tmp_path,
        uri,
        optimizer={"base_batch_size": 96},
        batch={"size": 96, "max_local_batch": 96, "check_every": 10},
        scaling={
            "min_workers": 1,
            "max_workers": 3,
            "cpus_per_worker": 0.5,
            "resize_mode": "restart",
            "resize_when": "always",
            "policy": "goodput",
        },
        train={"epochs": 1.2, "log_every": 5, "eval_every": 0},
    )
    run = run_training(cfg, progress=False)
    assert run.status == "FINISHED"
    workers = metric_series(uri, run.run_id, "workers")
    assert workers[0] == (1, 1.0) and workers[-1] == (18, 3.0)
    assert [(r["from"], r["to"], r["step"]) for r in run.resizes] == [(1, 3, 10)]
    tags = MlflowClient(uri).get_run(run.run_id).data.tags
    reason = tags["elastic.goodput.change.1"]
    assert reason.startswith("step 10: growing W 1 -> 3, at B=96: goodput "), reason
    for w in (1, 2, 3):  # the predicted goodput of every alternative
        assert f"B=96 W={w}: goodput " in reason
    assert "B_noise " in reason and "B_noise unknown" not in reason  # goodput turned the noise estimator on
    assert tags["elastic.goodput.decisions"] == "1"
    ((step, chosen),) = metric_series(uri, run.run_id, "goodput/chosen")
    ((_, current),) = metric_series(uri, run.run_id, "goodput/current")
    assert step == 10 and chosen > current > 0
    assert "goodput at step 10: growing W 1 -> 3" in capfd.readouterr().err
