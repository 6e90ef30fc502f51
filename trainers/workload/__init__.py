"""A workload is a model, a (train, val) pair of datasets and a per-sample loss: built-in
names and the user's factories turned into the same thing.

Import the submodules directly; the order in which packages may import each other is in
``docs/architecture.md``."""
