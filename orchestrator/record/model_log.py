"""A run's final model in MLflow, as a state dict and as an MLflow PyTorch model; the one registered.

The raw state dict is ``model/model.pt`` (with ``config.yaml``); the MLflow PyTorch model has a
signature and the run's last step (its metrics there linked to it).  Registered where asked: the
final model, or (``tracking.register_pick: best``) the run's model with the lowest ``val/loss`` among
its checkpoints' LoggedModels (orchestrator/record/checkpoint_models.py) and the final one, its
weights read from its checkpoint."""

from __future__ import annotations

import importlib.metadata
import os
import tempfile
from collections.abc import Callable
from typing import Any

import mlflow.pytorch
import numpy as np
import torch
import yaml
from mlflow.models import infer_signature

from orchestrator.config.schema import RootConfig
from orchestrator.config.uris import redact_text
from orchestrator.record.checkpoint_models import model_step, ranked_models
from trainers.errors import one_line
from trainers.link import tags as T
from trainers.loop.checkpoint import read_checkpoint
from trainers.loop.storage import store_for
from trainers.workload.build import build_workload

MODEL_NAME = "final_model"  # the MLflow Model's name (the run's artifact "model/" holds the raw state dict)
BEST_NAME = "best_model"  # the best checkpoint's weights as an MLflow Model (tracking.register_pick: best)
EXAMPLE_ROWS = 4  # validation samples in the logged model's input example


class ModelLogger:
    """Log a run's final weights as its model, and register it (or the best checkpoint) where asked.

    ``set_tags``: how the run's tags are set (the model's error, its registered version)."""

    def __init__(self, client: Any, run_id: str, experiment_id: str, set_tags: Callable[[dict[str, Any]], None]):
        self.client, self.run_id, self.experiment_id = client, run_id, experiment_id
        self.set_tags = set_tags

    def log(
        self,
        model_state: dict[str, Any],
        build: Callable[[], Any],
        config: dict[str, Any],
        register: str | None = None,
        pick: str = "last",
        warn: Any = print,
        step: int = 0,
    ) -> tuple[str | None, str | None]:
        """The final weights (of ``step``) as the artifact ``model/model.pt`` (a state dict, with the
        public ``config`` as ``config.yaml``), and as an MLflow PyTorch model (:meth:`log_pytorch`,
        the model rebuilt by ``build``: :func:`seeded_workload`).  Returns that model's URI and, with
        ``register``, the registered ``name/version`` of the model ``pick`` names (:meth:`register`;
        None where logging it failed: warned)."""

        with tempfile.TemporaryDirectory() as d:
            torch.save(model_state, os.path.join(d, "model.pt"))
            with open(os.path.join(d, "config.yaml"), "w") as f:
                f.write(yaml.safe_dump(config, sort_keys=False))
            self.client.log_artifacts(self.run_id, d, "model")
        try:
            uri = self.log_pytorch(model_state, build, MODEL_NAME, step)
            return uri, (self.register(uri, build, register, pick, warn) if register else None)
        except Exception as e:  # the run trained; its weights are logged above
            why = redact_text(one_line(e, None))[:300]
            message = f"the MLflow model was not logged ({why}); model/model.pt holds the weights"
            warn(f"warning: {message}")
            self.set_tags({T.MODEL_ERROR: message})
            return None, None

    def log_pytorch(self, model_state: dict[str, Any], build: Callable[[], Any], name: str, step: int) -> str:
        """The model rebuilt on the driver (``build``) with ``model_state``, logged with ``mlflow.pytorch`` as
        ``name`` at ``step`` (under the run's Logged models, the run's metrics of that step linked
        to it), its signature inferred from the first validation samples (also its input example).
        Saved with ``torch.export`` (MLflow's default: loads without this project's code); a model
        that cannot be exported is pickled instead.  Returns its ``models:/`` URI."""

        work = build()
        model = work.model.cpu()
        model.load_state_dict(model_state)
        model.eval()
        if work.tensors is not None:
            x = work.tensors.val_x[:EXAMPLE_ROWS]
        else:
            x = torch.stack([torch.as_tensor(work.val[i][0]) for i in range(min(EXAMPLE_ROWS, len(work.val)))])
        with torch.no_grad():
            y = model(x)
        example = x.numpy()
        signature = infer_signature(example, y.numpy() if isinstance(y, torch.Tensor) else np.asarray(y))
        common = dict(
            name=name,
            run_id=self.run_id,
            step=step,
            signature=signature,
            input_example=example,
            pip_requirements=[f"torch=={importlib.metadata.version('torch')}"],
            validate_serving_input=False,
        )  # the example was just run through the model

        def new_model() -> str:
            # created here so that it belongs to the run's experiment (log_model alone would put it in
            # the active experiment of this process, the Default one)
            return self.client.create_logged_model(
                self.experiment_id, name=name, source_run_id=self.run_id, model_type="pytorch"
            ).model_id

        # not deferred as a whole (orchestrator/interrupts.py): the export takes seconds, and ray job
        # stop's SIGKILL follows its SIGTERM after 3 s; a stop here leaves the model PENDING
        try:
            info = mlflow.pytorch.log_model(model, model_id=new_model(), **common)
        except Exception:  # torch.export could not trace it (data-dependent control flow)
            info = mlflow.pytorch.log_model(model, model_id=new_model(), serialization_format="pickle", **common)
        return info.model_uri

    def register(
        self, final_uri: str, build: Callable[[], Any], name: str, pick: str = "last", warn: Any = print
    ) -> str:
        """Register the final model (``final_uri``) under ``name``, or with ``pick`` ``best``
        (``tracking.register_pick``) the run's model lowest in ``val/loss`` whose weights are still stored (a checkpoint
        pruned by ``checkpoint.keep`` is passed over), logged as :data:`BEST_NAME` first.  Tags the
        run ``elastic.registered_model`` (``name/version``); returns that."""
        uri = final_uri
        if pick == "best":
            uri = self._best_uri(final_uri, build, warn)
        mv = mlflow.register_model(uri, name)
        version = f"{mv.name}/{mv.version}"
        self.set_tags({T.REGISTERED_MODEL: version})
        return version

    def _best_uri(self, final_uri: str, build: Callable[[], Any], warn: Any) -> str:
        for model in ranked_models(self.client, self.experiment_id, self.run_id):
            if model.model_uri == final_uri:
                return final_uri
            path = (model.tags or {}).get(T.CHECKPOINT_URI)
            if path and store_for(path).kind(path) is not None:
                state = read_checkpoint(path)["model"]
                return self.log_pytorch(state, build, BEST_NAME, model_step(model) or 0)
        warn("warning: no model of the run has val/loss; registering the final model")
        return final_uri


def seeded_workload(cfg: RootConfig, functions: dict[str, Any] | None = None) -> Any:
    """The run's workload (its model, a few validation samples) as the driver rebuilds it to log the
    final model: seeded with ``train.seed``, from ``cfg`` and the factories sent by value."""
    torch.manual_seed(cfg.train.seed)
    return build_workload(cfg, functions)
