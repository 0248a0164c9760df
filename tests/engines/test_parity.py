"""The parity engine on CPU callables: both sides under identical inputs and RNG, compared on
copies neither side can reach; its arguments checked before any work; its report; its own
memory bounded; and the toggle form."""

from __future__ import annotations

import dataclasses
import gc
import itertools
import os
import threading
import types

import pytest
import torch

from pytest_cudagraph.engines import parity
from pytest_cudagraph.engines.compare import PendingValues
from pytest_cudagraph.engines.parity import MAX_SEED, NOTHING_COMPARED, ParityChecker


def scaled(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def one_input(generator: torch.Generator, case: object) -> tuple[torch.Tensor]:
    return (torch.randn(4, 3, generator=generator),)


def affine(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w + 1


def random_inputs(generator: torch.Generator, case: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(case + 1, 4, generator=generator), torch.randn(4, 3, generator=generator)


@dataclasses.dataclass
class Step:
    logits: torch.Tensor
    rows: int


# Both sides alike


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


# Inputs of their own


def test_an_input_both_sides_are_handed_is_refused_before_either_runs() -> None:
    """A cached input: the eager side doubles it in place, and a graphed side that computes
    nothing would then read the doubled values and match."""
    cached = torch.randn(4)
    ran: list[str] = []

    def eager(x: torch.Tensor) -> torch.Tensor:
        ran.append("eager")
        return x.mul_(2).clone()

    def does_nothing(x: torch.Tensor) -> torch.Tensor:
        ran.append("graphed")
        return x.clone()

    checker = ParityChecker("cpu")
    with pytest.raises(
        ValueError,
        match=r"make_inputs gave both sides of case 0 the same memory \(x of the graphed call "
        r"with x of the eager call\): each side needs inputs of its own",
    ):
        checker.check(eager, does_nothing, lambda generator, case: {"x": cached}, cases=2)
    assert (ran, checker.comparisons) == ([], 0)


def test_a_view_of_a_shared_tensor_is_shared_too() -> None:
    weights = torch.randn(4, 4)

    def inputs(generator: torch.Generator, case: int) -> Step:
        return (torch.randn(4, generator=generator), Step(weights[case], 1))

    with pytest.raises(ValueError, match=r"\(args\[1\]\.logits of the graphed call with "):
        ParityChecker("cpu").check(torch.add, torch.add, inputs, cases=2)


# Each side's output as it was when that side returned


def test_an_eager_output_that_is_state_the_graphed_call_writes_is_copied_first() -> None:
    """The eager side returns its module's buffer; the graphed side writes x * 3 there (a KV
    cache, a static output both share): compared as it was, x * 2 is not x * 3."""
    buffer = torch.zeros(4, 3)

    def eager(x: torch.Tensor) -> torch.Tensor:
        return torch.mul(x, 2, out=buffer)

    def graphed(x: torch.Tensor) -> torch.Tensor:
        return torch.mul(x, 3, out=buffer).clone()

    result = ParityChecker("cpu").check(eager, graphed, one_input, cases=2)
    assert result.passed == 0
    assert all(outcome.mismatches[0].differing == 12 for outcome in result.failures)


def test_an_eager_output_inside_a_dataclass_is_copied_too() -> None:
    buffer = torch.zeros(4, 3)

    def eager(x: torch.Tensor) -> Step:
        return Step(torch.mul(x, 2, out=buffer), 4)

    def graphed(x: torch.Tensor) -> Step:
        return Step(torch.mul(x, 3, out=buffer).clone(), 4)

    result = ParityChecker("cpu").check(eager, graphed, one_input, cases=1)
    assert [mismatch.path for mismatch in result.failures[0].mismatches] == ["output.logits"]


def test_the_graphed_output_is_read_when_the_graphed_call_returns() -> None:
    """A graphed side that returns state the next case's eager call overwrites: case 0's
    figures are what case 0's output held."""
    state = torch.zeros(4, 3)
    calls = []

    def eager(x: torch.Tensor) -> torch.Tensor:
        return state.copy_(x * 2).clone()

    def graphed(x: torch.Tensor) -> torch.Tensor:
        state.copy_(x * 2)
        if not calls:
            state[1, 2] += 1.0  # case 0 differs in one element
        calls.append(x)
        return state

    result = ParityChecker("cpu").check(eager, graphed, one_input, cases=2)
    value = result.outcomes[0].mismatches[0]
    assert (value.first_index, value.differing, value.max_abs_diff) == ((1, 2), 1, 1.0)
    assert value.graphed == pytest.approx(float(calls[0][1, 2] * 2 + 1))
    assert [m.detail for m in result.outcomes[1].mismatches] == [
        "shares storage with case 0 output"
    ]


def test_which_elements_differ_is_taken_at_the_call_not_when_read() -> None:
    """An eager side that returns one buffer it rewrites every call: what differed in case 0,
    and where, is case 0's own."""
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


def test_check_reads_every_case_after_the_last_one_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def graphed(x: torch.Tensor) -> torch.Tensor:
        calls.append("graphed")
        return x * 2 + (len(calls) == 1)  # the first case differs

    read = PendingValues.mismatch

    def record_read(self: PendingValues, differing: int | None = None) -> object:
        calls.append("read")
        return read(self, differing)

    monkeypatch.setattr(PendingValues, "mismatch", record_read)
    result = ParityChecker("cpu").check(scaled, graphed, one_input, cases=3)
    assert calls == ["graphed"] * 3 + ["read"] * 3
    assert [outcome.passed for outcome in result.outcomes] == [False, True, True]


def test_a_long_check_reads_what_it_holds_past_the_pending_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads: list[int] = []
    settle = parity.settle_comparisons

    def counted(groups: list[list[object]]) -> object:
        reads.append(len(groups))
        return settle(groups)

    monkeypatch.setattr(parity, "PENDING_LIMIT", 2)
    monkeypatch.setattr(parity, "settle_comparisons", counted)
    result = ParityChecker("cpu").check(scaled, scaled, one_input, cases=5)
    assert (reads, result.passed) == ([3, 2], 5)


# Arguments checked before any work


@pytest.mark.parametrize("cases", [0, [], (), -3])
def test_a_check_of_no_cases_is_a_value_error(cases: object) -> None:
    checker = ParityChecker("cpu", on_result=lambda result: pytest.fail("ran"))
    with pytest.raises(ValueError, match=r"cases must name at least one case"):
        checker.check(scaled, scaled, one_input, cases=cases)
    assert checker.comparisons == 0


@pytest.mark.parametrize("cases", [True, 2.0, None, "8", b"8"])
def test_cases_of_the_wrong_type_is_a_type_error(cases: object) -> None:
    with pytest.raises(TypeError, match=r"cases must be a count \(an int\) or an iterable"):
        ParityChecker("cpu").check(scaled, scaled, one_input, cases=cases)


def test_too_many_cases_are_refused_before_running() -> None:
    with pytest.raises(ValueError, match=r"cases must be at most 1,000,000 a check, got 18,446,"):
        ParityChecker("cpu").check(scaled, scaled, one_input, cases=2**64)
    with pytest.raises(ValueError, match=r"at most 1,000,000 case values .* endless iterator"):
        ParityChecker("cpu").check(scaled, scaled, one_input, cases=itertools.count())


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


@pytest.mark.parametrize(
    ("tolerance", "error"),
    [
        ({"atol": float("inf")}, ValueError),
        ({"rtol": -1.0}, ValueError),
        ({"atol": True}, TypeError),
    ],
)
def test_bad_tolerances_are_refused_before_running(
    tolerance: dict[str, object], error: type[Exception]
) -> None:
    ran = []
    with pytest.raises(error, match=r"tol must be"):
        ParityChecker("cpu").check(lambda x: ran.append(x), scaled, one_input, 2, **tolerance)
    assert ran == []


@pytest.mark.parametrize("argument", ["eager", "graphed", "make_inputs", "key_of"])
def test_arguments_that_are_not_callable_are_refused(argument: str) -> None:
    arguments = {"eager": scaled, "graphed": scaled, "make_inputs": one_input, "key_of": None}
    arguments[argument] = 3
    with pytest.raises(TypeError, match=rf"^{argument} must be callable"):
        ParityChecker("cpu").check(**arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"only_case": -1}, ValueError, "only_case must be >= 0, got -1"),
        ({"only_case": "2"}, TypeError, "only_case must be an integer"),
        ({"output_budget_bytes": 1.5}, TypeError, "output_budget_bytes must be an integer"),
        ({"rerun": "pytest"}, TypeError, "rerun must be callable or None"),
        ({"on_result": 1}, TypeError, "on_result must be callable or None"),
    ],
)
def test_checker_options_are_checked(
    options: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        ParityChecker("cpu", **options)  # type: ignore[arg-type]


# Nothing compared


def test_outputs_that_hold_no_element_are_not_a_match() -> None:
    def nothing(x: torch.Tensor) -> tuple[torch.Tensor, dict[str, object]]:
        return torch.empty(0, 3), {"kv": [], "done": None}

    result = ParityChecker("cpu").check(nothing, nothing, one_input, cases=8)
    assert (result.ok, result.passed, result.checked) == (False, 0, 8)
    assert {outcome.mismatches[0].detail for outcome in result.outcomes} == {NOTHING_COMPARED}
    assert result.reason().startswith(
        f"cuda_graph_parity: case 0 of 8 differs: output: {NOTHING_COMPARED}"
    )


def test_an_empty_case_among_others_is_fine() -> None:
    def rows(generator: torch.Generator, case: int) -> torch.Tensor:
        return torch.randn(case, 3, generator=generator)  # case 0 has no rows

    assert ParityChecker("cpu").check(scaled, scaled, rows, cases=3).ok


@pytest.mark.parametrize(
    ("eager", "graphed"),
    [
        (lambda x: (x[:0] * 2, 3, "label"), lambda x: (x[:0] * 3, 3, "label")),
        (lambda x: {"logits": x[:0] * 2, "step": len(x)}, lambda x: {"logits": x[:0], "step": 4}),
        (lambda x: ("ok", None), lambda x: ("ok", None)),
        (lambda x: [], lambda x: []),
        (lambda x: {}, lambda x: {}),
    ],
    ids=["numbers beside empty tensors", "a step count", "labels", "empty lists", "empty dicts"],
)
def test_what_computes_nothing_compares_nothing(eager: object, graphed: object) -> None:
    """Numbers and labels beside the tensors used to count as compared, so a graphed x*3
    against an eager x*2 passed when their tensors were empty."""
    result = ParityChecker("cpu").check(eager, graphed, one_input, cases=3)  # type: ignore[arg-type]
    assert (result.ok, result.passed) == (False, 0)
    assert {outcome.mismatches[0].detail for outcome in result.outcomes} == {NOTHING_COMPARED}


def test_numbers_alone_are_compared_values() -> None:
    """An output of numbers and no tensor (a loss read with .item(), tokens as a list) is
    compared number by number, as before."""

    def total(x: torch.Tensor) -> tuple[float, list[int]]:
        return float(x.sum()), [int(x.argmax()), 7]

    def total_off_by_one(x: torch.Tensor) -> tuple[float, list[int]]:
        return float(x.sum()) + 1, [int(x.argmax()), 7]

    assert ParityChecker("cpu").check(total, total, one_input, cases=3).ok
    result = ParityChecker("cpu").check(total, total_off_by_one, one_input, cases=3)
    assert (result.ok, result.passed) == (False, 0)
    assert result.failures[0].mismatches[0].path == "output[0]"


def nested(depth: int) -> list[object]:
    value: list[object] = [torch.zeros(1)]
    for _ in range(depth):
        value = [value]
    return value


def holding_itself(x: torch.Tensor) -> list[object]:
    looped: list[object] = [x * 2]
    looped.append(looped)
    return looped


@pytest.mark.parametrize(
    ("eager", "graphed", "message"),
    [
        (lambda x: nested(3000), scaled, r"^eager output(\[0\]){100}: nested deeper than 100"),
        (scaled, lambda x: nested(3000), r"^output(\[0\]){100}: nested deeper than 100"),
        (holding_itself, scaled, r"^eager output\[1\]: holds itself \(it is eager output again"),
        (scaled, holding_itself, r"^output\[1\]: holds itself \(it is output again"),
    ],
    ids=["eager 3000 deep", "graphed 3000 deep", "eager holds itself", "graphed holds itself"],
)
def test_an_output_no_walk_can_finish_is_named_with_the_bound(
    eager: object, graphed: object, message: str
) -> None:
    """Each used to be a raw RecursionError."""
    with pytest.raises(ValueError, match=message):
        ParityChecker("cpu").check(eager, graphed, one_input, cases=1)  # type: ignore[arg-type]


# The report


def test_mismatch_report_names_case_seed_shapes_values_and_count() -> None:
    def off_by_one_element(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out = affine(x, w)
        if out.shape[0] > 2:
            out[2, 1] += 0.125
        return out

    result = ParityChecker("cpu", seed=10).check(affine, off_by_one_element, random_inputs, cases=4)
    assert (result.checked, result.passed) == (4, 2)
    value = result.failures[0].mismatches[0]
    assert value.abs_diff == pytest.approx(0.125) and value.graphed - value.eager == pytest.approx(
        0.125
    )
    reason = result.reason()
    assert reason.startswith(
        "cuda_graph_parity: case 2 of 4 differs: output at index (2, 1): eager "
    )
    assert reason.endswith(
        "; 1 of 9 elements differ, largest |diff| 0.125; input shapes: args[0] (3, 4), "
        "args[1] (4, 3); seed 12; 2 of 4 cases differ"
    )
    lines = result.details().splitlines()
    assert lines[0] == "case 2 of 4, seed 12 (input shapes: args[0] (3, 4), args[1] (4, 3)):"
    assert lines[1].startswith("    output at index (2, 1): eager ")
    assert lines[2] == "case 3 of 4, seed 13 (input shapes: args[0] (4, 4), args[1] (4, 3)):"
    assert lines[4] == "2 of 4 match"


def test_keyword_inputs_case_values_and_keys_are_named_in_the_report() -> None:
    def inputs(generator: torch.Generator, case: str) -> dict[str, torch.Tensor]:
        return {"tokens": torch.zeros(8, 64), "memory": torch.zeros(8, 16, 4)}

    result = ParityChecker("cpu").check(
        lambda tokens, memory: tokens.sum(),
        lambda tokens, memory: tokens.sum() + 1,
        inputs,
        ["a"],
        key_of=lambda inputs: tuple(inputs["tokens"].shape),
    )
    assert result.reason() == (
        "cuda_graph_parity: case 0 of 1 ('a'), key (8, 64) differs: output at index (): eager "
        "0, graphed 1 (|diff| 1, rel inf; tolerance exact); 1 of 1 elements differ, largest "
        "|diff| 1; input shapes: tokens (8, 64), memory (8, 16, 4); seed 0"
    )


def test_a_failing_case_carries_its_rerun_command_and_its_data() -> None:
    def rerun(seed: int, case: int | None) -> str:
        return f"pytest t.py::test_a --cudagraph-seed={seed} --cudagraph-case={case}"

    def graphed(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + (x.shape[0] == 3)

    def rows(generator: torch.Generator, case: int) -> torch.Tensor:
        return torch.ones(case + 1, 2)

    result = ParityChecker("cpu", seed=5, rerun=rerun).check(scaled, graphed, rows, cases=4)
    [failing] = result.failures
    assert (failing.title, failing.seed) == ("case 2 of 4", 7)
    assert failing.rerun == "pytest t.py::test_a --cudagraph-seed=5 --cudagraph-case=2"
    assert result.reason().endswith("; seed 7; rerun: " + failing.rerun)
    assert result.details().splitlines()[2] == "    rerun: " + failing.rerun
    assert all(outcome.rerun == "" for outcome in result.outcomes if outcome.passed)
    [mismatch] = failing.data()["mismatches"]
    assert failing.data()["title"] == "case 2 of 4"
    assert (mismatch["seed"], mismatch["first_index"], mismatch["eager"], mismatch["graphed"]) == (
        7,
        [0, 0],
        2.0,
        3.0,
    )


def test_only_case_runs_that_case_alone_under_its_own_seed() -> None:
    seen = []

    def inputs(generator: torch.Generator, case: int) -> torch.Tensor:
        seen.append((case, generator.initial_seed()))
        return torch.zeros(2)

    checker = ParityChecker("cpu", seed=100, only_case=2)
    result = checker.check(torch.neg, torch.neg, inputs, cases=[10, 20, 30, 40])
    assert seen == [(30, 102), (30, 102)]
    assert [outcome.title for outcome in result.outcomes] == ["case 2 of 4 (30)"]
    assert checker.comparisons == 1
    with pytest.raises(
        ValueError, match=r"only_case 2 names no case of this check, which has cases 0 to 1"
    ):
        checker.check(torch.neg, torch.neg, inputs, cases=2)


def test_on_result_sees_every_result() -> None:
    seen = []
    checker = ParityChecker("cpu", on_result=seen.append)
    result = checker.check(affine, affine, random_inputs, cases=2)
    assert seen == [result]


def test_comparisons_count_every_case_and_toggled_pair() -> None:
    checker = ParityChecker("cpu")
    assert checker.comparisons == 0
    checker.check(scaled, scaled, one_input, cases=3)
    checker.check(scaled, scaled, one_input, cases=[1])
    checker.run_toggled(lambda: checker.record("x", 1), "H13_DEMO_TOGGLE")
    assert checker.comparisons == 5


def test_running_counts_the_checks_in_progress() -> None:
    checker = ParityChecker("cpu")
    during = []

    def graphed(x: torch.Tensor) -> torch.Tensor:
        during.append(checker.running)
        return x * 2

    checker.check(scaled, graphed, one_input, cases=1)
    with pytest.raises(ZeroDivisionError):
        checker.check(scaled, lambda x: 1 / 0, one_input, cases=1)
    assert (during, checker.running) == ([1], 0)


# The storage rule, and the engine's own memory


def test_graphed_side_returning_its_input_fails_the_case() -> None:
    result = ParityChecker("cpu").check(lambda x: x * 1, lambda x: x, one_input, cases=2)
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


@pytest.mark.parametrize("budget", [parity.DEFAULT_OUTPUT_BUDGET, 0])
def test_a_static_output_buffer_reused_across_calls_fails_the_next_case(budget: int) -> None:
    static = torch.empty(4, 3)

    def graphed(x: torch.Tensor) -> Step:
        return Step(static.copy_(x * 2), 1)

    result = ParityChecker("cpu", output_budget_bytes=budget).check(
        lambda x: Step(x * 2, 1), graphed, one_input, cases=3
    )
    assert [outcome.passed for outcome in result.outcomes] == [True, False, False]
    assert [m.describe() for m in result.outcomes[2].mismatches] == [
        "output.logits: shares storage with case 0 output.logits",
        "output.logits: shares storage with case 1 output.logits",
    ]


def test_a_copy_of_the_static_buffer_passes() -> None:
    static = torch.empty(4, 3)

    def graphed(x: torch.Tensor) -> torch.Tensor:
        return static.copy_(x * 2).clone()

    assert ParityChecker("cpu").check(scaled, graphed, one_input, cases=3).ok


@pytest.mark.slow
def test_earlier_outputs_are_kept_within_the_budget_and_let_go_past_it() -> None:
    """Outputs of 48 bytes: a budget of 100 keeps the last two alive while a case runs."""
    refs = []

    def graphed(x: torch.Tensor) -> torch.Tensor:
        gc.collect()
        alive = [not ref.expired() for ref in refs]
        out = x * 2
        refs.append(torch.multiprocessing.reductions.StorageWeakRef(out.untyped_storage()))
        graphed.alive.append(alive)
        return out

    graphed.alive = []
    ParityChecker("cpu", output_budget_bytes=100).check(scaled, graphed, one_input, cases=4)
    assert graphed.alive == [[], [True], [True, True], [False, True, True]]
    refs.clear()
    graphed.alive = []
    ParityChecker("cpu").check(scaled, graphed, one_input, cases=4)
    assert graphed.alive[-1] == [True, True, True]


def test_memory_handed_out_again_after_an_output_was_let_go_is_not_shared() -> None:
    """Each graphed output lies in the same bytes, a storage of its own each time, as the
    caching allocator hands out a freed block again."""
    buffer = bytearray(48)

    def graphed(x: torch.Tensor) -> torch.Tensor:
        out = torch.frombuffer(buffer, dtype=torch.float32, count=12).view(4, 3)
        return out.copy_(x * 2)

    assert ParityChecker("cpu", output_budget_bytes=0).check(scaled, graphed, one_input, 3).ok
    kept = ParityChecker("cpu").check(scaled, graphed, one_input, 3)
    assert [outcome.passed for outcome in kept.outcomes] == [True, False, False]


# The toggle form


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


@pytest.mark.parametrize("toggle", [" REASYN_CUDAGRAPH", "REASYN_CUDAGRAPH\n", "1X", "", "A=B"])
def test_a_toggle_that_is_not_a_plain_variable_name_is_refused(toggle: str) -> None:
    ran = []
    with pytest.raises(ValueError, match=r"toggle must name an environment variable: letters"):
        ParityChecker("cpu").run_toggled(lambda: ran.append(1), toggle)
    assert ran == []
    with pytest.raises(TypeError, match=r"toggle must name an environment variable, got 5"):
        ParityChecker("cpu").run_toggled(lambda: None, 5)  # type: ignore[arg-type]


def test_toggled_difference_uses_the_same_report() -> None:
    checker = ParityChecker("cpu", seed=4, rerun=lambda seed, case: f"again {seed} {case}")

    def body() -> None:
        value = torch.zeros(2, 2)
        if os.environ["DEMO_TOGGLE"] == "1":
            value[1, 0] = 3.0
        checker.record("logits", value)
        checker.record("steps", [1, 2])

    result = checker.run_toggled(body, "DEMO_TOGGLE")
    assert result.reason() == (
        "cuda_graph_parity: runs with DEMO_TOGGLE=0 and =1 differ: recorded['logits'][0] at "
        "index (1, 0): DEMO_TOGGLE=0 0, DEMO_TOGGLE=1 3 (|diff| 3, rel inf; tolerance exact); "
        "1 of 4 elements differ, largest |diff| 3; seed 4; rerun: again 4 None"
    )


def test_recorded_values_are_snapshots_and_containers_are_walked() -> None:
    checker = ParityChecker("cpu")
    static_output = torch.zeros(3)

    def body() -> None:
        static_output.fill_(float(os.environ["DEMO_TOGGLE"]))
        checker.record(
            "output", types.SimpleNamespace(logits=static_output, step=Step(static_output, 1))
        )
        static_output.zero_()  # like the next graph replay overwriting a static output

    result = checker.run_toggled(body, "DEMO_TOGGLE")
    assert [m.path for m in result.outcomes[0].mismatches] == [
        "recorded['output'][0].logits",
        "recorded['output'][0].step.logits",
    ]


def test_recording_nothing_or_only_empty_values_fails() -> None:
    result = ParityChecker("cpu").run_toggled(lambda: None, "DEMO_TOGGLE")
    assert "nothing was recorded; call graph_parity.record(name, value)" in result.reason()
    checker = ParityChecker("cpu")
    result = checker.run_toggled(lambda: checker.record("kv", torch.empty(0)), "DEMO_TOGGLE")
    assert parity.NOTHING_RECORDED in result.reason()


def test_each_recorded_value_counts_its_own_compared_elements() -> None:
    """A number beside empty tensors in one value is bookkeeping; numbers recorded as a value
    of their own (sampled tokens) are compared."""
    checker = ParityChecker("cpu")

    def bookkeeping() -> None:
        checker.record("out", (torch.empty(0), 3, "label"))

    def tokens() -> None:
        bookkeeping()
        checker.record("tokens", [17, 5, 3])

    assert parity.NOTHING_RECORDED in checker.run_toggled(bookkeeping, "DEMO_TOGGLE").reason()
    assert checker.run_toggled(tokens, "DEMO_TOGGLE").ok


def test_record_refuses_what_it_cannot_compare_and_records_nothing() -> None:
    checker = ParityChecker("cpu")
    errors = []

    def body() -> None:
        checker.record("a", 1)
        try:
            checker.record("a", [object()])
        except TypeError as error:
            errors.append(str(error))
        with pytest.raises(TypeError, match="name must be a string"):
            checker.record(3, 1)  # type: ignore[arg-type]

    assert checker.run_toggled(body, "DEMO_TOGGLE").ok
    assert errors[0].startswith("recorded['a'][1][0]: a builtins.object is not compared")


def test_record_outside_a_toggled_run_is_an_error() -> None:
    with pytest.raises(RuntimeError, match=r"only in the body of a test marked"):
        ParityChecker("cpu").record("x", 1)


def test_a_check_from_another_thread_counts_as_running_until_it_ends() -> None:
    checker = ParityChecker("cpu")
    entered, release = threading.Event(), threading.Event()

    def graphed(x: torch.Tensor) -> torch.Tensor:
        entered.set()
        release.wait(5)
        return x * 2

    worker = threading.Thread(target=checker.check, args=(scaled, graphed, one_input, 1))
    worker.start()
    entered.wait(5)
    assert checker.running == 1
    release.set()
    worker.join(5)
    assert checker.running == 0


def test_the_largest_count_of_cases_is_accepted() -> None:
    last = parity.MAX_CASES - 1
    checker = ParityChecker("cpu", only_case=last)  # the count is checked; one case is run
    result = checker.check(scaled, scaled, one_input, cases=parity.MAX_CASES)
    assert result.ok and [outcome.seed for outcome in result.outcomes] == [checker.seed + last]
