"""An error in one line: how every part of the project shows an exception where one line is all
there is room for.

That is a terminal line, an MLflow tag, an event sent to the driver, a message that quotes a
library's error.  The module sits below every other unit of ``trainers`` (``docs/architecture.md``,
the order of the house), so the worker's side and the driver's side (``orchestrator``, ``search``)
format an error the same way.
"""

from __future__ import annotations


def first_line(text: str, limit: int | None = 200) -> str:
    """The first line of ``text`` that is not blank, stripped, cut to ``limit`` characters (``None``:
    uncut); ``""`` when ``text`` has no such line."""
    line = next((s.strip() for s in text.splitlines() if s.strip()), "")
    return line if limit is None else line[:limit]


def one_line(e: BaseException, limit: int | None = 200, *, name: bool = True) -> str:
    """``Type: first line of the message``, cut to ``limit`` characters (``None``: uncut); the type
    alone when the message has no text.  ``name=False``: the message's first line alone (still the
    type when the message has no text), for a sentence that names the failure itself.

    >>> one_line(ValueError("bad value\\nmore detail"))
    'ValueError: bad value'
    >>> one_line(KeyError())
    'KeyError'
    """
    line = first_line(str(e), None)
    text = (f"{type(e).__name__}: {line}" if name else line) if line else type(e).__name__
    return text if limit is None else text[:limit]


class EndsRun(Exception):
    """Mixed into an error of what the run reads from (a store that did not answer through its
    retries) that ends the run at once, without a restart that would meet it again, its checkpoints
    kept: the run resumes where it stopped once the cause is gone (trainers/link/failure.py).  Its
    message is one line, ``field: problem; fix``, and the type is built from a message alone."""
