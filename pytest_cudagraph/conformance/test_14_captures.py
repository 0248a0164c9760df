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
from collections.abc import Callable, Sequence

import torch

from pytest_cudagraph.conformance.catalog import needed
from pytest_cudagraph.conformance.judging import (
    calls_over_keys,
    case_in_key,
    draw,
    graphed_path,
    synchronize,
)
from pytest_cudagraph.conformance.protocol import Cache, CudaGraphTarget, Inputs
from pytest_cudagraph.conformance.suite import FigureRecorder
from pytest_cudagraph.conformance.witness import Factory, Judgement, witnessed
from pytest_cudagraph.engines.captures import CaptureCounter, replays_to_repay
from pytest_cudagraph.skips import needs_cuda

MAX_KEYS = 4
ROUNDS = 4  # the first captures each key, the later ones must only replay it
TIMED_CALLS = 5


@needs_cuda
def test_captures(
    target: CudaGraphTarget,
    capture_counter: CaptureCounter,
    target_factory: Factory | None,
    record_figure: FigureRecorder,
) -> None:
    capacity = needed(target, Cache, "capacity").capacity
    assert capacity is not None
    key_count = min(MAX_KEYS, target.num_keys, capacity)
    seen = witnessed(target, capture_counter, judge, range(key_count), target_factory)
    record_figure(f"{seen.judgement.figure}; {seen.describe()}")
    recaptured = seen.judgement.problems
    assert not recaptured, (
        f"keys the cache held were captured again ({key_count} keys, capacity "
        f"{capacity}): " + ", ".join(recaptured)
    )


def judge(target: CudaGraphTarget, keys: Sequence[int], counter: CaptureCounter) -> Judgement:
    """Rounds over ``keys``, then timed calls of the first, as one more round: a key captured
    in more than one round is a problem."""
    for call, case in calls_over_keys(target, keys, range(ROUNDS)):
        inputs = draw(target, case, seed=case)
        with counter.call(target.key_of(inputs), round_number=call // len(keys)):
            graphed_path(target)(inputs)
    timed = draw(target, case_in_key(target, keys[0], ROUNDS), seed=ROUNDS)
    with counter.call(target.key_of(timed), round_number=ROUNDS):
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
    return Judgement(problems, figure)


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
