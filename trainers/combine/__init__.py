"""How the ranks' gradients become one update: mean (DDP), Adasum, local SGD.

Import the submodules directly; the order in which packages may import each other is in
``docs/architecture.md``."""
