"""The parity engine on CPU callables, and the graph_parity fixture and marker around it."""

from __future__ import annotations

import math
import os

import pytest
import torch

from pytest_cudagraph import settings
from pytest_cudagraph.engines.parity import Mismatch, ParityChecker, compare_outputs

# compare_outputs


def test_equal_outputs_have_no_mismatch() -> None:
    output = (torch.arange(6.0).reshape(2, 3), {"n": 3, "ids": torch.tensor([1, 2])})
    assert compare_outputs(output, (output[0].clone(), {"n": 3, "ids": torch.tensor([1, 2])})) == []


def test_value_mismatch_reports_first_index_max_diff_and_count() -> None:
    expected = torch.zeros(4, 5)
    actual = expected.clone()
    actual[1, 3] = 0.25
    actual[2, 0] = -0.5
    [mismatch] = compare_outputs(expected, actual)
    assert mismatch == Mismatch("output", "", (1, 3), 0.5, 2, 20)
    assert mismatch.describe() == "output at index (1, 3): max |diff| 0.5 over 2 of 20 elements"


def test_exact_by_default_and_tolerances_loosen_it() -> None:
    expected = torch.ones(3)
    actual = expected + 1e-6
    assert len(compare_outputs(expected, actual)) == 1
    assert compare_outputs(expected, actual, atol=1e-5) == []
    assert compare_outputs(expected, actual, rtol=1e-5) == []


def test_nan_equals_nan_but_not_a_number() -> None:
    nan = torch.tensor([math.nan, 1.0])
    assert compare_outputs(nan, nan.clone()) == []
    [mismatch] = compare_outputs(nan, torch.tensor([0.0, 1.0]))
    assert mismatch.first_index == (0,)


def test_shape_and_dtype_differences_are_named() -> None:
    [shape] = compare_outputs(torch.zeros(2, 3), torch.zeros(3, 2))
    assert shape.describe() == "output: shape (2, 3) in eager, (3, 2) in graphed"
    [dtype] = compare_outputs(torch.zeros(2), torch.zeros(2, dtype=torch.bfloat16))
    assert dtype.describe() == "output: dtype torch.float32 in eager, torch.bfloat16 in graphed"


def test_integer_and_bool_tensors_compare_exactly() -> None:
    [ints] = compare_outputs(torch.tensor([5, 7]), torch.tensor([5, 9]))
    assert (ints.first_index, ints.max_abs_diff) == ((1,), 2.0)
    [bools] = compare_outputs(torch.tensor([True, False]), torch.tensor([True, True]))
    assert bools.differing == 1


def test_nested_structures_are_walked_and_paths_name_each_leaf() -> None:
    expected = {"logits": [torch.zeros(2), torch.zeros(2)], "steps": 4, "tag": "a"}
    actual = {"logits": [torch.zeros(2), torch.ones(2)], "steps": 5, "tag": "a"}
    described = sorted(mismatch.describe() for mismatch in compare_outputs(expected, actual))
    assert described == [
        "output['logits'][1] at index (0,): max |diff| 1 over 2 of 2 elements",
        "output['steps']: 4 in eager, 5 in graphed",
    ]


def test_structure_differences_are_named() -> None:
    [keys] = compare_outputs({"a": 1, "b": 2}, {"a": 1, "c": 2})
    assert keys.describe() == "output: keys ['b'] only in eager, ['c'] only in graphed"
    [length] = compare_outputs([1, 2], [1, 2, 3])
    assert length.describe() == "output: length 2 in eager, 3 in graphed"
    [kinds] = compare_outputs(torch.zeros(1), 0.0)
    assert kinds.describe() == "output: Tensor in eager, float in graphed"


def test_float_leaves_follow_the_tolerances() -> None:
    assert compare_outputs(1.0, 1.0 + 1e-9) != []
    assert compare_outputs(1.0, 1.0 + 1e-9, atol=1e-6) == []
    assert compare_outputs(math.nan, math.nan) == []


# ParityChecker.check on the CPU


def affine(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w + 1


def random_inputs(generator: torch.Generator, case: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(case + 1, 4, generator=generator), torch.randn(4, 3, generator=generator)


def test_identical_callables_pass_every_case() -> None:
    result = ParityChecker("cpu").check(affine, lambda x, w: x @ w + 1, random_inputs, cases=5)
    assert (result.ok, result.checked, result.passed, result.reason()) == (True, 5, 5, "")


def test_both_sides_run_under_identical_rng() -> None:
    def sample(x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand(x.shape)

    def sample_on_another_stream(x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand(x.shape, generator=torch.Generator().manual_seed(99))

    def inputs(generator: torch.Generator, case: int) -> torch.Tensor:
        return torch.zeros(3, 3)

    checker = ParityChecker("cpu", seed=7)
    assert checker.check(sample, sample, inputs, cases=3).ok
    assert not checker.check(sample, sample_on_another_stream, inputs, cases=3).ok


def test_global_rng_is_restored_after_a_check() -> None:
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    ParityChecker("cpu").check(torch.rand, torch.rand, lambda generator, case: (2,), cases=2)
    assert torch.equal(torch.rand(1), expected_next)


def test_each_side_gets_fresh_inputs() -> None:
    def eager_in_place(x: torch.Tensor) -> torch.Tensor:
        return x.mul_(2)

    def inputs(generator: torch.Generator, case: int) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(4, generator=generator)}

    assert ParityChecker("cpu").check(eager_in_place, lambda x: x * 2, inputs, cases=2).ok


def test_inputs_drawn_from_the_global_rng_match_too() -> None:
    def inputs(generator: torch.Generator, case: int) -> torch.Tensor:
        return torch.randn(5)

    assert ParityChecker("cpu").check(torch.sin, torch.sin, inputs, cases=3).ok


def test_cases_are_varied_by_seed_and_case_values_are_passed() -> None:
    seen = []

    def inputs(generator: torch.Generator, case: tuple[int, int]) -> torch.Tensor:
        tensor = torch.randn(case, generator=generator)
        seen.append(tensor)
        return tensor

    ParityChecker("cpu").check(torch.neg, torch.neg, inputs, cases=[(2, 3), (2, 3)])
    assert [tuple(tensor.shape) for tensor in seen] == [(2, 3)] * 4
    assert torch.equal(seen[0], seen[1]) and not torch.equal(seen[0], seen[2])


def test_mismatch_report_names_case_shapes_index_diff_and_count() -> None:
    def off_by_one_element(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out = affine(x, w)
        if out.shape[0] > 2:
            out[2, 1] += 0.125
        return out

    result = ParityChecker("cpu").check(affine, off_by_one_element, random_inputs, cases=4)
    assert (result.checked, result.passed) == (4, 2)
    assert result.reason() == (
        "cuda_graph_parity: case 2 of 4 differs: output at index (2, 1): max |diff| 0.125 "
        "over 1 of 9 elements; input shapes: args[0] (3, 4), args[1] (4, 3); 2 of 4 cases differ"
    )
    assert result.details().splitlines() == [
        "case 2 of 4 (input shapes: args[0] (3, 4), args[1] (4, 3)):",
        "    output at index (2, 1): max |diff| 0.125 over 1 of 9 elements",
        "case 3 of 4 (input shapes: args[0] (4, 4), args[1] (4, 3)):",
        "    output at index (2, 1): max |diff| 0.125 over 1 of 12 elements",
        "2 of 4 match",
    ]


def test_keyword_inputs_are_named_in_the_report() -> None:
    def inputs(generator: torch.Generator, case: str) -> dict[str, torch.Tensor]:
        return {"tokens": torch.zeros(8, 64), "memory": torch.zeros(8, 16, 4)}

    result = ParityChecker("cpu").check(
        lambda tokens, memory: tokens.sum(), lambda tokens, memory: tokens.sum() + 1, inputs, ["a"]
    )
    assert result.reason() == (
        "cuda_graph_parity: case 0 of 1 ('a') differs: output at index (): max |diff| 1 over 1 "
        "of 1 elements; input shapes: tokens (8, 64), memory (8, 16, 4)"
    )


def test_on_result_sees_every_result() -> None:
    seen = []
    checker = ParityChecker("cpu", on_result=seen.append)
    result = checker.check(affine, affine, random_inputs, cases=2)
    assert seen == [result]


# ParityChecker.run_toggled on the CPU


def test_toggled_runs_see_the_variable_and_restore_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEMO_TOGGLE", "outer")
    checker = ParityChecker("cpu")
    seen = []

    def body() -> None:
        seen.append(os.environ["DEMO_TOGGLE"])
        checker.record("sample", torch.rand(4))

    result = checker.run_toggled(body, "DEMO_TOGGLE")
    assert (result.ok, seen, os.environ["DEMO_TOGGLE"]) == (True, ["0", "1"], "outer")


def test_toggle_variable_is_removed_when_it_was_unset() -> None:
    checker = ParityChecker("cpu")
    checker.run_toggled(lambda: checker.record("x", 1), "DEMO_TOGGLE_UNSET")
    assert "DEMO_TOGGLE_UNSET" not in os.environ


def test_toggled_difference_uses_the_same_report() -> None:
    checker = ParityChecker("cpu")

    def body() -> None:
        value = torch.zeros(2, 2)
        if os.environ["DEMO_TOGGLE"] == "1":
            value[1, 0] = 3.0
        checker.record("logits", value)
        checker.record("steps", [1, 2])

    result = checker.run_toggled(body, "DEMO_TOGGLE")
    assert result.reason() == (
        "cuda_graph_parity: runs with DEMO_TOGGLE=0 and =1 differ: recorded['logits'][0] at "
        "index (1, 0): max |diff| 3 over 1 of 4 elements"
    )


def test_recorded_values_are_snapshots() -> None:
    checker = ParityChecker("cpu")
    static_output = torch.zeros(3)

    def body() -> None:
        static_output.fill_(float(os.environ["DEMO_TOGGLE"]))
        checker.record("output", static_output)
        static_output.zero_()  # like the next graph replay overwriting a static output

    assert not checker.run_toggled(body, "DEMO_TOGGLE").ok


def test_recording_nothing_fails() -> None:
    result = ParityChecker("cpu").run_toggled(lambda: None, "DEMO_TOGGLE")
    assert "nothing was recorded; call graph_parity.record(name, value)" in result.reason()


def test_record_outside_a_toggled_run_is_an_error() -> None:
    with pytest.raises(RuntimeError, match=r"only in the body of a test marked"):
        ParityChecker("cpu").record("x", 1)


# The fixture and the marker (cuda_device is the CPU in these runs)


def test_failing_check_fails_the_test_with_reason_and_section(
    cpu_pytester: pytest.Pytester,
) -> None:
    cpu_pytester.makepyfile(
        """
        import torch

        def inputs(generator, case):
            return {"tokens": torch.randn(2, 8, generator=generator)}

        def eager(tokens):
            return torch.tanh(tokens)

        def test_differs(graph_parity):
            graph_parity.check(eager, lambda tokens: eager(tokens) * 1.5, inputs, cases=3)

        def test_matches(graph_parity):
            result = graph_parity.check(eager, lambda tokens: tokens.tanh(), inputs, cases=3)
            assert result.passed == 3
        """
    )
    result = cpu_pytester.runpytest_inprocess()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_differs _*",
            "cuda_graph_parity: case 0 of 3 differs: output at index (0, 0): max |diff| * over 16 "
            "of 16 elements; input shapes: tokens (2, 8); 3 of 3 cases differ",
            "*- cudagraph parity -*",
            "case 0 of 3 (input shapes: tokens (2, 8)):",
            "case 2 of 3 (input shapes: tokens (2, 8)):",
            "0 of 3 match",
            "*= cudagraph =*",
            "parity: 3 of 6 checked cases match",
            "  test_*.py::test_differs: 0 of 3 cases match",
            "  test_*.py::test_matches: 3 of 3 cases match",
        ]
    )


def test_toggle_marker_runs_the_body_twice_and_compares(cpu_pytester: pytest.Pytester) -> None:
    cpu_pytester.makepyfile(
        """
        import os
        import pytest
        import torch

        RUNS = []

        @pytest.fixture
        def shared():
            return []

        @pytest.mark.cuda_graph_parity(toggle="DEMO_GRAPHS", seed=5)
        def test_same(graph_parity, shared):
            shared.append(os.environ["DEMO_GRAPHS"])
            RUNS.append(list(shared))
            graph_parity.record("noise", torch.randn(3))

        @pytest.mark.cuda_graph_parity(toggle="DEMO_GRAPHS")
        def test_differs(graph_parity):
            graph_parity.record("mode", int(os.environ["DEMO_GRAPHS"]))

        def test_after():
            assert RUNS == [["0"], ["0", "1"]]
            assert "DEMO_GRAPHS" not in os.environ
        """
    )
    result = cpu_pytester.runpytest_inprocess()
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "cuda_graph_parity: runs with DEMO_GRAPHS=0 and =1 differ: recorded['mode'][0]: "
            "0 in DEMO_GRAPHS=0, 1 in DEMO_GRAPHS=1",
            "*= cudagraph =*",
            "  test_*.py::test_same: 1 of 1 toggled run pairs match",
            "  test_*.py::test_differs: 0 of 1 toggled run pairs match",
        ]
    )


SEED_TEST = """
import pytest

@pytest.mark.cuda_graph_parity{arguments}
def test_seed(graph_parity):
    print("seed", graph_parity.seed)
    graph_parity.check(abs, abs, lambda generator, case: -1.5, cases=1)
"""


@pytest.mark.parametrize(
    ("arguments", "env", "option", "ini", "expected"),
    [
        ("", None, None, None, 0),
        ("", None, None, "4", 4),
        ("", "3", None, "4", 3),
        ("", "3", "2", "4", 2),
        ("(seed=1)", "3", "2", "4", 1),
    ],
    ids=["default", "ini", "env-over-ini", "option-over-env", "marker-over-option"],
)
def test_seed_precedence_is_marker_option_env_ini(
    cpu_pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    arguments: str,
    env: str | None,
    option: str | None,
    ini: str | None,
    expected: int,
) -> None:
    if ini is not None:
        cpu_pytester.makeini(f"[pytest]\ncudagraph_seed = {ini}")
    if env is not None:
        monkeypatch.setenv("PYTEST_CUDAGRAPH_SEED", env)
    cpu_pytester.makepyfile(SEED_TEST.format(arguments=arguments))
    args = ["-s"] + ([f"--cudagraph-seed={option}"] if option else [])
    result = cpu_pytester.runpytest_inprocess(*args)
    result.stdout.fnmatch_lines([f"*seed {expected}*"])


@pytest.mark.skipif(not settings.TYPED_INI, reason="native TOML numbers need pytest >= 9.2")
def test_seed_as_a_native_toml_integer(cpu_pytester: pytest.Pytester) -> None:
    cpu_pytester.makepyprojecttoml("[tool.pytest]\ncudagraph_seed = 7\n")
    cpu_pytester.makepyfile(SEED_TEST.format(arguments=""))
    result = cpu_pytester.runpytest_inprocess("-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*seed 7*"])


def test_a_marked_test_that_compares_nothing_fails_saying_so(cpu_pytester: pytest.Pytester) -> None:
    cpu_pytester.makepyfile(
        """
        import pytest

        @pytest.mark.cuda_graph_parity
        def test_forgot(graph_parity):
            pass

        @pytest.mark.cuda_graph_parity(toggle="DEMO_GRAPHS")
        def test_records_nothing(graph_parity):
            pass
        """
    )
    result = cpu_pytester.runpytest_inprocess()
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        ["*cuda_graph_parity on test_*.py::test_forgot: the test compared nothing; call *"]
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip where CUDA is absent")
def test_marker_skips_without_cuda(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.cuda_graph_parity
        def test_check(graph_parity):
            pass

        @pytest.mark.cuda_graph_parity(toggle="DEMO")
        def test_toggle():
            raise AssertionError("must not run")
        """
    )
    result = pytester.runpytest_inprocess("-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(
        [
            "skips by reason:",
            "  2 x needs CUDA: torch.cuda.is_available() is False",
            "SKIPPED [[]1[]] test_*.py:*: needs CUDA: torch.cuda.is_available() is False",
            "SKIPPED [[]1[]] test_*.py:*: needs CUDA: torch.cuda.is_available() is False",
        ]
    )
