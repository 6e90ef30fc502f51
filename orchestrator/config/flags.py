"""Command-line flags checked like config fields: one argparse type for every numeric flag (finite,
in range, the right kind), and a parser whose errors are one line naming the flag (exit status 2).

Both CLIs (``python -m orchestrator``, ``python -m search``) build their parsers from
:class:`OneLineParser` and give each numeric flag a :func:`number` type, so ``--timeout nan`` or
``--every -1`` is refused as ``train.epochs: .nan`` is in a config: one line, before anything
starts.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence

from orchestrator.config.schema import ConfigError


class FlagError(ConfigError):
    """A bad command line: one line that names the flag and the fix."""


def number(
    kind: type = float,
    *,
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
    example: str | None = None,
) -> Callable[[str], int | float]:
    """An argparse ``type`` for a numeric flag: ``kind`` (``int`` or ``float``), finite, and
    ``> gt`` / ``>= ge`` / ``<= le`` where given.  The message (argparse names the flag) says what
    to write instead."""
    bounds = [
        f"> {gt:g}" if gt is not None else "",
        f">= {ge:g}" if ge is not None else "",
        f"<= {le:g}" if le is not None else "",
    ]
    wanted = (
        f"between {ge:g} and {le:g}"
        if ge is not None and le is not None and gt is None
        else " and ".join(b for b in bounds if b)
    )
    what = ("a whole number" if kind is int else "a number") + (f" {wanted}" if wanted else "")
    hint = f", e.g. {example}" if example else ""

    def parse(text: str) -> int | float:
        word = text.strip()
        try:
            value: int | float = int(word, 10) if kind is int else float(word)
        except ValueError:
            try:
                finite = math.isfinite(float(word))
            except ValueError:
                finite = True
            if finite:
                raise argparse.ArgumentTypeError(f"expects {what} (got {text!r}); write {what}{hint}") from None
            value = float(word)
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(
                f"must be a finite number (got {text!r}); inf and nan are not allowed, write {what}{hint}"
            )
        if (
            (gt is not None and not value > gt)
            or (ge is not None and not value >= ge)
            or (le is not None and not value <= le)
        ):
            raise argparse.ArgumentTypeError(f"must be {wanted} (got {text}); write {what}{hint}")
        return value

    parse.__name__ = kind.__name__  # argparse's own messages name the type
    return parse


class OneLineParser(argparse.ArgumentParser):
    """``error`` raises :class:`FlagError` (``--flag: problem; fix``) instead of printing the usage
    and exiting: the CLI prints it as ``error: ...`` and exits 2, like every other bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        prefix = "argument "
        if message.startswith(prefix) and ": " in message:
            flag, _, problem = message[len(prefix) :].partition(": ")
            raise FlagError(
                f"{flag.split('/')[0]}: {problem}" + ("" if ";" in problem else f"; see {self.prog} --help")
            )
        raise FlagError(f"{self.prog}: {message}; see {self.prog} --help")


def set_without_equals(argv: Sequence[str]) -> FlagError | None:
    """The hint for ``--set KEY VALUE`` (a space where ``=`` belongs), or ``None``.  argparse would
    take VALUE for the next positional argument or refuse it as unrecognised, neither of which
    says what went wrong."""
    for i, word in enumerate(argv):
        if word == "--set" and i + 1 < len(argv):
            item = argv[i + 1]
        elif word.startswith("--set="):
            item = word[len("--set=") :]
        else:
            continue
        if "=" in item:
            continue
        after = argv[i + 2] if word == "--set" and i + 2 < len(argv) else None
        if after is not None and not after.startswith("-") and not after.endswith((".yaml", ".yml")):
            return FlagError(
                f"--set {item} {after}: write the key and its value as one word joined by =: --set {item}={after}"
            )
        return FlagError(f"--set {item}: expected KEY=VALUE; write --set {item}=VALUE, e.g. --set batch.size=128")
    return None
