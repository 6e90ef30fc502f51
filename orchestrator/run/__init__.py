"""The run layer: one training run on Ray (the phases of ``TorchTrainer.fit()``, the monitor actor,
the cluster's nodes and reservations) and how it ends (``outcome``)."""
