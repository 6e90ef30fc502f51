"""What runs on each worker: the training loop (trainer) and its parts.

The learner (the model side), the reporter (the link side), the group (rank, world, agreement), the checkpoint
manager, rollback and
the throughput meter.  Where the run stands lives in the batch plan (``trainers/policies/plan.py``).

Import the submodules directly; the order in which packages may import each other is in
``docs/architecture.md``."""
