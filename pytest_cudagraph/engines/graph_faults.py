"""Faults at torch's own CUDA-graph API, so that any code built on torch's graphs has fault points.

torch.cuda.graph, make_graphed_callables, a cache that calls ``capture_begin`` itself and
torch.compile's cudagraph trees all capture and replay through the methods of
``torch.cuda.CUDAGraph`` (torch 2.7 to 2.13). ``GraphFaults.inject(stage)`` makes the next call
of one of them, from any thread, raise while its block is open:

- ``capture_begin``: before the capture begins, so nothing is captured;
- ``capture_end``: after the capture ends, the graph then reset, as a failed capture leaves it
  (the stream is out of capture mode, the graph cannot be replayed);
- ``replay``: before the replay, so the graph does not run.

The class is a parameter, so the engine is tested on the CPU with a stand-in of the same shape
(as pytest_cudagraph.engines.captures). torch is imported only for the default class.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

STAGES = ("capture_begin", "capture_end", "replay")
_METHODS = (*STAGES, "reset")


class Resettable(Protocol):
    """What a faulty ``capture_end`` needs of the graph: ``reset()``."""

    def reset(self) -> None: ...


@dataclass
class GraphFault:
    """One injected fault: its stage, the exception it raises, whether it fired."""

    stage: str
    exc: BaseException
    fired: bool = False


class GraphFaults:
    """Injects faults into ``graph_class`` (default ``torch.cuda.CUDAGraph``)."""

    def __init__(self, graph_class: type | None = None) -> None:
        if graph_class is None:
            import torch

            graph_class = torch.cuda.CUDAGraph
        if not isinstance(graph_class, type):
            raise TypeError(f"graph_class must be a class, got {graph_class!r}")
        missing = [name for name in _METHODS if not callable(getattr(graph_class, name, None))]
        if missing:
            raise TypeError(f"graph_class {graph_class.__name__} lacks the methods {missing}")
        self.graph_class = graph_class

    @contextmanager
    def inject(self, stage: str, exc: BaseException) -> Iterator[GraphFault]:
        """Make the first call of ``stage`` inside the block raise ``exc``; the method is
        put back when the block ends."""
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
        if not isinstance(exc, BaseException):
            raise TypeError(f"exc must be an exception instance, got {exc!r}")
        fault = GraphFault(stage, exc)
        own = vars(self.graph_class).get(stage)
        original = getattr(self.graph_class, stage)
        wrapper = self._faulty(fault, original)
        setattr(self.graph_class, stage, wrapper)
        try:
            yield fault
        finally:
            if vars(self.graph_class).get(stage) is wrapper:  # a later patch undoes its own
                if own is None:
                    delattr(self.graph_class, stage)
                else:
                    setattr(self.graph_class, stage, own)

    @staticmethod
    def _faulty(fault: GraphFault, original: Callable[..., object]) -> Callable[..., object]:
        lock = threading.Lock()

        def fire() -> bool:
            with lock:
                first, fault.fired = not fault.fired, True
            return first

        def faulty(graph: Resettable, *args: object, **kwargs: object) -> object:
            if fault.stage == "capture_end":
                result = original(graph, *args, **kwargs)
                if not fire():
                    return result
                graph.reset()  # what a failed capture leaves: no graph to replay
                raise fault.exc
            if fire():
                raise fault.exc
            return original(graph, *args, **kwargs)

        faulty.__name__ = fault.stage
        faulty.__doc__ = getattr(original, "__doc__", None)
        return faulty
