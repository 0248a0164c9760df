"""A stand-in of torch.cuda.CUDAGraph for the CPU tests of the checks: the same method names,
so that the engines patching that class (CaptureCounter, GraphFaults) patch this one instead;
and a graphed side made of such graphs around any function."""

from __future__ import annotations

from collections.abc import Callable, Hashable


class StandInGraph:
    """torch.cuda.CUDAGraph's shape: a replay needs a completed capture, reset drops it."""

    def __init__(self) -> None:
        self.captured = False

    def capture_begin(self, *args: object, **kwargs: object) -> None:
        pass

    def capture_end(self) -> None:
        self.captured = True

    def replay(self) -> None:
        if not self.captured:
            raise RuntimeError("replay without a preceding successful capture")

    def reset(self) -> None:
        self.captured = False


def captured() -> StandInGraph:
    """A stand-in graph, captured (as ``torch.cuda.graph`` leaves one)."""
    graph = StandInGraph()
    graph.capture_begin()
    graph.capture_end()
    return graph


class StandInGraphs:
    """``function`` behind stand-in graphs, one per key (``key_of(inputs)``), captured on the
    key's first call after ``warm_up_calls`` calls without a graph (cudagraph trees warm up on
    one) and replayed by each call from then on: the captures and replays a graph cache makes,
    for the checks that count them (and witness their captures)."""

    def __init__(
        self,
        function: Callable[[dict[str, object]], object],
        key_of: Callable[..., Hashable],
        warm_up_calls: int = 0,
    ) -> None:
        self.function, self.key_of, self.warm_up_calls = function, key_of, warm_up_calls
        self.graphs: dict[Hashable, StandInGraph] = {}
        self.calls: dict[Hashable, int] = {}

    def __call__(self, inputs: dict[str, object]) -> object:
        key = self.key_of(inputs)
        self.calls[key] = self.calls.get(key, 0) + 1
        if self.calls[key] <= self.warm_up_calls:
            return self.function(inputs)
        if key not in self.graphs:  # kept once captured: a failed capture leaves no entry
            self.graphs[key] = captured()
        self.graphs[key].replay()
        return self.function(inputs)
