"""bench/scale.py's model (no processes): the ring all-reduce, the fits, the projected step and
speedups, the cost of losing a node; and its bad arguments (exit 2 before anything is measured).
The measuring itself runs in tests/integration/test_benches.py (``bench/scale.py --quick``)."""

import math

import pytest

from bench import scale
from bench.scale import Compute, Network, Recovery, fit_line, fit_network, projection, ring_allreduce_s, step_s

GPU = Network("gpu", 100e9, 5e-6)


def test_ring_allreduce_moves_twice_the_data_once_w_is_large_and_pays_a_latency_per_hop():
    assert ring_allreduce_s(1, 1e9, GPU) == 0.0
    # W = 2: 2 * 1/2 * S at 100 Gb/s + 2 hops
    assert ring_allreduce_s(2, 1e9, GPU) == pytest.approx(8e9 / 100e9 + 2 * 5e-6)
    big = ring_allreduce_s(10_000, 1e9, GPU)
    assert big == pytest.approx(2 * 0.9999 * 0.08 + 2 * 9999 * 5e-6)
    # the bandwidth term saturates at 2 S / bandwidth; the latency term grows with W
    assert ring_allreduce_s(512, 0, GPU) == pytest.approx(2 * 511 * 5e-6)


def test_fit_line_recovers_a_line_and_keeps_both_terms_non_negative():
    a, c = fit_line([10, 20, 40], [0.002 + 1e-4 * b for b in (10, 20, 40)])
    assert a == pytest.approx(0.002) and c == pytest.approx(1e-4)
    a, c = fit_line([10, 20], [0.0005, 0.003])  # the line would cross zero: through the origin instead
    assert a == 0.0 and c == pytest.approx((10 * 0.0005 + 20 * 0.003) / 500)
    assert fit_line([10, 20], [0.003, 0.002]) == (pytest.approx(0.0025), 0.0)  # slower with fewer samples: flat
    assert fit_line([16, 16], [1.0, 3.0]) == (2.0, 0.0)


def test_fit_network_recovers_bandwidth_and_latency_of_ring_all_reduces():
    true = Network("t", 5e9, 300e-6)
    points = [(w, b, ring_allreduce_s(w, b, true)) for w in (2, 3) for b in (4096, 65536, 1 << 20, 1 << 22)]
    got = fit_network(points)
    assert got.bandwidth_bps == pytest.approx(5e9, rel=1e-6) and got.latency_s == pytest.approx(300e-6, rel=1e-6)
    # times that do not grow with size: all latency, bandwidth as good as unlimited
    flat = fit_network([(2, 4096, 1e-3), (2, 1 << 20, 1e-3), (3, 4096, 2e-3)])
    assert flat.bandwidth_bps >= scale.UNRESOLVED_BPS and flat.latency_s > 0
    with pytest.raises(ValueError):
        fit_network([(1, 4096, 1e-3)])


def test_step_time_adds_compute_and_all_reduce_and_hides_at_most_backward():
    comp = Compute(0.001, 1e-4)
    t, tc, ta = step_s(8, 32, comp, 1e8, GPU)
    assert tc == pytest.approx(0.0042) and ta == pytest.approx(ring_allreduce_s(8, 1e8, GPU)) and t == tc + ta
    # full overlap hides the all-reduce up to backward's 2/3 of compute, never more
    t, tc, ta = step_s(8, 32, comp, 1e8, GPU, overlap=1.0)
    assert t == pytest.approx(tc + ta - 2 / 3 * tc) and ta > 2 / 3 * tc
    t_small, tc, ta = step_s(2, 32, comp, 1e3, GPU, overlap=1.0)
    assert t_small == pytest.approx(tc)
    assert Compute(0.001, 1e-4, speedup=10)(32) == pytest.approx(0.00042)


def test_projection_speedups_fall_below_w_as_the_all_reduce_grows():
    comp = Compute(0.002, 1e-4)
    free = projection([1, 8, 64], comp, 0, Network("free", 1e30, 0.0), local_batch=32, strong_batch=8192)
    assert [r["speedup"] for r in free] == pytest.approx([1, 8, 64]) and free[1]["batch"] == 256
    rows = projection([1, 8, 64, 512], comp, 4e6, GPU, local_batch=32, strong_batch=256)
    by_w = {r["workers"]: r for r in rows}
    assert by_w[1]["speedup"] == 1.0 and by_w[1]["ar_s"] == 0.0
    eff = [by_w[w]["efficiency"] for w in (8, 64, 512)]
    assert 1 > eff[0] > eff[1] > eff[2] > 0
    assert by_w[64]["samples_per_s"] == pytest.approx(32 * 64 / by_w[64]["step_s"])
    # B fixed: 256 / 512 is less than a sample a worker, so no strong-scaling figure there
    assert by_w[512]["strong_speedup"] is None and by_w[64]["strong_speedup"] is not None
    t1 = step_s(1, 256, comp, 4e6, GPU)[0]
    assert by_w[8]["strong_speedup"] == pytest.approx(t1 / step_s(8, 32, comp, 4e6, GPU)[0])


def test_recovery_adds_detection_restart_load_and_half_the_checkpoint_interval():
    rec = Recovery(
        detect_period_s=3,
        detect_threshold=5,
        train_poll_s=2,
        restart_s=10,
        restart_per_node_s=1,
        state_bytes=1e9,
        storage_Bps=10e9,
        checkpoint_every_s=600,
        workers_per_node=8,
        node_mtbf_h=6000,
    )
    c = rec.cost(64)  # 8 nodes; one lost: 7 nodes, 56 workers restart and read the state
    assert c["nodes"] == 8 and c["detect_s"] == 17
    assert c["restart_s"] == 10 + 7 and c["load_s"] == pytest.approx(56 * 0.1) and c["lost_work_s"] == 300
    assert c["total_s"] == pytest.approx(17 + 17 + 5.6 + 300)
    assert c["failures_per_day"] == pytest.approx(24 * 8 / 6000)
    assert c["time_lost"] == pytest.approx(8 / 6000 * c["total_s"] / 3600)
    one = rec.cost(3)  # a one-node group waits for its replacement and restarts at its size
    assert one["nodes"] == 1 and one["restart_s"] == 11 and one["load_s"] == pytest.approx(0.3)
    assert rec.cost(512)["time_lost"] > c["time_lost"]  # failures grow with the nodes


def test_the_modelled_detection_is_rays_default_health_check():
    d = scale.RAY_HEALTH_CHECK
    assert Recovery(train_poll_s=0).detect_s == d["health_check_period_ms"] * d["health_check_failure_threshold"] / 1000


def test_ray_train_poll_follows_its_environment_variable(monkeypatch):
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    assert scale.ray_train_poll_s() == 0.5
    monkeypatch.delenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S")
    assert math.isfinite(scale.ray_train_poll_s()) and scale.ray_train_poll_s() > 0


@pytest.mark.parametrize(
    "argv, field",
    [
        (["--overlap", "2"], "--overlap"),
        (["--batch", "4"], "--batch"),
        (["--workers", "1,x"], "--workers"),
        (["--cold-start-s", "15"], "--cold-start-s"),
        (["--bandwidth-gbps", "0"], "--bandwidth-gbps"),
    ],
)
def test_bad_arguments_exit_2_with_one_line_naming_the_field(argv, field, capsys, monkeypatch):
    monkeypatch.setattr(scale, "measure_compute", lambda *a, **k: pytest.fail("measured despite a bad argument"))
    with pytest.raises(SystemExit) as e:
        scale.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(field) and "\n" not in err
