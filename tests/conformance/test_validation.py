"""The argument checks of the conformance wing (pytest_cudagraph.conformance._validation) as a
user meets them: the adapters refuse a bad argument when called, before any work, naming
themselves, the argument and the value; a guard's regex that matches any message, an episode
length out of bounds and a contract field that is not callable are refused when the capability
or the target is made."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from pytest_cudagraph.conformance import (
    Case,
    CudaGraphTarget,
    Guards,
    State,
    compiled,
    graphed_callables,
)
from pytest_cudagraph.conformance._protocol import MAX_EPISODE_CALLS

CPU = torch.device("cpu")


def draw(generator: torch.Generator, case: Case) -> dict[str, torch.Tensor]:
    return {"x": torch.randn(case.key, 4, generator=generator)}


def step(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


SHARED = torch.nn.Linear(4, 4)


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (
            lambda: compiled(step, device=CPU, keys=[2], draw=draw, model=lambda: None),
            TypeError,
            "compiled: model() must build a torch.nn.Module, got NoneType",
        ),
        (
            lambda: compiled(step, device=CPU, keys=[2], draw=draw, model=3),
            TypeError,
            "compiled: model must be a torch.nn.Module or a zero-arg callable building one, "
            "got int",
        ),
        (
            lambda: compiled(step, device="cpu", keys=[2], draw=draw),
            TypeError,
            "compiled: device must be a torch.device, got 'cpu' (write torch.device('cpu'))",
        ),
        (
            lambda: compiled(step, device=CPU, keys=[2], draw=draw, mode=None, options={1: 2}),
            TypeError,
            "compiled: options must have string keys, got 1",
        ),
        (
            lambda: compiled(step, device=CPU, keys=[2], draw=3),
            TypeError,
            "compiled: draw must be callable, got int",
        ),
        (
            lambda: compiled(step, device=CPU, keys=[2], draw=draw, rerecord_limit=True),
            TypeError,
            "compiled: rerecord_limit must be an int, got True",
        ),
        (
            lambda: compiled(3, device=CPU, keys=[2], draw=draw),
            TypeError,
            "compiled: fn must be callable, got int",
        ),
        (
            lambda: graphed_callables(step, device="cpu", keys=[2], draw=draw),
            TypeError,
            "graphed_callables: device must be a torch.device, got 'cpu' "
            "(write torch.device('cpu'))",
        ),
        (
            lambda: graphed_callables(step, device=CPU, keys=[2], draw=draw, num_warmup_iters=-1),
            ValueError,
            "graphed_callables: num_warmup_iters must be >= 0, got -1",
        ),
        (
            lambda: graphed_callables(step, device=CPU, keys=[2], draw=draw, key_of=3),
            TypeError,
            "graphed_callables: key_of must be callable or None, got int",
        ),
    ],
    ids=[
        "model builds None",
        "model neither",
        "compiled device spelt",
        "options keys",
        "draw",
        "rerecord_limit",
        "fn",
        "graphed_callables device spelt",
        "num_warmup_iters",
        "key_of",
    ],
)
def test_an_adapter_refuses_a_bad_argument_naming_itself(
    make: Callable[[], object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as refused:
        make()
    assert str(refused.value) == message


@pytest.mark.parametrize("adapter", [compiled, graphed_callables], ids=lambda a: a.__name__)
def test_an_adapter_builds_no_model_before_its_arguments_are_checked(
    adapter: Callable[..., CudaGraphTarget],
) -> None:
    built: list[torch.nn.Module] = []

    def model() -> torch.nn.Module:
        built.append(torch.nn.Linear(4, 4))
        return built[-1]

    with pytest.raises(TypeError, match=r"device must be a torch.device"):
        adapter(step, device="cpu", keys=[2], draw=draw, model=model)
    assert built == []
    adapter(step, device=CPU, keys=[2], draw=draw, model=model)
    assert len(built) == 2  # one module for each side


@pytest.mark.parametrize("adapter", [compiled, graphed_callables], ids=lambda a: a.__name__)
def test_a_builder_giving_one_module_twice_is_refused_unless_the_sides_share_it(
    adapter: Callable[..., CudaGraphTarget],
) -> None:
    with pytest.raises(ValueError) as refused:
        adapter(step, device=CPU, keys=[2], draw=draw, model=lambda: SHARED)
    assert str(refused.value) == (
        f"{adapter.__name__}: model() returned the same module twice: each side needs one of "
        "its own (build a new module on each call, or give share_state=True)"
    )
    shared = adapter(step, device=CPU, keys=[2], draw=draw, model=lambda: SHARED, share_state=True)
    assert shared.state is None  # nothing to keep apart: the two sides hold one state


ANY_MESSAGE = [".", r"\w", ".+", r"\S", "[^\n]"]
SAYS_WHAT_IS_UNMET = ["batch", "must be", r"bf16 .* off", r"\d+ rows"]


def test_a_guard_regex_is_refused_exactly_when_it_matches_any_message() -> None:
    for pattern in ANY_MESSAGE:
        with pytest.raises(ValueError) as refused:
            Guards({"m": (lambda: None, pattern)})
        assert str(refused.value).startswith(
            f"Guards.modes['m']: {pattern!r} matches any message (it matched each of 'x', '0', "
            "'No.', 'Unrelated words.'), so any refusal would pass"
        ), pattern
    for pattern in SAYS_WHAT_IS_UNMET:
        assert Guards({"m": (lambda: None, pattern)}).modes["m"][1] == pattern


def sides() -> tuple[object, object]:
    return torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)


@pytest.mark.parametrize(
    ("episode_calls", "error", "message"),
    [
        (0, ValueError, "State.episode_calls must be >= 1, got 0"),
        (-3, ValueError, "State.episode_calls must be >= 1, got -3"),
        (
            MAX_EPISODE_CALLS + 1,
            ValueError,
            f"State.episode_calls must be at most {MAX_EPISODE_CALLS}, got {MAX_EPISODE_CALLS + 1}",
        ),
        (16.0, TypeError, "State.episode_calls must be an int, got 16.0"),
        (True, TypeError, "State.episode_calls must be an int, got True"),
    ],
)
def test_an_episode_length_out_of_bounds_is_refused(
    episode_calls: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as refused:
        State(sides=sides, reset=lambda: None, episode_calls=episode_calls)  # type: ignore[arg-type]
    assert str(refused.value) == message


def test_an_episode_length_within_bounds_is_kept() -> None:
    assert State(reset=lambda: None, episode_calls=1).episode_calls == 1
    longest = State(reset=lambda: None, episode_calls=MAX_EPISODE_CALLS)
    assert longest.episode_calls == MAX_EPISODE_CALLS
    assert State(reset=lambda: None).episode_calls is None  # found by the suite


def target_with(**changes: object) -> CudaGraphTarget:
    fields: dict[str, object] = dict(
        device=CPU, eager=len, graphed=None, keys=[2], draw=draw, key_of=len
    )
    return CudaGraphTarget(**{**fields, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("generators", "message"),
    [
        (3, "CudaGraphTarget.generators must be callable or None, got int"),
        (
            [torch.Generator()],
            "CudaGraphTarget.generators must be callable or None, got list",
        ),
    ],
)
def test_generators_that_are_not_a_callable_are_refused(generators: object, message: str) -> None:
    with pytest.raises(TypeError) as refused:
        target_with(generators=generators)
    assert str(refused.value) == message
    generator = torch.Generator()
    assert list(target_with(generators=lambda: [generator]).generators()) == [generator]  # type: ignore[misc]
