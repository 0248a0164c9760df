"""Trajectories stepped on two sides: the first step where they part, free running or
teacher-forced."""

from __future__ import annotations

import pytest

from pytest_cudagraph.engines.trajectory import Divergence, first_divergence


def count_up(step: int, inputs: list[int]) -> int:
    """A decode of numbers: the next token is the last one plus one."""
    return inputs[-1] + 1


def appended(inputs: list[int], output: int) -> list[int]:
    return [*inputs, output]


def differ(inputs: list[int], expected: int, actual: int) -> list[str]:
    return [] if expected == actual else [f"token {actual}, eager {expected}"]


def run(graphed, steps: int = 10, **options: object) -> Divergence | None:
    return first_divergence(lambda: [0], steps, count_up, graphed, appended, differ, **options)


def test_equal_sides_never_part() -> None:
    assert run(count_up) is None


def test_a_stale_slot_from_step_4_on_is_reported_at_step_4_with_its_inputs() -> None:
    def stale(step: int, inputs: list[int]) -> int:
        return inputs[-1] + (1 if step < 4 else 2)

    assert run(stale) == Divergence(4, [0, 1, 2, 3, 4], ("token 6, eager 5",))


def test_a_token_flipped_within_the_tolerance_parts_free_running_sides_only() -> None:
    """Outputs within the tolerance of each other may still pick different tokens: free running,
    the sides then decode different prefixes; teacher-forced, each step is judged on eager's."""

    def within(inputs: list[int], expected: float, actual: float) -> list[str]:
        return [] if abs(expected - actual) <= 0.6 else [f"{actual} against {expected}"]

    def noisy(step: int, inputs: list[int]) -> float:
        return inputs[-1] + 1 + (0.55 if step == 2 else 0.0)  # rounds up to the next token

    def rounded(inputs: list[int], output: float) -> list[int]:
        return [*inputs, round(output)]

    def trajectory(teacher_forced: bool) -> Divergence | None:
        return first_divergence(
            lambda: [0], 6, count_up, noisy, rounded, within, teacher_forced=teacher_forced
        )

    assert trajectory(teacher_forced=False) == Divergence(3, [0, 1, 2, 3], ("5.0 against 4",))
    assert trajectory(teacher_forced=True) is None


def test_teacher_forced_the_graphed_side_takes_a_copy_of_eagers_inputs() -> None:
    seen: list[list[int]] = []
    copies: list[list[int]] = []

    def recording(step: int, inputs: list[int]) -> int:
        seen.append(inputs)
        return count_up(step, inputs)

    def copy(inputs: list[int]) -> list[int]:
        copies.append(list(inputs))
        return copies[-1]

    assert run(recording, steps=4, teacher_forced=True, copy=copy) is None
    assert seen == [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3]]
    assert all(a is b for a, b in zip(seen[1:], copies, strict=True))


def test_the_graphed_side_follows_its_own_outputs_when_not_teacher_forced() -> None:
    fed: list[list[int]] = []

    def recording(step: int, inputs: list[int]) -> int:
        fed.append(inputs)
        return inputs[-1] + 1

    run(recording, steps=3)
    assert fed == [[0], [0, 1], [0, 1, 2]]


def test_a_count_of_steps_that_is_not_one_or_more_is_refused() -> None:
    with pytest.raises(ValueError, match=r"steps must be >= 1, got 0"):
        run(count_up, steps=0)
    with pytest.raises(TypeError, match=r"steps must be an int, got True"):
        run(count_up, steps=True)
