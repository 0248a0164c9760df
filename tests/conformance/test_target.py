"""The protocol of pytest_cudagraph.conformance.target on the CPU: the contract a target declares
(tolerance per output part, real part, output lifetime, threads, refusals), one key being
enough, a graphed side left out away from CUDA, and every field that would only fail later
(a regex, make_inputs, key_of) refused when the target is validated, naming it."""

from __future__ import annotations

import pytest
import torch

from pytest_cudagraph.conformance.target import (
    EXACT,
    NEXT_CALL,
    SERIAL,
    CudaGraphTarget,
    Padding,
    TargetError,
    Tolerance,
    Trajectory,
    validate_target,
)
from pytest_cudagraph.engines import compare

CPU = torch.device("cpu")


def target_with(**changes: object) -> CudaGraphTarget:
    """A valid one-key target on the CPU, then ``changes``."""
    fields: dict[str, object] = dict(
        device=CPU,
        eager=lambda inputs: {"logits": inputs["x"] * 2, "cache": inputs["x"]},
        graphed=None,
        make_inputs=lambda generator, case: {"x": torch.randn(3, generator=generator)},
        key_of=lambda inputs: inputs["x"].shape,
        num_keys=1,
    )
    return CudaGraphTarget(**{**fields, **changes})


def refused(target: CudaGraphTarget, device: torch.device = CPU) -> str:
    with pytest.raises(TargetError) as error:
        validate_target("mine:make", target, device)
    return str(error.value).removeprefix("conformance target 'mine:make': ")


def test_one_key_and_no_graphed_side_away_from_cuda_make_a_valid_target() -> None:
    validate_target("mine:make", target_with(), CPU)


def test_the_graphed_side_is_required_on_cuda() -> None:
    cuda = torch.device("cuda", 0)
    assert refused(target_with(device=cuda), cuda) == "core field(s) missing: graphed"


def test_the_declared_contract_is_accepted() -> None:
    target = target_with(
        tolerance={"logits": Tolerance(atol=1e-3)},
        real_part=lambda inputs: {"logits": slice(0, 2)},
        output_lifetime=NEXT_CALL,
        threads=SERIAL,
        refusal_errors=(AssertionError, ValueError),
    )
    validate_target("mine:make", target, CPU)
    assert target.tolerance_of("logits") == Tolerance(atol=1e-3)
    assert target.tolerance_of("cache") == EXACT
    assert target.describe_tolerance() == "'logits' atol 0.001, rtol 0; other parts exact"


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"num_keys": 0}, "num_keys must be an int >= 1, got 0"),
        ({"tolerance": {}}, "tolerance must name at least one output part when a mapping"),
        (
            {"tolerance": {"logits": 1e-3}},
            "tolerance['logits'] must be a pytest_cudagraph.conformance.target.Tolerance, got float",
        ),
        ({"real_part": slice(0, 2)}, "real_part must be callable, got slice"),
        (
            {"output_lifetime": "until reset"},
            "output_lifetime must be one of 'owned', 'next call of its key', 'next call', got "
            "'until reset'",
        ),
        (
            {"threads": "many"},
            "threads must be one of 'concurrent', 'serial', 'single', got 'many'",
        ),
        (
            {"refusal_errors": AssertionError},
            "refusal_errors must be a non-empty tuple of exception classes, got <class "
            "'AssertionError'>",
        ),
        (
            {"refusal_errors": ()},
            "refusal_errors must be a non-empty tuple of exception classes, got ()",
        ),
        (
            {"refusal_errors": (ValueError, "assert")},
            "refusal_errors must be a non-empty tuple of exception classes, got (<class "
            "'ValueError'>, 'assert')",
        ),
        ({"runs_eagerly": True}, "runs_eagerly must be callable, got bool"),
        ({"side_state": (1, 2)}, "side_state must be callable, got tuple"),
        (
            {"padding": 16},
            "padding must be a pytest_cudagraph.conformance.target.Padding, got int",
        ),
        (
            {"trajectory": lambda inputs, output: inputs},
            "trajectory must be a pytest_cudagraph.conformance.target.Trajectory, got function",
        ),
        (
            {"unsupported_modes": {"bf16 off": (lambda: None, "needs (bf16")}},
            "unsupported_modes['bf16 off']: 'needs (bf16' is not a regex (missing ), unterminated "
            "subpattern at position 6)",
        ),
    ],
)
def test_a_malformed_contract_field_is_named(changes: dict[str, object], problem: str) -> None:
    assert refused(target_with(**changes)) == problem


def fails(error: Exception) -> object:
    def call(*args: object) -> object:
        raise error

    return call


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        (
            {"make_inputs": lambda generator, case: [torch.zeros(3)]},
            "make_inputs(generator, 0) returned list; it must return a dict of input name -> value",
        ),
        (
            {"make_inputs": lambda generator, case: {0: torch.zeros(3)}},
            "make_inputs(generator, 0) returned dict; it must return a dict of input name -> value",
        ),
        (
            {"make_inputs": fails(KeyError("batch"))},
            "make_inputs(generator, 0) raised KeyError: 'batch'",
        ),
        (
            {"key_of": lambda inputs: [3]},
            "key_of(case 0's inputs) returned an unhashable list: [3]",
        ),
        (
            {"key_of": fails(IndexError("no dim 2\nsecond line"))},
            "key_of(case 0's inputs) raised IndexError: no dim 2",
        ),
    ],
)
def test_case_0_is_drawn_and_keyed_when_the_target_is_validated(
    changes: dict[str, object], problem: str
) -> None:
    assert refused(target_with(**changes)) == problem


def test_the_protocols_tolerance_is_the_comparison_engines() -> None:
    """One rule and one wording for a tolerance: the engine's, named by the protocol too."""
    assert Tolerance is compare.Tolerance and EXACT is compare.EXACT


def rows_of(generator: torch.Generator, rows: int) -> dict[str, torch.Tensor]:
    return {"x": torch.randn(rows, generator=generator)}


def test_padding_and_a_trajectory_are_accepted_with_their_defaults() -> None:
    padding, trajectory = Padding(16, rows_of), Trajectory(lambda inputs, output: inputs)
    validate_target("mine:make", target_with(padding=padding, trajectory=trajectory), CPU)
    assert (padding.junk, trajectory.teacher_forced, trajectory.case) == (None, False, 0)


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: Padding(0, rows_of), ValueError, r"Padding.largest must be >= 1, got 0"),
        (lambda: Padding(16.0, rows_of), TypeError, r"Padding.largest must be an int, got 16.0"),
        (lambda: Padding(True, rows_of), TypeError, r"Padding.largest must be an int, got True"),
        (
            lambda: Padding(4, None),
            TypeError,
            r"Padding.make_inputs must be callable, got NoneType",
        ),
        (lambda: Padding(4, rows_of, "nan"), TypeError, r"Padding.junk must be callable or None"),
        (lambda: Trajectory(3), TypeError, r"Trajectory.next_inputs must be callable, got int"),
        (
            lambda: Trajectory(rows_of, teacher_forced=1),
            TypeError,
            r"Trajectory.teacher_forced must be True or False, got 1",
        ),
        (lambda: Trajectory(rows_of, case=-1), ValueError, r"Trajectory.case must be >= 0, got -1"),
        (
            lambda: Trajectory(rows_of, case="0"),
            TypeError,
            r"Trajectory.case must be an int, got '0'",
        ),
    ],
)
def test_a_malformed_padding_or_trajectory_is_refused_naming_the_field(
    make: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        make()  # type: ignore[operator]
