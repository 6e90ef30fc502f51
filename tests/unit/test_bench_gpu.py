import pytest

from bench import gpu


def test_quick_cpu_form_prints_device_memory_and_rate(capsys):
    gpu.main(["--device", "cpu", "--quick", "--models", "cnn", "--augment", "random_crop,hflip"])
    out = capsys.readouterr().out
    assert "device: CPU" in out and "tuned plain PyTorch loop" in out and "MiB" in out


def test_report_prints_ratio_when_the_orchestrator_row_exists():
    setup = gpu.Setup(device="cpu")
    ms = {"plain": [gpu.Measurement("plain", "resnet18", 100.0, 1, 1.0, 0)],
          "orchestrator": [gpu.Measurement("orchestrator", "resnet18", 95.0, 1, 1.0, 0)]}
    gpu.ROWS.setdefault("orchestrator", ("orchestrator loop, W=1", None))
    try:
        assert gpu.report(setup, ms).splitlines()[-1] == "ratio=0.950"
    finally:
        gpu.ROWS.pop("orchestrator")


def test_fp16_on_cpu_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        gpu.main(["--device", "cpu", "--precision", "fp16", "--quick"])
    assert e.value.code == 2 and "train.precision" in capsys.readouterr().err
