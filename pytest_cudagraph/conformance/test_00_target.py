"""The target keeps its side of the protocol: cases land in the keys it says, and every input
tensor varies between draws of one case. Runs on the CPU too."""

from __future__ import annotations

from collections.abc import Callable

import torch

from pytest_cudagraph.conformance.support import draw, input_tensor_names
from pytest_cudagraph.conformance.target import CudaGraphTarget

DRAWS = 4  # draws of one case; each input tensor must take at least two values among them
VARIED_CASES = 4


def test_target_contract(target: CudaGraphTarget, record_figure: Callable[[str], None]) -> None:
    keys = [target.key_of(draw(target, case, seed=case)) for case in range(target.num_keys)]
    assert len(set(keys)) == target.num_keys, (
        f"cases 0..{target.num_keys - 1} land in {len(set(keys))} distinct keys; "
        f"num_keys={target.num_keys} says each lands in its own"
    )
    names: list[str] = []
    for case in range(VARIED_CASES):
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
                "draws of one case must be interchangeable input by input"
            )
            assert any(not torch.equal(first, d[name]) for d in draws[1:]), (
                f"input {name!r} of case {case} is the same in {DRAWS} draws; make_inputs must "
                "vary every input tensor"
            )
    record_figure(
        f"{target.num_keys} keys; inputs {', '.join(names)} vary over {DRAWS} draws of "
        f"{VARIED_CASES} cases"
    )
