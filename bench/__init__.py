"""The benchmarks: each prints its figures beside a reference measured in the same run."""
