"""``plan`` without Ray: rows follow the data order, the batch schedule and the resize policy."""

import csv
import io

import pytest

from orchestrator.cli import main
from orchestrator.config.schema import validate
from orchestrator.preview import COLUMNS, make_plan, to_csv, to_table

N = 1438  # digits training samples at val_fraction 0.2


def _cfg(**sections):
    raw = {
        "data": {"name": "digits"},
        "model": {"name": "mlp"},
        "optimizer": {"lr": 0.1, "base_batch_size": 32, "mf": 0.9},
        "batch": {"size": 32, "max_local_batch": 32},
        "scaling": {"min_workers": 1, "max_workers": 4},
        "train": {"epochs": 3},
    }
    for k, v in sections.items():
        raw[k] = {**raw.get(k, {}), **v}
    return validate(raw)


def test_schedule_policy_grows_batch_and_workers_at_epoch_boundaries():
    plan = make_plan(_cfg(batch={"policy": "schedule", "schedule": [[1, 64], [2, 128]]}), every=1)
    e1 = -(-N // 32)
    e2 = e1 + -(-N // 64)
    rows = {int(r["step"]): r for r in plan.rows}
    assert plan.total_steps == -(-N // 32) + -(-N // 64) + -(-N // 128)
    assert rows[e1]["batch_global"] == 32 and rows[e1]["workers"] == 1  # the policy's B, also at the tail
    assert rows[e1]["batch_samples"] == N - 32 * (e1 - 1) and rows[e1 - 1]["batch_samples"] == 32
    assert rows[e1 + 1]["batch_global"] == 64 and rows[e1 + 1]["workers"] == 2
    assert rows[e2 + 1]["batch_global"] == 128 and rows[e2 + 1]["workers"] == 4
    assert rows[e1 + 1]["lr"] == pytest.approx(0.2) and rows[e2 + 1]["lr"] == pytest.approx(0.4)  # linear rule
    assert rows[plan.total_steps]["epoch"] == pytest.approx(3.0)


def test_legw_and_mf_rule_values():
    cfg = _cfg(
        schedule={"scaling_rule": "sqrt", "warmup": "legw", "warmup_epochs": 0.5},
        optimizer={"mf_rule": "per_worker_batch", "mf_ref_batch": 16},
        batch={"size": 128},
        scaling={"max_workers": 2},
    )
    plan = make_plan(cfg, every=1)
    first = plan.rows[0]
    assert first["workers"] == 2 and first["batch_local"] == 64 and first["accum_steps"] == 2
    assert first["mf"] == pytest.approx(0.9**4)  # b = 128/2 = 64 = 4 x 16
    # LEGW: warmup epochs = 0.5 * (128/32) = 2, peak 0.1 * sqrt(4) = 0.2
    warm_end = max(int(r["step"]) for r in plan.rows if r["epoch"] <= 2.0 + 1e-9)
    assert max(r["lr"] for r in plan.rows) == pytest.approx(0.2, rel=1e-2)
    assert all(r["lr"] < 0.2 for r in plan.rows if int(r["step"]) < warm_end - 1)
    assert any("per_worker_batch" in n for n in plan.notes)


def test_adaptive_parts_are_named():
    plan = make_plan(_cfg(batch={"policy": "noise_scale"}, schedule={"warmup": "auto", "decay": "cosine"}))
    text = " ".join(plan.notes)
    assert "noise_scale" in text and "auto" in text
    assert "note:" in to_table(plan)


def test_csv_columns_and_cli(tmp_path, capsys):
    rows = list(csv.DictReader(io.StringIO(to_csv(make_plan(_cfg(), every=10)))))
    assert (
        list(rows[0])
        == COLUMNS
        == ["step", "epoch", "lr", "mf", "batch_global", "workers", "batch_local", "accum_steps", "batch_samples"]
    )
    p = tmp_path / "c.yaml"
    p.write_text("data: {name: digits}\nbatch: {size: 64, max_local_batch: 32}\nscaling: {max_workers: 2}\n")
    png = tmp_path / "plan.png"
    assert main(["plan", str(p), "--format", "csv", "--every", "5", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == ",".join(COLUMNS) and png.stat().st_size > 1000
    assert main(["plan", str(p), "--set", "batch.size=0"]) == 2


def test_the_worker_loop_logs_what_plan_previews(tmp_path, monkeypatch):
    """Without Ray: the loop (one worker) and ``plan`` step the same batch plan, so every step's
    settings agree exactly, through warmup, decay, a batch change and the MF rule."""
    import torch

    from trainers.link.channel import Channel
    from trainers.link.runtime import Runtime
    from trainers.loop.config import LoopConfig
    from trainers.loop.trainer import Trainer

    cfg = _cfg(
        optimizer={"mf_rule": "per_worker_batch", "mf_ref_batch": 16, "name": "lars"},
        batch={"policy": "schedule", "schedule": [[1, 64]]},
        scaling={"max_workers": 1},
        schedule={"warmup": "gradual", "warmup_epochs": 0.5, "decay": "cosine"},
        train={"epochs": 1.8, "eval_every": 0},
    )
    logged: dict[int, dict[str, float]] = {}
    monkeypatch.setattr(Channel, "log", lambda self, step, metrics, when=None: logged.setdefault(step, metrics))
    runtime = Runtime(storage=str(tmp_path), run_prefix="elastic-p", run_name="elastic-p")
    t = Trainer(LoopConfig.model_validate(cfg.loop_dict()), runtime, rank=0, world=1, device=torch.device("cpu"))
    t.run()
    t.close()
    plan = make_plan(cfg, every=1)
    assert sorted(logged) == [int(r["step"]) for r in plan.rows] and t.state.finished
    for r in plan.rows:
        m = logged[int(r["step"])]
        for key, col in (
            ("lr", "lr"),
            ("mf", "mf"),
            ("batch/global", "batch_global"),
            ("workers", "workers"),
            ("batch/local", "batch_local"),
            ("batch/accum_steps", "accum_steps"),
            ("batch/samples", "batch_samples"),
            ("epoch", "epoch"),
        ):
            assert m[key] == r[col], (int(r["step"]), key)
    assert {r["accum_steps"] for r in plan.rows} == {1, 2} and plan.rows[-1]["epoch"] >= 1.8


def test_new_batch_policies_and_the_wd_rule_in_the_plan():
    """ramp and seesaw are planned exactly; the timescale rule adds a weight-decay column; cbs_warmup is
    decided at run time and says so."""
    ramp = make_plan(_cfg(batch={"policy": "ramp", "ramp_to": 96, "ramp_epochs": 1, "round_to": 32}), every=1)
    e = {int(r["step"]): r["epoch"] for r in ramp.rows}
    sizes = {int(r["step"]): int(r["batch_global"]) for r in ramp.rows}
    first64 = min(s for s, b in sizes.items() if b == 64)
    assert e[first64 - 1] >= 0.5 > e[first64 - 2]  # the row's epoch is after the step: it started at >= 0.5
    assert max(sizes.values()) == 96
    seesaw = make_plan(
        _cfg(
            optimizer={
                "name": "adamw",
                "lr": 0.001,
                "base_batch_size": 32,
                "mf": 0.9,
                "weight_decay": 0.1,
                "wd_rule": "timescale",
            },
            batch={"policy": "seesaw"},
            schedule={"scaling_rule": "sqrt", "decay": "seesaw", "milestones": [1, 2], "decay_factor": 0.5},
        ),
        every=1,
    )
    by_b = {int(r["batch_global"]): r for r in seesaw.rows}
    assert sorted(by_b) == [32, 64, 128]
    assert [by_b[b]["lr"] for b in (32, 64, 128)] == pytest.approx([0.001, 0.001 / 2**0.5, 0.0005])
    assert [by_b[b]["weight_decay"] for b in (32, 64, 128)] == pytest.approx([0.1, 0.1 * 2**0.5, 0.2])
    assert list(csv.DictReader(io.StringIO(to_csv(seesaw))))[0]["weight_decay"] == "0.1"
    assert to_table(seesaw).splitlines()[0].split()[-1] == "wd"
    cbs = make_plan(_cfg(batch={"policy": "cbs_warmup", "max_size": 256}))
    assert any("cbs_warmup" in n and "powers of x2" in n for n in cbs.notes)
