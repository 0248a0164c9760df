"""Targets written for earlier releases keep working until 0.5.0 (pytest_cudagraph.conformance
.legacy): 0.3.0's flat fields and ``make_inputs``/``num_keys``, its attribute names, its import
paths, and the release before's ``draw(generator, key)``, each with one DeprecationWarning that
points at the user's line and names the new spelling; a form that cannot be told apart fails
before any check, naming both spellings."""

from __future__ import annotations

import inspect
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch

from pytest_cudagraph.conformance import (
    Cache,
    Case,
    CudaGraphTarget,
    Sampling,
    State,
    TargetError,
    hand_written,
    validate_target,
)

CPU = torch.device("cpu")


def make_inputs(generator: torch.Generator, case: int) -> dict[str, torch.Tensor]:
    return {"x": torch.randn(2 + case % 3, generator=generator)}


@contextmanager
def one_deprecation(*fragments: str) -> Iterator[list[warnings.WarningMessage]]:
    """Exactly one DeprecationWarning, saying each of ``fragments``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught
    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert len(deprecations) == 1, [str(w.message) for w in deprecations]
    for fragment in fragments:
        assert fragment in str(deprecations[0].message)


def this_line() -> int:
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno


def test_a_target_of_0_3_0s_flat_fields_runs_with_one_warning_at_the_users_line() -> None:
    lock = threading.Lock()
    with one_deprecation(
        "is the spelling of pytest-cudagraph 0.3.0, accepted until 0.5.0",
        "keys=range(num_keys), draw=lambda generator, case: make_inputs(generator, case.number)",
        "cache=Cache(reset=..., lock=..., capacity=..., largest_key=...)",
        "sampling=Sampling(sample=...)",
        "state=State(reset=...)",
        "guards=Guards(modes=..., refusal_errors=...)",
    ) as caught:
        line = this_line() + 1
        target = CudaGraphTarget(device=CPU, eager=lambda i: i["x"], graphed=None, make_inputs=make_inputs, key_of=lambda i: i["x"].shape[0], num_keys=3, reset=lambda: None, lock=lock, capacity=2, largest_case=5, sampler=lambda seed, graphs: [seed], reset_state=lambda: None, unsupported_modes={"m": (lambda: None, "x")}, refusal_errors=(AssertionError,))  # fmt: skip
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)
    assert target.keys == range(3)
    assert target.cache == Cache(reset=target.cache.reset, lock=lock, capacity=2, largest_key=2)
    assert isinstance(target.sampling, Sampling) and isinstance(target.state, State)
    assert target.guards is not None and target.guards.refusal_errors == (AssertionError,)
    drawn = target.make_inputs(torch.Generator().manual_seed(0), 4)
    assert drawn["x"].shape == (3,)  # make_inputs got the case number, 4


def test_refusal_errors_alone_is_dropped_and_replace_merges_an_old_field() -> None:
    with one_deprecation("refusal_errors"):
        target = CudaGraphTarget(device=CPU, eager=len, graphed=None, make_inputs=make_inputs, key_of=len, num_keys=1, refusal_errors=(AssertionError,))  # fmt: skip
    assert target.guards is None
    with_cache = CudaGraphTarget(device=CPU, eager=len, graphed=None, keys=[1], draw=lambda g, c: {}, key_of=len, cache=Cache(capacity=4, reset=lambda: None))  # fmt: skip
    with one_deprecation("cache=Cache(capacity=...)"):
        changed = CudaGraphTarget(**{**vars(with_cache), "capacity": 6})
    assert changed.cache is not None and changed.cache.capacity == 6
    assert changed.cache.reset is with_cache.cache.reset  # type: ignore[union-attr]


def test_0_3_0s_attribute_names_read_from_their_new_homes_with_a_warning() -> None:
    target = CudaGraphTarget(device=CPU, eager=len, graphed=None, keys=["a", "b"], draw=lambda g, c: {}, key_of=len, cache=Cache(capacity=4, largest_key="b"))  # fmt: skip
    with one_deprecation(
        "CudaGraphTarget.capacity is the spelling", "read CudaGraphTarget.cache.capacity"
    ):
        assert target.capacity == 4
    with one_deprecation("read CudaGraphTarget.cache.largest_key"):
        assert target.largest_case == 1
    with one_deprecation("read CudaGraphTarget.guards.refusal_errors"):
        assert target.refusal_errors == (ValueError, TypeError, RuntimeError)
    with one_deprecation("read CudaGraphTarget.sampling.sample"):
        assert target.sampler is None
    assert target.num_keys == 2  # kept: not deprecated
    with pytest.raises(AttributeError, match="has no attribute 'capacityy'"):
        target.capacityy  # noqa: B018


@pytest.mark.parametrize(
    ("given", "error", "message"),
    [
        (
            {"make_inputs": make_inputs},
            TypeError,
            "make_inputs and num_keys go together; num_keys is missing",
        ),
        (
            {"num_keys": 2},
            TypeError,
            "make_inputs and num_keys go together; make_inputs is missing",
        ),
        (
            {"make_inputs": make_inputs, "num_keys": 0},
            ValueError,
            "num_keys must be an int >= 1, got 0",
        ),
        (
            {"make_inputs": make_inputs, "num_keys": 2, "keys": [1]},
            TypeError,
            "give draw and keys, not both spellings",
        ),
        (
            {"make_inputs": make_inputs, "num_keys": 2, "largest_case": -1},
            ValueError,
            "largest_case must be an int >= 0, got -1",
        ),
    ],
)
def test_an_old_form_that_does_not_hold_together_is_named(
    given: dict[str, object], error: type[Exception], message: str
) -> None:
    fields: dict[str, object] = dict(device=CPU, eager=len, graphed=None, key_of=len)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(error, match=message):
            CudaGraphTarget(**fields, **given)


def test_an_adapter_given_0_3_0s_flat_fields_builds_the_capabilities() -> None:
    def draw(generator: torch.Generator, case: Case) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(case.key, generator=generator)}

    with one_deprecation("hand_written(capacity=..., largest_key=..., sampler=...)") as caught:
        line = this_line() + 1
        target = hand_written(device=CPU, eager=len, graphed=None, keys=[1, 2], draw=draw, key_of=len, capacity=2, largest_key=2, sampler=lambda seed, graphs: [])  # fmt: skip
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)
    assert target.cache == Cache(capacity=2, largest_key=2)
    with pytest.raises(
        TypeError,
        match=r"hand_written\(\) got unknown field\(s\) capacityy; it takes by name cache, capture_clean",
    ):
        hand_written(device=CPU, eager=len, graphed=None, keys=[1], draw=draw, key_of=len, capacityy=2)  # type: ignore[call-arg]  # fmt: skip


def keyed_target(draw: Callable[..., object]) -> CudaGraphTarget:
    return CudaGraphTarget(device=CPU, eager=len, graphed=None, keys=[(2,), (3,)], draw=draw, key_of=lambda i: i["x"].shape)  # type: ignore[arg-type]  # fmt: skip


def test_a_draw_of_the_release_before_by_its_parameters_name_gets_the_key() -> None:
    def draw(generator: torch.Generator, key: tuple[int]) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(*key, generator=generator)}

    target = keyed_target(draw)
    with one_deprecation(
        "draw(generator, key)", "write draw(generator, case) and read case.key"
    ) as caught:
        validate_target("mine:make", target, CPU)
    assert (caught[0].filename, caught[0].lineno) == (__file__, draw.__code__.co_firstlineno)
    assert target.make_inputs(torch.Generator(), 1)["x"].shape == (3,)


def test_a_draw_with_an_unnamed_parameter_is_told_apart_by_what_it_accepts() -> None:
    def old(generator: torch.Generator, shape: tuple[int]) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(*shape, generator=generator)}  # a Case is not a shape

    def new(generator: torch.Generator, c: Case) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(*c.key, generator=generator)}

    with one_deprecation("draw(generator, key)"):
        validate_target("mine:make", keyed_target(old), CPU)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        validate_target("mine:make", keyed_target(new), CPU)


def test_a_draw_that_fails_both_spellings_is_named_with_both_errors_before_any_check() -> None:
    def broken(generator: torch.Generator, c: object) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(c.rows, generator=generator)}  # type: ignore[attr-defined]

    with pytest.raises(TargetError) as refused:
        validate_target("mine:make", keyed_target(broken), CPU)
    message = str(refused.value)
    assert message.startswith(
        "conformance target 'mine:make': draw: draw(generator, case) raised AttributeError"
    )
    assert "called as draw(generator, key), the spelling before 0.3.0, it raised" in message
    assert "Name its second parameter 'case'" in message


def test_a_draw_named_for_cases_is_never_retried_with_the_key() -> None:
    def draw(generator: torch.Generator, case: Case) -> dict[str, torch.Tensor]:
        raise KeyError("hidden")

    with pytest.raises(
        TargetError,
        match=r"draw\(generator, case 0: key \(2,\), repeat 0\) raised KeyError: 'hidden'$",
    ):
        validate_target("mine:make", keyed_target(draw), CPU)


OLD_IMPORTS = """\
import warnings
warnings.simplefilter("always")
from pytest_cudagraph.conformance.target import CudaGraphTarget, Tolerance, TargetError, validate_target, Padding, Trajectory
from pytest_cudagraph.conformance.adapters import hand_written, compiled, graphed_callables, InductorSkips, Case
import pytest_cudagraph.target as old_target
import pytest_cudagraph.adapters as old_adapters
import pytest_cudagraph.conformance as door
assert CudaGraphTarget is door.CudaGraphTarget and old_target.TargetError is door.TargetError
assert old_adapters.hand_written is door.hand_written and Case is door.Case
print("ok")
"""


def test_0_3_0s_import_paths_give_the_same_objects_each_with_a_warning_at_its_import(
    tmp_path: object,
) -> None:
    run = subprocess.run(
        [sys.executable, "-c", OLD_IMPORTS], capture_output=True, text=True, check=True
    )
    assert run.stdout == "ok\n"
    lines = [line for line in run.stderr.splitlines() if "DeprecationWarning" in line]
    assert len(lines) == 3, run.stderr
    assert lines[0].startswith(
        "<string>:3: DeprecationWarning: pytest_cudagraph.conformance.target is 0.3.0's home"
    )
    assert lines[1].startswith("<string>:5: DeprecationWarning: pytest_cudagraph.target moved")
    assert lines[2].startswith("<string>:6: DeprecationWarning: pytest_cudagraph.adapters moved")


def test_the_old_module_still_lists_the_installed_targets() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "pytest_cudagraph.conformance.target"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "reasyn  reasyn_ref.targets.reference:make_target" in run.stdout


def test_largest_case_0_names_the_first_key() -> None:
    with one_deprecation("cache=Cache(largest_key=...)"):
        target = CudaGraphTarget(device=CPU, eager=len, graphed=None, make_inputs=make_inputs, key_of=len, num_keys=3, largest_case=0)  # fmt: skip
    assert target.cache == Cache(largest_key=0)


@pytest.mark.parametrize(
    ("given", "error", "message"),
    [
        ({"make_inputs": make_inputs, "num_keys": True}, ValueError, "num_keys must be an int >= 1, got True"),
        ({"make_inputs": 3, "num_keys": 2}, TypeError, "make_inputs must be callable, got int"),
        ({"make_inputs": make_inputs, "num_keys": 2, "largest_case": True}, ValueError, "largest_case must be an int >= 0, got True"),
        ({"draw": len, "largest_case": 0}, TypeError, r"largest_case needs keys \(or num_keys\)"),
    ],
)  # fmt: skip
def test_more_old_forms_that_do_not_hold_together_are_named(
    given: dict[str, object], error: type[Exception], message: str
) -> None:
    fields: dict[str, object] = dict(device=CPU, eager=len, graphed=None, key_of=len)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(error, match=message):
            CudaGraphTarget(**fields, **given)


def test_an_old_field_given_as_none_gives_no_capability() -> None:
    with one_deprecation("sampler"):
        target = CudaGraphTarget(device=CPU, eager=len, graphed=None, keys=[1], draw=lambda g, c: {}, key_of=len, sampler=None)  # fmt: skip
    assert target.sampling is None


def test_make_inputs_gets_the_case_number_not_its_key() -> None:
    numbers: list[int] = []

    def recorded(generator: torch.Generator, number: int) -> dict[str, torch.Tensor]:
        numbers.append(number)
        return make_inputs(generator, number)

    with one_deprecation("make_inputs"):
        target = CudaGraphTarget(device=CPU, eager=len, graphed=None, make_inputs=recorded, key_of=len, num_keys=3)  # fmt: skip
    target.make_inputs(torch.Generator(), 4)
    assert numbers == [4]


def test_a_draw_named_for_the_key_gets_the_key_even_where_a_case_would_do() -> None:
    given: list[object] = []

    def draw(generator: torch.Generator, key: object) -> dict[str, torch.Tensor]:
        given.append(key)
        return {"x": torch.zeros(2)}

    with one_deprecation("draw(generator, key)"):
        validate_target("mine:make", keyed_target(draw), CPU)
    assert given and set(given) == {(2,)}  # the key each time, never a Case
