"""Captures: a cache captures each key once and then only replays it. Over rounds of calls on
no more keys than the cache holds (``capacity``), a held key captured again in a later round
fails: such a cache is correct, so every other check passes, and slow. The graphs of one key
captured in one round are one capture of it: piecewise code holds several per key (one per
layer segment, eager attention between). Captures are counted however they are made
(pytest_cudagraph.engines.captures.CaptureCounter: hand-written, make_graphed_callables,
compile's cudagraph trees, on any thread) and witnessed (``witness``): seeing none, the check
has one made. The figure says what a capture costs in calls: replays per capture, and how many
replays repay one capture (its seconds over what a replay saves against the eager call)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Sequence

import torch

from pytest_cudagraph.conformance._catalog import check, declared
from pytest_cudagraph.conformance._judging import (
    Episodes,
    calls_over_keys,
    case_of,
    draw,
    graphed_path,
    synchronize,
)
from pytest_cudagraph.conformance._protocol import Cache, CudaGraphTarget, Inputs
from pytest_cudagraph.conformance._suite import Conclude
from pytest_cudagraph.conformance._verdict import Judgement
from pytest_cudagraph.conformance._witness import Witness, labelled
from pytest_cudagraph.engines.captures import CaptureCounter, replays_to_repay

MAX_KEYS = 4
ROUNDS = 4  # the first captures each key, the later ones must only replay it
TIMED_CALLS = 5


@check("captures", needs=("cache.capacity",), witnessed=True)
def test_captures(
    target: CudaGraphTarget, cache: Cache, witness: Witness, conclude: Conclude
) -> None:
    capacity = declared(cache.capacity)
    keys = list(target.keys[: min(MAX_KEYS, capacity)])
    seen = witness(judge, keys)
    headline = f"keys the cache held were captured again ({len(keys)} keys, capacity {capacity}):"
    conclude(seen.judgement, headline, seen.describe())


def judge(target: CudaGraphTarget, keys: Sequence[Hashable], counter: CaptureCounter) -> Judgement:
    """Rounds over ``keys``, then timed calls of the first, as one more round: a key captured
    in more than one round, whether or not its later graphs were replayed, is a problem."""
    episodes = Episodes(target)
    for _, case in calls_over_keys(target, keys, range(ROUNDS)):
        episodes.begin()
        inputs = draw(target, case, seed=case.number)
        with labelled(counter, case):
            graphed_path(target)(inputs)
    timed_case = case_of(target, keys[0], ROUNDS)
    episodes.begin(1 + TIMED_CALLS)
    timed = draw(target, timed_case, seed=ROUNDS)
    with labelled(counter, timed_case):
        eager_s = seconds_per_call(target.eager, timed, target.device)
        graph_s = seconds_per_call(graphed_path(target), timed, target.device)
    captures = counter.captures
    figure = f"{ROUNDS} rounds over {len(keys)} keys: {len(captures)} captures"
    if captures:
        capture_s = counter.capture_seconds() / len(captures)
        repay = replays_to_repay(capture_s, eager_s, graph_s)
        repaid = "a replay saves nothing" if math.isinf(repay) else f"{repay:.0f} replays repay it"
        figure += (
            f", {counter.replays_per_capture():.1f} replays per capture; a capture takes "
            f"{capture_s * 1e3:.1f} ms, a call {eager_s * 1e3:.2f} ms eager and "
            f"{graph_s * 1e3:.2f} ms graphed: {repaid}"
        )
    again = counter.keys_captured_again()
    problems = [f"{key!r} in {rounds} of {ROUNDS + 1} rounds" for key, rounds in again.items()]
    return Judgement(problems, figure, ROUNDS * len(keys), "calls")


def seconds_per_call(
    function: Callable[[Inputs], object], inputs: Inputs, device: torch.device
) -> float:
    """Mean wall time of a call, the device's work included; one untimed call first."""
    function(inputs)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(TIMED_CALLS):
        function(inputs)
    synchronize(device)
    return (time.perf_counter() - start) / TIMED_CALLS
