"""Side isolation: the eager and the graphed side do not depend on the order they run in. On
each of up to 4 keys, the graphed side right after eager ran on other inputs, and the eager side
right after graphed ran on other inputs, each equal the eager answer.

The hazard is state the two sides share (a module both run on, its KV cache): an eager call
just before a graphed one pre-writes what the graphed one reads, so parity, which calls them in
that order on the same inputs, passes a graphed path that fails to write it.

Each side may keep state of its own (``State``): then both halves start from one state (the
eager side's written state copied into the graphed side, or ``state.reset``), and the eager
answer the second half is held to is taken from that state, the eager side then put back where
it started before the graphed call on other inputs (its own state copied back,
``state.sides``; or, where state accumulates and only ``state.reset`` is given, a reset before
that graphed call, which is what the eager call after it reads), so that only what the sides
share can tell the order."""

from __future__ import annotations

import functools
from collections.abc import Callable

from pytest_cudagraph.conformance._catalog import check
from pytest_cudagraph.conformance._judging import (
    Lockstep,
    called,
    case_of,
    differences,
    draw,
    eager_call,
    graphed_call,
)
from pytest_cudagraph.conformance._protocol import CudaGraphTarget
from pytest_cudagraph.conformance._suite import Conclude
from pytest_cudagraph.conformance._verdict import Judgement
from pytest_cudagraph.engines.state import load_state, module_state

KEYS = 4


@check("side isolation", sharper_with=("state.sides", "state.reset"))
def test_side_isolation(target: CudaGraphTarget, conclude: Conclude) -> None:
    lockstep = Lockstep(target)
    keys = list(target.keys[:KEYS])
    problems = []
    for key in keys:
        case, other = case_of(target, key, 0), case_of(target, key, 1)
        inputs = functools.partial(draw, target, case, case.number)
        elsewhere = functools.partial(draw, target, other, other.number)
        lockstep.sync()
        expected = eager_call(target, inputs(), case.number)
        eager_call(target, elsewhere(), other.number)
        actual = graphed_call(target, inputs(), case.number)
        problems += [
            f"key {key!r}, graphed right after eager on other inputs: {d}"
            for d in differences(target, inputs(), expected, actual)
        ]
        lockstep.sync()
        back = eager_back_to_start(lockstep)
        expected = eager_call(target, inputs(), case.number)
        back()  # eager as it was, for the same call again
        graphed_call(target, elsewhere(), other.number)
        problems += [
            f"key {key!r}, eager right after graphed on other inputs: {d}"
            for d in differences(
                target, inputs(), expected, eager_call(target, inputs(), case.number)
            )
        ]
    lockstep.sync()  # the calls above were uneven by design
    figure = f"{len(keys)} keys, each side right after the other on other inputs"
    judgement = Judgement(problems, figure, 2 * len(keys), "orders compared")
    also = lockstep.describe() if lockstep.stateful else ""
    conclude(judgement, "one side's answer depends on the other side's calls:", also)


def eager_back_to_start(lockstep: Lockstep) -> Callable[[], object]:
    """What puts the eager side back where it is now: its own state copied back (``sides``), a
    reset where the state accumulates and only ``reset`` is given, else nothing."""
    if lockstep.sides is not None:
        eager_side = lockstep.sides.eager
        saved = module_state(eager_side)
        return lambda: load_state(eager_side, saved)
    if lockstep.episodic and lockstep.reset is not None:
        return functools.partial(called, "State.reset", lockstep.reset)
    return lambda: None
