"""Graphs not skipped: every call of the graphed path ran its graph. Code whose graphs are
captured for it (torch.compile's cudagraph trees) can fall back to eager without an error: a
capture skipped for an unsupported op or a mutated input, a graph re-recorded past its limit.
The target reports those through ``graph_skips()``. Inductor reports a skip once, when the
graph it skipped is first called (often in an earlier check), so every skip since the target was
made counts, not only those of this check's rounds."""

from __future__ import annotations

from pytest_cudagraph.conformance._catalog import check, declared
from pytest_cudagraph.conformance._judging import (
    Episodes,
    called,
    calls_over_keys,
    draw,
    graphed_path,
)
from pytest_cudagraph.conformance._protocol import CudaGraphTarget, Fallbacks
from pytest_cudagraph.conformance._suite import Conclude
from pytest_cudagraph.conformance._verdict import Judgement

MAX_KEYS = 8
ROUNDS = 3  # the first records each key's graph, the later ones must only replay it


@check("graphs not skipped", needs=("fallbacks.graph_skips",))
def test_graphs_not_skipped(
    target: CudaGraphTarget, fallbacks: Fallbacks, conclude: Conclude
) -> None:
    keys = list(target.keys[:MAX_KEYS])
    episodes = Episodes(target)
    for _, case in calls_over_keys(target, keys, range(ROUNDS)):
        episodes.begin()
        graphed_path(target)(draw(target, case, seed=case.number))
    skips = list(called("Fallbacks.graph_skips", declared(fallbacks.graph_skips)))
    figure = (
        f"{ROUNDS} rounds over {len(keys)} keys: {len(skips)} graph(s) skipped since the target "
        "was made"
    )
    judgement = Judgement(skips, figure, ROUNDS * len(keys), "graphed calls")
    conclude(judgement, "the graphed path ran without its graph:")
