"""Train the example workload from a script with the Python API:
``cd examples/user_project && PYTHONPATH=src python train_script.py``."""

from my_workload.data import rings
from my_workload.model import ring_net

from orchestrator import fit

if __name__ == "__main__":
    result = fit("config.yaml", model_fn=ring_net, data_fn=rings, overrides=["train.epochs=2"])
    print(result.run_id, result.status, result.metrics)
