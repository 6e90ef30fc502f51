"""The push pace of the loop (trainers/loop/meter.py)."""


def test_push_interval_follows_the_step_pace_but_never_below_log_every():
    from trainers.loop.meter import push_interval

    assert push_interval(10, 0.25, steps=10, seconds=0.02) == 125  # 500 steps/s -> a push per 0.25 s
    assert push_interval(10, 0.25, steps=10, seconds=5.0) == 10  # slow steps: every log_every steps
    assert push_interval(10, 0.0, steps=10, seconds=0.02) == 10  # time-based pushes turned off
    assert push_interval(1, 0.25, steps=3, seconds=1e-6) == 10_000  # capped
