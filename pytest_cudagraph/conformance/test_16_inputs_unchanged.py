"""Inputs unchanged: after a graphed call, the caller's tensors (that call's, and every earlier
call's still held) hold what the eager side leaves in a copy of them: a step that writes its
input in place writes it alike, and nothing writes them after. ``make_graphed_callables`` keeps
the sample arguments it was given as the graph's static inputs and copies each later call's
inputs into them, so code that hands it the caller's first tensors (petals does) rewrites them
on every later call of that key. Only the inputs of a call that captured show it, so the
check's captures are witnessed (``witness``): seeing none, it has one made.

Over 3 rounds on up to 4 keys (no more than ``capacity``), each call's inputs (nested
containers walked) are compared with eager's effect after that call and after each later one:
at most 12 calls on each side (well under a second on the reference)."""

from __future__ import annotations

from collections.abc import Sequence

from pytest_cudagraph.conformance.catalog import given
from pytest_cudagraph.conformance.judging import (
    calls_over_keys,
    draw,
    eager_call,
    graphed_call,
    keys_held,
)
from pytest_cudagraph.conformance.protocol import Cache, CudaGraphTarget
from pytest_cudagraph.conformance.suite import FigureRecorder
from pytest_cudagraph.conformance.witness import Factory, Judgement, witnessed
from pytest_cudagraph.engines import trees
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.engines.unchanged import Unchanged
from pytest_cudagraph.skips import needs_cuda

MAX_KEYS = 4
ROUNDS = 3  # the first captures each key; the later ones copy new inputs into its graph
SEED = 0  # torch's generators, for both sides of every call


@needs_cuda
def test_inputs_unchanged(
    target: CudaGraphTarget,
    capture_counter: CaptureCounter,
    target_factory: Factory | None,
    record_figure: FigureRecorder,
) -> None:
    key_count = keys_held(target, MAX_KEYS, given(target, Cache, "capacity"))
    seen = witnessed(target, capture_counter, judge, range(key_count), target_factory)
    record_figure(f"{seen.judgement.figure}; {seen.describe()}")
    problems = seen.judgement.problems
    assert not problems, (
        "graphed calls left the caller's inputs other than eager leaves them:\n"
        + ("\n".join(problems[:10]))
    )


def judge(target: CudaGraphTarget, keys: Sequence[int], counter: CaptureCounter) -> Judgement:
    """Each call's inputs held to what eager left in a copy of them, after it and every later
    call."""
    held = Unchanged(sides=("eager left", "now"))
    problems: list[str] = []
    for number, case in calls_over_keys(target, keys, range(ROUNDS)):
        inputs, effect = draw(target, case, seed=case), draw(target, case, seed=case)
        eager_call(target, effect, SEED)  # what a step that writes its inputs writes
        call = f"call {number} (case {case}, key {target.key_of(inputs)!r})"
        left = dict(trees.tensors(effect))
        for path, tensor in trees.tensors(inputs):
            held.keep(f"input {path!r} of {call}", tensor, expected=left[path])
        graphed_call(target, inputs, SEED)
        problems += [change.describe() for change in held.changes(after=call)]
    figure = (
        f"{ROUNDS * len(keys)} calls over {len(keys)} keys: {len(held)} input tensors held to "
        "eager's effect after each later call"
    )
    return Judgement(problems, figure)
