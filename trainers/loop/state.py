"""The training counters that survive phases and restarts: one checkpoint component.

The checkpoint format, discovery and fallback live in ``trainers/loop/checkpoint.py``
(``docs/architecture.md``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

# Keys that format-1 checkpoints carry and nothing reads any more: ``restarts`` (never read)
# and ``extra`` (the policies' state, now components of their own; see trainers/loop/checkpoint.py).
_RETIRED = frozenset({"restarts", "extra"})


@dataclass
class TrainState:
    """Counters that survive phases and restarts.  ``step`` is the global optimizer step;
    ``cursor`` the samples of ``epoch``'s permutation already consumed."""

    step: int = 0
    epoch: int = 0
    cursor: int = 0
    samples_seen: int = 0
    finished: bool = False

    def state_dict(self) -> dict[str, Any]:
        """Plain ints and a bool (loads with ``weights_only=True``)."""
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore in place; retired keys of old checkpoints are ignored, unknown ones refused."""
        names = {f.name for f in fields(self)}
        unknown = set(state) - names - _RETIRED
        if unknown:
            raise KeyError(f"TrainState has no {sorted(unknown)}")
        fresh = TrainState()
        for name in names:
            setattr(self, name, type(getattr(fresh, name))(state.get(name, getattr(fresh, name))))
