"""The large-batch policies: LR scaling, warmup and decay, MF and momentum correction, batch
growth, worker count.

The one PolicySet that composes them and the one BatchPlan stepped with
them (the loop and ``plan`` alike). Plain Python: no Ray, no MLflow.

Import the submodules directly; the order in which packages may import each other is in
``docs/architecture.md``."""
