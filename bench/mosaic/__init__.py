"""MosaicML Streaming beside the token shards (bench/tokens.py): kept out of bench/*.py, which holds only benchmarks."""
