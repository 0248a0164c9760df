"""Side isolation: the eager and the graphed side do not depend on the order they run in. On
each of up to 4 keys, the graphed side right after eager ran on other inputs, and the eager side
right after graphed ran on other inputs, each equal the eager answer.

The hazard is state the two sides share (a module both run on, its KV cache): an eager call
just before a graphed one pre-writes what the graphed one reads, so parity, which calls them in
that order on the same inputs, passes a graphed path that fails to write it.

Each side may keep state of its own (``State``): then both halves start from one state (the
graphed side's copied into the eager side's, or ``state.reset``), and the eager answer the
second half is held to is taken from that state before the graphed call on other inputs, the
eager side's state put back after it (``state.sides``), so that only what the sides share can
tell the order."""

from __future__ import annotations

import functools

from pytest_cudagraph.conformance.catalog import given
from pytest_cudagraph.conformance.judging import (
    Lockstep,
    case_in_key,
    differences,
    draw,
    eager_call,
    graphed_call,
)
from pytest_cudagraph.conformance.protocol import CudaGraphTarget, State
from pytest_cudagraph.conformance.suite import FigureRecorder
from pytest_cudagraph.engines.state import load_state, module_state
from pytest_cudagraph.skips import needs_cuda

KEYS = 4


@needs_cuda
def test_side_isolation(target: CudaGraphTarget, record_figure: FigureRecorder) -> None:
    lockstep = Lockstep(target, given(target, State, "sides"), given(target, State, "reset"))
    key_count = min(KEYS, target.num_keys)
    problems = []
    for key_index in range(key_count):
        case, other = (case_in_key(target, key_index, repeat) for repeat in (0, 1))
        inputs = functools.partial(draw, target, case, case)
        elsewhere = functools.partial(draw, target, other, other)
        key = target.key_of(inputs())
        lockstep.sync()
        expected = eager_call(target, inputs(), case)
        eager_call(target, elsewhere(), other)
        problems += [
            f"key {key!r}, graphed right after eager on other inputs: {d}"
            for d in differences(target, inputs(), expected, graphed_call(target, inputs(), case))
        ]
        lockstep.sync()
        saved = module_state(lockstep.sides[0]) if lockstep.sides is not None else None
        expected = eager_call(target, inputs(), case)
        if saved is not None and lockstep.sides is not None:
            load_state(lockstep.sides[0], saved)  # eager as it was, for the same call again
        graphed_call(target, elsewhere(), other)
        problems += [
            f"key {key!r}, eager right after graphed on other inputs: {d}"
            for d in differences(target, inputs(), expected, eager_call(target, inputs(), case))
        ]
    lockstep.sync()  # the calls above were uneven by design
    record_figure(
        f"{key_count} keys, each side right after the other on other inputs"
        + (f"; {lockstep.describe()}" if lockstep.stateful else "")
    )
    assert not problems, "one side's answer depends on the other side's calls:\n" + "\n".join(
        problems
    )
