"""What a graph reads, as the recorder at torch's dispatcher saw its capture: no rebound tensors
judges it (on graphs emulated on the CPU here), wherever the Python object holding a rebound
tensor lives, and a replay on freed memory elsewhere fails the check that made it."""

from __future__ import annotations

import argparse
import re
import types
from collections.abc import Callable
from typing import ClassVar

import pytest
import torch
from cpu_checks import CPU, cpu_target, rows, run
from torch import Tensor

from pytest_cudagraph.conformance import Cache
from pytest_cudagraph.conformance.checks import test_22_rebound_tensors
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.engines.emulation import CUDAGraph, emulated_graphs

Failed = pytest.fail.Exception


class GraphPerKey:
    """A graph per row count around ``x * scale()`` with a static input; ``rebind`` replaces
    the scale tensor after each call (instead of copying into it), wherever ``holder`` keeps it."""

    def __init__(self, get: Callable[[], Tensor], rebind: Callable[[], None] | None) -> None:
        self.get, self.rebind = get, rebind
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, Tensor, Tensor]] = {}

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        key = rows(inputs)
        if key not in self.graphs:
            static = inputs["x"].clone()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = static * self.get()
            self.graphs[key] = graph, static, out
        graph, static, out = self.graphs[key]
        static.copy_(inputs["x"])
        graph.replay()
        answer = out.clone()
        if self.rebind is not None:
            self.rebind()
        return answer


class ClassHeld:
    scale: ClassVar[Tensor] = torch.full((4,), 2.0)


def holders() -> dict[str, tuple[Callable[[], Tensor], Callable[[], None]]]:
    """Where the rebound scale lives: a SimpleNamespace, an argparse.Namespace, a class."""
    simple = types.SimpleNamespace(scale=torch.full((4,), 2.0))
    parsed = argparse.Namespace(scale=torch.full((4,), 2.0))

    def rebind_simple() -> None:
        simple.scale = torch.full((4,), 2.0)

    def rebind_parsed() -> None:
        parsed.scale = torch.full((4,), 2.0)

    def rebind_class() -> None:
        ClassHeld.scale = torch.full((4,), 2.0)

    return {
        "a SimpleNamespace": (lambda: simple.scale, rebind_simple),
        "an argparse.Namespace": (lambda: parsed.scale, rebind_parsed),
        "a class attribute": (lambda: ClassHeld.scale, rebind_class),
    }


def judged(graphed: GraphPerKey, **changes: object) -> list[str]:
    target = cpu_target(graphed=graphed, **changes)
    with emulated_graphs():
        return run(
            test_22_rebound_tensors.test_no_rebound_tensors,
            target,
            capture_counter=CaptureCounter(CUDAGraph, record=True),
        )


@pytest.mark.parametrize("where", list(holders()))
def test_a_tensor_rebound_after_capture_fails_wherever_its_holder_lives(where: str) -> None:
    get, rebind = holders()[where]
    with pytest.raises(Failed) as failure:
        judged(GraphPerKey(get, rebind))
    message = str(failure.value)
    assert message.startswith("tensors a graph may read were replaced:\n")
    assert re.search(
        r"call 0 \(case 0, key 2\): the graph of key 2 \(captured in call 0\) reads a "
        r"torch.float32 tensor of shape \(4\) at 0x[0-9a-f]+, first used at "
        rf"{re.escape(__file__)}:\d+, freed since its capture \(rebound",
        message,
    )


def test_a_graph_whose_inputs_stay_passes_judging_what_it_read() -> None:
    get, _ = holders()["a SimpleNamespace"]
    [figure] = judged(GraphPerKey(get, None))
    assert figure.startswith(
        "9 calls over 3 keys: 6 storages the graphs read (recorded at capture), 0 freed"
    )


def test_the_walk_judges_where_no_capture_was_recorded() -> None:
    """A counter that records nothing (kernels no dispatcher sees) leaves the object walk."""
    get, _ = holders()["a SimpleNamespace"]
    target = cpu_target(graphed=GraphPerKey(get, None))
    with emulated_graphs():
        [figure] = run(
            test_22_rebound_tensors.test_no_rebound_tensors,
            target,
            capture_counter=CaptureCounter(CUDAGraph),
        )
    assert "no read recorded at capture, so the graphed side walked:" in figure


def test_a_static_that_names_nothing_is_not_a_pass_where_nothing_was_recorded() -> None:
    get, _ = holders()["a SimpleNamespace"]
    target = cpu_target(graphed=GraphPerKey(get, None), cache=Cache(static=dict))
    with emulated_graphs(), pytest.raises(Failed, match=r"^not exercised: this check judged 0"):
        run(
            test_22_rebound_tensors.test_no_rebound_tensors,
            target,
            capture_counter=CaptureCounter(CUDAGraph),
        )


def test_the_emulated_replay_refuses_freed_inputs_naming_them() -> None:
    get, rebind = holders()["a class attribute"]
    graphed = GraphPerKey(get, rebind)
    with emulated_graphs():
        inputs = {"x": torch.ones(2, 4, device=CPU)}
        graphed(inputs)
        with pytest.raises(RuntimeError, match=r"^CUDA graph replay detected 1 dead tensor\(s\)"):
            graphed(inputs)


class PetalsLike:
    """``make_graphed_callables`` handed the capturing call's own tensors as its sample
    arguments (petals does): they are the graph's static inputs, which later calls overwrite."""

    def __init__(self) -> None:
        self.layer = torch.nn.Linear(4, 4).requires_grad_(False)
        self.graphs: dict[int, Callable[..., Tensor]] = {}

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        key = rows(inputs)
        if key not in self.graphs:
            step = self.layer.__call__  # a function: given the module, torch replaces its forward
            self.graphs[key] = torch.cuda.make_graphed_callables(step, (inputs["x"],))
        return self.graphs[key](inputs["x"]).clone()


def test_inputs_unchanged_names_the_callers_tensors_a_graph_kept_as_static_inputs() -> None:
    from pytest_cudagraph.conformance.checks import test_16_inputs_unchanged

    with emulated_graphs():
        graphed = PetalsLike()
        target = cpu_target(eager=lambda inputs: graphed.layer(inputs["x"]), graphed=graphed)
        with pytest.raises(Failed) as failure:
            run(
                test_16_inputs_unchanged.test_inputs_unchanged,
                target,
                capture_counter=CaptureCounter(CUDAGraph, record=True),
            )
    message = str(failure.value)
    assert "input 'x' of call 0 (case 0, key 2)" in message
    assert message.splitlines()[-1].startswith(
        "what a graph kept as its static inputs (its capture reads them where the caller put "
        "them, and each later call of its key copies its inputs into them): input 'x' of call 0 "
        "(case 0, key 2)"
    )
