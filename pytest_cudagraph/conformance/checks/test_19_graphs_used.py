"""Graphs used: in steady state every call of a cached key replays its graphs. Code that captured
its graphs can still run a call without them and answer right, only slowly: a lookup that
misses the bucket's graph and falls back (SGLang #30752 looked graphs up by a raw batch size),
eager above the largest bucket, a draft model never dispatched (vLLM #47460), an error mode
that does not fire (PyTorch #193044), a module whose training flag differs from the one
``make_graphed_callables`` graphed it in (it then runs its own forward), one piece of a
piecewise runner falling back for good. Replays are counted at torch's graph API
(``CaptureCounter``, graphs captured before this check included). Calls the target declares
eager (``runs_eagerly``) are counted and reported; any other call that replays fewer graphs
than a call of its key did in the warm-up rounds fails, and a check whose every call was
declared eager judged nothing.

2 warm-up rounds (compiled code records a key's graph on its second call), then 2 judged rounds,
on up to 4 keys (no more than ``capacity``): at most 16 graphed calls and no eager one, well
under a second on the reference."""

from __future__ import annotations

from collections.abc import Hashable

from pytest_cudagraph.conformance._catalog import check
from pytest_cudagraph.conformance._judging import (
    Episodes,
    calls_over_keys,
    draw,
    first_keys,
    graphed_path,
)
from pytest_cudagraph.conformance._protocol import Cache, CudaGraphTarget, Fallbacks
from pytest_cudagraph.conformance._suite import Conclude
from pytest_cudagraph.conformance._verdict import Judgement
from pytest_cudagraph.engines.captures import CaptureCounter

MAX_KEYS = 4
WARM_ROUNDS = 2
JUDGED_ROUNDS = 2


@check("graphs used", sharper_with=("cache.capacity", "fallbacks.runs_eagerly"))
def test_graphs_used(
    target: CudaGraphTarget,
    cache: Cache | None,
    fallbacks: Fallbacks | None,
    capture_counter: CaptureCounter,
    conclude: Conclude,
) -> None:
    graphed = graphed_path(target)
    keys = first_keys(target, MAX_KEYS, cache.capacity if cache is not None else None)
    runs_eagerly = fallbacks.runs_eagerly if fallbacks is not None else None
    most: dict[Hashable, int] = {}  # a key -> the most graphs one of its calls replayed
    bypassed: list[str] = []
    declared = judged = 0
    episodes = Episodes(target)
    with capture_counter:
        for call, case in calls_over_keys(target, keys, range(WARM_ROUNDS + JUDGED_ROUNDS)):
            episodes.begin()
            inputs = draw(target, case, seed=case.number)
            before = capture_counter.all_replays
            graphed(inputs)
            replays = capture_counter.all_replays - before
            if case.repeat < WARM_ROUNDS:
                most[case.key] = max(most.get(case.key, 0), replays)
            elif runs_eagerly is not None and runs_eagerly(inputs):
                declared += 1
            else:
                judged += 1
                if replays < max(1, most.get(case.key, 0)):
                    bypassed.append(
                        f"call {call} (case {case.number}, key {case.key!r}) replayed {replays} "
                        f"graph(s), where a call of its key replayed {most.get(case.key, 0)} in "
                        "the warm-up rounds: the graphed path ran without them"
                    )
    calls = JUDGED_ROUNDS * len(keys)
    eager = f"; {declared} eager, as the target declares" if runs_eagerly else ""
    figure = (
        f"{calls} calls over {len(keys)} keys after {WARM_ROUNDS} warm-up rounds: "
        f"{capture_counter.all_replays} replays, {len(bypassed)} calls without their graphs{eager}"
    )
    headline = (
        f"{len(bypassed)} of {calls} calls of cached keys ran without their graphs (none "
        "declared in runs_eagerly):"
    )
    conclude(Judgement(bypassed, figure, judged, "calls not declared eager"), headline)
