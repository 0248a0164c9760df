"""The parity engine's rules beyond value equality: a check must compare something, seeds
must fit torch's generator, and a graphed output must own its memory."""

from __future__ import annotations

import pytest
import torch

from pytest_cudagraph.engines.parity import (
    MAX_SEED,
    ParityChecker,
    PendingValues,
    StorageOverlap,
    compare_outputs,
    pending_comparison,
    settle_comparison,
    storage_overlaps,
)


def scaled(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def one_input(generator: torch.Generator, case: object) -> tuple[torch.Tensor]:
    return (torch.randn(4, 3, generator=generator),)


# Cases and seeds


@pytest.mark.parametrize("cases", [0, [], (), -3])
def test_a_check_of_no_cases_is_a_value_error(cases: object) -> None:
    checker = ParityChecker("cpu", on_result=lambda result: pytest.fail("ran"))
    with pytest.raises(ValueError, match=r"cases must name at least one case"):
        checker.check(scaled, scaled, one_input, cases=cases)
    assert checker.comparisons == 0


@pytest.mark.parametrize("cases", [True, 2.0, None])
def test_cases_of_the_wrong_type_is_a_type_error(cases: object) -> None:
    with pytest.raises(TypeError, match=r"cases must be a count or an iterable"):
        ParityChecker("cpu").check(scaled, scaled, one_input, cases=cases)


@pytest.mark.parametrize("seed", [-1, MAX_SEED + 1, 2**64])
def test_seed_outside_the_generator_range_is_a_value_error(seed: int) -> None:
    with pytest.raises(ValueError, match=r"seed must be between 0 and 2\*\*64 - 1"):
        ParityChecker("cpu", seed)


def test_seed_of_the_wrong_type_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"seed must be an integer"):
        ParityChecker("cpu", 1.5)  # type: ignore[arg-type]


def test_cases_that_run_past_the_largest_seed_are_refused_before_running() -> None:
    ran = []
    checker = ParityChecker("cpu", MAX_SEED - 1)
    with pytest.raises(ValueError, match=r"cases: 3 cases from seed .* run past the largest"):
        checker.check(lambda x: ran.append(x), scaled, one_input, cases=3)
    assert ran == []
    assert checker.check(scaled, scaled, one_input, cases=2).ok


def test_comparisons_count_every_case_and_toggled_pair() -> None:
    checker = ParityChecker("cpu")
    assert checker.comparisons == 0
    checker.check(scaled, scaled, one_input, cases=3)
    checker.check(scaled, scaled, one_input, cases=[1])
    checker.run_toggled(lambda: checker.record("x", 1), "H13_DEMO_TOGGLE")
    assert checker.comparisons == 5


# Output storage


def test_distinct_outputs_share_nothing() -> None:
    x = torch.randn(3)
    assert storage_overlaps((x + 1, {"y": x * 2}), {"inputs": (x,)}) == []


def test_an_output_that_is_an_input_or_a_view_of_one_is_named() -> None:
    x, y = torch.randn(4, 4), torch.randn(4)
    found = storage_overlaps((x[1:], y + 1, {"again": x.t()}), {"inputs": {"x": x, "y": y}})
    assert found == [
        StorageOverlap("output[0]", "inputs['x']"),
        StorageOverlap("output[2]['again']", "inputs['x']"),
    ]
    assert found[0].describe() == "output[0] shares storage with inputs['x']"


def test_views_of_disjoint_parts_of_one_storage_still_share_it() -> None:
    base = torch.zeros(8)
    assert storage_overlaps(base[:4], {"kept": base[4:]}) == [StorageOverlap("output", "kept")]


def test_empty_tensors_and_non_tensors_never_overlap() -> None:
    empty = torch.empty(0)
    assert storage_overlaps((empty, 3, "a"), {"inputs": (empty, 3)}) == []


def test_graphed_side_returning_its_input_fails_the_case() -> None:
    result = ParityChecker("cpu").check(lambda x: x, lambda x: x, one_input, cases=2)
    assert not result.ok
    assert result.reason().startswith(
        "cuda_graph_parity: case 0 of 2 differs: output: shares storage with inputs[0]"
    )


def test_graphed_side_returning_the_eager_output_fails_the_case() -> None:
    """The trap where a test compares a tensor with itself: values match, storage too."""
    last: list[torch.Tensor] = []

    def eager(x: torch.Tensor) -> torch.Tensor:
        last[:] = [x * 2]
        return last[0]

    result = ParityChecker("cpu").check(eager, lambda x: last[0], one_input, cases=1)
    [mismatch] = result.outcomes[0].mismatches
    assert mismatch.describe() == "output: shares storage with eager output"


def test_a_static_output_buffer_reused_across_calls_fails_the_next_case() -> None:
    static = torch.empty(4, 3)

    def graphed(x: torch.Tensor) -> torch.Tensor:
        return static.copy_(x * 2)

    result = ParityChecker("cpu").check(scaled, graphed, one_input, cases=3)
    assert [outcome.passed for outcome in result.outcomes] == [True, False, False]
    assert [m.describe() for m in result.outcomes[2].mismatches] == [
        "output: shares storage with case 0 output",
        "output: shares storage with case 1 output",
    ]


def test_a_copy_of_the_static_buffer_passes() -> None:
    static = torch.empty(4, 3)

    def graphed(x: torch.Tensor) -> torch.Tensor:
        return static.copy_(x * 2).clone()

    assert ParityChecker("cpu").check(scaled, graphed, one_input, cases=3).ok


# Value comparison: figures read after every case ran


def test_value_differences_name_the_first_index_the_largest_gap_and_the_count() -> None:
    expected = torch.zeros(2, 3, 4)
    actual = expected.clone()
    actual[1, 0, 2] = 0.5
    actual[1, 2, 3] = -2.0
    (mismatch,) = compare_outputs(expected, actual)
    assert mismatch.first_index == (1, 0, 2)
    assert (mismatch.max_abs_diff, mismatch.differing, mismatch.numel) == (2.0, 2, 24)


def test_scalars_empty_tensors_and_nan_compare_as_values() -> None:
    (scalar,) = compare_outputs(torch.tensor(1.0), torch.tensor(3.0))
    assert (scalar.first_index, scalar.max_abs_diff, scalar.numel) == ((), 2.0, 1)
    assert compare_outputs(torch.empty(0, 5), torch.empty(0, 5)) == []
    nan = torch.tensor([1.0, float("nan")])
    assert compare_outputs(nan, nan.clone()) == []


def test_pending_comparisons_hold_their_figures_until_settled() -> None:
    found = pending_comparison(
        {"a": torch.ones(3), "b": [torch.ones(2)]}, {"a": torch.ones(3), "b": [torch.zeros(2)]}
    )
    assert all(isinstance(item, PendingValues) for item in found)  # nothing read yet
    (mismatch,) = settle_comparison(found)
    assert mismatch.path == "output['b'][0]" and mismatch.first_index == (0,)


def test_which_elements_differ_is_taken_at_the_call_not_when_read() -> None:
    """An eager side that returns one buffer it rewrites every call: by the time the check
    reads its figures, case 0's expected output holds case 2's values. What differed, and
    where, is still case 0's own."""
    buffer = torch.empty(4, 3)

    def eager_into_buffer(x: torch.Tensor) -> torch.Tensor:
        return torch.mul(x, 2, out=buffer)

    def graphed(x: torch.Tensor) -> torch.Tensor:
        out = x * 2
        if graphed.calls == 0:
            out[1, 2] += 1  # case 0 differs in one element
        graphed.calls += 1
        return out

    graphed.calls = 0
    result = ParityChecker("cpu").check(eager_into_buffer, graphed, one_input, cases=3)
    assert [outcome.passed for outcome in result.outcomes] == [False, True, True]
    (mismatch,) = result.outcomes[0].mismatches
    assert (mismatch.first_index, mismatch.differing, mismatch.numel) == ((1, 2), 1, 12)


def test_check_reads_every_case_after_the_last_one_ran() -> None:
    calls: list[str] = []

    def graphed(x: torch.Tensor) -> torch.Tensor:
        calls.append("graphed")
        return x * 2 + (len(calls) == 1)  # the first case differs

    read = PendingValues.mismatch

    def record_read(self: PendingValues) -> object:
        calls.append("read")
        return read(self)

    checker = ParityChecker("cpu")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PendingValues, "mismatch", record_read)
        result = checker.check(scaled, graphed, one_input, cases=3)
    assert calls == ["graphed"] * 3 + ["read"] * 3
    assert [outcome.passed for outcome in result.outcomes] == [False, True, True]


def test_storages_that_touch_but_do_not_overlap_are_not_shared() -> None:
    """The caching allocator hands out adjacent blocks: one storage ending where the next
    begins is two storages, not one shared."""
    memory = bytearray(64)
    first = torch.frombuffer(memory, dtype=torch.float32, count=8)  # bytes [0, 32)
    second = torch.frombuffer(memory, dtype=torch.float32, offset=32, count=8)  # [32, 64)
    assert second.untyped_storage().data_ptr() == (
        first.untyped_storage().data_ptr() + first.untyped_storage().nbytes()
    )
    assert storage_overlaps(first, {"kept": second}) == []
    assert storage_overlaps(second, {"kept": first}) == []
    overlapping = torch.frombuffer(memory, dtype=torch.float32, offset=28, count=8)  # [28, 60)
    assert storage_overlaps(first, {"kept": overlapping}) == [StorageOverlap("output", "kept")]
