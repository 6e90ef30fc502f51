import os
import pickle

import numpy as np
import pytest

from bench import gpu
from orchestrator.config.schema import validate
from trainers.data.datasets import load_data


def test_quick_cpu_form_of_the_plain_row_prints_device_memory_and_rate(capsys):
    gpu.main(["--device", "cpu", "--quick", "--rows", "plain", "--augment", "random_crop,hflip"])
    out = capsys.readouterr().out
    assert "device: CPU" in out and "tuned plain PyTorch loop" in out and "MiB" in out
    assert "plain_samples_per_s=" in out


def test_report_prints_the_paired_ratios_of_sliced_rows():
    setup = gpu.Setup(device="cpu")
    ms = {
        "plain": [
            gpu.Measurement("plain", "resnet18", 100.0, 1, 1.0, 0),
            gpu.Measurement("plain", "resnet18", 104.0, 1, 1.0, 0),
        ],
        "ray": [gpu.Measurement("ray", "resnet18", 98.0, 1, 1.0, 0, {"ratio": 0.97})],
        "orchestrator": [gpu.Measurement("orchestrator", "resnet18", 95.0, 1, 1.0, 2**20, {"ratio": 0.95})],
    }
    lines = gpu.report(setup, ms).splitlines()
    assert lines[-3:] == ["plain_samples_per_s=102.0", "ratio_ray=0.970", "ratio=0.950"]


def test_fp16_on_cpu_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        gpu.main(["--device", "cpu", "--precision", "fp16", "--quick"])
    assert e.value.code == 2 and "train.precision" in capsys.readouterr().err


def test_the_cifar_files_load_as_cifar10_and_the_orchestrator_config_matches_the_plain_loop(tmp_path):
    root = gpu.write_cifar_files(str(tmp_path), 40, seed=1, n_test=8)
    d = load_data(gpu.data_config(root), 0, raw=True)
    x, y = gpu.synthetic_images(48, 1)
    assert d.num_train == 40 and len(d.val_y) == 8
    assert (d.train_x.numpy() == x[:40].numpy()).all() and d.train_y.tolist() == y[:40].tolist()
    with open(os.path.join(root, "cifar-10-batches-py", "data_batch_5"), "rb") as f:
        assert len(pickle.load(f)["labels"]) == 8
    setup = gpu.Setup(model="cnn", batch=8, device="cpu", augment=("hflip",), size=40)
    cfg = validate(gpu.orchestrator_config(setup, root, str(tmp_path), steps=10))
    assert (cfg.model.name, cfg.model.channels_last, cfg.train.precision, cfg.data.augment) == (
        "cnn",
        True,
        "bf16",
        ["hflip"],
    )
    assert cfg.batch.size == cfg.batch.max_local_batch == 8 and cfg.data.device == "host"
    assert cfg.train.epochs * 40 == pytest.approx(10 * 8)
    step, n = gpu.plain_step(setup, root)
    assert n == 40 and np.isfinite(step(np.arange(8), 0))


def test_gpu_checks_keeps_the_bench_figures_and_not_the_progress_redraws():
    from bench.gpu_checks import figures

    text = (
        "device: NVIDIA H200; B=256\n"
        "plain loop in a bare Ray Train worker: 1 slices [00:00]\r"
        "plain loop in a bare Ray Train worker: 9 slices [00:08]\r"
        "  plain loop in a bare Ray Train worker: 0.949 of the plain loop (19 pairs)\n"
        "noise\n"
        "tuned plain PyTorch loop               22000  1.000\n"
        "ratio_ray=0.949\n"
        "ratio=0.93\n"
    )
    assert figures(text) == [
        "device: NVIDIA H200; B=256",
        "plain loop in a bare Ray Train worker: 0.949 of the plain loop (19 pairs)",
        "tuned plain PyTorch loop               22000  1.000",
        "ratio_ray=0.949",
        "ratio=0.93",
    ]
