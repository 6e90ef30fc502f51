"""The run's timeline (orchestrator/record/timeline.py): stretches of constant B and W from the step
records, each resize's latency on the stretch it opened, and the summary table."""

from __future__ import annotations

from orchestrator.record.timeline import Timeline, format_table, plot


def _rec(step: int, b: int, w: int, t: float, n: int | None = None) -> tuple:
    return (step, {"batch/global": float(b), "workers": float(w), "batch/samples": float(n or b)}, t)


def _timeline() -> Timeline:
    tl = Timeline()
    tl.add_records([_rec(s, 32, 1, 100.0 + s) for s in range(1, 11)])  # steps 1-10: B 32 on 1
    tl.add_records([_rec(s, 48, 1, 100.0 + s) for s in range(11, 21)])  # the batch grew, same group
    tl.add_records([_rec(20, 48, 1, 999.0)])  # a step seen before: ignored
    tl.add_records([_rec(21, 72, 2, 130.0)])  # resized: 9 s stand-still
    tl.add_resize(
        {
            "from": 1,
            "to": 2,
            "mode": "restart",
            "step": 20,
            "time": 120.5,
            "latency_s": 9.0,
            "overlap_s": 0.0,
            "teardown_s": 2.0,
            "start_s": 4.0,
            "setup_s": 3.0,
        }
    )
    tl.add_records([_rec(s, 72, 2, 110.0 + s, 50 if s == 25 else None) for s in range(22, 26)])
    return tl


def test_stretches_follow_b_and_w_and_carry_the_resize_that_opened_them():
    rows = _timeline().rows()
    assert [(r["batch"], r["workers"], r["first_step"], r["last_step"], r["steps"], r["samples"]) for r in rows] == [
        (32, 1, 1, 10, 10, 320),
        (48, 1, 11, 20, 10, 480),
        (72, 2, 21, 25, 5, 4 * 72 + 50),
    ]
    assert [r["resize_latency_s"] for r in rows] == [None, None, 9.0]
    # a stretch's wall time runs from the previous stretch's last step (the resize included)
    assert [r["wall_s"] for r in rows] == [9.0, 10.0, 15.0]


def test_the_table_artifact_puts_resizes_between_the_stretches_in_time_order():
    table = _timeline().table()
    assert table["kind"] == ["train", "train", "resize", "train"]
    i = table["kind"].index("resize")
    assert (table["latency_s"][i], table["teardown_s"][i], table["start_s"][i], table["begin_s"][i]) == (
        9.0,
        2.0,
        4.0,
        19.5,
    )
    assert table["begin_s"][0] == 0.0  # seconds from the first step
    assert len({len(v) for v in table.values()}) == 1


def test_the_summary_table_has_a_line_per_stretch(tmp_path):
    text = format_table(_timeline().rows())
    lines = text.splitlines()
    assert lines[0].split() == ["steps", "B", "W", "samples", "wall_s", "worker-s", "resize_latency_s"]
    assert lines[2].split() == ["1-10", "32", "1", "320", "9.0", "0.0"]  # no holds written down: no cost
    assert lines[4].split() == ["21-25", "72", "2", "338", "15.0", "0.0", "9.0"]
    assert plot(_timeline(), str(tmp_path / "t.png")) and (tmp_path / "t.png").stat().st_size > 0
    assert not plot(Timeline(), str(tmp_path / "empty.png"))


def _close_resizes() -> Timeline:
    """Three resizes within a few seconds of each other, and one at the very end of the run."""
    tl = Timeline()
    t, step = 0.0, 0
    for i, (b, w) in enumerate([(32, 1), (64, 2), (128, 4), (256, 8), (256, 4)]):
        if i:
            tl.add_resize(
                {
                    "from": tl.stretches[-1].workers,
                    "to": w,
                    "mode": "restart",
                    "step": step,
                    "time": t,
                    "latency_s": 1.0,
                    "overlap_s": 0.0,
                    "teardown_s": 0.3,
                    "start_s": 0.4,
                    "setup_s": 0.3,
                }
            )
            t += 1.0
        n = 400 if i == 0 else (2 if i < 4 else 1)  # the resizes: a few seconds apart in 200
        for _ in range(n):
            step, t = step + 1, t + 0.5
            tl.add_records([_rec(step, b, w, t)])
    return tl


def test_the_charts_labels_overlap_neither_the_axes_nor_each_other():
    import matplotlib.pyplot as plt

    from orchestrator.record.timeline import figure

    fig = figure(_close_resizes())
    renderer = fig.canvas.get_renderer()
    ax, ax2 = fig.axes
    key = [t for t in fig.texts if t is not fig._suptitle]
    labels = list(ax.texts) + key  # the resizes' numbers and the key's lines
    assert len(ax.texts) == 4 and len(key) == 4
    boxes = [t.get_window_extent(renderer) for t in labels]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b), (a, b)
    # nothing the chart draws by itself: the plotting area, the axis and tick labels, the title
    fixed = [ax.get_window_extent(renderer), fig._suptitle.get_window_extent(renderer)]
    for axis in (ax.xaxis, ax.yaxis, ax2.yaxis):
        fixed.append(axis.label.get_window_extent(renderer))
        fixed += [t.get_window_extent(renderer) for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
    page = fig.bbox
    for box in boxes:
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, box
        for other in fixed:
            assert not box.overlaps(other), (box, other)
    plt.close(fig)


def test_a_drained_node_the_run_left_is_a_row_of_its_own_kind():
    tl = _timeline()
    tl.add_drain({"step": 18, "time": 118.0, "node": "n1", "deadline": 148.0, "from": 1, "to": 2, "mode": "restart"})
    table = tl.table()
    assert table["kind"] == ["train", "train", "drain", "resize", "train"]  # the notice, then the resize it asked
    i = table["kind"].index("drain")
    # from the notice to the node's deadline, seconds from the first step
    assert (table["first_step"][i], table["begin_s"][i], table["end_s"][i], table["workers"][i]) == (18, 17.0, 47.0, 2)
    assert len({len(v) for v in table.values()}) == 1
