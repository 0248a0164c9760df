"""Side isolation: the eager and the graphed side do not depend on the order they run in. On
each of up to 4 keys, the graphed side right after eager ran on other inputs, and the eager side
right after graphed ran on other inputs, each equal the eager answer.

The hazard is state the two sides share (a module both run on, its KV cache): an eager call
just before a graphed one pre-writes what the graphed one reads, so parity, which calls them in
that order on the same inputs, passes a graphed path that fails to write it."""

from __future__ import annotations

import functools

from pytest_cudagraph.conformance.judging import (
    case_in_key,
    differences,
    draw,
    eager_call,
    graphed_call,
)
from pytest_cudagraph.conformance.protocol import CudaGraphTarget
from pytest_cudagraph.conformance.suite import FigureRecorder
from pytest_cudagraph.skips import needs_cuda

KEYS = 4


@needs_cuda
def test_side_isolation(target: CudaGraphTarget, record_figure: FigureRecorder) -> None:
    key_count = min(KEYS, target.num_keys)
    problems = []
    for key_index in range(key_count):
        case, other = (case_in_key(target, key_index, repeat) for repeat in (0, 1))
        inputs = functools.partial(draw, target, case, case)
        elsewhere = functools.partial(draw, target, other, other)
        key = target.key_of(inputs())
        expected = eager_call(target, inputs(), case)
        eager_call(target, elsewhere(), other)
        problems += [
            f"key {key!r}, graphed right after eager on other inputs: {d}"
            for d in differences(target, inputs(), expected, graphed_call(target, inputs(), case))
        ]
        graphed_call(target, elsewhere(), other)
        problems += [
            f"key {key!r}, eager right after graphed on other inputs: {d}"
            for d in differences(target, inputs(), expected, eager_call(target, inputs(), case))
        ]
    record_figure(f"{key_count} keys, each side right after the other on other inputs")
    assert not problems, "one side's answer depends on the other side's calls:\n" + "\n".join(
        problems
    )
