"""Parity: graphed output equals eager (bit for bit, or within the target's tolerance) over
64 varied cases on up to 8 keys, over each output's real part.
Cases come grouped by key, so each key is captured once and then replayed with new inputs. A
target with a tolerance per output part is compared once per tolerance, on the parts it
covers."""

from __future__ import annotations

from collections.abc import Callable, Hashable

import pytest
import torch

from pytest_cudagraph.conformance.progress import CheckProgress
from pytest_cudagraph.conformance.suite import FigureRecorder
from pytest_cudagraph.conformance.support import (
    case_in_key,
    draw,
    eager_call,
    graphed_path,
    kept,
    parts_of,
    real,
)
from pytest_cudagraph.conformance.target import (
    EXACT,
    CudaGraphTarget,
    Inputs,
    Part,
    Tolerance,
)
from pytest_cudagraph.engines.parity import ParityChecker
from pytest_cudagraph.skips import needs_cuda

CASES = 64
MAX_KEYS = 8


@needs_cuda
@pytest.mark.cuda_graph_parity
def test_parity(
    target: CudaGraphTarget,
    graph_parity: ParityChecker,
    record_figure: FigureRecorder,
    progress: CheckProgress,
) -> None:
    key_count = min(MAX_KEYS, target.num_keys)
    per_key = -(-CASES // key_count)
    cases = [case_in_key(target, k, j) for k in range(key_count) for j in range(per_key)]
    keys: set[Hashable] = set()

    def make_inputs(generator: torch.Generator, case: int) -> tuple[Inputs]:
        inputs = target.make_inputs(generator, case)
        keys.add(target.key_of(inputs))
        progress(f"key {target.key_of(inputs)!r} ({len(keys)} of {key_count} keys)")
        return (inputs,)  # one positional argument: the inputs dict

    record_figure(f"{len(cases)} cases over {key_count} keys, {target.describe_tolerance()}")
    checked = 0
    for tolerance, parts in tolerance_groups(target):
        result = graph_parity.check(
            compared(target, target.eager, parts),
            compared(target, lambda inputs: kept(target, graphed_path(target)(inputs)), parts),
            make_inputs,
            cases,
            atol=tolerance.atol,
            rtol=tolerance.rtol,
        )
        checked = result.checked
    record_figure(f"{checked} cases over {len(keys)} keys, {target.describe_tolerance()}")


def tolerance_groups(target: CudaGraphTarget) -> list[tuple[Tolerance, list[Part] | None]]:
    """(tolerance, the output parts it covers) for each tolerance in force; None: the whole
    output. The parts not named are found in one eager output (of case 0)."""
    if isinstance(target.tolerance, Tolerance):
        return [(target.tolerance, None)]
    groups: dict[Tolerance, list[Part]] = {}
    for part, tolerance in target.tolerance.items():
        groups.setdefault(tolerance, []).append(part)
    parts = parts_of(eager_call(target, draw(target, 0, seed=0), seed=0)) or {}
    others = [part for part in parts if part not in target.tolerance]
    if others:
        groups.setdefault(EXACT, []).extend(others)
    return list(groups.items())


def compared(
    target: CudaGraphTarget, side: Callable[[Inputs], object], parts: list[Part] | None
) -> Callable[[Inputs], object]:
    """``side`` as parity compares it: its real part, only ``parts`` of it (None: all)."""

    def call(inputs: Inputs) -> object:
        output = real(target, inputs, side(inputs))
        if parts is None:
            return output
        whole = parts_of(output) or {}
        return {part: whole[part] for part in parts if part in whole}

    return call
