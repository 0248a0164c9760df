"""Parity: graphed output equals eager (bit for bit, or within the target's tolerance) over
64 varied cases on at least 4 keys.
Cases come grouped by key, so each key is captured once and then replayed with new inputs."""

from __future__ import annotations

from collections.abc import Callable, Hashable

import pytest
import torch

from pytest_cudagraph.conformance.progress import check_progress
from pytest_cudagraph.conformance.support import case_in_key
from pytest_cudagraph.conformance.target import CudaGraphTarget, Inputs
from pytest_cudagraph.engines.parity import ParityChecker
from pytest_cudagraph.skips import needs_cuda

CASES = 64
MAX_KEYS = 8


@needs_cuda
@pytest.mark.cuda_graph_parity
def test_parity(
    target: CudaGraphTarget,
    graph_parity: ParityChecker,
    record_figure: Callable[[str], None],
    request: pytest.FixtureRequest,
) -> None:
    progress = check_progress(request)
    key_count = min(MAX_KEYS, target.num_keys)
    per_key = -(-CASES // key_count)
    cases = [case_in_key(target, k, j) for k in range(key_count) for j in range(per_key)]
    keys: set[Hashable] = set()

    def make_inputs(generator: torch.Generator, case: int) -> tuple[Inputs]:
        inputs = target.make_inputs(generator, case)
        keys.add(target.key_of(inputs))
        progress(f"key {target.key_of(inputs)!r} ({len(keys)} of {key_count} keys)")
        return (inputs,)  # one positional argument: the inputs dict

    tolerance = target.tolerance
    record_figure(f"{len(cases)} cases over {key_count} keys, {tolerance.describe()}")
    result = graph_parity.check(
        target.eager, target.graphed, make_inputs, cases, atol=tolerance.atol, rtol=tolerance.rtol
    )
    assert len(keys) >= 4, f"the cases landed in {len(keys)} keys; parity needs at least 4"
    record_figure(f"{result.checked} cases over {len(keys)} keys, {tolerance.describe()}")
