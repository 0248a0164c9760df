"""Values that must not change: each one snapshotted when it is handed over, compared later.

``Unchanged.keep(name, value)`` copies ``value`` (its tensors, in its structure) and holds the
value itself; ``changes(after)`` compares every value held with its copy, all of them read with
one synchronization, and returns what changed, each value once: at the first look that finds it
changed, ``after`` naming what ran before that look. ``keep(name, value, expected)`` holds a
value to what it must hold instead (what the eager side left in a copy of a call's inputs). The
inputs-unchanged check holds each call's inputs so, the replay-order check its canaries. torch
is imported when used.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_cudagraph.engines import trees
from pytest_cudagraph.engines.compare import Mismatch, pending_comparison, settle_comparisons

SIDES = ("was", "now")  # how a change shows the two values


@dataclass(frozen=True)
class Change:
    """A held value that changed: its name, what ran before the look that saw it, and how it
    differs from its copy."""

    name: str
    after: str
    mismatches: tuple[Mismatch, ...]

    def describe(self) -> str:
        first = self.mismatches[0].describe()
        more = f" (and {len(self.mismatches) - 1} more)" if len(self.mismatches) > 1 else ""
        return f"{first}{more}; seen after {self.after}"


@dataclass
class _Held:
    name: str
    value: object
    copy: object
    changed: bool = False


class Unchanged:
    """Values held with their copies, compared on demand (see the module docstring); a change
    shows the copy and the value under ``sides``."""

    def __init__(self, sides: tuple[str, str] = SIDES) -> None:
        self.sides = sides
        self._held: list[_Held] = []

    def __len__(self) -> int:
        return len(self._held)

    def keep(self, name: str, value: object, expected: object = None) -> None:
        """Hold ``value`` and a copy of what it must hold: ``expected`` where given (alike in
        structure), else ``value`` as it is now. TypeError naming a leaf that cannot be
        compared (``trees.snapshot``) or a name that is not text, before anything is held."""
        if not isinstance(name, str):
            raise TypeError(f"name must be text, got {name!r}")
        copy = trees.snapshot(value if expected is None else expected, name)
        self._held.append(_Held(name, value, copy))

    def changes(self, after: str) -> list[Change]:
        """Each held value that differs from its copy and was not reported before."""
        if not isinstance(after, str):
            raise TypeError(f"after must be text, got {after!r}")
        looked = [held for held in self._held if not held.changed]
        pending = [
            pending_comparison(held.copy, held.value, path=held.name, sides=self.sides)
            for held in looked
        ]
        found = []
        for held, mismatches in zip(looked, settle_comparisons(pending), strict=True):
            if mismatches:
                held.changed = True
                found.append(Change(held.name, after, tuple(mismatches)))
        return found
