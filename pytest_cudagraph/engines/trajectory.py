"""Two sides stepped along one trajectory and compared step by step, to the first step where
they part.

``first_divergence(first, steps, eager, graphed, next_inputs, differences)`` runs step 0 on
``first()`` (a fresh copy for each side) and each later step on ``next_inputs(inputs,
output)``: each side from its own inputs and output (free running, as a decode runs), or, with
``teacher_forced``, both on the eager side's (the graphed side on a copy), so that a step is
judged on eager's path even after a token flipped within the tolerance. It stops at the first
step whose outputs ``differences`` tells apart. Pure logic: the caller seeds and copies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Step = Callable[[int, Any], Any]  # (step, inputs) -> output


@dataclass(frozen=True)
class Divergence:
    """The first step whose outputs differ, the inputs the eager side took there, and each
    difference described."""

    step: int
    inputs: Any
    differences: tuple[str, ...]


def first_divergence(
    first: Callable[[], Any],
    steps: int,
    eager: Step,
    graphed: Step,
    next_inputs: Callable[[Any, Any], Any],
    differences: Callable[[Any, Any, Any], Sequence[str]],
    *,
    teacher_forced: bool = False,
    copy: Callable[[Any], Any] = lambda inputs: inputs,
) -> Divergence | None:
    """The first divergence in ``steps`` steps, or None. ``differences(inputs, expected,
    actual)`` compares one step's outputs; ``copy`` gives the graphed side inputs of its own
    when it takes the eager side's."""
    if isinstance(steps, bool) or not isinstance(steps, int):
        raise TypeError(f"steps must be an int, got {steps!r}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps!r}")
    eager_inputs, graphed_inputs = first(), first()
    for step in range(steps):
        expected = eager(step, eager_inputs)
        actual = graphed(step, graphed_inputs)
        found = differences(eager_inputs, expected, actual)
        if found:
            return Divergence(step, eager_inputs, tuple(found))
        if step == steps - 1:
            break
        following = next_inputs(eager_inputs, expected)
        if teacher_forced:
            graphed_inputs = copy(following)
        else:
            graphed_inputs = next_inputs(graphed_inputs, actual)
        eager_inputs = following
    return None
