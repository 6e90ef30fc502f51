"""The worker's torch-profiler look (trainers/accel/profile.py, bench/gpu.py --profile)."""

from __future__ import annotations

import pytest
import torch

from trainers.accel.profile import StepProfiler, profiler_from_env


def test_the_profiled_window_is_the_named_steps_and_counts_host_syncs(tmp_path):
    path = tmp_path / "p.txt"
    prof = StepProfiler(str(path), skip=2, steps=3, cuda=False)
    for i in range(6):
        t = torch.randn(8).sum()
        if 2 <= i < 5:  # only inside the window: two reads of a tensor to the host a step
            t.item()
            float(t)
        prof.step()
        assert prof.written == (i >= 4)
    text = path.read_text()
    assert text.startswith("3 steps profiled after 2:")
    assert "aten::_local_scalar_dense 2.00" in text
    assert "top operators by CPU time" in text


def test_nothing_is_profiled_unless_asked_and_only_on_rank_0(tmp_path, monkeypatch):
    monkeypatch.delenv("ELB_PROFILE_DIR", raising=False)
    assert profiler_from_env(0, 0, cuda=False) is None
    monkeypatch.setenv("ELB_PROFILE_DIR", str(tmp_path))
    monkeypatch.setenv("ELB_PROFILE_SKIP", "4")
    assert profiler_from_env(1, 0, cuda=False) is None
    prof = profiler_from_env(0, 3, cuda=False)
    assert prof is not None and prof.skip == 4 and prof.steps == 20
    assert prof.path == str(tmp_path / "profile-phase3.txt")


def test_an_empty_window_is_refused(tmp_path):
    with pytest.raises(ValueError, match="steps must be >= 1"):
        StepProfiler(str(tmp_path / "p.txt"), steps=0)
