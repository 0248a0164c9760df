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

from collections.abc import Hashable, Sequence

from pytest_cudagraph.conformance._catalog import check
from pytest_cudagraph.conformance._judging import (
    Episodes,
    calls_over_keys,
    draw,
    eager_call,
    first_keys,
    graphed_call,
)
from pytest_cudagraph.conformance._protocol import Cache, CudaGraphTarget, Inputs
from pytest_cudagraph.conformance._suite import Conclude
from pytest_cudagraph.conformance._verdict import Judgement
from pytest_cudagraph.conformance._witness import Witness, labelled
from pytest_cudagraph.engines import trees
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.engines.unchanged import Unchanged

MAX_KEYS = 4
ROUNDS = 3  # the first captures each key; the later ones copy new inputs into its graph
SEED = 0  # torch's generators, for both sides of every call


@check("inputs unchanged", sharper_with=("cache.capacity",), witnessed=True)
def test_inputs_unchanged(
    target: CudaGraphTarget, cache: Cache | None, witness: Witness, conclude: Conclude
) -> None:
    keys = first_keys(target, MAX_KEYS, cache.capacity if cache is not None else None)
    seen = witness(judge, keys)
    headline = "graphed calls left the caller's inputs other than eager leaves them:"
    conclude(seen.judgement, headline, seen.describe())


def judge(target: CudaGraphTarget, keys: Sequence[Hashable], counter: CaptureCounter) -> Judgement:
    """Each call's inputs held to what eager left in a copy of them, after it and every later
    call."""
    held = Unchanged(sides=("eager left", "now"))
    problems: list[str] = []
    kept_by_graph: list[str] = []
    episodes = Episodes(target)
    for number, case in calls_over_keys(target, keys, range(ROUNDS)):
        episodes.begin()
        inputs, effect = draw(target, case, seed=case.number), draw(target, case, seed=case.number)
        eager_call(target, effect, SEED)  # what a step that writes its inputs writes
        call = f"call {number} (case {case.number}, key {case.key!r})"
        left = dict(trees.tensors(effect))
        for path, tensor in trees.tensors(inputs):
            held.keep(f"input {path!r} of {call}", tensor, expected=left[path])
        with labelled(counter, case) as number_counted:
            graphed_call(target, inputs, SEED)
        kept_by_graph += static_inputs(counter, number_counted, inputs, call)
        problems += [change.describe() for change in held.changes(after=call)]
    if problems and kept_by_graph:
        problems.append(
            f"what a graph kept as its static inputs (its capture reads them where the caller "
            f"put them, and each later call of its key copies its inputs into them): "
            f"{'; '.join(kept_by_graph)}; give the graph copies of the first call's tensors"
        )
    figure = (
        f"{ROUNDS * len(keys)} calls over {len(keys)} keys: {len(held)} input tensors held to "
        "eager's effect after each later call"
    )
    return Judgement(problems, figure, len(held), "input tensors held")


def static_inputs(counter: CaptureCounter, number: object, inputs: Inputs, call: str) -> list[str]:
    """The caller's input tensors of the call numbered ``number`` that a capture made in it
    reads or writes where they lie (as recorded at the capture): the graph's static inputs."""
    kept = []
    for capture in counter.captures:
        if capture.call != number or capture.record is None:
            continue
        for path, tensor in trees.tensors(inputs):
            if capture.record.reads_storage_of(tensor) or capture.record.writes_storage_of(tensor):
                kept.append(f"input {path!r} of {call}")
    return kept
