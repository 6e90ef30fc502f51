"""The data order: one permutation per (seed, epoch), global batches, worker slices, micro-batches."""

import numpy as np

from trainers.data.datasets import digits_arrays


def test_digits_read_from_the_file_match_scikit_learns_loader():
    import subprocess
    import sys

    from sklearn.datasets import load_digits

    pixels, labels = digits_arrays()
    d = load_digits()
    np.testing.assert_array_equal(pixels, d.data)
    np.testing.assert_array_equal(labels, d.target)
    # and a worker that loads digits does not pay for importing scikit-learn
    code = (
        "import sys; from trainers.data.datasets import digits_arrays; digits_arrays(); print('sklearn' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _write_tiny_cifar(root, per_batch=6):
    """A tiny dataset in CIFAR-10's own on-disk format (python pickles of dicts)."""
    import os
    import pickle

    folder = os.path.join(root, "cifar-10-batches-py")
    os.makedirs(folder)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        entry = {
            "data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            "labels": rng.integers(0, 10, per_batch).tolist(),
        }
        with open(os.path.join(folder, name), "wb") as f:
            pickle.dump(entry, f)
    with open(os.path.join(folder, "batches.meta"), "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f)
    return folder
