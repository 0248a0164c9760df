"""Parity: graphed output equals eager (bit for bit, or within the target's tolerance, per part
where it gives one) over 64 varied cases on up to 8 keys, over each output's real part. Cases
come grouped by key, so each key is captured once and then replayed with new inputs. A target
that keeps state is called in lockstep (one call sequence on both sides, from one state), and
its two sides' states are compared after each case too."""

from __future__ import annotations

from collections.abc import Callable, Hashable

import pytest
import torch

from pytest_cudagraph.conformance._catalog import check
from pytest_cudagraph.conformance._diagnosis import fail_naming_the_module
from pytest_cudagraph.conformance._judging import (
    Lockstep,
    case_of,
    describe_tolerance,
    real,
    seeded_as_torch,
)
from pytest_cudagraph.conformance._progress import CheckProgress
from pytest_cudagraph.conformance._protocol import Case, CudaGraphTarget, Inputs
from pytest_cudagraph.conformance._suite import Conclude
from pytest_cudagraph.conformance._verdict import Judgement
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.engines.parity import ParityChecker

CASES = 64
MAX_KEYS = 8


@check("parity", sharper_with=("state.sides", "state.reset"))
@pytest.mark.cuda_graph_parity
def test_parity(
    target: CudaGraphTarget,
    graph_parity: ParityChecker,
    capture_counter: CaptureCounter,
    conclude: Conclude,
    progress: CheckProgress,
) -> None:
    keys = list(target.keys[:MAX_KEYS])
    per_key = -(-CASES // len(keys))
    cases = [case_of(target, key, repeat) for key in keys for repeat in range(per_key)]
    seen: set[Hashable] = set()
    lockstep = Lockstep(target, capture_counter)

    def make_inputs(generator: torch.Generator, case: Case) -> tuple[Inputs]:
        inputs = target.draw(generator, case)
        seen.add(case.key)
        progress(f"key {case.key!r} ({len(seen)} of {len(keys)} keys)")
        return (inputs,)  # one positional argument: the inputs dict

    def eager(inputs: Inputs) -> object:
        seeded_as_torch(target)  # the parity engine seeded torch's generators for this case
        return lockstep.eager(inputs, None)

    def graphed(inputs: Inputs) -> object:
        seeded_as_torch(target)
        return lockstep.graphed(inputs, None, f"key {target.key_of(inputs)!r}")

    with capture_counter:
        try:
            result = graph_parity.check(
                compared(target, eager),
                compared(target, graphed),
                make_inputs,
                cases,
                tolerance=target.tolerance,
            )
        except pytest.fail.Exception as failure:  # the outputs differ: one case of each key
            found = AssertionError("\n".join([str(failure), *lockstep.problems()]))
            fail_naming_the_module(target, cases[::per_key], found)
    state = lockstep.describe()
    figure = f"{result.checked} cases over {len(seen)} keys, {describe_tolerance(target)}"
    judgement = Judgement(lockstep.problems(), figure, result.checked, "cases compared")
    conclude(judgement, "the two sides' states parted:", state)


def compared(
    target: CudaGraphTarget, side: Callable[[Inputs], object]
) -> Callable[[Inputs], object]:
    """``side`` as parity compares it: its real part."""
    return lambda inputs: real(target, inputs, side(inputs))
