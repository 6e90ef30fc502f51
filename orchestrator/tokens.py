"""``python -m orchestrator tokens prepare SRC... --out DIR``: text files -> token shards and their
manifest, the corpus ``data.name: token_shards`` trains on (trainers/data/shards/prepare.py).

Upload the folder to an object store with your store's own tools (``aws s3 sync DIR s3://b/p``) and
set ``data.root`` to the prefix; the manifest there says what every worker checks each shard against.
"""

from __future__ import annotations

import argparse
from typing import Any

from orchestrator.config.flags import number
from orchestrator.config.schema import ConfigError


def add_parser(sub: Any) -> None:
    """The ``tokens`` command and its ``prepare`` subcommand, on the CLI's subparsers."""
    tok = sub.add_parser(
        "tokens",
        help="prepare token shards (data.name: token_shards) from text files",
        description="Token shards and their manifest for data.name: token_shards.",
    )
    tsub = tok.add_subparsers(dest="tokens_command", required=True, metavar="SUBCOMMAND")
    p = tsub.add_parser(
        "prepare",
        help="tokenize text files into shards and write manifest.json last",
        description="Tokenize text files (or folders of them) into flat uint16/uint32 shards and a manifest. "
        "Default tokenizer: bytes (the text set's vocabulary of 256). Idempotent: a second run with the same "
        "inputs writes nothing.",
    )
    p.add_argument("sources", nargs="*", metavar="SRC", help="text files or folders (default: the text set's corpus)")
    p.add_argument("--out", required=True, metavar="DIR", help="the folder to write shards and manifest.json to")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--tokenizer", metavar="tokenizer.json", help="a local Hugging Face tokenizer file")
    how.add_argument(
        "--train-bpe",
        type=number(int, ge=257, example="--train-bpe 4096"),
        metavar="VOCAB",
        help="train a byte-level BPE of this vocabulary on the sources (saved as DIR/tokenizer.json)",
    )
    p.add_argument(
        "--shard-tokens",
        type=number(int, ge=2, example="--shard-tokens 1048576"),
        default=1 << 20,
        metavar="N",
        help="tokens per shard (default 1048576; a short last shard joins the one before)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def cmd_tokens(args: argparse.Namespace) -> int:
    from trainers.data.shards.prepare import prepare

    sources = list(args.sources)
    if not sources:
        from trainers.data.text import default_corpus

        sources = [str(p) for p in default_corpus()]
    try:
        m, written = prepare(
            sources,
            args.out,
            tokenizer_file=args.tokenizer,
            train_bpe=args.train_bpe,
            shard_tokens=args.shard_tokens,
            progress=not args.no_progress,
        )
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(str(e)) from None
    state = "wrote" if written else "up to date:"
    print(
        f"{state} {len(m.shards)} shards, {m.total_tokens:,} {m.dtype} tokens (vocabulary {m.vocab_size}) "
        f"and manifest.json in {m.location}"
    )
    return 0
