"""What runs on each worker: the training loop, its checkpoint manager, rollback, meter and state.

Import the submodules directly; the order in which packages may import each other is in
``docs/architecture.md``."""
