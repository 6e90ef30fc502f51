"""Tokenized shards, in a local folder or under an object-store prefix, read in the global data order.

``manifest``: the on-disk format and its checks (no torch); ``order``: the epoch's window order, a pure
function of ``(seed, epoch)`` with shard locality; ``cache``: the bounded local cache of remote shards
and its prefetch thread; ``dataset``: the map-style windows the loop reads; ``prepare``: text files ->
shards with a Hugging Face tokenizer.  See ``manifest`` for why the format is what it is.
"""
