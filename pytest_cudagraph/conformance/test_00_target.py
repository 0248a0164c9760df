"""The target keeps its side of the protocol, and its code runs: both checks run on the CPU too.

- target contract: cases land in the keys the target says, two draws of one case are
  interchangeable input by input, and every input tensor varies between draws.
- dry run: each key's eager side once (and the graphed side where it runs without CUDA), so
  that a plumbing error (a KeyError, a wrong shape, an output the declared contract does not
  fit) fails on a laptop, not after the GPU checks skipped it."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from pytest_cudagraph.conformance.judging import (
    differences,
    draw,
    eager_call,
    graphed_call,
    input_tensor_names,
    parts_of,
    real,
    synchronize,
)
from pytest_cudagraph.conformance.protocol import CudaGraphTarget, Inputs
from pytest_cudagraph.conformance.suite import FigureRecorder
from pytest_cudagraph.engines.parity import compare_outputs

DRAWS = 4  # draws of one case; each input tensor must take at least two values among them
VARIED_CASES = 4
MAX_KEYS = 64  # keys whose cases are checked (or called, in the dry run)


def test_target_contract(target: CudaGraphTarget, record_figure: FigureRecorder) -> None:
    checked = min(target.num_keys, MAX_KEYS)
    keys = [target.key_of(draw(target, case, seed=case)) for case in range(checked)]
    assert len(set(keys)) == checked, (
        f"cases 0..{checked - 1} land in {len(set(keys))} distinct keys; "
        f"num_keys={target.num_keys} says each lands in its own"
    )
    names: list[str] = []
    varying = 0
    for case in range(min(VARIED_CASES, target.num_keys)):
        draws = [draw(target, case, seed) for seed in range(DRAWS)]
        repeat = draw(target, case + target.num_keys, seed=0)
        assert {target.key_of(inputs) for inputs in [*draws, repeat]} == {keys[case]}, (
            f"draws of case {case} and case {case + target.num_keys} must all land in key {keys[case]!r}"
        )
        names = input_tensor_names(draws[0])
        assert names, f"make_inputs(case={case}) returned no tensors"
        for name in names:
            first = draws[0][name]
            assert first.device == target.device, (
                f"input {name!r} is on {first.device}, the target on {target.device}"
            )
            shapes = {(tuple(d[name].shape), d[name].dtype) for d in draws}
            assert len(shapes) == 1, (
                f"input {name!r} of case {case} changes shape or dtype between draws {shapes}: "
                "two draws of one case must be interchangeable input by input (shapes come "
                "from the case, values from the generator)"
            )
            assert any(not torch.equal(first, d[name]) for d in draws[1:]), (
                f"input {name!r} of case {case} is the same in {DRAWS} draws; make_inputs must "
                "vary every input tensor"
            )
        varying += shapes_of(repeat) != shapes_of(draws[0])
    of_keys = f"{checked} of {target.num_keys}" if checked < target.num_keys else f"{checked}"
    record_figure(
        f"{of_keys} key{'s' if target.num_keys > 1 else ''}; inputs {', '.join(names)} vary over {DRAWS} draws of "
        f"{min(VARIED_CASES, target.num_keys)} cases; shapes vary inside {varying} of them"
    )


def shapes_of(inputs: Inputs) -> dict[str, tuple[int, ...]]:
    return {name: tuple(inputs[name].shape) for name in input_tensor_names(inputs)}


def test_dry_run(target: CudaGraphTarget, record_figure: FigureRecorder) -> None:
    called = min(target.num_keys, MAX_KEYS)
    graphed_too = target.graphed is not None and target.device.type != "cuda"
    problems: list[str] = []
    for case in range(called):
        try:
            problems += [f"case {case}: {p}" for p in dry_call(target, case, graphed_too)]
        except Exception as error:
            problems.append(f"case {case}: {type(error).__name__}: {error}")
    synchronize(target.device)
    sides = "eager and graphed" if graphed_too else "eager"
    where = " (graphed runs without CUDA)" if graphed_too else ""
    record_figure(f"{sides} once on each of {called} key{'s' if called > 1 else ''}{where}")
    assert not problems, f"{len(problems)} of {called} dry calls failed:\n" + "\n".join(
        problems[:10]
    )


def dry_call(target: CudaGraphTarget, case: int, graphed_too: bool) -> list[str]:
    """One case through eager (twice under one seed on case 0: the seed must decide its
    answer) and, when asked, graphed; what does not fit the declared contract."""
    inputs = draw(target, case, seed=case)
    where = f"eager on key {target.key_of(inputs)!r}"
    expected = eager_call(target, inputs, seed=case)
    problems = [f"{where}: {p}" for p in fits_contract(target, inputs, expected)]
    if problems:  # nothing to compare by until the contract fits
        return problems
    if case == 0:
        again = eager_call(target, draw(target, case, seed=case), seed=case)
        problems += [
            f"{where} is not reproducible under one seed (is something drawn from a generator "
            f"the suite does not seed?): {m.describe()}"
            for m in compare_outputs(expected, again)
        ]
    if graphed_too:
        actual = graphed_call(target, draw(target, case, seed=case), seed=case)
        problems += [f"graphed: {d}" for d in differences(target, inputs, expected, actual)]
    return problems


def fits_contract(target: CudaGraphTarget, inputs: Inputs, output: object) -> list[str]:
    """The parts that ``tolerance`` and ``real_part`` name are parts of the output, and the
    real part can be taken."""
    parts = parts_of(output)
    named = {"tolerance": target.tolerance}
    if target.real_part is not None:
        named["real_part"] = target.real_part(inputs)
    problems = []
    for field, value in named.items():
        if not isinstance(value, Mapping):
            continue
        if parts is None:
            problems.append(f"{field} names parts {list(value)} of an output without parts")
            continue
        problems += [
            f"{field} names part {p!r}, not in the output" for p in value if p not in parts
        ]
    if target.real_part is not None and not problems:
        try:
            real(target, inputs, output)
        except (IndexError, TypeError) as error:
            problems.append(f"real_part does not index the output: {error}")
    return problems
