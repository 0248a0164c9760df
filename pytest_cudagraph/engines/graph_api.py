"""torch's CUDA-graph API as the engines reach it: the methods of one class, patched while a
scope is open.

torch.cuda.graph, make_graphed_callables, a cache that calls ``capture_begin`` itself and
torch.compile's cudagraph trees all capture and replay through the methods of
``torch.cuda.CUDAGraph`` (torch 2.7 to 2.13), so an engine that wraps those methods sees every
graph, whatever builds it. The class is a parameter of each such engine (``CaptureCounter``,
``GraphFaults``), so that they are tested on the CPU with a stand-in of the same shape; torch is
imported only for the default class.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

Method = Callable[..., object]
_INHERITED = object()  # what a class held of a method it inherits: nothing of its own


def graph_class_with(graph_class: type | None, methods: Sequence[str]) -> type:
    """``graph_class`` (None: ``torch.cuda.CUDAGraph``) when it is a class with each of
    ``methods``; TypeError naming what it lacks."""
    if graph_class is None:
        import torch

        graph_class = torch.cuda.CUDAGraph
    if not isinstance(graph_class, type):
        raise TypeError(f"graph_class must be a class, got {graph_class!r}")
    missing = [name for name in methods if not callable(getattr(graph_class, name, None))]
    if missing:
        raise TypeError(f"graph_class {graph_class.__name__} lacks the methods {missing}")
    return graph_class


@contextmanager
def patched(graph_class: type, name: str, wrap: Callable[[Method], Method]) -> Iterator[None]:
    """``graph_class.name`` replaced by ``wrap(the method)`` inside the block, from any thread.
    The class is put back as it was after it (a method it inherits by deleting the patch),
    unless something patched that method again since: a later patch undoes its own."""
    own = vars(graph_class).get(name, _INHERITED)
    original = getattr(graph_class, name)
    wrapper = wrap(original)
    wrapper.__name__ = name
    wrapper.__doc__ = getattr(original, "__doc__", None)
    setattr(graph_class, name, wrapper)
    try:
        yield
    finally:
        if vars(graph_class).get(name) is wrapper:
            if own is _INHERITED:
                delattr(graph_class, name)
            else:
                setattr(graph_class, name, own)
