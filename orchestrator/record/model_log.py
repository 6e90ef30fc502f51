"""A run's final model in MLflow: the raw state dict (``model/model.pt`` with ``config.yaml``) and an
MLflow PyTorch model with a signature, optionally registered."""

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

from orchestrator.config.schema import RootConfig, public_config
from orchestrator.config.uris import redact_text
from trainers.errors import one_line
from trainers.link import tags as T
from trainers.workload.build import build_workload

MODEL_NAME = "final_model"  # the MLflow Model's name (the run's artifact "model/" holds the raw state dict)
EXAMPLE_ROWS = 4  # validation samples in the logged model's input example


class ModelLogger:
    """Log a run's final weights as its model, and register it where asked.

    ``set_tags``: how the run's tags are set (the model's error, its registered version)."""

    def __init__(self, client: Any, run_id: str, experiment_id: str, set_tags: Callable[[dict[str, Any]], None]):
        self.client, self.run_id, self.experiment_id = client, run_id, experiment_id
        self.set_tags = set_tags

    def log(
        self,
        model_state: dict[str, Any],
        cfg: RootConfig,
        functions: dict[str, Any] | None = None,
        register: str | None = None,
        warn: Any = print,
    ) -> tuple[str | None, str | None]:
        """The final weights as the artifact ``model/model.pt`` (a state dict, with ``config.yaml``),
        and as an MLflow PyTorch model (:meth:`log_pytorch`).  Returns that model's URI and, with
        ``register``, the registered ``name/version`` (None where logging it failed: warned)."""

        with tempfile.TemporaryDirectory() as d:
            torch.save(model_state, os.path.join(d, "model.pt"))
            with open(os.path.join(d, "config.yaml"), "w") as f:
                f.write(yaml.safe_dump(public_config(cfg), sort_keys=False))
            self.client.log_artifacts(self.run_id, d, "model")
        try:
            return self.log_pytorch(model_state, cfg, functions, register)
        except Exception as e:  # the run trained; its weights are logged above
            why = redact_text(one_line(e, None))[:300]
            message = f"the MLflow model was not logged ({why}); model/model.pt holds the weights"
            warn(f"warning: {message}")
            self.set_tags({T.MODEL_ERROR: message})
            return None, None

    def log_pytorch(
        self, model_state: dict[str, Any], cfg: RootConfig, functions: dict[str, Any] | None, register: str | None
    ) -> tuple[str, str | None]:
        """The model rebuilt on the driver with the final weights, logged with ``mlflow.pytorch`` as
        :data:`MODEL_NAME` (under the run's Logged models), its signature inferred from the first
        validation samples (also its input example).  Saved with ``torch.export`` (MLflow's default:
        loads without this project's code); a model that cannot be exported is pickled instead.
        With ``register``, registered under that name."""

        torch.manual_seed(cfg.train.seed)
        work = build_workload(cfg, functions)
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
            name=MODEL_NAME,
            run_id=self.run_id,
            signature=signature,
            input_example=example,
            pip_requirements=[f"torch=={importlib.metadata.version('torch')}"],
            validate_serving_input=False,
        )  # the example was just run through the model

        def new_model() -> str:
            # created here so that it belongs to the run's experiment (log_model alone would put it in
            # the active experiment of this process, the Default one)
            return self.client.create_logged_model(
                self.experiment_id, name=MODEL_NAME, source_run_id=self.run_id, model_type="pytorch"
            ).model_id

        try:
            info = mlflow.pytorch.log_model(model, model_id=new_model(), **common)
        except Exception:  # torch.export could not trace it (data-dependent control flow)
            info = mlflow.pytorch.log_model(model, model_id=new_model(), serialization_format="pickle", **common)
        version = None
        if register:
            mv = mlflow.register_model(info.model_uri, register)
            version = f"{mv.name}/{mv.version}"
            self.set_tags({T.REGISTERED_MODEL: version})
        return info.model_uri, version
