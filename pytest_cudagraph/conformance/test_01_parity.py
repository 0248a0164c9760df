"""Parity: graphed output equals eager (bit for bit, or within the target's tolerance, per part
where it gives one) over 64 varied cases on up to 8 keys, over each output's real part. Cases
come grouped by key, so each key is captured once and then replayed with new inputs. A target
that keeps state is called in lockstep (one call sequence on both sides, from one state), and
its two sides' states are compared after each case too."""

from __future__ import annotations

from collections.abc import Callable, Hashable

import pytest
import torch

from pytest_cudagraph.conformance.catalog import given
from pytest_cudagraph.conformance.diagnosis import fail_naming_the_module
from pytest_cudagraph.conformance.judging import Lockstep, case_in_key, real
from pytest_cudagraph.conformance.progress import CheckProgress
from pytest_cudagraph.conformance.protocol import CudaGraphTarget, Inputs, State
from pytest_cudagraph.conformance.suite import FigureRecorder
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.engines.parity import ParityChecker
from pytest_cudagraph.skips import needs_cuda

CASES = 64
MAX_KEYS = 8


@needs_cuda
@pytest.mark.cuda_graph_parity
def test_parity(
    target: CudaGraphTarget,
    graph_parity: ParityChecker,
    capture_counter: CaptureCounter,
    record_figure: FigureRecorder,
    progress: CheckProgress,
) -> None:
    key_count = min(MAX_KEYS, target.num_keys)
    per_key = -(-CASES // key_count)
    cases = [case_in_key(target, k, j) for k in range(key_count) for j in range(per_key)]
    keys: set[Hashable] = set()
    lockstep = Lockstep(
        target, given(target, State, "sides"), given(target, State, "reset"), capture_counter
    )

    def make_inputs(generator: torch.Generator, case: int) -> tuple[Inputs]:
        inputs = target.make_inputs(generator, case)
        keys.add(target.key_of(inputs))
        progress(f"key {target.key_of(inputs)!r} ({len(keys)} of {key_count} keys)")
        return (inputs,)  # one positional argument: the inputs dict

    def graphed(inputs: Inputs) -> object:
        where = f"key {target.key_of(inputs)!r}"
        return lockstep.graphed(inputs, None, where)  # seeded by the parity engine

    state = lockstep.describe()
    record_figure(
        f"{len(cases)} cases over {key_count} keys, {target.describe_tolerance()}"
        + (f"; {state}" if state else "")
    )
    with capture_counter:
        try:
            result = graph_parity.check(
                compared(target, lambda inputs: lockstep.eager(inputs, None)),
                compared(target, graphed),
                make_inputs,
                cases,
                tolerance=target.tolerance,
            )
        except pytest.fail.Exception as failure:  # the outputs differ: one case of each key
            found = AssertionError("\n".join([str(failure), *lockstep.problems()]))
            fail_naming_the_module(target, cases[::per_key], found)
    record_figure(
        f"{result.checked} cases over {len(keys)} keys, {target.describe_tolerance()}"
        + (f"; {state}" if state else "")
    )
    assert not lockstep.problems(), "\n".join(lockstep.problems())


def compared(
    target: CudaGraphTarget, side: Callable[[Inputs], object]
) -> Callable[[Inputs], object]:
    """``side`` as parity compares it: its real part."""
    return lambda inputs: real(target, inputs, side(inputs))
