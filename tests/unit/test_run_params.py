"""The params a run logs are the fields it reads (orchestrator/record/params.py): a digits run has no
synthetic-data fields, no auto-warmup knobs without auto warmup, no other policy's knobs."""

from __future__ import annotations

import os

from orchestrator.config.prepare import load_config
from orchestrator.config.schema import validate
from orchestrator.record.params import ConfigRecord

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _params(**sections) -> dict:
    raw = {"data": {"name": "digits"}, "model": {"name": "mlp", "hidden": 32}, "tracking": {"uri": "sqlite:///x.db"}}
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return ConfigRecord.from_config(validate(raw)).params


def test_the_quickstart_logs_only_what_a_digits_cnn_with_noise_scale_reads():
    p = ConfigRecord.from_config(load_config(os.path.join(ROOT, "configs", "quickstart.yaml"))).params
    # what it reads
    for key in (
        "data.name",
        "data.val_fraction",
        "model.name",
        "model.hidden",
        "model.norm",
        "optimizer.lr",
        "optimizer.mf_rule",
        "batch.policy",
        "batch.max_size",
        "batch.noise_scale_factor",
        "batch.ema",
        "batch.check_every",
        "scaling.resize_mode",
        "scaling.cpus_per_worker",
        "train.epochs",
    ):
        assert key in p, key
    # what it never reads: synthetic data, text, loaders of map-style data, other optimizers' and
    # policies' knobs, auto warmup, decay knobs without decay, GPU settings on CPU, unset values
    assert not [
        k
        for k in p
        if k.startswith(
            (
                "data.size",
                "data.shape",
                "data.num_classes",
                "data.seed",
                "data.context",
                "data.path",
                "data.root",
                "data.loader",
                "data.factory",
                "schedule.auto_",
                "model.factory",
            )
        )
    ]
    for key in (
        "optimizer.beta2",
        "optimizer.eps",
        "optimizer.trust_coefficient",
        "batch.norm_test_eta",
        "batch.schedule",
        "schedule.warmup_epochs",
        "schedule.min_lr",
        "schedule.milestones",
        "schedule.poly_power",
        "scaling.gpus_per_worker",
        "model.sync_bn",
        "model.zero_init_residual",
        "tracking.run_name",
        "code.auto",
        "code.py_modules",
    ):
        assert key not in p, key


def test_each_choice_brings_its_own_fields():
    auto = _params(schedule={"warmup": "auto", "decay": "cosine"})
    assert auto["schedule.auto_growth"] == 1.02 and "schedule.warmup_epochs" not in auto
    assert "schedule.auto_growth" not in _params(schedule={"warmup": "gradual", "warmup_epochs": 1})
    assert _params(schedule={"warmup": "gradual", "warmup_epochs": 1})["schedule.warmup_epochs"] == 1
    synthetic = _params(data={"name": "synthetic", "size": 512})
    assert synthetic["data.size"] == 512 and synthetic["data.shape"] == [1, 8, 8]
    adam = _params(optimizer={"name": "adamw"})
    assert "optimizer.beta2" in adam and "optimizer.trust_coefficient" not in adam
    fixed = _params()
    assert "batch.max_size" not in fixed and "batch.ema" not in fixed and "scaling.resize_mode" not in fixed
    step = _params(schedule={"decay": "step", "milestones": [0.5]})
    assert step["schedule.milestones"] == [0.5] and "schedule.min_lr" in step and "schedule.poly_power" not in step
    # the gradient-noise estimator's EMA runs for AdaScale too
    assert "batch.ema" in _params(schedule={"scaling_rule": "adascale"})


def test_a_factory_run_logs_the_factory_and_its_params_not_the_builtin_knobs():
    p = _params(
        data={"name": None, "factory": "pkg.mod:data", "params": {"n": 3}},
        model={"name": None, "factory": "pkg.mod:model", "hidden": 128},
    )
    assert p["data.factory"] == "pkg.mod:data" and p["data.params.n"] == 3 and p["model.factory"] == "pkg.mod:model"
    assert "data.name" not in p and "model.hidden" not in p and "model.norm" not in p
    assert p["data.loader.workers"] == 0 and "data.loader.prefetch" not in p  # no loader processes
    assert p["code.auto"] is True


def test_the_new_batch_policies_log_their_own_fields():
    ramp = _params(batch={"policy": "ramp", "ramp_to": 128, "ramp_epochs": 1})
    assert (ramp["batch.ramp_to"], ramp["batch.ramp_epochs"], ramp["batch.round_to"]) == (128, 1, 8)
    assert "batch.cbs_window" not in ramp and "batch.ema" not in ramp and "batch.check_every" not in ramp
    cbs = _params(batch={"policy": "cbs_warmup"})
    assert cbs["batch.cbs_window"] == 3 and cbs["batch.cbs_growth"] == 2.0 and "batch.ema" in cbs
    assert "batch.min_growth" not in cbs and "batch.ramp_to" not in cbs
    seesaw = _params(
        batch={"policy": "seesaw"}, schedule={"scaling_rule": "sqrt", "decay": "seesaw", "milestones": [0.5]}
    )
    assert seesaw["schedule.milestones"] == [0.5] and "schedule.decay_factor" in seesaw


def test_the_record_keeps_the_stores_credentials_to_reach_it_and_logs_none():
    """ConfigRecord (what the MLflow record takes from the config, read once): the tracking URI as
    given, to reach the store; the public config and the params with the credentials redacted."""
    cfg = validate(
        {"data": {"name": "digits"}, "model": {"name": "mlp"}, "tracking": {"uri": "postgresql://u:s3cret@db/ml"}}
    )
    record = ConfigRecord.from_config(cfg)
    assert record.uri == "postgresql://u:s3cret@db/ml"
    assert "s3cret" not in str(record.public) and "s3cret" not in str(record.params)
    assert record.params["data.name"] == "digits" and "data.size" not in record.params
    assert [d.tags[0].value for d in record.datasets] == ["training", "validation"]
