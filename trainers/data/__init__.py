"""The data: one order per (seed, epoch) that every worker agrees on, the datasets, the
sampler that feeds a DataLoader, augmentation and the input pipeline on the device.

Import the submodules directly; the order in which packages may import each other is in
``docs/architecture.md``."""
