"""The compiled adapter's graphed side where CUDA graphs are emulated on the CPU (cudagraph
trees' contract kept around a compilation that makes no graphs), and both sides' kernel choices
pinned, so that two compilations of the same code run the same kernels."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import Tensor

from pytest_cudagraph.conformance import Case, compiled
from pytest_cudagraph.conformance._adapters import TreesEmulation, pinned_kernel_choices
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.engines.emulation import CUDAGraph, emulated_graphs

CPU = torch.device("cpu")


def twice(x: Tensor) -> Tensor:
    return x * 2


def test_trees_emulation_warms_up_records_on_the_second_call_and_replays_after() -> None:
    step = TreesEmulation(twice)
    with emulated_graphs(), CaptureCounter(CUDAGraph) as counter:
        outputs = [step(torch.ones(3) * call) for call in range(4)]
        assert outputs[-1].tolist() == [6.0, 6.0, 6.0]  # valid until the next call...
        other_shape = step(torch.ones(5))
    assert len(counter.captures) == 1  # the second call of shape (3,): none for (5,) yet
    assert counter.captures[0].replays == 3  # calls 2, 3 and 4 of shape (3,)
    assert other_shape.tolist() == [2.0] * 5
    assert all(output.isnan().all() for output in outputs)  # ... garbage since, as in trees' pool


class Cached(torch.nn.Module):
    """A step that returns a view of its own buffer (a KV cache it writes)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(3))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        self.cache.add_(x)
        return self.cache[:2], x + 1


def test_trees_emulation_leaves_outputs_that_are_its_modules_memory() -> None:
    model = Cached()
    step = TreesEmulation(lambda module, x: module(x))
    with emulated_graphs():
        view, fresh = step(model, torch.ones(3))
        step(model, torch.ones(3))
    assert view.tolist() == [2.0, 2.0] and model.cache.tolist() == [2.0, 2.0, 2.0]
    assert fresh.isnan().all()


def test_a_compiled_target_made_under_emulation_counts_its_captures() -> None:
    def draw(generator: torch.Generator, case: Case) -> dict[str, Tensor]:
        return {"x": torch.randn(*case.key, generator=generator)}

    with emulated_graphs():
        target = compiled(twice, device=CPU, keys=[(2, 3)], draw=draw)
        assert target.graphed is not None
        inputs = draw(torch.Generator().manual_seed(0), Case(0, (2, 3), 0))
        with CaptureCounter(CUDAGraph) as counter:
            answers = [target.graphed(inputs).clone() for _ in range(3)]  # type: ignore[attr-defined]
    assert len(counter.captures) == 1 and counter.captures[0].replays == 2
    assert all(torch.equal(answer, inputs["x"] * 2) for answer in answers)
    without = compiled(twice, device=CPU, keys=[(2, 3)], draw=draw)  # no emulation: no graphs
    with CaptureCounter(CUDAGraph) as counter:
        assert without.graphed is not None
        without.graphed(inputs)
        without.graphed(inputs)
    assert not counter.captures


def test_both_sides_choose_their_kernels_without_benchmarking_them() -> None:
    import torch._inductor.config as inductor_config

    seen: list[object] = []

    def call(step: object, model: object, inputs: dict[str, Tensor]) -> Tensor:
        seen.append(getattr(inductor_config, "deterministic", "absent"))
        return step(**inputs)  # type: ignore[operator]

    def draw(generator: torch.Generator, case: Case) -> dict[str, Tensor]:
        return {"x": torch.randn(*case.key, generator=generator)}

    target = compiled(twice, device=CPU, keys=[(2,)], draw=draw, call=call)
    inputs = draw(torch.Generator().manual_seed(0), Case(0, (2,), 0))
    target.eager(inputs)
    assert target.graphed is not None
    target.graphed(inputs)
    expected = True if hasattr(inductor_config, "deterministic") else "absent"
    assert seen == [expected, expected]
    with pinned_kernel_choices():
        pass
    assert getattr(inductor_config, "deterministic", False) is not True  # put back after


def test_releasing_compiled_targets_resets_their_trees_on_their_thread_and_ends_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Cudagraph trees keep their graphs in the state of the thread that used them: a reset on
    another thread (the main one, at exit) finds none, and graphs left to the interpreter's
    exit outlive CUDA (a SIGSEGV at exit)."""
    import torch._inductor.cudagraph_trees as cudagraph_trees

    from pytest_cudagraph.conformance import _adapters

    reset_on: list[threading.Thread] = []
    monkeypatch.setattr(
        cudagraph_trees,
        "reset_cudagraph_trees",
        lambda: reset_on.append(threading.current_thread()),
    )
    ran_on = _adapters.on_compiled_targets_thread(threading.current_thread)
    assert isinstance(ran_on, threading.Thread) and ran_on.name.startswith("compiled-targets")
    _adapters.release_compiled_targets()
    assert reset_on == [ran_on]
    assert not ran_on.is_alive()  # the thread ended
    _adapters.release_compiled_targets()  # nothing left to release: nothing done
    assert reset_on == [ran_on]
    again = _adapters.on_compiled_targets_thread(threading.current_thread)
    assert again is not ran_on  # a later target starts the thread anew
    _adapters.release_compiled_targets()
