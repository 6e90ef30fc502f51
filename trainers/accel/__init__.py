"""The accelerator around the model: device placement, channels_last, compile, precision.

Import the submodules directly; the order in which packages may import each other is in
``docs/architecture.md``."""
