"""A run's charts for review, logged as artifacts: the training curves (``plots/training_curves.png``)
and the stretches of constant B and W (``timeline.json``, ``plots/timeline.png``)."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd
from mlflow.utils.mlflow_tags import MLFLOW_LOGGED_ARTIFACTS

from orchestrator.record.note import (
    changes as resize_steps,
)  # resize/to changes at each resize (its stretch's end repeats it)
from orchestrator.record.timeline import plot
from trainers.link import metrics as M


class RunPlots:
    """Draw a run's metrics and timeline and log the pictures and table into the run."""

    def __init__(self, client: Any, run_id: str) -> None:
        self.client, self.run_id = client, run_id

    def curves(self, history: dict[str, list[tuple[int, float]]]) -> None:
        """The loss, accuracy, lr, mf, B and W over the steps (``history``: the points MLflow holds
        of each metric), a dashed line at each resize; nothing without any of them."""

        matplotlib.use("Agg")

        panels = [(M.TRAIN_LOSS, M.VAL_LOSS), (M.VAL_ACCURACY,), (M.LR,), (M.MF,), (M.BATCH_GLOBAL,), (M.WORKERS,)]
        panels = [p for p in panels if any(history.get(k) for k in p)]
        if not panels:
            return
        fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.2 * len(panels)), sharex=True, squeeze=False)
        for ax, keys in zip(axes[:, 0], panels):
            for k in keys:
                pts = sorted(history.get(k, []))
                if pts:
                    ax.plot(
                        [s for s, _ in pts],
                        [v for _, v in pts],
                        label=k,
                        drawstyle="steps-post" if k in (M.WORKERS, M.BATCH_GLOBAL) else "default",
                        marker="o" if k.startswith("val/") else None,
                        markersize=3,
                    )
            for step, _ in resize_steps(history.get(M.RESIZE_TO, [])):  # where the worker group was resized
                ax.axvline(step, color="gray", linestyle="--", linewidth=0.8)
            ax.set_ylabel(keys[0])
            ax.grid(alpha=0.3)
            if len(keys) > 1:
                ax.legend(loc="upper right")
        axes[-1, 0].set_xlabel("optimizer step")
        fig.tight_layout()
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "training_curves.png")
            fig.savefig(path, dpi=100)
            self.client.log_artifact(self.run_id, path, "plots")
        plt.close(fig)

    def _replace_table(self, table: dict[str, list[Any]], artifact_file: str) -> None:
        """``table`` as the run's table artifact ``artifact_file``, in place of one an earlier driver
        of the run logged.  MLflow's ``log_table`` appends to an existing one (a resumed run's
        timeline would hold the first driver's rows and then the whole run's again); this writes
        the same file (pandas' ``split`` JSON) and the same tag that shows it in the UI's table view."""
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, os.path.basename(artifact_file))
            pd.DataFrame(table).to_json(path, orient="split", index=False, date_format="iso")
            self.client.log_artifact(self.run_id, path, os.path.dirname(artifact_file) or None)
        logged = json.loads(self.client.get_run(self.run_id).data.tags.get(MLFLOW_LOGGED_ARTIFACTS, "[]"))
        entry = {"path": artifact_file, "type": "table"}
        if entry not in logged:
            self.client.set_tag(self.run_id, MLFLOW_LOGGED_ARTIFACTS, json.dumps([*logged, entry]))

    def timeline(self, timeline: Any) -> None:
        """The run's stretches of constant B and W and its resizes (orchestrator/record/timeline.py): the
        table artifact ``timeline.json`` (MLflow's table view) and the chart ``plots/timeline.png``."""

        table = timeline.table()
        if not table:
            return
        self._replace_table(table, "timeline.json")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "timeline.png")
            if plot(timeline, path):
                self.client.log_artifact(self.run_id, path, "plots")
