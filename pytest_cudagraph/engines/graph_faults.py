"""Faults at torch's own CUDA-graph API, so that any code built on torch's graphs has fault points.

Every graph captures and replays through the methods of torch's graph class
(``engines.graph_api``). ``GraphFaults.inject(stage)`` makes the next call of one of them, from
any thread, raise while its block is open:

- ``capture_begin``: before the capture begins, so nothing is captured;
- ``capture_end``: after the capture ends, the graph then reset, as a failed capture leaves it
  (the stream is out of capture mode, the graph cannot be replayed);
- ``replay``: before the replay, so the graph does not run.

The class is a parameter (a stand-in of its shape on the CPU); torch is imported only for the
default class.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from pytest_cudagraph.engines.graph_api import Method, graph_class_with, patched

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
        self.graph_class = graph_class_with(graph_class, _METHODS)

    @contextmanager
    def inject(self, stage: str, exc: BaseException) -> Iterator[GraphFault]:
        """Make the first call of ``stage`` inside the block raise ``exc``; the method is
        put back when the block ends."""
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
        if not isinstance(exc, BaseException):
            raise TypeError(f"exc must be an exception instance, got {exc!r}")
        fault = GraphFault(stage, exc)
        with patched(self.graph_class, stage, lambda original: self._faulty(fault, original)):
            yield fault

    @staticmethod
    def _faulty(fault: GraphFault, original: Method) -> Method:
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

        return faulty
