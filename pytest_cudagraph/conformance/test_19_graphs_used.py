"""Graphs used: in steady state every call of a cached key replays a graph. Code that captured
its graphs can still run a call without them and answer right, only slowly: a lookup that
misses the bucket's graph and falls back (SGLang #30752 looked graphs up by a raw batch size),
eager above the largest bucket, a draft model never dispatched (vLLM #47460), an error mode
that does not fire (PyTorch #193044), a module whose training flag differs from the one
``make_graphed_callables`` graphed it in (it then runs its own forward). Replays are counted at
torch's graph API (``CaptureCounter``, graphs captured before this check included). Calls the
target declares eager (``runs_eagerly``) are counted and reported; any other call that replays
no graph fails.

2 warm-up rounds (compiled code records a key's graph on its second call), then 2 judged rounds,
on up to 4 keys (no more than ``capacity``): at most 16 graphed calls and no eager one, well
under a second on the reference."""

from __future__ import annotations

from pytest_cudagraph.conformance.catalog import given
from pytest_cudagraph.conformance.judging import calls_over_keys, draw, graphed_path, keys_held
from pytest_cudagraph.conformance.protocol import Cache, CudaGraphTarget, Fallbacks
from pytest_cudagraph.conformance.suite import FigureRecorder
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.skips import needs_cuda

MAX_KEYS = 4
WARM_ROUNDS = 2
JUDGED_ROUNDS = 2


@needs_cuda
def test_graphs_used(
    target: CudaGraphTarget, capture_counter: CaptureCounter, record_figure: FigureRecorder
) -> None:
    graphed = graphed_path(target)
    key_count = keys_held(target, MAX_KEYS, given(target, Cache, "capacity"))
    for _, case in calls_over_keys(target, key_count, range(WARM_ROUNDS)):
        graphed(draw(target, case, seed=case))
    runs_eagerly = given(target, Fallbacks, "runs_eagerly")
    bypassed: list[str] = []
    declared = 0
    with capture_counter:
        judged_rounds = range(WARM_ROUNDS, WARM_ROUNDS + JUDGED_ROUNDS)
        for call, case in calls_over_keys(target, key_count, judged_rounds):
            inputs = draw(target, case, seed=case)
            before = capture_counter.all_replays
            graphed(inputs)
            if runs_eagerly is not None and runs_eagerly(inputs):
                declared += 1
            elif capture_counter.all_replays == before:
                bypassed.append(
                    f"call {call} (case {case}, key {target.key_of(inputs)!r}) replayed no "
                    "graph: the graphed path ran without one"
                )
    calls = JUDGED_ROUNDS * key_count
    eager = f"; {declared} eager, as the target declares" if runs_eagerly else ""
    record_figure(
        f"{calls} calls over {key_count} keys after {WARM_ROUNDS} warm-up rounds: "
        f"{capture_counter.all_replays} replays, {len(bypassed)} calls without a graph{eager}"
    )
    assert not bypassed, (
        f"{len(bypassed)} of {calls} calls of cached keys ran without a graph (none declared "
        "in runs_eagerly):\n" + "\n".join(bypassed[:10])
    )
