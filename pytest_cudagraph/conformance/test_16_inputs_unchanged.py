"""Inputs unchanged: a graphed call leaves the caller's tensors as they were, after that call
and after every later one. ``torch.cuda.make_graphed_callables`` keeps the sample arguments it
was given as the graph's static inputs and copies each later call's inputs into them, so code
that hands it the caller's first tensors (petals does) rewrites them on every later call of
that key.

Over 3 rounds on up to 4 keys (no more than ``capacity``), each call's input tensors are copied
when drawn and compared after that call and after each later one: at most 12 graphed calls and
no eager one (well under a second on the reference)."""

from __future__ import annotations

from pytest_cudagraph.conformance.catalog import given
from pytest_cudagraph.conformance.judging import (
    calls_over_keys,
    draw,
    graphed_path,
    input_tensor_names,
    keys_held,
)
from pytest_cudagraph.conformance.protocol import Cache, CudaGraphTarget
from pytest_cudagraph.conformance.suite import FigureRecorder
from pytest_cudagraph.engines.unchanged import Unchanged
from pytest_cudagraph.skips import needs_cuda

MAX_KEYS = 4
ROUNDS = 3  # the first captures each key; the later ones copy new inputs into its graph


@needs_cuda
def test_inputs_unchanged(target: CudaGraphTarget, record_figure: FigureRecorder) -> None:
    graphed = graphed_path(target)
    key_count = keys_held(target, MAX_KEYS, given(target, Cache, "capacity"))
    held = Unchanged()
    problems: list[str] = []
    for number, case in calls_over_keys(target, key_count, range(ROUNDS)):
        inputs = draw(target, case, seed=case)
        call = f"call {number} (case {case}, key {target.key_of(inputs)!r})"
        for name in input_tensor_names(inputs):
            held.keep(f"input {name!r} of {call}", inputs[name])
        graphed(inputs)
        problems += [change.describe() for change in held.changes(after=call)]
    calls = ROUNDS * key_count
    record_figure(
        f"{calls} calls over {key_count} keys: {len(held)} input tensors compared after each "
        "later call"
    )
    assert not problems, "graphed calls changed the caller's inputs:\n" + "\n".join(problems[:10])
