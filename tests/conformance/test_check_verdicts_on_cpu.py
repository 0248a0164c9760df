"""Each check's verdict, on the CPU: the check called as a function on a twin broken its way (with
stand-in graphs where it counts captures) fails, and on a correct target passes, so that a
check whose verdict assertion were turned off fails a test here, not only a GPU run: no baked
inputs (nested tensors and numbers given as inputs too), the target contract (a key_of that
gives another key, a constant nested input), identical sampling, device binding, worker
processes and refusal, guards, graphs not skipped, output storage, captures, inputs unchanged
held to eager's effect, and graphs used naming a ``runs_eagerly`` that does not answer True or
False."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import time
import types
from collections.abc import Callable

import pytest
import torch
from cpu_checks import KEYS, StandInConclude, cpu_target, double, reported, run
from graph_stand_ins import StandInGraphs, captured
from torch import Tensor

from pytest_cudagraph.conformance import (
    Cache,
    Case,
    CudaGraphTarget,
    Fallbacks,
    Guards,
    Sampling,
    Workers,
)
from pytest_cudagraph.conformance.checks import (
    test_00_target,
    test_02_no_baked_inputs,
    test_04_identical_sampling,
    test_06_device_binding,
    test_07_guards,
    test_11_processes,
    test_12_graphs_not_skipped,
    test_13_output_storage,
    test_14_captures,
    test_16_inputs_unchanged,
    test_19_graphs_used,
)
from pytest_cudagraph.engines import trees
from pytest_cudagraph.engines.units import MiB

Failed = pytest.fail.Exception  # how a check fails: its headline and problems, no traceback


def rows(inputs: dict[str, object]) -> int:
    x = inputs["x"]
    assert isinstance(x, Tensor)
    return x.shape[0]


# No baked inputs, nested inputs included


def nested_draw(generator: torch.Generator, case: Case) -> dict[str, object]:
    return {
        "x": torch.randn(case.key, 4, generator=generator),
        "extra": [torch.randn(4, generator=generator)],
    }


def shifted(inputs: dict[str, object]) -> Tensor:
    extra = inputs["extra"]
    assert isinstance(extra, list)
    return double(inputs) + extra[0]  # type: ignore[arg-type]


class Baking:
    """Stand-in graphs that keep the value of the input at ``path`` their capture saw."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.graphs = StandInGraphs(shifted, rows)
        self.baked: dict[int, Tensor] = {}

    def __call__(self, inputs: dict[str, object]) -> Tensor:
        key = rows(inputs)
        baked = self.baked.setdefault(key, dict(trees.tensors(inputs))[self.path].clone())
        return self.graphs(trees.with_tensor(inputs, self.path, baked))  # type: ignore[return-value]


def nested_target(graphed: Callable[[dict[str, object]], object]) -> CudaGraphTarget:
    return cpu_target(eager=shifted, graphed=graphed, draw=nested_draw)


@pytest.mark.parametrize("path", ["x", "extra[0]"])
def test_no_baked_inputs_fails_a_graph_that_keeps_one_inputs_first_value(path: str) -> None:
    check = test_02_no_baked_inputs.test_no_baked_inputs
    assert run(check, nested_target(StandInGraphs(shifted, rows))) == [
        "key 3: changed x, extra[0] one at a time; 1 capture(s) of its keys in this check"
    ]
    with pytest.raises(Failed) as failure:
        run(check, nested_target(Baking(path)))
    lines = reported(failure)
    assert lines[0] == "graphed answers after changing one input:"
    assert lines[1].startswith(f"{path} changed: output at index (0, 0): eager ")


def draw_numbers(generator: torch.Generator, case: Case) -> dict[str, object]:
    """A batch, with a temperature and a step count given as Python numbers."""
    return {
        "x": torch.randn(case.key, 4, generator=generator),
        "temperature": 0.5 + float(torch.rand((), generator=generator)),
        "steps": int(torch.randint(1, 9, (), generator=generator)),
    }


def scaled(inputs: dict[str, object]) -> Tensor:
    return inputs["x"] / inputs["temperature"] + inputs["steps"]  # type: ignore[operator, no-any-return]


class BakingNumbers:
    """A graph per key whose kernels took the Python numbers of the call that captured it as
    arguments: replays answer for the first temperature and step count."""

    def __init__(self) -> None:
        self.graphs: dict[int, tuple[object, float, int]] = {}

    def __call__(self, inputs: dict[str, object]) -> Tensor:
        key = rows(inputs)
        if key not in self.graphs:
            self.graphs[key] = (captured(), inputs["temperature"], inputs["steps"])  # type: ignore[assignment]
        graph, temperature, steps = self.graphs[key]
        graph.replay()  # type: ignore[attr-defined]
        return scaled({**inputs, "temperature": temperature, "steps": steps})


def test_no_baked_inputs_fails_a_graph_that_baked_in_a_number_given_as_an_input() -> None:
    check = test_02_no_baked_inputs.test_no_baked_inputs
    right = cpu_target(eager=scaled, graphed=StandInGraphs(scaled, rows), draw=draw_numbers)
    assert run(check, right) == [
        "key 3: changed x, temperature, steps one at a time; 1 capture(s) of its keys in this check"
    ]
    with pytest.raises(Failed) as failure:
        run(check, cpu_target(eager=scaled, graphed=BakingNumbers(), draw=draw_numbers))
    lines = reported(failure)
    assert [line.split(":")[0] for line in lines] == [
        "graphed answers after changing one input",
        "temperature changed",
        "steps changed",
    ]


# The target contract: each case's key, every input tensor drawn


def test_the_contract_fails_a_key_of_that_gives_another_key_than_the_cases() -> None:
    """Keys told apart, each the next one up: every call would be labelled with a key the
    suite did not draw it for."""
    check = test_00_target.test_target_contract
    run(check, cpu_target())
    with pytest.raises(Failed) as failure:
        run(check, cpu_target(key_of=lambda inputs: rows(inputs) + 1))
    assert reported(failure) == [
        "the target breaks the protocol:",
        *(
            f"key_of gives {key + 1} for a draw of the key {key} (case {case}: key {key}, repeat "
            "0): key_of must give each draw the key it was drawn for (the checks label every "
            "call with key_of and judge it against the target's keys)"
            for case, key in enumerate(KEYS)
        ),
    ]


def test_the_contract_fails_a_constant_input_nested_in_a_container() -> None:
    def masked(generator: torch.Generator, case: Case) -> dict[str, object]:
        return {**nested_draw(generator, case), "extra": [torch.ones(case.key)]}

    with pytest.raises(Failed) as failure:
        run(test_00_target.test_target_contract, cpu_target(draw=masked))
    assert reported(failure)[1] == (
        "draw ignores its generator for input 'extra[0]': the same values in 4 draws of case 0: "
        "key 2, repeat 0 under seeds 0 to 3; every input tensor must vary with the generator"
    )
    (figure,) = run(test_00_target.test_target_contract, cpu_target(draw=nested_draw))
    assert "inputs x, extra[0] vary over 4 draws" in figure


# Inputs unchanged: what eager leaves in a copy, nested containers walked


def writes_x(inputs: dict[str, object]) -> Tensor:
    x = inputs["x"]
    assert isinstance(x, Tensor)
    return x.mul_(2)  # a step that writes its input in place, as eager does too


def writes_extra(inputs: dict[str, object]) -> Tensor:
    extra = inputs["extra"]
    assert isinstance(extra, list)
    extra[0].zero_()  # a graph writing a caller's tensor eager leaves alone
    return shifted(inputs)


def test_inputs_unchanged_holds_a_callers_tensors_to_what_eager_leaves_in_them() -> None:
    check = test_16_inputs_unchanged.test_inputs_unchanged
    in_place = cpu_target(eager=writes_x, graphed=StandInGraphs(writes_x, rows))
    assert run(check, in_place)[0].startswith("9 calls over 3 keys: 9 input tensors held to")
    with pytest.raises(Failed) as failure:
        run(check, cpu_target(graphed=StandInGraphs(writes_x, rows)))  # eager writes nothing
    assert reported(failure)[1].startswith("input 'x' of call 0 (case 0, key 2) at index (0, 0)")
    with pytest.raises(Failed) as nested:
        run(check, nested_target(StandInGraphs(writes_extra, rows)))
    assert reported(nested)[1].startswith("input 'extra[0]' of call 0 (case 0, key 2) at index")


# Identical sampling and device binding


def test_identical_sampling_fails_tokens_that_differ_with_graphs_on() -> None:
    check = test_04_identical_sampling.test_identical_sampling

    def sample(seed: int, graphs: bool) -> Tensor:
        return torch.arange(4) + seed + int(graphs and seed == 1)

    alike = cpu_target(sampling=Sampling(lambda seed, graphs: torch.arange(4) + seed))
    assert run(check, alike) == ["graphs off vs on, seeds 0, 1: 8 tokens per side"]
    with pytest.raises(Failed, match=r"sampled tokens differ:\n\s*seed\[1\] at index \(0,\)"):
        run(check, cpu_target(sampling=Sampling(sample)))


def found_in_fresh_process(problems: list[str], current_after: int = 0) -> dict[str, object]:
    """What the binding probe reports, its problems and the device left current given."""
    return {
        "calls": 8,
        "keys": 4,
        "problems": problems,
        "current_after": current_after,
        "torch_reserved_on_current": 0,
        "nvml_on_current": (None, None),
        "nvml_on_target": MiB,
    }


@pytest.mark.parametrize(
    ("found", "message"),
    [
        (found_in_fresh_process(["case 1 (replay): output at index (0,)"]), r"case 1 \(replay\)"),
        (found_in_fresh_process([], current_after=1), r"cuda:1 was left current instead of"),
    ],
)
def test_device_binding_fails_what_the_fresh_process_saw(
    monkeypatch: pytest.MonkeyPatch, found: dict[str, object], message: str
) -> None:
    check = test_06_device_binding.test_device_binding
    request = types.SimpleNamespace(config=None)
    monkeypatch.setattr(test_06_device_binding, "chosen_target_spec", lambda config: "t")
    figures: list[str] = []
    monkeypatch.setattr(
        test_06_device_binding, "run_in_fresh_process", lambda *a, **k: found_in_fresh_process([])
    )
    check(request, figures.append, StandInConclude(figures))  # type: ignore[arg-type]
    assert figures[-1].endswith("max |diff| 0, no context on cuda:0")
    monkeypatch.setattr(test_06_device_binding, "run_in_fresh_process", lambda *a, **k: found)
    with pytest.raises(Failed, match=message):
        check(request, figures.append, StandInConclude(figures))  # type: ignore[arg-type]


# Worker processes and refusal


def workers(run_workers: Callable[[int, bool], tuple[list[int], list[int]]]) -> CudaGraphTarget:
    return cpu_target(workers=Workers(run_workers))


def test_worker_processes_fails_results_that_differ_from_eager() -> None:
    check = test_11_processes.test_worker_processes
    assert run(check, workers(lambda per_gpu, graphs: ([1, 2], [1, 2]))) == [
        "2 workers on one GPU, graphs off: 2 jobs"
    ]
    with pytest.raises(Failed, match=r"worker results differ from eager:\n\s*output\[1\]"):
        run(check, workers(lambda per_gpu, graphs: ([1, 3], [1, 2])))


def refuse(per_gpu: int, graphs: bool) -> tuple[list[int], list[int]]:
    raise ValueError("graphs need one worker per GPU")


def starts_a_child_then_refuses(per_gpu: int, graphs: bool) -> tuple[list[int], list[int]]:
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return refuse(per_gpu, graphs)


def forks_a_worker_then_refuses(per_gpu: int, graphs: bool) -> tuple[list[int], list[int]]:
    worker = multiprocessing.get_context("fork").Process(target=time.sleep, args=(0,))
    worker.start()
    worker.join()
    return refuse(per_gpu, graphs)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("run_workers", "how"),
    [
        (starts_a_child_then_refuses, "subprocess.Popen"),
        (forks_a_worker_then_refuses, "multiprocessing.Process.start, os.fork"),
    ],
)
def test_worker_refusal_fails_a_process_started_and_joined_before_the_refusal(
    run_workers: Callable[[int, bool], tuple[list[int], list[int]]], how: str
) -> None:
    check = test_11_processes.test_worker_refusal
    assert run(check, workers(refuse)) == [
        "graphs with 2 workers per GPU refused: graphs need one worker per GPU"
    ]
    with pytest.raises(Failed, match=rf"process\(es\) started before the refusal: {how}"):
        run(check, workers(run_workers))


# Guards: an empty refusal says nothing, a mode that hangs is bounded


def test_guards_fail_an_empty_refusal_and_a_mode_that_does_not_return(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    check = test_07_guards.test_guards
    monkeypatch.setattr(test_07_guards, "MODE_SECONDS", 0.2)

    def empty() -> None:
        raise ValueError()

    modes = {"empty": (empty, "needs"), "sleeps": (lambda: time.sleep(5), "needs")}
    with pytest.raises(Failed) as failure:
        run(check, cpu_target(guards=Guards(modes)))
    assert reported(failure) == [
        "unsupported modes not refused:",
        "empty: ValueError() refused with an empty message",
        "sleeps: still running after 0.2 s (left running)",
    ]


# Graphs not skipped, output storage, captures


def test_graphs_not_skipped_fails_any_skip_the_target_reports() -> None:
    check = test_12_graphs_not_skipped.test_graphs_not_skipped
    assert run(check, cpu_target(fallbacks=Fallbacks(graph_skips=list))) == [
        "3 rounds over 3 keys: 0 graph(s) skipped since the target was made"
    ]
    skipped = Fallbacks(graph_skips=lambda: ["skipping cudagraphs due to mutated inputs"])
    with pytest.raises(Failed, match=r"ran without its graph:\n\s*skipping cudagraphs due"):
        run(check, cpu_target(fallbacks=skipped))


class StaticOutput:
    """Stand-in graphs, each key's output written into one static buffer handed out."""

    def __init__(self) -> None:
        self.graphs = StandInGraphs(double, rows)
        self.outputs: dict[int, Tensor] = {}

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        answer = self.graphs(inputs)
        assert isinstance(answer, Tensor)
        return self.outputs.setdefault(rows(inputs), torch.empty_like(answer)).copy_(answer)


def test_output_storage_fails_outputs_in_a_graphs_static_buffer() -> None:
    check = test_13_output_storage.test_output_storage
    assert run(check, cpu_target(graphed=StandInGraphs(double, rows))) == [
        "9 calls over 3 keys: 0 shared storage(s); 3 capture(s) of its keys in this check"
    ]
    with pytest.raises(Failed) as failure:
        run(check, cpu_target(graphed=StaticOutput()))
    assert reported(failure)[1].startswith(
        "call 3 (key 2): output shares storage with call 0 (key 2)'s output"
    )


class Recapturing:
    """Captures a key it holds again on every call."""

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        captured().replay()
        return double(inputs)


def test_captures_fails_a_key_captured_again_in_a_later_round() -> None:
    check = test_14_captures.test_captures
    held = Cache(capacity=len(KEYS))
    figure = run(check, cpu_target(graphed=StandInGraphs(double, rows), cache=held))[0]
    assert figure.startswith("4 rounds over 3 keys: 3 captures, 6.0 replays per capture;")
    with pytest.raises(Failed) as failure:
        run(check, cpu_target(graphed=Recapturing(), cache=held))
    assert reported(failure) == [
        "keys the cache held were captured again (3 keys, capacity 3):",
        "2 in 5 of 5 rounds",
        "3 in 4 of 5 rounds",
        "4 in 4 of 5 rounds",
    ]


@pytest.mark.parametrize("declared", [torch.Size([4]), "no", [0]], ids=repr)
def test_graphs_used_names_a_runs_eagerly_that_does_not_say_yes_or_no(declared: object) -> None:
    """A shape, "no" or [0] read as truthy would count every call as declared eager."""
    target = cpu_target(
        graphed=StandInGraphs(double, rows),
        fallbacks=Fallbacks(runs_eagerly=lambda inputs: declared),
    )
    with pytest.raises(TypeError, match=r"Fallbacks.runs_eagerly returned .*; it must return True"):
        run(test_19_graphs_used.test_graphs_used, target)
