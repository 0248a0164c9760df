"""The comparison engine: its walk over containers, its one tolerance rule for every kind of
value, and what a mismatch reports."""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import types

import pytest
import torch

from pytest_cudagraph.engines.compare import (
    EXACT,
    Mismatch,
    PendingValues,
    Tolerance,
    compare_outputs,
    pending_comparison,
    settle_comparison,
)


@dataclasses.dataclass
class Step:
    logits: torch.Tensor
    length: int


@dataclasses.dataclass
class OtherStep:
    logits: torch.Tensor
    length: int


Pair = collections.namedtuple("Pair", ["tokens", "memory"])


def described(expected: object, actual: object, **tolerance: float) -> list[str]:
    return [mismatch.describe() for mismatch in compare_outputs(expected, actual, **tolerance)]


# What is walked


def test_equal_outputs_have_no_mismatch() -> None:
    output = (torch.arange(6.0).reshape(2, 3), {"n": 3, "ids": torch.tensor([1, 2])})
    assert compare_outputs(output, (output[0].clone(), {"n": 3, "ids": torch.tensor([1, 2])})) == []


def test_nested_structures_are_walked_and_paths_name_each_leaf() -> None:
    expected = {"logits": [torch.zeros(2), torch.zeros(2)], "steps": 4, "tag": "a"}
    actual = {"logits": [torch.zeros(2), torch.ones(2)], "steps": 5, "tag": "a"}
    assert [mismatch.path for mismatch in compare_outputs(expected, actual)] == [
        "output['logits'][1]",
        "output['steps']",
    ]


def test_dataclasses_and_namespaces_are_walked_not_compared_with_eq() -> None:
    expected = (Step(torch.zeros(3), 2), types.SimpleNamespace(kv=torch.zeros(2), n=1))
    actual = (Step(torch.ones(3), 2), types.SimpleNamespace(kv=torch.zeros(2), n=2))
    assert [mismatch.path for mismatch in compare_outputs(expected, actual)] == [
        "output[0].logits",
        "output[1].n",
    ]


def test_a_named_tuple_and_a_tuple_compare_by_position() -> None:
    x = torch.ones(2)
    assert compare_outputs(Pair(x, 1), (x.clone(), 1)) == []
    [mismatch] = compare_outputs(Pair(x, 1), Pair(x, 2))
    assert mismatch.path == "output.memory"


def test_structure_differences_are_named() -> None:
    assert described({"a": 1, "b": 2}, {"a": 1, "c": 2}) == [
        "output: keys ['b'] only in eager, ['c'] only in graphed"
    ]
    assert described([1, 2], [1, 2, 3]) == ["output: length 2 in eager, 3 in graphed"]
    assert described(torch.zeros(1), 0.0) == ["output: Tensor in eager, float in graphed"]
    z = torch.zeros(1)
    assert described(Step(z, 1), OtherStep(z, 1)) == ["output: Step in eager, OtherStep in graphed"]
    assert described(types.SimpleNamespace(a=1), types.SimpleNamespace(b=1)) == [
        "output: attributes ['a'] only in eager, ['b'] only in graphed"
    ]


def test_an_unsupported_leaf_on_either_side_is_a_type_error_naming_it() -> None:
    class Opaque:
        pass

    with pytest.raises(TypeError, match=r"^graphed output\[1\]\.logits: a .*Opaque is not"):
        compare_outputs([1, Step(torch.zeros(1), 1)], [1, Step(Opaque(), 1)])
    with pytest.raises(TypeError, match=r"^eager output: a builtins\.set is not compared"):
        compare_outputs({1}, {1})


def test_shape_and_dtype_differences_are_named() -> None:
    assert described(torch.zeros(2, 3), torch.zeros(3, 2)) == [
        "output: shape (2, 3) in eager, (3, 2) in graphed"
    ]
    assert described(torch.zeros(2), torch.zeros(2, dtype=torch.bfloat16)) == [
        "output: dtype torch.float32 in eager, torch.bfloat16 in graphed"
    ]


# One tolerance rule


def test_exact_by_default_and_tolerances_loosen_it() -> None:
    expected = torch.ones(3)
    actual = expected + 1e-6
    assert len(compare_outputs(expected, actual)) == 1
    assert compare_outputs(expected, actual, atol=1e-5) == []
    assert compare_outputs(expected, actual, rtol=1e-5) == []


def test_the_relative_tolerance_is_relative_to_the_eager_value() -> None:
    # |101.005 - 100| = 1.005: over 0.01 * |eager| = 1.0, within 0.01 * |graphed| = 1.01005.
    small, large = torch.tensor([100.0], dtype=torch.float64), torch.tensor([101.005])
    large = large.double()
    assert len(compare_outputs(small, large, rtol=0.01)) == 1
    assert compare_outputs(large, small, rtol=0.01) == []
    assert len(compare_outputs(100.0, 101.005, rtol=0.01)) == 1
    assert compare_outputs(101.005, 100.0, rtol=0.01) == []


def test_nan_equals_nan_and_an_infinity_only_itself() -> None:
    nan = torch.tensor([math.nan, 1.0])
    assert compare_outputs(nan, nan.clone()) == []
    [mismatch] = compare_outputs(nan, torch.tensor([0.0, 1.0]))
    assert mismatch.first_index == (0,)
    inf = torch.tensor([math.inf])
    assert compare_outputs(inf, inf.clone(), rtol=1.0) == []
    assert len(compare_outputs(inf, torch.tensor([1e38]), rtol=1.0)) == 1
    assert compare_outputs(math.nan, math.nan) == [] and compare_outputs(math.inf, math.inf) == []
    assert len(compare_outputs(math.inf, 1e308, rtol=1.0)) == 1


@pytest.mark.parametrize(
    ("expected", "actual"),
    [(torch.tensor([True, False]), torch.tensor([True, True])), (True, False)],
    ids=["tensor", "leaf"],
)
def test_bools_compare_exactly_whatever_the_tolerance(expected: object, actual: object) -> None:
    [mismatch] = compare_outputs(expected, actual, atol=1.0, rtol=1.0)
    assert (mismatch.atol, mismatch.rtol, mismatch.tolerance()) == (0.0, 0.0, "exact")


def test_a_bool_is_not_the_integer_it_equals() -> None:
    assert described(True, 1) == ["output: True in eager, 1 in graphed"]


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint64])
def test_integers_compare_in_integer_arithmetic(dtype: torch.dtype) -> None:
    big = 2**62
    expected = torch.tensor([big, 5], dtype=dtype)
    [mismatch] = compare_outputs(expected, torch.tensor([big + 1, 5], dtype=dtype), atol=0.5)
    assert (mismatch.first_index, mismatch.eager, mismatch.graphed) == ((0,), big, big + 1)
    assert mismatch.abs_diff == 1
    assert compare_outputs(expected, torch.tensor([big + 1, 6], dtype=dtype), atol=1.0) == []


def test_integer_gaps_past_what_int64_holds_are_never_within() -> None:
    low, high = torch.tensor([-(2**63)]), torch.tensor([2**63 - 1])
    assert len(compare_outputs(low, high, atol=1.0)) == 1
    assert len(compare_outputs(high, low, atol=1.0)) == 1
    assert compare_outputs(low, low.clone(), atol=1.0) == []


def test_unsigned_64_bit_values_past_2_to_the_63_keep_their_gaps() -> None:
    top = 2**64 - 1
    expected = torch.tensor([top], dtype=torch.uint64)
    assert compare_outputs(expected, torch.tensor([top - 2], dtype=torch.uint64), atol=2.0) == []
    assert (
        len(compare_outputs(expected, torch.tensor([top - 3], dtype=torch.uint64), atol=2.0)) == 1
    )


def test_integer_and_complex_leaves_honour_the_tolerance() -> None:
    assert compare_outputs(5, 7, atol=2.0) == []
    assert len(compare_outputs(2**62, 2**62 + 1, atol=0.5)) == 1
    assert compare_outputs(10**400, 10**400 + 10**397, rtol=0.01) == []
    assert compare_outputs(1 + 1j, 1 + 1.0001j, atol=1e-3) == []
    assert len(compare_outputs(1 + 1j, 1 + 1.01j, atol=1e-3)) == 1
    complex_tensor = torch.tensor([1 + 1j])
    assert compare_outputs(complex_tensor, complex_tensor + 1e-4j, atol=1e-3) == []


def test_integer_tensors_honour_the_tolerance() -> None:
    assert compare_outputs(torch.tensor([5, 7]), torch.tensor([6, 9]), atol=2.0) == []
    assert compare_outputs(torch.tensor([100]), torch.tensor([110]), rtol=0.1) == []
    assert len(compare_outputs(torch.tensor([100]), torch.tensor([111]), rtol=0.1)) == 1


@pytest.mark.parametrize(
    ("tolerance", "error", "message"),
    [
        ({"atol": math.inf}, ValueError, "atol must be a finite number >= 0, got inf"),
        ({"rtol": math.nan}, ValueError, "rtol must be a finite number >= 0, got nan"),
        ({"atol": -1e-3}, ValueError, r"atol must be a finite number >= 0, got -0\.001"),
        ({"atol": True}, TypeError, "atol must be a number, got True"),
        ({"rtol": "0.1"}, TypeError, "rtol must be a number, got '0.1'"),
        ({"atol": 10**400}, ValueError, "^atol must be a finite number >= 0, got 1000"),
    ],
)
def test_bad_tolerances_are_refused_whatever_is_compared(
    tolerance: dict[str, object], error: type[Exception], message: str
) -> None:
    for expected, actual in ((1, 1), (torch.tensor([1]), torch.tensor([1])), ("a", "a")):
        with pytest.raises(error, match=message):
            compare_outputs(expected, actual, **tolerance)  # type: ignore[arg-type]


# The tolerance: one rule, one wording, for the engines and the conformance protocol


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"atol": math.inf}, ValueError, r"Tolerance.atol must be a finite number >= 0, got inf"),
        ({"rtol": math.nan}, ValueError, r"Tolerance.rtol must be a finite number >= 0, got nan"),
        ({"atol": -1e-3}, ValueError, r"Tolerance.atol must be a finite number >= 0, got -0.001"),
        ({"atol": True}, TypeError, r"Tolerance.atol must be a number, got True"),
        ({"rtol": "1e-3"}, TypeError, r"Tolerance.rtol must be a number, got '1e-3'"),
        ({"rtol": 10**400}, ValueError, r"Tolerance.rtol must be a finite number >= 0, got 1000"),
    ],
)
def test_a_tolerance_must_be_finite_and_not_negative(
    arguments: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        Tolerance(**arguments)  # type: ignore[arg-type]


def test_a_tolerance_is_checked_and_described() -> None:
    assert Tolerance().describe() == "exact"
    assert Tolerance(atol=1e-3).describe() == "atol 0.001, rtol 0"
    with pytest.raises(ValueError, match=r"Tolerance.rtol must be a finite number >= 0, got -1"):
        Tolerance(rtol=-1)


def test_a_mismatch_words_its_tolerance_as_the_tolerance_does() -> None:
    [exact] = compare_outputs(1.0, 2.0)
    [within] = compare_outputs(1.0, 2.0, atol=0.5, rtol=0.25)
    assert exact.tolerance() == EXACT.describe() == "exact"
    assert within.tolerance() == Tolerance(atol=0.5, rtol=0.25).describe() == "atol 0.5, rtol 0.25"


def test_a_pending_comparison_takes_its_tolerance_checked() -> None:
    assert settle_comparison(pending_comparison(1.0, 1.5, Tolerance(atol=0.5))) == []
    [mismatch] = settle_comparison(pending_comparison(1.0, 1.5))
    assert (mismatch.atol, mismatch.rtol) == (0.0, 0.0)
    with pytest.raises(TypeError, match="tolerance must be a Tolerance or a mapping"):
        pending_comparison(1.0, 1.5, 0.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"tolerance\['logits'\] must be a Tolerance, got float"):
        pending_comparison(1.0, 1.5, {"logits": 0.5})  # type: ignore[dict-item]


def test_a_tolerance_per_part_holds_each_top_level_part_to_its_own() -> None:
    per_part = {"logits": Tolerance(atol=0.5)}
    expected = {"logits": torch.tensor([1.0]), "cache": torch.tensor([1.0])}
    within = {"logits": torch.tensor([1.4]), "cache": torch.tensor([1.0])}
    assert compare_outputs(expected, within, tolerance=per_part) == []
    # A part the mapping does not name is exact, wherever it first appears.
    [mismatch] = compare_outputs(
        expected, {**within, "cache": torch.tensor([1.1])}, tolerance=per_part
    )
    assert mismatch.path == "output['cache']" and mismatch.atol == 0.0
    [extra] = compare_outputs(expected, {**within, "extra": 1}, tolerance=per_part)
    assert "['extra'] only in graphed" in extra.describe()
    # By index for a tuple; below the top level, the part's tolerance holds.
    assert compare_outputs((1.0, [2.0]), (1.0, [2.4]), tolerance={1: Tolerance(atol=0.5)}) == []
    with pytest.raises(TypeError, match="give rtol and atol, or tolerance, not both"):
        compare_outputs(1.0, 1.0, atol=1.0, tolerance=per_part)


# What a mismatch reports


def test_a_value_mismatch_names_the_first_index_both_values_and_the_differences() -> None:
    expected = torch.zeros(2, 3, 4)
    actual = expected.clone()
    actual[1, 0, 2] = 0.5
    actual[1, 2, 3] = -2.0
    [mismatch] = compare_outputs(expected, actual, atol=0.25)
    assert mismatch.first_index == (1, 0, 2)
    assert (mismatch.eager, mismatch.graphed, mismatch.abs_diff) == (0.0, 0.5, 0.5)
    assert mismatch.rel_diff == math.inf  # relative to an eager 0
    assert (mismatch.max_abs_diff, mismatch.differing, mismatch.numel) == (2.0, 2, 24)
    assert mismatch.describe() == (
        "output at index (1, 0, 2): eager 0, graphed 0.5 (|diff| 0.5, rel inf; tolerance "
        "atol 0.25, rtol 0); 2 of 24 elements differ, largest |diff| 2"
    )


def test_a_differing_number_names_its_values_and_differences() -> None:
    [mismatch] = compare_outputs({"steps": 4}, {"steps": 5})
    assert mismatch.describe() == (
        "output['steps']: 4 in eager, 5 in graphed (|diff| 1, rel 0.25; tolerance exact)"
    )
    assert (mismatch.eager, mismatch.graphed, mismatch.abs_diff, mismatch.rel_diff) == (
        4,
        5,
        1,
        0.25,
    )


def test_scalars_and_empty_tensors() -> None:
    [scalar] = compare_outputs(torch.tensor(1.0), torch.tensor(3.0))
    assert (scalar.first_index, scalar.max_abs_diff, scalar.numel, scalar.rel_diff) == (
        (),
        2.0,
        1,
        2.0,
    )
    assert compare_outputs(torch.empty(0, 5), torch.empty(0, 5)) == []


def test_the_sides_are_named_as_given() -> None:
    [mismatch] = compare_outputs(torch.zeros(1), torch.ones(1), sides=("X=0", "X=1"))
    assert mismatch.describe().startswith("output at index (0,): X=0 0, X=1 1 (")


def test_mismatch_data_is_plain_json() -> None:
    [values] = compare_outputs(torch.tensor([1 + 2j]), torch.tensor([1 + 3j]))
    [shape] = compare_outputs(torch.zeros(1), torch.zeros(2))
    data = [values.data(), shape.data()]
    assert json.loads(json.dumps(data)) == [
        {
            "path": "output",
            "detail": "",
            "first_index": [0],
            "eager": "(1+2j)",
            "graphed": "(1+3j)",
            "abs_diff": 1.0,
            "rel_diff": pytest.approx(1 / math.sqrt(5)),
            "tolerance": {"atol": 0.0, "rtol": 0.0},
        },
        {
            "path": "output",
            "detail": "shape (1,) in eager, (2,) in graphed",
            "first_index": None,
            "eager": None,
            "graphed": None,
            "abs_diff": None,
            "rel_diff": None,
            "tolerance": {"atol": 0.0, "rtol": 0.0},
        },
    ]
    assert Mismatch("output", "x").data()["first_index"] is None
    [infinite] = compare_outputs(torch.tensor([0.0]), torch.tensor([math.nan]))
    assert (infinite.data()["graphed"], infinite.data()["rel_diff"]) == ("nan", "nan")
    [relative] = compare_outputs(torch.tensor([0.0]), torch.tensor([1.0]))
    assert relative.data()["rel_diff"] == "inf"
    assert json.loads(json.dumps(relative.data(), allow_nan=False))["abs_diff"] == 1.0


# Pending comparisons


def test_pending_comparisons_take_their_figures_when_queued() -> None:
    """What the two tensors held when compared is what is reported, whatever is written to
    them before the figures are read."""
    expected, actual = torch.zeros(4), torch.zeros(4)
    actual[2] = 3.0
    found = pending_comparison(
        {"a": torch.ones(3), "b": [expected]}, {"a": torch.ones(3), "b": [actual]}
    )
    assert all(isinstance(item, PendingValues) for item in found)  # nothing read yet
    expected.fill_(7.0)
    actual.fill_(7.0)
    (mismatch,) = settle_comparison(found)
    assert (mismatch.path, mismatch.first_index) == ("output['b'][0]", (2,))
    assert (mismatch.eager, mismatch.graphed, mismatch.max_abs_diff) == (0.0, 3.0, 3.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
def test_nan_matches_nan_within_a_tolerance_too(dtype):
    expected = torch.tensor([float("nan"), 1.0], dtype=dtype)
    assert compare_outputs(expected, expected.clone(), rtol=1e-3, atol=1e-3) == []


def test_a_number_leaf_exactly_at_the_bound_matches():
    assert compare_outputs(1.0, 1.5, atol=0.5) == []
    assert len(compare_outputs(1.0, 1.75, atol=0.5)) == 1


def test_uint64_gaps_are_taken_across_the_signed_boundary():
    """uint64 values on either side of 2**63, and the two ends of the range, keep their gap."""
    uint64 = torch.uint64
    middle = torch.tensor([2**63 - 1], dtype=uint64)
    assert compare_outputs(middle, torch.tensor([2**63], dtype=uint64), atol=1.0) == []
    ends = compare_outputs(
        torch.tensor([0], dtype=uint64), torch.tensor([2**64 - 1], dtype=uint64), atol=1.0
    )
    assert len(ends) == 1


def test_the_largest_difference_is_over_the_differing_elements_only():
    expected, actual = torch.tensor([100.0, 0.0]), torch.tensor([105.0, 1.0])
    (mismatch,) = compare_outputs(expected, actual, rtol=0.1)  # 5 within 10; 1 past 0
    assert (mismatch.first_index, mismatch.differing, mismatch.max_abs_diff) == ((1,), 1, 1.0)


def test_values_nested_past_the_walks_bound_are_refused_naming_the_side() -> None:
    deep: list[object] = [1.0]
    for _ in range(3000):
        deep = [deep]
    with pytest.raises(ValueError, match=r"^graphed output\S*: .*deeper than"):
        compare_outputs([[1.0]], deep)
    looped: list[object] = []
    looped.append(looped)
    with pytest.raises(ValueError, match=r"^eager output"):
        compare_outputs(looped, [])
