"""Where a search's trials write: the study's MLflow experiment and the base config's checkpoint folder."""

from __future__ import annotations

import logging
from typing import Any

from orchestrator.config.code import runtime_env
from orchestrator.config.schema import validate
from orchestrator.config.uris import absolute_tracking_uri
from search.space import SearchSpace
from search.view import trial_run_name
from trainers.loop.storage import join, resolve, store_for

logger = logging.getLogger(__name__)


class Targets:
    """Where a trial's run writes: the study's MLflow experiment (``tracking_uri``), the base config's
    checkpoint folder (``storage_path``), and the user's code its actors need (``runtime_env``);
    ``storage``: where the study itself lives, as shown."""

    def __init__(self, space: SearchSpace, tracking_uri: str | None, storage_desc: str) -> None:

        base_cfg = validate(space.base)
        self.tracking_uri = absolute_tracking_uri(tracking_uri or base_cfg.tracking.resolved_uri())
        self.experiment = base_cfg.tracking.experiment
        self.runtime_env = runtime_env(base_cfg)  # the user's code, for the trial actors (orchestrator/config/code.py)
        self.storage_path = resolve(base_cfg.checkpoint.storage_path)  # a local folder made absolute, or a URI
        self.storage = storage_desc
        self.base_batch = float(base_cfg.batch.size)  # the unit of equal work (records.ReportUnit)

    def runtime(self, raw: dict[str, Any], number: int) -> dict[str, Any]:
        """Where trial ``number``'s results go: the study's MLflow experiment and the checkpoint folder."""
        raw.setdefault("tracking", {}).update(
            uri=self.tracking_uri, experiment=self.experiment, run_name=trial_run_name(number)
        )
        raw.setdefault("checkpoint", {})["storage_path"] = self.storage_path
        return raw

    def delete_checkpoints(self, run_id: str) -> None:
        """Every checkpoint folder of the training run of MLflow run ``run_id`` (all its phases)."""
        store = store_for(self.storage_path)
        try:
            for name, kind in store.children(self.storage_path):
                if kind == "dir" and name.startswith(f"elastic-{run_id}"):
                    store.remove(join(self.storage_path, name))
        except OSError as e:  # an object store that does not answer now: the folders stay
            logger.warning("could not delete the checkpoints of run %s (%s)", run_id, e)
