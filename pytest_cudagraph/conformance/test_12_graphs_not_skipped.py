"""Graphs not skipped: every call of the graphed path ran its graph. Code whose graphs are
captured for it (torch.compile's cudagraph trees) can fall back to eager without an error: a
capture skipped for an unsupported op or a mutated input, a graph re-recorded past its limit.
The target reports those through ``graph_skips()``. Inductor reports a skip once, when the
graph it skipped is first called (often in an earlier check), so every skip since the target was
made counts, not only those of this check's rounds."""

from __future__ import annotations

from pytest_cudagraph.conformance.catalog import needed
from pytest_cudagraph.conformance.judging import calls_over_keys, draw, graphed_path
from pytest_cudagraph.conformance.protocol import CudaGraphTarget, Fallbacks
from pytest_cudagraph.conformance.suite import FigureRecorder
from pytest_cudagraph.skips import needs_cuda

MAX_KEYS = 8
ROUNDS = 3  # the first records each key's graph, the later ones must only replay it


@needs_cuda
def test_graphs_not_skipped(target: CudaGraphTarget, record_figure: FigureRecorder) -> None:
    graph_skips = needed(target, Fallbacks, "graph_skips").graph_skips
    assert graph_skips is not None
    key_count = min(MAX_KEYS, target.num_keys)
    for _, case in calls_over_keys(target, key_count, range(ROUNDS)):
        graphed_path(target)(draw(target, case, seed=case))
    skips = list(graph_skips())
    record_figure(
        f"{ROUNDS} rounds over {key_count} keys: {len(skips)} graph(s) skipped since the target "
        "was made"
    )
    assert not skips, "the graphed path ran without its graph:\n" + "\n".join(skips[:10])
